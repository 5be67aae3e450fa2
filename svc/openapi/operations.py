"""Operations (``paths``) that both documents describe: inference, the job routes, their replies.

The model-server document uses them as they are; the gateway document
serves the same operations under ``/v1/models/<id>`` and adds the replies
the gateway makes itself.  Wait bounds come from ``svc.contract.query``, paths from
``svc.contract.protocol``.
"""

from __future__ import annotations

from typing import Any

from svc.config import ModelServerConfig
from svc.contract.oip import is_oip_path
from svc.contract.protocol import (
    JOB,
    JOB_RESULT,
    JOB_WAIT,
    JOBS,
    MODEL_SERVER_REALM,
    WEIGHTS_HEADER,
    bearer_challenge,
)
from svc.contract.query import MAX_DIGITS, WAIT_DEFAULT_MS, WAIT_MAX_MS
from svc.openapi.components import REQ_ID_PATTERN, ref
from svc.web.limits import LimitedChannel

#: The largest query number svc.contract.query accepts (MAX_DIGITS nines).
MAX_QUERY_NUMBER = 10**MAX_DIGITS - 1


OUTCOME_RULES = (
    "Outcome of an admitted request: every item succeeded: 200 status 0. Some item timed out (deadline "
    "`run_timeout_ms`): 200 status 68 with `partial: true` when another item finished, else 504 status 4. "
    "No timeout and at least one success: 200 status 0 and the failed items carry their own status "
    "(3 empty image, 5 undecodable image, 1 engine error, 6 contract failure). Every item failed without a "
    "timeout: 500 with status 1 or 6 when the server failed, else 400 with the status of the first item."
)


def json_reply(description: str, schema: dict, headers: dict | None = None) -> dict:
    """A reply with a JSON body (every reply but /metrics is JSON)."""
    reply: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        reply["headers"] = headers
    return reply


def header_doc(description: str, schema: dict | None = None) -> dict:
    """A reply header (a string unless ``schema`` says otherwise)."""
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
WEIGHTS_HEADER_DOC = header_doc(
    "What the model's weights are: `demo` (random init, for trying the service: outputs are noise), `pretrained` "
    "(a pretrained variant from the weights cache) or `file` (a local weights file of the model config).",
    {"type": "string", "enum": ["demo", "pretrained", "file"]})
#: ``X-Service-Weights`` of a status that is an envelope of results or a rejection (which does not carry it).
RESULTS_WEIGHTS_HEADER_DOC = {**WEIGHTS_HEADER_DOC, "description": "With an envelope of results only (not with a "
                              "rejection, status 50 or 500). " + WEIGHTS_HEADER_DOC["description"]}
NO_STORE_HEADER = header_doc("Always `no-store`.", {"type": "string", "const": "no-store"})
RETRY_AFTER_HEADER = header_doc("Seconds to wait before retrying.", {"type": "integer", "minimum": 1, "maximum": 60})
CONNECTION_CLOSE_HEADER = header_doc("Always `close`: the connection is closed after this reply.",
                                     {"type": "string", "const": "close"})
#: The headers of every envelope reply (svc.web.replies.envelope_headers), errors included.
ENVELOPE_HEADERS = {"X-Request-ID": REQUEST_ID_HEADER, "Cache-Control": NO_STORE_HEADER}


def challenge_header(realm: str) -> dict:
    """The ``WWW-Authenticate`` of a 401 from ``realm``: the value is fixed, so the document states it."""
    return header_doc("The bearer challenge.", {"type": "string", "const": bearer_challenge(realm)})


def rejection(description: str, extra_headers: dict | None = None, schema: dict | None = None) -> dict:
    """A process-level error reply: the ``Rejection`` envelope (or ``schema``) with ``X-Request-ID`` and
    ``Cache-Control``, as every error of the envelope's processes has them (svc.web.routes.envelope_reply)."""
    return json_reply(description, schema or ref("Rejection"), {**ENVELOPE_HEADERS, **(extra_headers or {})})


def unauthorized(realm: str, description: str = "Status 401: missing or wrong bearer token.") -> dict:
    """The 401 of ``realm``: the envelope with its challenge (and never a credential's name: none authenticated)."""
    return rejection(description, {"WWW-Authenticate": challenge_header(realm)})


def rate_limited(description: str = "Status 429: the per-client rate limit (rate_limit_qps) is used up.") -> dict:
    """A 429 with ``Retry-After``."""
    return rejection(description, {"Retry-After": RETRY_AFTER_HEADER})


def infer_operation(config: ModelServerConfig, factory: Any, *, summary: str, auth_note: str) -> dict:
    """The POST of synchronous inference for one model."""
    mid = config.id
    raw_schema = {"type": "string", "format": "binary"}
    ok_headers = {
        "X-Request-ID": REQUEST_ID_HEADER,
        "Cache-Control": NO_STORE_HEADER,
        WEIGHTS_HEADER: WEIGHTS_HEADER_DOC,
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
                "description": "Request id used as `task_id` when the body has no `req_id`; with a JSON body "
                               "that has one, it is not read (nor judged by this pattern).",
                "schema": {"type": "string", "pattern": REQ_ID_PATTERN},
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
                "headers": {"X-Request-ID": REQUEST_ID_HEADER, "Cache-Control": NO_STORE_HEADER,
                            WEIGHTS_HEADER: RESULTS_WEIGHTS_HEADER_DOC},
            },
            "401": unauthorized(MODEL_SERVER_REALM),
            "413": rejection("Status 61: body over the size limit; status 67: more images than max_request_items."),
            "415": rejection("Status 60: unsupported content type."),
            "422": rejection("Status 66: the request breaks the contract; `errors[]` has one `{pointer, message}` per problem, the first 50 of them."),
            "429": rejection(
                "Status 429: per-client rate limit, or the wait queue (max_queue_depth image items) is full.",
                {"Retry-After": RETRY_AFTER_HEADER},
            ),
            "500": {
                "description": "Every item failed on the server side (status 1 engine error or 6 contract failure), "
                "or status 500 for an unexpected server error.",
                "content": {"application/json": {"schema": {"anyOf": [ref("Rejection"), ref(f"{mid}_Envelope")]}}},
                "headers": {"X-Request-ID": REQUEST_ID_HEADER, "Cache-Control": NO_STORE_HEADER,
                            WEIGHTS_HEADER: RESULTS_WEIGHTS_HEADER_DOC},
            },
            "503": rejection("Status 65: the model is loading or the server is shutting down."),
            "504": json_reply("Status 4: no item finished before the deadline.", ref(f"{mid}_Envelope"), ok_headers),
        },
    }


def job_paths(config: ModelServerConfig, factory: Any, prefix: str = "") -> dict:
    """The four job routes (``prefix`` is '' on a model server, /v1/models/<id> on the gateway)."""
    mid = config.id
    job_param = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    about_job = {**ENVELOPE_HEADERS, WEIGHTS_HEADER: WEIGHTS_HEADER_DOC}  # JobRoutes.reply and job_error
    not_found = rejection("Status 63: `error` contains `job not found` (unknown, expired or evicted job, or "
                          "one from before a restart).", schema=ref("JobRejection"))
    admission = {"401": unauthorized(MODEL_SERVER_REALM), "429": rate_limited()}  # the server's authenticate
    timeout_s = f"{config.async_timeout} ms" if config.async_timeout else "no limit"
    infer = infer_operation(config, factory, summary="", auth_note="")
    return {
        prefix + JOBS: {
            "post": {
                "operationId": f"submit_job_{mid}",
                "summary": f"Submit an asynchronous {mid} job (same body as synchronous inference).",
                "description": "Validated like the synchronous route first: an invalid body is rejected at once with "
                "422 or 400 and no job. A valid body is admitted while pending + running jobs are below "
                f"async_max_queue ({config.async_max_queue}); the reply goes out before any inference starts. "
                f"Budget (async_timeout): {timeout_s}, waiting for a worker included. Finished jobs stay readable "
                f"{config.async_job_ttl} ms (async_job_ttl), at most {config.async_max_completed} of them "
                "(async_max_completed, least recently read first out).",
                "requestBody": infer["requestBody"],
                "parameters": infer["parameters"],
                "responses": {
                    "202": json_reply("Admitted (state pending).", ref("JobAccepted"), {
                        "Location": header_doc("The job's status path."), **about_job}),
                    "400": rejection("Status 50: body is not JSON or not an object."),
                    "401": admission["401"],
                    "413": rejection("Status 61 (body size) or 67 (too many images)."),
                    "415": rejection("Status 60: unsupported content type."),
                    "422": rejection("Status 66: the request breaks the contract (`errors[]`)."),
                    "429": json_reply("Status 429: `error` contains `async queue full`. Retry-After: the mean job "
                                      "duration over the workers, 1 to 60 s. Or the per-client rate limit "
                                      "(rate_limit_qps).", ref("JobRejection"),
                                      {**about_job, "Retry-After": RETRY_AFTER_HEADER}),
                    "503": rejection("Status 65: loading or shutting down."),
                },
            }
        },
        prefix + JOB: {
            "get": {
                "operationId": f"job_status_{mid}",
                "summary": "Poll a job.",
                "parameters": [job_param],
                "responses": {"200": json_reply("The job's state.", ref("JobStatus"), about_job), **admission,
                              "404": not_found},
            }
        },
        prefix + JOB_WAIT: {
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
                        "description": f"Budget in milliseconds, 1 to {MAX_DIGITS} ASCII digits, default "
                        f"{WAIT_DEFAULT_MS}. Above {WAIT_MAX_MS} it is clamped to {WAIT_MAX_MS}; 0 answers at once; anything else (a sign, a fraction, spaces, other "
                        "scripts' digits, a longer number) is 422 (pointer `/timeout`). Of repeated keys the first "
                        "counts. An unknown job is 404 whatever the value.",
                        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_QUERY_NUMBER},
                    },
                ],
                "responses": {
                    "200": json_reply("The job's state.", ref("JobStatus"), about_job),
                    **admission,
                    "404": not_found,
                    "422": rejection("Status 66: timeout is not a non-negative integer.", schema=ref("JobRejection")),
                },
            }
        },
        prefix + JOB_RESULT: {
            "get": {
                "operationId": f"job_result_{mid}",
                "summary": "The result of a done job (repeatable within retention).",
                "parameters": [job_param],
                "responses": {
                    "200": json_reply("The unified envelope of the finished job (status 0; items may carry their own "
                                      "failure status).", ref(f"{mid}_Envelope"), about_job),
                    **admission,
                    "404": not_found,
                    "409": json_reply("Status 409: the job is pending, running, failed or timeout; `error` states "
                                      "which. The reason of a failure is in the poll/wait body. failed and timeout "
                                      "are legal outcomes, not API errors.", ref("JobRejection"), about_job),
                },
            }
        },
    }


def not_found_405() -> dict:
    """The 404 and 405 every path can answer (added where an operation has no reply of its own)."""
    return {
        "404": rejection("Status 63: not found."),
        "405": rejection("Status 62: method not allowed.", {"Allow": header_doc("The methods the path accepts.")}),
    }


#: The names of the listener's replies under ``components/responses`` (the ``/v2`` ones: ``Oip`` before them).
LISTENER_REPLIES = {"400": "MalformedHttp", "408": "RequestTimeout", "413": "BodyTooLarge",
                    "414": "RequestLineTooLong", "431": "HeadTooLarge", "503": "TooManyConnections"}


def listener_replies(oip: bool) -> dict:
    """The replies a process's listener makes before any route sees the request, whatever its path and method
    (svc.web.limits, svc.web.bodylimits): every operation of every document can get them.

    ``oip``: for a path under ``/v2``, whose errors are the protocol's ``{"error"}`` rather than the
    envelope; but the 400 of a request line that could not be read, and the 503 of a connection refused
    before any request, are the envelope whatever the path: no path was read to choose the shape by.
    """
    closed = {**ENVELOPE_HEADERS, "Connection": CONNECTION_CLOSE_HEADER}
    error_schema = ref("OipError") if oip else ref("Rejection")
    unread = {"anyOf": [error_schema, ref("Rejection")]} if oip else error_schema
    shape = " (the envelope when not even the path could be read)" if oip else ""
    channel = LimitedChannel
    return {
        "400": json_reply("Status 50 (the listener's): the request is not valid HTTP/1.1 (its request line, a "
                          "header, its Content-Length or chunked framing; an HTTP/1.1 request without Host, any with "
                          f"two); the connection is then closed{shape}.", unread, closed),
        "408": json_reply("Status 408 (the listener's): the request body did not arrive within body_timeout_ms of "
                          "its head; the connection is then closed. A head not complete within header_timeout_ms "
                          "gets a bare 408 instead: no body, and of these headers only `Connection: close` and, "
                          "once its line was read, the client's `X-Request-ID` when it is valid.",
                          error_schema, closed),
        "413": json_reply("Status 61 (the listener's): a body over max_body_bytes, whatever the method, answered from "
                          "its Content-Length (or as a chunked body grows past it) before it is read; the connection "
                          "is then closed.", error_schema, closed),
        "414": json_reply(f"Status 61 (the listener's): the request line (its path) is over {channel.MAX_LENGTH} "
                          "bytes; the connection is then closed.", error_schema, closed),
        "431": json_reply(f"Status 61 (the listener's): the head (request line and headers) is over "
                          f"{channel.totalHeadersSize} bytes, or has more than {channel.maxHeaders} header lines; "
                          "the connection is then closed.", error_schema, closed),
        "503": json_reply(f"Status 65 (the listener's): a connection past max_connections, answered at once with "
                          f"`Retry-After: 1` and closed{shape}.", unread,
                          {**closed, "Retry-After": RETRY_AFTER_HEADER}),
    }


def listener_components() -> dict:
    """The listener's replies as ``components/responses``, which :func:`add_listener_replies` refers to."""
    return {("Oip" if oip else "") + LISTENER_REPLIES[code]: reply
            for oip in (False, True) for code, reply in listener_replies(oip).items()}


def _either(own: dict, other: dict) -> dict:
    """A schema that is ``own`` or ``other`` (``anyOf``, without repeating a member either has)."""
    members = list(own.get("anyOf", [own]))
    members += [m for m in other.get("anyOf", [other]) if m not in members]
    return members[0] if len(members) == 1 else {"anyOf": members}


def _noted(doc: dict, note: str) -> dict:
    """A header's ``doc`` with ``note`` before its description (a ``$ref`` is left as it is)."""
    return doc if "$ref" in doc else {**doc, "description": note + doc["description"]}


def add_listener_replies(responses: dict, path: str) -> None:
    """Give the operation of ``path`` the listener's replies (:func:`listener_replies`): a reference to the
    shared one, or, for a status the operation answers itself, its own reply with the listener's case added to
    its description, headers and JSON body."""
    oip = is_oip_path(path.encode())
    for code, reply in listener_replies(oip).items():
        own = responses.get(code)
        if own is None:
            responses[code] = {"$ref": "#/components/responses/" + ("Oip" if oip else "") + LISTENER_REPLIES[code]}
            continue
        own["description"] = f"{own['description']} Or {reply['description']}"
        # A copy (replies of one builder may share their headers); a header that one of the two replies lacks
        # says so, or "Always `close`" promised a Connection header that the operation's own reply never sends.
        # (A shared component, a $ref, says it in its own description.)
        theirs = reply["headers"]
        own["headers"] = {name: _noted(doc, "Not on the listener's reply. ") if name not in theirs else doc
                          for name, doc in own.get("headers", {}).items()}
        for name, doc in theirs.items():
            own["headers"].setdefault(name, _noted(doc, "On the listener's reply only. "))
        body = own.setdefault("content", {}).setdefault("application/json", {})
        wanted = reply["content"]["application/json"]["schema"]
        body["schema"] = _either(body["schema"], wanted) if "schema" in body else wanted
