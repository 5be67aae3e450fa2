"""The ``/v2`` routes of the documents: the Open Inference Protocol (svc.gateway.oip, svc.modelserver.oip_route).

The gateway's document has every route below; a model server's has the
inference routes of its model (``svc.openapi.modelserver``).

Each catalog model's routes are listed under its id, as its ``/v1`` routes
are.  The inference request's schema is its JSON tensors; the binary
tensor data extension (``Inference-Header-Content-Length`` bytes of JSON,
then the tensors' bytes: what tritonclient sends by default) is a body
OpenAPI cannot shape, so it is listed as ``application/octet-stream`` of
bytes, and its media type's description states it.  A null ``id``,
``model_name``, ``model_version``, ``parameters`` or ``outputs``, or a null
``parameters`` of an input or output, is read as absent (svc.web.oip.codec)
and allowed.  The JSON request schema states exactly what the gateway accepts: one ``BYTES``
input whose ``shape`` is ``[k]`` (or ``[k, 1]``) with ``k`` strings of data (``k`` up to
``max_request_items``), the model's params and the protocol's own
parameters, and the model's outputs by name.
"""

from __future__ import annotations

from typing import Any

from svc import __version__
from svc.config import ModelServerConfig
from svc.contract.oip import (
    CLASSIFICATION,
    EXTENSIONS,
    INPUT,
    PLATFORM,
    PREFIX,
    RESERVED,
    RESERVED_PREFIX,
    SEGMENTATION,
    SERVER_NAME,
    TRITON_TYPES,
    shape_from_data_schema,
)
from svc.contract.protocol import GATEWAY_REALM, WEIGHTS_HEADER
from svc.openapi.components import ref
from svc.openapi.operations import (
    ENVELOPE_HEADERS,
    RETRY_AFTER_HEADER,
    WEIGHTS_HEADER_DOC,
    challenge_header,
    header_doc,
    json_reply,
)

STRING, BOOLEAN = {"type": "string"}, {"type": "boolean"}
SHAPE = {"type": "array", "items": {"type": "integer"}}
TENSOR_METADATA = {"type": "object", "required": ["name", "datatype", "shape"],
                   "properties": {"name": STRING, "datatype": STRING, "shape": SHAPE}}
FAILURES = (
    "The protocol fails a request as a whole: a request with a row that did not succeed is answered with the "
    "status of the first such row, `{\"error\": \"row i of n failed (STATUS): ...\"}`: 400 for an image that is "
    "empty or not an image, 500 for an engine or output failure, 504 for a row past the deadline "
    "(`run_timeout_ms`; a partial result is a 504 here)."
)
BINARY = (
    "Tensors come as JSON (a `BYTES` element is the base64 of the image file) or in the binary tensor data "
    "extension: `Inference-Header-Content-Length` bytes of this JSON, then each input's data as its "
    "`parameters.binary_data_size` says (a `BYTES` element: 4-byte little-endian length, then the file's bytes). "
    "An output is binary when it asks for `binary_data` (or the request's `binary_data_output` is true): the "
    "reply is then `application/octet-stream` with `Inference-Header-Content-Length`."
)


TRITON_TENSOR = {"type": "object", "required": ["name", "data_type", "dims"],
                 "properties": {"name": STRING, "data_type": {"enum": sorted(TRITON_TYPES.values())},
                                "dims": SHAPE, "format": {"const": "FORMAT_NONE"}}}
MODEL_CONFIG = {
    "type": "object",
    "required": ["name", "platform", "backend", "max_batch_size", "input", "output", "instance_group", "parameters"],
    "description": "The model's configuration in Triton's shape (what tritonclient's `get_model_config` and "
                   "perf_analyzer read): `max_batch_size` is the rows one request may carry (`max_request_items`), "
                   "each tensor's `dims` its metadata shape without the first dimension, `dynamic_batching` the "
                   "model server's own batching (present when its `max_batch_size` is above 1: its window, and its "
                   "batch size as `preferred_batch_size` where that is not above the rows of a request), "
                   "`instance_group` its workers, and `parameters` the weights' `version`, the execution mode in use "
                   "(`optimize`), the kind of weights (`weights`: demo, pretrained or file) and the server's batch "
                   "size (`batch_size`, its `max_batch_size`).",
    "properties": {
        "name": STRING, "platform": {"const": PLATFORM}, "backend": {"const": ""},
        "max_batch_size": {"type": "integer", "minimum": 1},
        "input": {"type": "array", "items": TRITON_TENSOR}, "output": {"type": "array", "items": TRITON_TENSOR},
        "dynamic_batching": {"type": "object", "required": ["max_queue_delay_microseconds"],
                             "properties": {"preferred_batch_size": {"type": "array",
                                                                     "items": {"type": "integer", "minimum": 2}},
                                            "max_queue_delay_microseconds": {"type": "integer", "minimum": 0}}},
        "instance_group": {"type": "array", "items": {
            "type": "object", "required": ["name", "kind", "count"],
            "properties": {"name": STRING, "kind": {"enum": ["KIND_CPU", "KIND_GPU"]},
                           "count": {"type": "integer", "minimum": 1}}}},
        "parameters": {"type": "object", "required": ["version", "optimize", "weights", "batch_size"],
                       "additionalProperties": {
            "type": "object", "required": ["string_value"], "properties": {"string_value": STRING}}},
    },
}


def components() -> dict:
    """The protocol's own bodies."""
    return {
        "OipError": {"type": "object", "required": ["error"], "properties": {"error": STRING},
                     "description": "Every error under /v2: the protocol's shape, with the contract's HTTP status."},
        "OipServerMetadata": {"type": "object", "required": ["name", "version", "extensions"],
                              "properties": {"name": {"const": SERVER_NAME}, "version": {"const": __version__},
                                             "extensions": {"type": "array", "items": {"enum": EXTENSIONS}}}},
        "OipLive": {"type": "object", "required": ["live"], "properties": {"live": BOOLEAN}},
        "OipReady": {"type": "object", "required": ["ready"], "properties": {"ready": BOOLEAN}},
        "OipModelReady": {"type": "object", "required": ["name", "ready"], "properties": {"name": STRING,
                                                                                         "ready": BOOLEAN}},
        "OipTensorMetadata": TENSOR_METADATA,
        "OipModelConfig": MODEL_CONFIG,
        "OipModelMetadata": {
            "type": "object", "required": ["name", "versions", "platform", "inputs", "outputs"],
            "properties": {"name": STRING, "versions": {"type": "array", "items": STRING},
                           "platform": {"const": PLATFORM},
                           "inputs": {"type": "array", "items": ref("OipTensorMetadata")},
                           "outputs": {"type": "array", "items": ref("OipTensorMetadata")}}},
        "OipInferResponse": {
            "type": "object", "required": ["model_name", "model_version", "outputs"],
            "properties": {
                "model_name": STRING, "model_version": STRING, "id": STRING,
                "outputs": {"type": "array", "items": {
                    "type": "object", "required": ["name", "datatype", "shape"],
                    "properties": {"name": STRING, "datatype": STRING, "shape": SHAPE, "data": {"type": "array", "items": {
                                       "description": "Row-major elements: numbers, or strings for BYTES (base64 "
                                       "for file contents)."}},
                                   "parameters": {"type": "object", "properties": {
                                       "binary_data_size": {"type": "integer", "minimum": 0}}}}}}}},
    }


def nullable(schema: dict) -> dict:
    """``schema`` or JSON's null, which the codec reads as absent."""
    return {"anyOf": [schema, {"type": "null"}]}


def model_request(config: ModelServerConfig, factory: Any, params: dict) -> dict:
    """The JSON inference request of one model (``params``: its params schema)."""
    shape = shape_from_data_schema(factory.data_schema, params)
    def image_input(shape: dict, data: dict) -> dict:
        return {"type": "object", "additionalProperties": False, "required": ["name", "datatype", "shape", "data"],
                "properties": {"name": {"const": INPUT, "description": "The model's one input (another name: 400)."},
                               "datatype": {"const": "BYTES"}, "shape": shape, "data": data,
                               "parameters": nullable({"type": "object", "additionalProperties": False, "properties": {
                                   "content_type": {"type": "string", "description": "KServe's and MLServer's hint; "
                                                    "ignored (the datatype says how to read the tensor)."}}})}}

    def rows(k: int, items: dict) -> dict:
        return {"type": "array", "items": items, "minItems": k, "maxItems": k}

    inputs = [variant for k in range(1, config.max_request_items + 1) for variant in (
        image_input(rows(1, {"const": k}), rows(k, STRING)),
        # [rows, 1], as Triton's batched BYTES inputs and MLServer's codecs shape them: data flat or nested so
        image_input({"type": "array", "prefixItems": [{"const": k}, {"const": 1}], "minItems": 2, "maxItems": 2},
                    {"anyOf": [rows(k, STRING), rows(k, rows(1, STRING))]}))]
    model_params = {k: v for k, v in (params.get("properties") or {}).items()
                    if not (shape.kind == CLASSIFICATION and k == "top_k")}
    reserved = {name: {"description": "A protocol parameter; ignored."} for name in sorted(RESERVED - {
        "binary_data_output", "options"})}
    output_params: dict[str, Any] = {"binary_data": BOOLEAN, "content_type": {
        "type": "string", "description": "MLServer's codecs' hint; ignored."}}
    if shape.kind == CLASSIFICATION:
        output_params["classification"] = {"type": "integer", "minimum": 0, "maximum": shape.classes,
                                           "description": "The k best classes as `score:index:label` (0: the plain "
                                           "tensor)."}
    options = ref(f"{config.id}_Options")
    if shape.kind == CLASSIFICATION:  # the outputs asked for set how many classes come back
        options = {"type": "object", "not": {"required": ["max_results"]}, "allOf": [options],
                   "description": "The model's options but `max_results` (400 here: the outputs asked for "
                   "set it)."}
    elif shape.kind == SEGMENTATION:
        options = {"type": "object", "properties": {"mask_format": {"const": "rle"}}, "allOf": [options]}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["inputs"],
        "properties": {
            "id": {"type": ["string", "null"], "description": "Echoed in the reply; also the request id when it is a "
                   "valid one and no X-Request-ID is sent."},
            "model_name": {"enum": [config.id, None], "description": "Not the protocol's, but what KServe's client "
                           "sends: the path's model (another: 400)."},
            "model_version": {"type": ["string", "null"], "description": "As KServe's client sends it; ignored (a "
                              "version in the path is the one checked)."},
            "parameters": {
                "type": ["object", "null"],
                "additionalProperties": False,
                "properties": {**model_params, "binary_data_output": BOOLEAN, "options": options, **reserved},
                "patternProperties": {f"^{RESERVED_PREFIX}": {}},
                "description": "The model's params"
                + (" (`top_k` comes from the outputs asked for)" if shape.kind == CLASSIFICATION else "")
                + ", `options`, and the protocol's own parameters.",
            },
            "inputs": {"type": "array", "minItems": 1, "maxItems": 1, "items": {"oneOf": inputs},
                       "description": f"One BYTES input of shape [rows] or [rows, 1]: one base64 image file per row, at most "
                       f"{config.max_request_items} (max_request_items; more: 413)."},
            "outputs": {"type": ["array", "null"], "description": "The outputs to answer with, each named once "
                        "(twice: 400); every output when absent or empty.",
                        "allOf": [{"contains": {"required": ["name"], "properties": {"name": {"const": o.name}}},
                                   "minContains": 0, "maxContains": 1} for o in shape.outputs], "items": {
                "type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {"name": {"enum": [o.name for o in shape.outputs]},
                               "parameters": nullable({"type": "object", "additionalProperties": False,
                                                       "properties": output_params})}}},
        },
    }


def error(description: str, headers: dict | None = None) -> dict:
    """An error under /v2: ``{"error"}`` with the headers of the envelope's errors (svc.web.oip.replies)."""
    return json_reply(description, ref("OipError"), {**ENVELOPE_HEADERS, **(headers or {})})


def errors(*codes: str, realm: str) -> dict:
    """The error replies of a route, from the gateway's and the model's conditions; ``realm``: its 401's."""
    table = {
        "400": error("A request the protocol or the model cannot take (a 422 of the model is a 400 here; an "
                     "`X-Request-ID` that breaks the request-id rule), or a row that failed on its input."),
        "401": error("Missing, wrong or disabled credential.", {"WWW-Authenticate": challenge_header(realm)}),
        "404": error("A model id not in the catalog, a version the model does not serve, or a path that is no route."),
        "405": error("Method not allowed.", {"Allow": header_doc("The methods the path accepts.")}),
        "413": error("More rows than `max_request_items`, or a body above the body limit."),
        "429": error("The key's `rate_limit_qps` is used up or it has `key_max_in_flight` requests in flight, or the "
                     "model's wait queue is full.",
                     {"Retry-After": RETRY_AFTER_HEADER}),
        "500": error("A row whose model run or output failed."),
        "502": error("The connection to the model server failed after it was made, or timed out."),
        "503": error("The model server is not running, loading or stopping."),
        "504": error("A row past the deadline."),
    }
    return {code: table[code] for code in codes}


#: The request id of a gateway's own /v2 reply (svc.gateway.oip.routes): the client's, when it sent one.
ECHOED_REQUEST_ID = {"X-Request-ID": header_doc("The request's `X-Request-ID`, when it sent one.")}


def _get(operation_id: str, summary: str, schema: str, *codes: str, parameters: list | None = None) -> dict:
    """A GET the gateway answers itself (its 401: the gateway's realm)."""
    op = {"operationId": operation_id, "summary": summary,
          "responses": {"200": json_reply("OK.", ref(schema), ECHOED_REQUEST_ID),
                        **errors("400", "401", "405", "429", *codes, realm=GATEWAY_REALM)}}
    if parameters:
        op["parameters"] = parameters
    return {"get": op}


#: The headers of an inference's 200 (svc.modelserver.oip_route; the gateway passes them back).
INFER_HEADERS = {
    **ENVELOPE_HEADERS,
    WEIGHTS_HEADER: WEIGHTS_HEADER_DOC,
    "Inference-Header-Content-Length": header_doc("The length of the reply's JSON part, when an output is binary.",
                                                  {"type": "integer", "minimum": 0}),
}


def oip_paths(config: ModelServerConfig, factory: Any, realm: str) -> dict:
    """The /v2 routes of one model; ``realm``: the 401's of its inference (the gateway's, or the model server's)."""
    mid = config.id
    base = f"{PREFIX}/models/{mid}"
    version = [{"name": "version", "in": "path", "required": True, "schema": STRING,
                "description": "The version the model serves (its metadata's `versions`); any other is 404."}]
    paths: dict[str, Any] = {}
    for path, suffix, params in ((base, "", None), (base + "/versions/{version}", "_version", version)):
        paths[path] = _get(f"oip_model_metadata_{mid}{suffix}", f"Model metadata of {mid}: inputs and outputs.",
                           "OipModelMetadata", "404", "502", "503", parameters=params)
        paths[path + "/ready"] = _get(f"oip_model_ready_{mid}{suffix}", f"200 when {mid} is ready, else 503.",
                                      "OipModelReady", "404", "502", "503", parameters=params)
        config_op = _get(f"oip_model_config_{mid}{suffix}", f"The configuration of {mid} in Triton's shape (its "
                         "model server's: the rows a request may carry, batching, workers, the mode in use).",
                         "OipModelConfig", "404", "502", "503", parameters=params)
        config_op["get"]["responses"]["401"] = errors("401", realm=realm)["401"]
        paths[path + "/config"] = config_op
        infer: dict[str, Any] = {
            "operationId": f"oip_infer_{mid}{suffix}",
            "summary": f"Inference with {mid} (Open Inference Protocol).",
            "description": BINARY + " " + FAILURES,
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": ref(f"{mid}_OipRequest")},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}, "description": (
                    "The binary tensor data extension (what tritonclient sends by default): the request's "
                    "`Inference-Header-Content-Length` header gives the length of a JSON part first, which is "
                    f"`{mid}_OipRequest` with each binary input's `data` left out and its "
                    "`parameters.binary_data_size` given instead (the bytes of that input, at most the rest of the "
                    "body); the inputs' bytes follow, in the order of the inputs (a `BYTES` element: 4-byte "
                    "little-endian length, then the file's bytes). Without the header, or with a length that is "
                    "not digits or not inside the body: 400.")}}},
            "responses": {
                "200": {"description": "The outputs asked for (every output when none is named).",
                        "headers": INFER_HEADERS,
                        "content": {"application/json": {"schema": ref("OipInferResponse")},
                                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                **errors("400", "401", "404", "405", "413", "429", "500", "502", "503", "504", realm=realm),
            },
        }
        if params:
            infer["parameters"] = params
        paths[path + "/infer"] = {"post": infer}
    return paths


def server_paths() -> dict:
    """The /v2 routes of the gateway itself."""
    return {
        PREFIX: _get("oip_server_metadata", "Server metadata: name, version, extensions.", "OipServerMetadata"),
        PREFIX + "/health/live": _get("oip_live", "Liveness of the gateway (with a credential; /healthz needs "
                                      "none).", "OipLive"),
        PREFIX + "/health/ready": _get("oip_ready", "Ready when every model of the catalog is ready (the "
                                       "protocol's server ready); else 503 naming the models that are not.",
                                       "OipReady", "503"),
    }
