"""An OIP inference request as the model server's own request, and its results as OIP outputs.

The request runs through the model server's data plane like any other
(batching, deadlines, per-item isolation, bounded queues): one image per
element of the ``IMAGE`` input (a binary element's bytes, a JSON element's
base64), the request's ``parameters`` as ``params`` less the protocol's own
(:data:`RESERVED`), ``parameters.options`` as ``options``, and the request's
``id`` as ``req_id`` when it is a valid one (a client's ``X-Request-ID`` that is
not one is 400, as on ``/v1``, where it is 422).

The protocol fails a request as a whole, where the envelope isolates
items: a reply with any item that did not succeed becomes an error with
the HTTP status of the first such item (400 for an image that is empty or
not an image, 500 for an engine or output failure, 504 for an item past
the deadline: a partial 200 status 68 is a 504 here) naming its index and
status.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.contract.oip import (
    CLASSIFICATION,
    DETECTION,
    GENERATION,
    INPUT,
    RESERVED,
    RESERVED_PREFIX,
    SEGMENTATION,
    ModelShape,
)
from svc.contract.request import REQ_ID_RE, REQ_ID_RULE
from svc.web.oip.codec import CodecError, InferRequest, RequestedOutput
from svc.web.oip.encode import Output

#: Model-server statuses that the protocol, which has one "bad request", answers 400.
AS_BAD_REQUEST = frozenset({415, 422})
#: Item statuses by code, for the error text and HTTP status of a failed item.
STATUSES: dict[object, st.Status] = {s.code: s for s in st.ALL}  # looked up with any JSON value


@dataclass
class Plan:
    """The model server's request for an OIP request (its images, params, options and request id), and which
    outputs to answer with (each with whether it is binary)."""

    images: list[str | bytes]
    params: dict
    options: dict
    req_id: str | None
    outputs: list[tuple[RequestedOutput, bool]]

    @property
    def rows(self) -> int:
        return len(self.images)


#: Params the plan sets from the request's outputs, per kind of model, and refuses from the client; an unknown
#: param's error does not offer them (it said "accepted: top_k", and a top_k param is a 400).
SET_PARAMS = {CLASSIFICATION: frozenset({"top_k"})}
#: The same for options: a classifier's max_results is refused here, so an unknown option's error does not offer it.
SET_OPTIONS = {CLASSIFICATION: frozenset({"max_results"})}


def _outputs(shape: ModelShape, request: InferRequest) -> list[tuple[RequestedOutput, bool]]:
    requested = request.outputs
    if not requested:  # absent or [] (Triton and KServe read an empty list so too): every output
        requested = [RequestedOutput(o.name, None, None) for o in shape.outputs]
    found: list[tuple[RequestedOutput, bool]] = []
    for out in requested:
        if any(out.name == seen.name for seen, _ in found):
            raise CodecError(f"output {out.name} is asked for twice: outputs are looked up by name")
        if shape.output(out.name) is None:
            names = ", ".join(o.name for o in shape.outputs)
            raise CodecError(f"unknown output {out.name[:80]!r}: the model's outputs are {names}")
        if out.classification is not None and shape.kind != CLASSIFICATION:
            raise CodecError(f"output {out.name} does not support the classification extension")
        if (out.classification or 0) > shape.classes:
            raise CodecError(f"classification {out.classification} is more than the model's {shape.classes} classes")
        found.append((out, out.binary if out.binary is not None else request.binary_output))
    return found


def plan(shape: ModelShape, request: InferRequest, request_id: str | None = None) -> Plan:
    """The model server's request for ``request`` (CodecError: 400); ``request_id``: the client's X-Request-ID.

    A binary element is the image file's bytes and a JSON one its base64, as the model server's own
    request holds them (raw bodies and JSON bodies): nothing is encoded again.  The model server then
    checks params and options against its schemas (``RequestValidator.from_parts``).
    """
    tensor = request.inputs[0] if len(request.inputs) == 1 else None
    # [rows], or [rows, 1] as Triton's batched BYTES inputs and MLServer's codecs shape one element per row
    if tensor is None or tensor.datatype != "BYTES" or not (
            len(tensor.shape) == 1 or (len(tensor.shape) == 2 and tensor.shape[1] == 1)):
        raise CodecError(f"the model takes one BYTES input {INPUT} of shape [-1] (or [-1, 1]): one encoded image "
                         "per row")
    if tensor.name != INPUT:
        raise CodecError(f"unexpected input {tensor.name[:80]!r}: the model takes one BYTES input {INPUT}")
    if not tensor.data:
        raise CodecError(f"{INPUT} has no rows")
    if not all(isinstance(v, (str, bytes)) for v in tensor.data):
        raise CodecError(f"the elements of {INPUT} must be strings (base64 of the image file) in JSON")
    outputs = _outputs(shape, request)
    params = {k: v for k, v in request.parameters.items() if k not in RESERVED and not k.startswith(RESERVED_PREFIX)}
    options = request.parameters.get("options", {})
    if not isinstance(options, dict):
        raise CodecError("parameters.options must be a JSON object")
    if shape.kind == CLASSIFICATION:
        if "top_k" in params:
            raise CodecError("top_k is not a parameter here: the outputs asked for set it (classification: k)")
        if "max_results" in options:  # it would cut the classes below what the outputs ask for
            raise CodecError("max_results is not an option here: the outputs asked for set it (classification: k)")
        wanted = [o.classification or 0 for o, _ in outputs]
        params["top_k"] = shape.classes if 0 in wanted else max(wanted)
    elif shape.kind == SEGMENTATION:
        if options.get("mask_format", "rle") != "rle":
            raise CodecError("masks are COCO RLE here: options.mask_format can only be rle")
        options = {**options, "mask_format": "rle"}
    if request_id is not None and not REQ_ID_RE.fullmatch(request_id):
        # refused as on /v1 (docs/api.md), not replaced: a client's correlation is never lost without a word
        raise CodecError("X-Request-ID header " + REQ_ID_RULE)
    return Plan(list(tensor.data), params, options, request_id_of(request_id, request.id), outputs)


def request_id_of(header_id: str | None, body_id: str | None) -> str | None:
    """The request id of a request: its ``X-Request-ID`` header, else its body's ``id`` when that is a valid
    one (docs/oip.md), else None (the server makes one).  A header that is not a valid id gives None: such a
    request is refused, and its reply names no id of the client's."""
    if header_id is not None:
        return header_id if REQ_ID_RE.fullmatch(header_id) else None
    return body_id if body_id is not None and REQ_ID_RE.fullmatch(body_id) else None


def check_version(model_id: str, asked: str | None, served: str) -> None:
    """404 when a version named in the path is not the one the model serves."""
    if asked is not None and asked != served:
        raise ApiError(st.NOT_FOUND, f"model {model_id} serves version {served!r}, not {asked[:80]!r}")


def check_named(request: InferRequest, model_id: str) -> None:
    """A body's ``model_name`` (KServe's client sends it) that is not the path's is a 400: run as it is, the reply
    would be another model's than the client thinks it asked.  Its ``model_version`` is ignored, as KServe's
    server ignores it: the version that counts is the path's (:func:`check_version`)."""
    if request.model_name is not None and request.model_name != model_id:
        raise CodecError(f"model_name {request.model_name[:80]!r} is not the model of the path, {model_id}")


def failed_item(results: list) -> ApiError | None:
    """The protocol's error for the first item that did not succeed (None when every item did)."""
    for i, item in enumerate(results):
        if item.get("status") != 0:
            status = STATUSES.get(item.get("status"), st.INTERNAL_ERROR)
            return ApiError(status, f"row {i} of {len(results)} failed ({status.text}): "
                                    f"{item.get('error') or status.meaning}; the request fails as a whole")
    return None


def _classification(shape: ModelShape, rows: list, out: RequestedOutput) -> Output:
    if out.classification:
        k = min([out.classification, *(len(d["scores"]) for d in rows)])
        text = [f"{s:f}:{c}:{label}" for d in rows
                for s, c, label in zip(d["scores"][:k], d["class_ids"][:k], d["categories"][:k])]
        return Output(out.name, "BYTES", [len(rows), k], text)
    data: list = []
    for d in rows:
        row = [0.0] * shape.classes
        for s, c in zip(d["scores"], d["class_ids"]):
            row[c] = s
        data.extend(row)
    return Output(out.name, "FP32", [len(rows), shape.classes], data)


def _detection(rows: list, name: str) -> Output:
    found = [(r, det) for r, dets in enumerate(rows) for det in dets]
    if name == "BOXES":
        return Output(name, "FP32", [len(found), 4], [x for _, det in found for x in det["bbox"]])
    if name == "SCORES":
        return Output(name, "FP32", [len(found)], [det["score"] for _, det in found])
    if name == "CLASSES":
        return Output(name, "INT32", [len(found)], [det["class_id"] for _, det in found])
    return Output(name, "INT32", [len(found)], [r for r, _ in found])


def _segmentation(rows: list, name: str) -> Output:
    found = [(r, mask) for r, masks in enumerate(rows) for mask in masks]
    if name == "MASKS":
        return Output(name, "BYTES", [len(found)], [json.dumps(m["segmentation"], separators=(",", ":"))
                                                    for _, m in found])
    return Output(name, "INT32", [len(found)], [r for r, _ in found])


def outputs(shape: ModelShape, rows: list, wanted: list[tuple[RequestedOutput, bool]]) -> list[tuple[Output, bool]]:
    """The OIP outputs of the ``data`` of every row (all succeeded), each with whether it is binary."""
    found = []
    for out, binary in wanted:
        if shape.kind == CLASSIFICATION:
            tensor = _classification(shape, rows, out)
        elif shape.kind == DETECTION:
            tensor = _detection(rows, out.name)
        elif shape.kind == SEGMENTATION:
            tensor = _segmentation(rows, out.name)
        elif shape.kind == GENERATION:
            tensor = Output(out.name, "BYTES", [len(rows)], [base64.b64decode(d["image"]) for d in rows])
        else:
            tensor = Output(out.name, "BYTES", [len(rows)], [json.dumps(d, separators=(",", ":")) for d in rows])
        found.append((tensor, binary))
    return found
