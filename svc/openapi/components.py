"""Schemas (``components/schemas``) shared by the model-server and gateway documents.

Each comes from its owner: statuses from ``svc.contract.status``, the request-id rule
from ``svc.contract.request``, options from ``svc.contract.options``, params and data from the
model plugin, job states from ``svc.modelserver.jobs``.  The envelope's
properties are written once (:func:`envelope_schema`); the rejection, health,
result and job-error bodies are that envelope with their own ``results``,
``partial`` and extra fields.
"""

from __future__ import annotations

from typing import Any

from svc.config import ModelServerConfig
from svc.contract import status as st
from svc.contract.jobs import PENDING, STATES
from svc.contract.options import options_schema
from svc.contract.request import MAX_FIELD_ERRORS, REQ_ID_RE, REQ_ID_RULE

REF = "#/components/schemas/"
#: The request-id rule as a JSON Schema pattern (``REQ_ID_RE`` must match the whole value).
REQ_ID_PATTERN = f"^{REQ_ID_RE.pattern}$"
#: Ids made by ``JobTable.submit``.
JOB_ID_PATTERN = "^job_[0-9a-f]+$"


def ref(name: str) -> dict:
    """A ``$ref`` to a schema of ``components/schemas``."""
    return {"$ref": REF + name}


#: ``results`` of a reply that admitted nothing.  ``items`` is there although the
#: array is always empty: client generators (openapi-python-client) drop a whole
#: model whose array has no ``items``, and with it every error reply.
EMPTY_RESULTS = {
    "type": "array",
    "maxItems": 0,
    "items": {"description": "Never present: a reply that admitted nothing has no results."},
    "description": "Always empty.",
}
#: The fields every envelope has (``svc.contract.envelope``).
ENVELOPE_FIELDS = ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial"]
BOOLEAN = {"type": "boolean"}
FIELD_ERRORS = {"type": "array", "items": ref("FieldError"), "maxItems": MAX_FIELD_ERRORS,
                "description": f"The first {MAX_FIELD_ERRORS} problems; `error` counts them all."}


def envelope_schema(description: str, required: list[str], *, results: dict = EMPTY_RESULTS,
                    partial: dict = BOOLEAN, **extra: dict) -> dict:
    """The unified envelope (``svc.contract.envelope``) with ``results``, ``partial`` and ``extra`` properties."""
    return {
        "type": "object",
        "description": description,
        "required": required,
        "properties": {
            "status": ref("Status"),
            "status_str": ref("StatusText"),
            "task_id": {"type": "string"},
            "model": ref("ModelIdentity"),
            "results": results,
            "server_time_ms": {"type": "number"},
            "partial": partial,
            **extra,
        },
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
        "Rejection": envelope_schema(
            "Process-level rejection: the unified envelope with empty `results`, an `error` text, "
            "and `errors[]` on a contract-validation rejection (422).",
            [*ENVELOPE_FIELDS, "error"],
            partial={"type": "boolean", "const": False},
            error={"type": "string"},
            errors=FIELD_ERRORS,
        ),
        "Health": envelope_schema(
            "Health and readiness: the envelope with empty results (status 0, or 65 when not ready).",
            ENVELOPE_FIELDS,
            error={"type": "string"},
        ),
    }


def model_components(config: ModelServerConfig, factory: Any, table: dict) -> dict:
    """Request, item and envelope schemas of one model, named after its id.

    ``table`` is the [model] table completed by ``svc.model.api.model_config``:
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
                    "pattern": REQ_ID_PATTERN,
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
        f"{mid}_Envelope": envelope_schema(
            "Unified response envelope of an admitted request.",
            ENVELOPE_FIELDS,
            results={"type": "array", "items": ref(f"{mid}_Item")},
        ),
    }


def job_components() -> dict:
    """Bodies of the job routes."""
    states = list(STATES)
    common = {
        "job_id": {"type": "string", "pattern": JOB_ID_PATTERN},
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
            "properties": {**common, "state": {"type": "string", "const": PENDING}},
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
        "JobRejection": envelope_schema(
            "Error of a job route: the process-level envelope with `error`, plus `job_id` and "
            "`state` when the job is known (409).",
            ["status", "status_str", "error"],
            error={"type": "string"},
            errors=FIELD_ERRORS,
            job_id={"type": "string"},
            state={"type": "string", "enum": states},
        ),
    }
