"""The Open Inference Protocol v2 as this service speaks it: names, extensions, and each model's tensors.

The gateway serves the protocol (:mod:`svc.gateway.oip`; a model server
answers its inference, :mod:`svc.modelserver.oip_route`, with
:mod:`svc.web.oip`) and the OpenAPI documents describe it
(:mod:`svc.openapi.oip`); all take its constants from here.  What a model's tensors are is read from the ``/openapi.json`` its
model server serves.

The gateway loads no model code, and nothing in ``svc`` names a model: a
model's OIP shape follows from the schema of its results' ``data`` and of its
params (``components.schemas["<ID>_Data"]`` and ``["<ID>_Params"]`` of its
own document), which every model server serves without a credential; the
first rule that fits:

- an object that requires ``class_ids``, ``scores`` and ``categories``, whose
  ``class_id`` has a ``maximum``, of a model whose ``top_k`` param reaches
  the class count (``class_id``'s maximum + 1): ``PROBABILITIES`` FP32
  ``[rows, classes]``, with the classification extension on it (the plain
  tensor sets ``top_k`` to the class count, ``classification: k`` to k; a
  ``top_k`` that stops short, or no ``top_k``, made every plain request a
  400, so such a classifier falls through to ``DATA``);
- an array of ``bbox``, ``score``, ``class_id``: ``BOXES`` FP32 ``[n, 4]``,
  ``SCORES`` FP32 ``[n]``, ``CLASSES`` INT32 ``[n]`` and ``ROWS`` INT32
  ``[n]``, every row's detections in turn;
- an array of ``segmentation``: ``MASKS`` BYTES ``[n]`` (JSON of each mask's
  COCO RLE) and ``ROWS``;
- an object with ``image``: ``GENERATED`` BYTES ``[rows]``, the encoded
  images (PNG by default);
- anything else: ``DATA`` BYTES ``[rows]``, JSON of each row's ``data``.

Every model takes one ``BYTES`` input ``IMAGE``: one encoded image per batch
row, of shape ``[rows, 1]`` in the metadata (Triton's form of a batched
``BYTES`` input, whose configuration's ``dims`` are ``[1]``: what
perf_analyzer builds its requests from); ``[rows]`` is taken too.  The document is read once per model and kept
for the gateway's life (a model's data schema changes only with its code).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: The path prefix of every OIP route: replies under it (errors too) take the protocol's shape.
PREFIX = "/v2"
_PREFIX_BYTES = PREFIX.encode()


def is_oip_path(path: bytes) -> bool:
    """Whether a request path is the protocol's: ``/v2`` or under it."""
    return path == _PREFIX_BYTES or path.startswith(_PREFIX_BYTES + b"/")
#: The server metadata's name and every model's platform.
SERVER_NAME = "inference-service"
PLATFORM = "inference-service"
#: The protocol's extensions the gateway supports (server metadata).
EXTENSIONS = ["binary_tensor_data", "classification", "parameters"]
#: Request parameters of the protocol (and of tritonclient, and MLServer's codec hint ``content_type``) that are
#: not model params.
RESERVED = frozenset({"binary_data_output", "options", "sequence_id", "sequence_start", "sequence_end", "priority",
                      "timeout", "headers", "content_type"})
RESERVED_PREFIX = "triton_"

INPUT = "IMAGE"
CLASSIFICATION, DETECTION, SEGMENTATION, GENERATION, GENERIC = (
    "classification", "detection", "segmentation", "generation", "generic")


@dataclass(frozen=True)
class Spec:
    """One tensor of the metadata: ``shape`` with -1 for a dimension that varies."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelShape:
    """A model's kind and its outputs."""

    kind: str
    outputs: tuple[Spec, ...]
    classes: int = 0

    def output(self, name: str) -> Spec | None:
        return next((o for o in self.outputs if o.name == name), None)


INPUTS = (Spec(INPUT, "BYTES", (-1, 1)),)
ROWS = Spec("ROWS", "INT32", (-1,))


def shape_of(kind: str, classes: int = 0) -> ModelShape:
    """The outputs of a model of ``kind``."""
    outputs = {
        CLASSIFICATION: (Spec("PROBABILITIES", "FP32", (-1, classes)),),
        DETECTION: (Spec("BOXES", "FP32", (-1, 4)), Spec("SCORES", "FP32", (-1,)), Spec("CLASSES", "INT32", (-1,)),
                    ROWS),
        SEGMENTATION: (Spec("MASKS", "BYTES", (-1,)), ROWS),
        GENERATION: (Spec("GENERATED", "BYTES", (-1,)),),
        GENERIC: (Spec("DATA", "BYTES", (-1,)),),
    }[kind]
    return ModelShape(kind, outputs, classes)


def _required(schema: Any) -> set:
    return set(schema.get("required") or ()) if isinstance(schema, dict) else set()


def _bound(value: Any) -> float:
    """A schema's numeric bound, or infinity where it states none."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("inf")


def top_k_reaches(params: Any, classes: int) -> bool:
    """Whether the params schema has a ``top_k`` that may be ``classes``: what ``PROBABILITIES`` asks of it."""
    props = params.get("properties") if isinstance(params, dict) else None
    top_k = props.get("top_k") if isinstance(props, dict) else None
    if not isinstance(top_k, dict):
        return False
    return _bound(top_k.get("maximum")) >= classes and _bound(top_k.get("exclusiveMaximum")) > classes


def shape_from_data_schema(data: Any, params: Any) -> ModelShape:
    """The model's shape from the JSON Schemas of its results' ``data`` and of its ``params`` (the module
    docstring's rules)."""
    if not isinstance(data, dict):
        return shape_of(GENERIC)
    props = data.get("properties") or {}
    if data.get("type") == "object" and {"class_ids", "scores", "categories"} <= _required(data):
        maximum = (props.get("class_id") or {}).get("maximum")
        if isinstance(maximum, int) and top_k_reaches(params, maximum + 1):
            return shape_of(CLASSIFICATION, maximum + 1)
    if data.get("type") == "array":
        items = _required(data.get("items"))
        if {"bbox", "score", "class_id"} <= items:
            return shape_of(DETECTION)
        if "segmentation" in items:
            return shape_of(SEGMENTATION)
    if data.get("type") == "object" and "image" in _required(data):
        return shape_of(GENERATION)
    return shape_of(GENERIC)


def shape_from_document(model_id: str, body: bytes) -> ModelShape:
    """The model's shape from its model server's ``/openapi.json``; ValueError when it has no data schema."""
    document = json.loads(body)
    schemas = document.get("components", {}).get("schemas", {}) if isinstance(document, dict) else {}
    data = schemas.get(f"{model_id}_Data")
    if data is None:
        raise ValueError(f"the OpenAPI document of {model_id} has no {model_id}_Data schema")
    return shape_from_data_schema(data, schemas.get(f"{model_id}_Params"))


#: Triton's names of the protocol's datatypes (``data_type`` in a model configuration).
TRITON_TYPES = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "INT32": "TYPE_INT32"}


@dataclass(frozen=True)
class Serving:
    """How a model server serves its model: what its configuration in Triton's shape states."""

    max_rows: int  # max_request_items: the rows one request may carry
    batch_size: int  # max_batch_size: the server's own batches
    batch_delay_ms: int
    device: str  # "cpu" or "gpu"
    workers: int
    parameters: dict[str, str]  # the rest, as Triton's string parameters


def model_config(model_id: str, shape: ModelShape, serving: Serving) -> dict:
    """The model's configuration in Triton's shape (``GET /v2/models/{id}/config``; tritonclient's
    ``get_model_config``, and what Triton's perf_analyzer reads before it sends a request).

    ``max_batch_size`` is the rows one request may carry (``max_request_items``), so each tensor's ``dims`` are
    its metadata shape without the first dimension (``[1]`` for the input, ``[]`` for an output of one element per
    row or detection); ``dynamic_batching`` is present when the server collects requests into batches (its
    ``max_batch_size`` above 1: its window, and its batch size as the preferred one where that is not above the
    rows of a request, which Triton's configuration cannot state: ``parameters`` carries it then, as always);
    ``instance_group`` counts the server's workers."""
    def tensor(spec: Spec) -> dict:
        return {"name": spec.name, "data_type": TRITON_TYPES[spec.datatype], "dims": list(spec.shape[1:])}

    config: dict[str, Any] = {
        "name": model_id, "platform": PLATFORM, "backend": "", "max_batch_size": serving.max_rows,
        "input": [{**tensor(spec), "format": "FORMAT_NONE"} for spec in INPUTS],
        "output": [tensor(spec) for spec in shape.outputs],
        "instance_group": [{"name": model_id, "kind": "KIND_GPU" if serving.device == "gpu" else "KIND_CPU",
                            "count": serving.workers}],
        "parameters": {name: {"string_value": value} for name, value in serving.parameters.items()},
    }
    if serving.batch_size > 1:
        batching: dict[str, Any] = {"max_queue_delay_microseconds": serving.batch_delay_ms * 1000}
        if serving.batch_size <= serving.max_rows:
            batching["preferred_batch_size"] = [serving.batch_size]
        config["dynamic_batching"] = batching
    return config
