"""The machine-readable contract, generated from the code's own schemas.

The status table (``svc.status``), the request rules, the option catalog and
each model plugin's params/data schemas are the single source; this module
only arranges them as OpenAPI 3.1.  A copy of every document is committed
under ``openapi/``; ``python -m svc.openapi --check`` (run by the tests)
fails when a committed copy differs from what the code generates, and
``python -m svc.openapi --write`` regenerates them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from svc import __version__
from svc import status as st
from svc.config import ModelServerConfig, model_server_configs
from svc.options import options_schema
from svc.query import MAX_DIGITS
from svc.request import REQ_ID_RULE

OPENAPI_DIR = "openapi"
REF = "#/components/schemas/"
#: The largest query number svc.query accepts (MAX_DIGITS nines).
MAX_QUERY_NUMBER = 10**MAX_DIGITS - 1


def ref(name: str) -> dict:
    return {"$ref": REF + name}


# -- shared components ----------------------------------------------------------------

#: ``results`` of a reply that admitted nothing.  ``items`` is there although the
#: array is always empty: client generators (openapi-python-client) drop a whole
#: model whose array has no ``items``, and with it every error reply.
EMPTY_RESULTS = {
    "type": "array",
    "maxItems": 0,
    "items": {"description": "Never present: a reply that admitted nothing has no results."},
    "description": "Always empty.",
}


def status_components() -> dict:
    """Schemas of the status table and the envelope."""
    table = [{"status": s.code, "status_str": s.text, "http": s.http, "meaning": s.meaning} for s in st.ALL]
    return {
        "Status": {
            "type": "integer",
            "enum": [s.code for s in st.ALL],
            # Names for the generated clients' enum members (Status.UNAUTHORIZED rather than Status.VALUE_401).
            "x-enum-varnames": [s.text for s in st.ALL],
            "description": "Top-level or per-item status. Clients read the HTTP status first, then `status`, "
            "then each `results[i].status`. Any other value is a server error (HTTP 500).",
            "x-status-table": table,
        },
        "StatusText": {"type": "string", "enum": [s.text for s in st.ALL], "description": "Text form of `status`."},
        "ItemStatus": {
            "type": "integer",
            "enum": [s.code for s in st.ITEM_STATUSES],
            "x-enum-varnames": [s.text for s in st.ITEM_STATUSES],
            "description": "Per-item status: " + "; ".join(f"{s.code} {s.text} ({s.meaning})" for s in st.ITEM_STATUSES),
        },
        "FieldError": {
            "type": "object",
            "required": ["pointer", "message"],
            "properties": {
                "pointer": {"type": "string", "description": "JSON pointer (RFC 6901) into the request."},
                "message": {"type": "string"},
            },
        },
        "ModelIdentity": {
            "type": "object",
            "required": ["name", "version"],
            "properties": {"name": {"type": "string"}, "version": {"type": "string"}},
        },
        "Rejection": {
            "type": "object",
            "description": "Process-level rejection: the unified envelope with empty `results`, an `error` text, "
            "and `errors[]` on a contract-validation rejection (422).",
            "required": ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial", "error"],
            "properties": {
                "status": ref("Status"),
                "status_str": ref("StatusText"),
                "task_id": {"type": "string"},
                "model": ref("ModelIdentity"),
                "results": EMPTY_RESULTS,
                "server_time_ms": {"type": "number"},
                "partial": {"type": "boolean", "const": False},
                "error": {"type": "string"},
                "errors": {"type": "array", "items": ref("FieldError")},
            },
        },
        "Health": {
            "type": "object",
            "description": "Health and readiness: the envelope with empty results (status 0, or 65 when not ready).",
            "required": ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial"],
            "properties": {
                "status": ref("Status"),
                "status_str": ref("StatusText"),
                "task_id": {"type": "string"},
                "model": ref("ModelIdentity"),
                "results": EMPTY_RESULTS,
                "server_time_ms": {"type": "number"},
                "partial": {"type": "boolean"},
                "error": {"type": "string"},
            },
        },
    }


def model_components(config: ModelServerConfig, factory: Any, table: dict) -> dict:
    """Request, item and envelope schemas of one model, named after its id.

    ``table`` is the [model] table completed by ``svc.modelapi.model_config``:
    params bounds that depend on the model come from it.
    """
    mid = config.id
    params = dict(factory.params_schema(table))
    options = options_schema(tuple(factory.options))
    image_rule = (
        "Base64 image (JPEG, PNG, WebP, BMP, GIF, TIFF), standard alphabet, padding optional; a "
        "`data:<type>;base64,` prefix is accepted. Any string is admitted: an empty one fails its own item "
        "(status 3), one that is not base64 or not a decodable image fails its own item (status 5)."
        if factory.needs_image
        else "Any valid base64 string (the empty string too): this model ignores the pixels. A string that is "
        "not base64 fails its own item (status 5)."
    )
    return {
        f"{mid}_Params": params,
        f"{mid}_Options": options,
        f"{mid}_Data": dict(factory.data_schema),
        f"{mid}_Request": {
            "type": "object",
            "additionalProperties": False,
            "description": "The inference request. Unknown root fields, params at the root, the removed `img_data` "
            "and the removed `{req_id, code, msg, data}` envelope are rejected with 422 status 66.",
            "required": ["images"],
            "properties": {
                "images": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": config.max_request_items,
                    "items": {"type": "string", "description": image_rule},
                    "description": f"One result per image, same order. At most {config.max_request_items} "
                    "(max_request_items); more is rejected with 413 status 67.",
                },
                "req_id": {
                    "type": "string",
                    "pattern": r"^[\x21-\x7e]{1,128}$",
                    "description": f"Client correlation id, echoed as `task_id` and `X-Request-ID`; {REQ_ID_RULE}.",
                },
                "params": ref(f"{mid}_Params"),
                "options": ref(f"{mid}_Options"),
            },
        },
        f"{mid}_Item": {
            "type": "object",
            "required": ["status", "data"],
            "properties": {
                "status": ref("ItemStatus"),
                "data": {"oneOf": [ref(f"{mid}_Data"), {"type": "null"}], "description": "null when the item failed."},
                "error": {"type": "string", "description": "Why the item failed (failed items only)."},
            },
        },
        f"{mid}_Envelope": {
            "type": "object",
            "description": "Unified response envelope of an admitted request.",
            "required": ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial"],
            "properties": {
                "status": ref("Status"),
                "status_str": ref("StatusText"),
                "task_id": {"type": "string"},
                "model": ref("ModelIdentity"),
                "results": {"type": "array", "items": ref(f"{mid}_Item")},
                "server_time_ms": {"type": "number"},
                "partial": {"type": "boolean"},
            },
        },
    }


OUTCOME_RULES = (
    "Outcome of an admitted request: every item succeeded: 200 status 0. Some item timed out (deadline "
    "`run_timeout_ms`): 200 status 68 with `partial: true` when another item finished, else 504 status 4. "
    "No timeout and at least one success: 200 status 0 and the failed items carry their own status "
    "(3 empty image, 5 undecodable image, 1 engine error, 6 contract failure). Every item failed without a "
    "timeout: 500 with status 1 or 6 when the server failed, else 400 with the status of the first item."
)


def json_reply(description: str, schema: dict, headers: dict | None = None) -> dict:
    reply: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        reply["headers"] = headers
    return reply


def header_doc(description: str, schema: dict | None = None) -> dict:
    return {"description": description, "schema": schema or {"type": "string"}}


def json_header(name: str, field: str, schema: dict) -> dict:
    """A request header whose value is a JSON object (``X-Service-Params``, ``X-Service-Options``).

    Declared with ``content`` rather than ``schema: {type: string}``: the server
    parses the value as JSON and validates it like the body's ``field``, so an
    arbitrary string (the empty one included) is not a valid value, and a
    string schema would promise acceptance of requests that get 422.
    """
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": f"Raw-body requests only (ignored with a JSON body): `{field}` as a JSON object. A value that "
        f"is not a JSON object (an empty value included) or breaks the schema is 422, pointer `/{field}`.",
        "content": {"application/json": {"schema": schema}},
    }


REQUEST_ID_HEADER = header_doc("Echo of the request id (`task_id`).")
RETRY_AFTER_HEADER = header_doc("Seconds to wait before retrying.", {"type": "integer", "minimum": 1, "maximum": 60})


def rejection(description: str, extra_headers: dict | None = None) -> dict:
    headers = {"X-Request-ID": REQUEST_ID_HEADER, **(extra_headers or {})}
    return json_reply(description, ref("Rejection"), headers)


def infer_operation(config: ModelServerConfig, factory: Any, *, summary: str, auth_note: str) -> dict:
    """The POST of synchronous inference for one model."""
    mid = config.id
    raw_schema = {"type": "string", "format": "binary"}
    ok_headers = {
        "X-Request-ID": REQUEST_ID_HEADER,
        "Cache-Control": header_doc("Always `no-store`.", {"type": "string", "const": "no-store"}),
    }
    return {
        "operationId": f"infer_{mid}",
        "summary": summary,
        "description": f"{factory.task} with {mid}. {OUTCOME_RULES} {auth_note}",
        "parameters": [
            json_header("X-Service-Params", "params", ref(f"{mid}_Params")),
            json_header("X-Service-Options", "options", ref(f"{mid}_Options")),
            {
                "name": "X-Request-ID",
                "in": "header",
                "required": False,
                "description": "Request id used as `task_id` when the body has no `req_id`.",
                "schema": {"type": "string", "pattern": r"^[\x21-\x7e]{1,128}$"},
            },
        ],
        "requestBody": {
            "required": True,
            "description": f"The JSON envelope, or one image's bytes (raw body: one item). Bodies over "
            f"{config.max_body_bytes} bytes (max_body_bytes) get 413 status 61 before they are read. Other "
            "content types get 415 status 60.",
            "content": {
                "application/json": {"schema": ref(f"{mid}_Request")},
                "image/*": {"schema": raw_schema},
                "application/octet-stream": {"schema": raw_schema},
            },
        },
        "responses": {
            "200": json_reply("Status 0 (success) or 68 (partial results at the deadline).", ref(f"{mid}_Envelope"), ok_headers),
            "400": {
                "description": "Status 50: body is not JSON or not an object (a rejection). Or every item failed on "
                "its input (status 3 or 5, an envelope with results).",
                "content": {"application/json": {"schema": {"anyOf": [ref("Rejection"), ref(f"{mid}_Envelope")]}}},
                "headers": {"X-Request-ID": REQUEST_ID_HEADER},
            },
            "401": rejection("Status 401: missing or wrong bearer token.", {"WWW-Authenticate": header_doc("Bearer challenge.")}),
            "413": rejection("Status 61: body over the size limit; status 67: more images than max_request_items."),
            "415": rejection("Status 60: unsupported content type."),
            "422": rejection("Status 66: the request breaks the contract; `errors[]` has one `{pointer, message}` per problem."),
            "429": rejection(
                "Status 429: per-client rate limit, or the wait queue (max_queue_depth image items) is full.",
                {"Retry-After": RETRY_AFTER_HEADER},
            ),
            "500": {
                "description": "Every item failed on the server side (status 1 engine error or 6 contract failure), "
                "or status 500 for an unexpected server error.",
                "content": {"application/json": {"schema": {"anyOf": [ref("Rejection"), ref(f"{mid}_Envelope")]}}},
                "headers": {"X-Request-ID": REQUEST_ID_HEADER},
            },
            "503": rejection("Status 65: the model is loading or the server is shutting down."),
            "504": json_reply("Status 4: no item finished before the deadline.", ref(f"{mid}_Envelope"), ok_headers),
        },
    }


def job_components() -> dict:
    """Bodies of the job routes."""
    states = ["pending", "running", "done", "failed", "timeout"]
    common = {
        "job_id": {"type": "string", "pattern": "^job_[0-9a-f]+$"},
        "state": {"type": "string", "enum": states},
        "task_id": {"type": "string", "description": "The request's `req_id`, or the job id."},
        "model": ref("ModelIdentity"),
        "poll_url": {"type": "string", "description": "Status path of the job (the gateway rewrites it onto /v1/models/<id>/jobs/...)."},
        "result_url": {"type": "string", "description": "Result path of the job."},
    }
    return {
        "JobAccepted": {
            "type": "object",
            "description": "202 at admission: the job is pending; nothing has been computed yet.",
            "required": ["job_id", "state", "poll_url", "result_url"],
            "properties": {**common, "state": {"type": "string", "const": "pending"}},
        },
        "JobStatus": {
            "type": "object",
            "description": "Poll and wait body. `elapsed_ms` counts from submission and grows until the job is "
            "terminal; `error` is present for failed and timeout jobs; `progress` is always present (null until "
            "the model reports progress, and for models that report none).",
            "required": ["job_id", "state", "elapsed_ms", "poll_url", "result_url", "progress"],
            "properties": {**common, "elapsed_ms": {"type": "number", "minimum": 0}, "error": {"type": "string"},
                           # null or the object: anyOf, so that generated clients keep JobProgress a class
                           "progress": {"anyOf": [ref("JobProgress"), {"type": "null"}]}},
        },
        "JobProgress": {
            "type": "object",
            "description": "How far the forward pass running the job's items has got, in units that the model "
            "defines (sampler steps of a diffusion model, batches of point prompts of automatic mask generation): "
            "what it reported last, written at most every 100 ms (the last step always). A batch may hold items "
            "of several jobs, and each of them shows the batch's progress; a job whose items run in several "
            "batches shows each batch in turn. A done job keeps the last report, `step` = `steps`. The status "
            "body's `progress` is null while nothing was reported: a pending job, or a model that reports none.",
            "required": ["step", "steps"],
            "properties": {
                "step": {"type": "integer", "minimum": 0, "description": "Units done, 0 to `steps`."},
                "steps": {"type": "integer", "minimum": 1, "description": "Units of the whole batch."},
            },
            "additionalProperties": False,
        },
        "JobRejection": {
            "type": "object",
            "description": "Error of a job route: the process-level envelope with `error`, plus `job_id` and "
            "`state` when the job is known (409).",
            "required": ["status", "status_str", "error"],
            "properties": {
                "status": ref("Status"),
                "status_str": ref("StatusText"),
                "task_id": {"type": "string"},
                "model": ref("ModelIdentity"),
                "results": EMPTY_RESULTS,
                "server_time_ms": {"type": "number"},
                "partial": {"type": "boolean"},
                "error": {"type": "string"},
                "errors": {"type": "array", "items": ref("FieldError")},
                "job_id": {"type": "string"},
                "state": {"type": "string", "enum": states},
            },
        },
    }


def job_paths(config: ModelServerConfig, factory: Any, prefix: str = "") -> dict:
    """The four job routes (``prefix`` is '' on a model server, /v1/models/<id> on the gateway)."""
    mid = config.id
    job_param = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ids = {"X-Request-ID": REQUEST_ID_HEADER}
    not_found = json_reply("Status 63: `error` contains `job not found` (unknown, expired or evicted job, or "
                           "one from before a restart).", ref("JobRejection"), ids)
    unauthorized = json_reply("Status 401: missing or wrong bearer token.", ref("JobRejection"))
    timeout_s = f"{config.async_timeout} ms" if config.async_timeout else "no limit"
    return {
        f"{prefix}/jobs": {
            "post": {
                "operationId": f"submit_job_{mid}",
                "summary": f"Submit an asynchronous {mid} job (same body as synchronous inference).",
                "description": "Validated like the synchronous route first: an invalid body is rejected at once with "
                "422 or 400 and no job. A valid body is admitted while pending + running jobs are below "
                f"async_max_queue ({config.async_max_queue}); the reply goes out before any inference starts. "
                f"Budget (async_timeout): {timeout_s}, waiting for a worker included. Finished jobs stay readable "
                f"{config.async_job_ttl} ms (async_job_ttl), at most {config.async_max_completed} of them "
                "(async_max_completed, least recently read first out).",
                "requestBody": infer_operation(config, factory, summary="", auth_note="")["requestBody"],
                "parameters": infer_operation(config, factory, summary="", auth_note="")["parameters"],
                "responses": {
                    "202": json_reply("Admitted (state pending).", ref("JobAccepted"), {
                        "Location": header_doc("The job's status path."), **ids}),
                    "400": rejection("Status 50: body is not JSON or not an object."),
                    "401": unauthorized,
                    "413": rejection("Status 61 (body size) or 67 (too many images)."),
                    "415": rejection("Status 60: unsupported content type."),
                    "422": rejection("Status 66: the request breaks the contract (`errors[]`)."),
                    "429": json_reply("Status 429: `error` contains `async queue full`. Retry-After: the mean job "
                                      "duration over the workers, 1 to 60 s.", ref("JobRejection"),
                                      {"Retry-After": RETRY_AFTER_HEADER}),
                    "503": rejection("Status 65: loading or shutting down."),
                },
            }
        },
        f"{prefix}/jobs/{{job_id}}": {
            "get": {
                "operationId": f"job_status_{mid}",
                "summary": "Poll a job.",
                "parameters": [job_param],
                "responses": {"200": json_reply("The job's state.", ref("JobStatus"), ids), "401": unauthorized,
                              "404": not_found},
            }
        },
        f"{prefix}/jobs/{{job_id}}/wait": {
            "get": {
                "operationId": f"job_wait_{mid}",
                "summary": "Wait until the job is terminal or the budget is used up.",
                "description": "Answers 200 as soon as the job is terminal (at once if it already is) or when the "
                "budget is used up, then `state` may still be pending or running: not a failure. Every concurrent "
                "waiter gets the same terminal state. A client that disconnects leaves no waiter behind. The "
                "client's HTTP timeout must exceed the budget.",
                "parameters": [
                    job_param,
                    {
                        "name": "timeout",
                        "in": "query",
                        "required": False,
                        "description": "Budget in milliseconds, 1 to 18 ASCII digits, default 30000. Above 300000 "
                        "it is clamped to 300000; 0 answers at once; anything else (a sign, a fraction, spaces, other "
                        "scripts' digits, a longer number) is 422 (pointer `/timeout`). Of repeated keys the first "
                        "counts. An unknown job is 404 whatever the value.",
                        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_NUMBER},
                    },
                ],
                "responses": {
                    "200": json_reply("The job's state.", ref("JobStatus"), ids),
                    "401": unauthorized,
                    "404": not_found,
                    "422": json_reply("Status 66: timeout is not a non-negative integer.", ref("JobRejection")),
                },
            }
        },
        f"{prefix}/jobs/{{job_id}}/result": {
            "get": {
                "operationId": f"job_result_{mid}",
                "summary": "The result of a done job (repeatable within retention).",
                "parameters": [job_param],
                "responses": {
                    "200": json_reply("The unified envelope of the finished job (status 0; items may carry their own "
                                      "failure status).", ref(f"{mid}_Envelope"), ids),
                    "401": unauthorized,
                    "404": not_found,
                    "409": json_reply("Status 409: the job is pending, running, failed or timeout; `error` states "
                                      "which. The reason of a failure is in the poll/wait body. failed and timeout "
                                      "are legal outcomes, not API errors.", ref("JobRejection"), ids),
                },
            }
        },
    }


def not_found_405() -> dict:
    return {
        "404": rejection("Status 63: not found."),
        "405": rejection("Status 62: method not allowed.", {"Allow": header_doc("The methods the path accepts.")}),
    }


# -- the model-server document ---------------------------------------------------------


def model_server_document(config: ModelServerConfig, factory: Any, table: dict | None = None) -> dict:
    """The contract of one model-server process (served at /openapi.json).

    ``table``: the completed [model] table (``svc.modelapi.model_config``);
    computed from ``config`` when not given.
    """
    from svc.modelapi import model_config

    mid = config.id
    if table is None:
        table = model_config(factory, config.model, config.path)
    auth = (
        "Needs `Authorization: Bearer <SERVICE_AUTH_TOKEN>` when the process has a token "
        "(authentication comes before the per-client rate limit)."
    )
    simple = {"security": [], "responses": {}}
    paths: dict[str, Any] = {
        "/healthz": {
            "get": {
                **simple,
                "operationId": "healthz",
                "summary": "Liveness: 200 while the process runs.",
                "responses": {"200": json_reply("Alive.", ref("Health"))},
            }
        },
        "/ready": {
            "get": {
                **simple,
                "operationId": "ready",
                "summary": "Readiness: 200 once the model is loaded and one warm-up batch at max_batch_size has run.",
                "responses": {
                    "200": json_reply("Ready (status 0).", ref("Health")),
                    "503": json_reply("Status 65: loading, warming up, or shutting down.", ref("Health")),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (text exposition format). " + auth,
                "responses": {
                    "200": {
                        "description": "Metrics text.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    "401": rejection("Status 401: missing or wrong bearer token."),
                },
            }
        },
        "/openapi.json": {
            "get": {
                **simple,
                "operationId": "openapi",
                "summary": "This document.",
                "responses": {"200": {"description": "OpenAPI 3.1 document.", "content": {"application/json": {"schema": {"type": "object"}}}}},
            }
        },
        config.server_uri: {
            "post": infer_operation(config, factory, summary=f"Synchronous inference with {mid}.", auth_note=auth),
        },
    }
    if config.async_enabled:
        paths.update(job_paths(config, factory))
    for item in paths.values():
        for op in item.values():
            op["responses"].update({k: v for k, v in not_found_405().items() if k not in op["responses"]})
    components = {**status_components(), **model_components(config, factory, table)}
    if config.async_enabled:
        components.update(job_components())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"Model server {mid}",
            "version": __version__,
            "description": f"One loopback model server ({factory.category}: {factory.task}). Every JSON reply is "
            "`application/json; charset=utf-8`. Unknown paths (including the removed `/welcome` and `/hello_world`) "
            "answer 404 status 63; a wrong method answers 405 status 62 with `Allow`.",
        },
        "servers": [{"url": f"http://127.0.0.1:{config.port}"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


# -- the gateway document -------------------------------------------------------------


GATEWAY_AUTH = (
    "Needs `Authorization: Bearer <credential>`: an API key of the key file (any scope), the static token "
    "`SERVICE_GATEWAY_AUTH_TOKEN` or the management token `SERVICE_API_TOKEN`. Authentication comes first (401 on "
    "every path without it), then the key's token bucket (429), then routing (404, 405)."
)
SERVICE_KEY_HEADER = header_doc(
    "Name of the credential that authenticated: the key's name in the key file, `static-token` "
    "(SERVICE_GATEWAY_AUTH_TOKEN), `management-token` (SERVICE_API_TOKEN) or `metrics-token` (GET /metrics)."
)


def gateway_responses() -> dict:
    """Replies the gateway itself makes on every authenticated route."""
    return {
        "401": rejection("Status 401 (made by the gateway): missing, wrong or disabled credential.",
                         {"WWW-Authenticate": header_doc("Bearer challenge.")}),
        "404": rejection("Status 63: unknown catalog id or path (the same envelope for both), or the model's own "
                         "404 passed through (unknown job, async disabled)."),
        "405": rejection("Status 62: method not allowed.", {"Allow": header_doc("The methods the path accepts.")}),
        "429": rejection("Status 429: the key's `rate_limit_qps` is used up (made by the gateway), or the model's own "
                         "429 (wait queue or async queue full) passed through.", {"Retry-After": RETRY_AFTER_HEADER}),
        "502": rejection("Status 502 (made by the gateway): the connection to the model server was lost after it "
                         "was made (a model server that dies under a parked wait too), or the reply was malformed or "
                         "did not complete within `upstream_recv_timeout_ms`; or a job wait budget at or above it."),
        "503": rejection("Status 65: the model server is not running (connection refused; made by the gateway), or "
                         "the model's own 503 (loading, shutting down) passed through."),
    }


def _with_gateway_replies(operation: dict, operation_id: str) -> dict:
    op = json.loads(json.dumps(operation))  # a deep copy: the model-server document shares the builders
    op["operationId"] = operation_id
    op["description"] = (op.get("description", "") + " " + GATEWAY_AUTH).strip()
    for code, reply in gateway_responses().items():
        op["responses"].setdefault(code, reply)
    for reply in op["responses"].values():
        reply.setdefault("headers", {})["X-Service-Key"] = SERVICE_KEY_HEADER
    return op


def gateway_document(configs: list[ModelServerConfig], found: dict[str, Any]) -> dict:
    """The contract of the gateway: every catalog model's routes under /v1/models/{id}."""
    paths: dict[str, Any] = {
        "/healthz": {
            "get": {
                "security": [],
                "operationId": "healthz",
                "summary": "Liveness of the gateway; no credential.",
                "responses": {"200": json_reply("Alive (status 0, `model.name` gateway).", ref("Health"))},
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics: only `Authorization: Bearer <SERVICE_METRICS_TOKEN>`; API keys, the "
                "static and the management token get 401.",
                "responses": {
                    "200": {"description": "Metrics text.", "content": {"text/plain": {"schema": {"type": "string"}}}},
                    "401": rejection("Status 401: not the metrics token."),
                },
            }
        },
    }
    components = status_components()
    any_async = False
    for config in configs:
        factory = found.get(config.id)
        if factory is None:
            continue
        mid = config.id
        table = None
        from svc.modelapi import model_config

        table = model_config(factory, config.model, config.path)
        components.update(model_components(config, factory, table))
        infer = infer_operation(config, factory, summary=f"Synchronous inference with {mid}.", auth_note="")
        paths[f"/v1/models/{mid}/infer"] = {"post": _with_gateway_replies(infer, f"infer_{mid}")}
        paths[config.server_uri] = {"post": _with_gateway_replies(
            {**infer, "summary": f"Legacy path of {mid} (exact match; synchronous inference only)."},
            f"legacy_infer_{mid}")}
        if config.async_enabled:
            any_async = True
            for path, item in job_paths(config, factory, prefix=f"/v1/models/{mid}").items():
                paths[path] = {method: _with_gateway_replies(op, op["operationId"]) for method, op in item.items()}
    if any_async:
        components.update(job_components())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Gateway",
            "version": __version__,
            "description": "The public entry point: authenticates, rate-limits per key and forwards to the loopback "
            "model servers. The model's status, body and the headers `Content-Type`, `X-Request-ID`, "
            "`Cache-Control`, `Retry-After` and `Allow` pass through unchanged; `Location`, `poll_url` and "
            "`result_url` are rewritten onto `/v1/models/<id>/jobs/...`. Replies made by the gateway itself carry "
            "`model.name` `gateway`. A bare `/jobs` is not a route. CORS: the configured origins (default the "
            "supervisor UI) are reflected with `Vary: Origin`, and a preflight `OPTIONS` needs no credential. "
            "Models with async disabled answer 404 on their job routes (passed through). " + GATEWAY_AUTH,
        },
        "servers": [{"url": "http://127.0.0.1:8080"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


# -- committed copies ----------------------------------------------------------------------


def documents(conf_dir: str = "conf/server") -> dict[str, dict]:
    """Every committed document by file name, generated from code and shipped configs."""
    from svc.modelapi import factories

    found = factories()
    configs = model_server_configs(conf_dir)
    docs: dict[str, dict] = {"gateway.json": gateway_document(configs, found)}
    for config in configs:
        if config.id in found:
            docs[f"model-{config.id}.json"] = model_server_document(config, found[config.id])
    return docs


def serialise(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def check(directory: str = OPENAPI_DIR, conf_dir: str = "conf/server") -> list[str]:
    """Names of committed documents that are missing, stale or extra."""
    problems = []
    docs = documents(conf_dir)
    for name, doc in docs.items():
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                committed = f.read()
        except FileNotFoundError:
            problems.append(f"{path}: missing")
            continue
        if committed != serialise(doc):
            problems.append(f"{path}: differs from what the code generates")
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json") and name not in docs:
                problems.append(f"{os.path.join(directory, name)}: no longer generated")
    return problems


def write(directory: str = OPENAPI_DIR, conf_dir: str = "conf/server") -> list[str]:
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, doc in documents(conf_dir).items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(serialise(doc))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m svc.openapi", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="fail when a committed document is stale")
    group.add_argument("--write", action="store_true", help="regenerate the committed documents")
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            print(f"wrote {path}")
        return 0
    problems = check()
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print("run: python -m svc.openapi --write", file=sys.stderr)
        return 1
    print("openapi documents are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
