"""The document of the gateway: every catalog model's routes under ``/v1/models/<id>``.

The operations are the model servers' own (``svc.openapi.operations``) with
the gateway's authentication and the replies it makes itself added, and the
Open Inference Protocol's ``/v2`` routes (``svc.openapi.oip``).  It is
committed as ``openapi/gateway.json`` and the gateway serves it at
``/openapi.json``, built from its own catalog when it starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from svc import __version__
from svc.config import ConfigError, ModelServerConfig
from svc.contract.protocol import (
    GATEWAY_METRICS_REALM,
    GATEWAY_PORT,
    GATEWAY_REALM,
    HEALTH_PATH,
    METRICS_PATH,
    MODEL_INFER,
    MODEL_PREFIX,
    OPENAPI_PATH,
    local_url,
)
from svc.model.api import PluginError, find_factory
from svc.model.plugincheck import checked_config
from svc.openapi import oip
from svc.openapi.components import job_components, model_components, ref, status_components
from svc.openapi.operations import (
    ENVELOPE_HEADERS,
    REQUEST_ID_HEADER,
    RETRY_AFTER_HEADER,
    add_listener_replies,
    header_doc,
    infer_operation,
    job_paths,
    json_reply,
    listener_components,
    rejection,
    unauthorized,
)

GATEWAY_AUTH = (
    "Needs `Authorization: Bearer <credential>`: an API key of the key file (any scope), the static token "
    "`SERVICE_GATEWAY_AUTH_TOKEN` or the management token `SERVICE_API_TOKEN`. Authentication comes first (401 on "
    "every path without it), then the key's token bucket and its requests in flight (429), then routing (404, 405)."
)
SERVICE_KEY_HEADER = header_doc(
    "Name of the credential that authenticated: the key's name in the key file, `static-token` "
    "(SERVICE_GATEWAY_AUTH_TOKEN), `management-token` (SERVICE_API_TOKEN), `metrics-token` (GET /metrics) or "
    "`cluster-token` (a job request forwarded by another host's gateway). On every reply to a request that "
    "authenticated; not on a 401, nor on the replies made before authentication (the listener's 400, 408, 413, 414, "
    "431 and 503)."
)
#: ``X-Service-Key`` on a reply: a reference to the one description (``components/headers``), which a reply of
#: nearly every operation repeats.
SERVICE_KEY_REF = {"$ref": "#/components/headers/ServiceKey"}


def gateway_responses() -> dict:
    """Replies the gateway itself makes on every authenticated route."""
    return {
        "401": unauthorized(GATEWAY_REALM, "Status 401 (made by the gateway): missing, wrong or disabled credential."),
        "404": rejection("Status 63: unknown catalog id or path (the same envelope for both), or the model's own "
                         "404 passed through (unknown job, async disabled); on a job route also `job not found` "
                         "made by the gateway for a job whose host is gone or not among its peers."),
        "405": rejection("Status 62: method not allowed.", {"Allow": header_doc("The methods the path accepts.")}),
        "429": rejection("Status 429: the key's `rate_limit_qps` is used up or it has `key_max_in_flight` requests in "
                         "flight (made by the gateway), or the model's own 429 (wait queue or async queue full) "
                         "passed through.", {"Retry-After": RETRY_AFTER_HEADER}),
        "502": rejection("Status 502 (made by the gateway): the connection to the model server was lost after it "
                         "was made (a model server that dies under a parked wait too), or the reply was malformed or "
                         "did not complete within `upstream_recv_timeout_ms`; or a job wait budget at or above it; or "
                         "the gateway of the host holding a job refused this host's cluster token, or took a "
                         "forwarded job request and did not answer within `peer_timeout_ms`; or a job submit whose "
                         "job id no replica makes so that this gateway would find it again (the model server's "
                         "SERVICE_JOB_SECRET, host id or replica differs; then with Retry-After)."),
        "503": rejection("Status 65: the model server is not running (connection refused; made by the gateway), or "
                         "the model's own 503 (loading, shutting down) passed through."),
    }


def _with_gateway_replies(operation: dict, operation_id: str) -> dict:
    """A model server's operation as the gateway serves it: its id, the gateway's auth note and replies.

    A status both make keeps the model's body and gets the gateway's description (which names the model's case)
    and headers too; the 401 is the gateway's alone: it authenticates before any model server is asked.
    """
    op = json.loads(json.dumps(operation))  # a deep copy: the model-server document shares the builders
    op["operationId"] = operation_id
    op["description"] = (op.get("description", "") + " " + GATEWAY_AUTH).strip()
    for code, reply in gateway_responses().items():
        own = op["responses"].get(code)
        if own is None or code == "401":
            op["responses"][code] = reply
            continue
        own["description"] = reply["description"]
        own["headers"] = {**own.get("headers", {})}
        for name, doc in reply["headers"].items():
            own["headers"].setdefault(name, doc)
    return op


def _authenticated(operation: dict) -> dict:
    """``operation`` with ``X-Service-Key`` on each of its own replies but the 401 (no credential authenticated);
    the listener's replies, made before authentication, come later (:func:`_finish`)."""
    for code, reply in operation["responses"].items():
        if code != "401":
            reply["headers"] = {**reply.get("headers", {}), "X-Service-Key": SERVICE_KEY_REF}
    return operation


def _finish(paths: dict) -> None:
    """What every operation shares: ``X-Service-Key`` where a credential authenticated (all but ``/healthz``),
    then the listener's replies (``/v2``: the protocol's error body)."""
    for path, item in paths.items():
        for op in item.values():
            if op.get("security") != []:
                _authenticated(op)
            add_listener_replies(op["responses"], path)


def gateway_document(configs: list[ModelServerConfig], found: dict[str, Any],
                     refused: Callable[[str, str], None] | None = None, port: int = GATEWAY_PORT) -> dict:
    """The contract of the gateway: every catalog model's routes under /v1/models/{id}; ``servers`` names
    ``port``, the gateway's own (it named 8080 whatever the gateway's ``[gateway] port``, where a model server's
    document names its port: a client generated from it went to 8080).

    A model whose plugin declares what cannot be used (:mod:`svc.model.plugincheck`), or whose
    ``[model]`` table its plugin refuses, raises its PluginError or ConfigError, or, given
    ``refused``, is left out, as a model without a plugin is, and ``refused(model_id, line)`` is
    called (for a model without a plugin too: two claim its id, or its module did not import):
    the gateway in front of every model starts without it (it stopped on one third-party
    plugin's mistake, and every model with it; a bad table dropped the whole document).
    """
    paths: dict[str, Any] = {
        HEALTH_PATH: {
            "get": {
                "security": [],
                "operationId": "healthz",
                "summary": "Liveness of the gateway; no credential.",
                "responses": {"200": json_reply("Alive (status 0, `model.name` gateway).", ref("Health"),
                                                ENVELOPE_HEADERS)},
            }
        },
        METRICS_PATH: {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics: only `Authorization: Bearer <SERVICE_METRICS_TOKEN>`; API keys, the "
                "static and the management token get 401.",
                "responses": {
                    "200": {"description": "Metrics text.", "content": {"text/plain": {"schema": {"type": "string"}}},
                            "headers": {"X-Request-ID": REQUEST_ID_HEADER, "X-Service-Key": SERVICE_KEY_REF}},
                    "401": unauthorized(GATEWAY_METRICS_REALM, "Status 401: not the metrics token."),
                    "405": rejection("Status 62: a method other than GET or HEAD, with any credential the gateway "
                                     "accepts (the metrics token, an API key, the static or the management token), "
                                     "as on every path: routing comes after authentication (without a credential, "
                                     "or with a wrong one, 401).", {"Allow": header_doc("The methods the path accepts."),
                                               "X-Service-Key": SERVICE_KEY_REF}),
                },
            }
        },
        OPENAPI_PATH: {
            "get": {
                "operationId": "openapi",
                "summary": "This document, for the gateway's catalog. " + GATEWAY_AUTH,
                "responses": {
                    "200": {"description": "OpenAPI 3.1 document.",
                            "content": {"application/json": {"schema": {"type": "object"}}}},
                    **{code: reply for code, reply in gateway_responses().items() if code in ("401", "405", "429")},
                },
            }
        },
        **oip.server_paths(),
    }
    components = {**status_components(), **oip.components()}
    any_async = False
    for config in configs:
        factory, mid = found.get(config.id), config.id
        if factory is None:  # no plugin serves it (two claim its id; its module did not import): said, as a refusal
            if refused is not None:
                try:
                    find_factory(mid)
                except PluginError as e:
                    refused(mid, str(e))
            continue
        # Without its weights: a file not copied yet, or a variant not pulled, is its model server's to report. The
        # gateway, in front of every model, failed to start on it (a traceback, then start_failed).
        try:
            checked = checked_config(factory, config.model, config.path, files=False)
        except (PluginError, ConfigError) as e:  # a [model] table its model server refuses too: the same
            if refused is None:
                raise
            refused(mid, str(e))
            continue
        table = checked.config
        components.update(model_components(config, factory, table))
        infer = infer_operation(config, factory, summary=f"Synchronous inference with {mid}.", auth_note="")
        paths[MODEL_INFER.format(model_id=mid)] = {"post": _with_gateway_replies(infer, f"infer_{mid}")}
        paths[config.server_uri] = {"post": _with_gateway_replies(
            {**infer, "summary": f"Legacy path of {mid} (exact match; synchronous inference only)."},
            f"legacy_infer_{mid}")}
        paths.update(oip.oip_paths(config, factory, GATEWAY_REALM))
        components[f"{mid}_OipRequest"] = oip.model_request(config, factory, checked.params)
        if config.async_enabled:
            any_async = True
            for path, item in job_paths(config, factory, prefix=MODEL_PREFIX.format(model_id=mid)).items():
                paths[path] = {method: _with_gateway_replies(op, op["operationId"]) for method, op in item.items()}
    if any_async:
        components.update(job_components())
    _finish(paths)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Gateway",
            "version": __version__,
            "description": "The public entry point: authenticates, rate-limits per key and forwards to the loopback "
            "model servers. The model's status, body and the headers `Content-Type`, `X-Request-ID`, "
            "`Cache-Control`, `Retry-After`, `Allow`, `X-Service-Weights` and `Accept-Encoding` (a 415 for a compressed "
            "body) pass through unchanged; `Location`, `poll_url` and "
            "`result_url` are rewritten onto `/v1/models/<id>/jobs/...`. Replies made by the gateway itself carry "
            "`model.name` `gateway`. A bare `/jobs` is not a route. CORS: the configured origins (default the "
            "supervisor UI) are reflected with `Vary: Origin`, and a preflight `OPTIONS` needs no credential. "
            "Models with async disabled answer 404 on their job routes (passed through). On a host of several "
            "behind a load balancer, a poll, wait or result of another host's job is answered by that host's "
            "gateway. The Open Inference Protocol v2 (KServe v2 REST) is served under `/v2` with the same "
            "credentials, rate limits, CORS and request ids; its errors are `{\"error\": \"...\"}` with the same "
            "HTTP statuses. " + GATEWAY_AUTH,
        },
        "servers": [{"url": local_url(port)}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": listener_components(),
            "headers": {"ServiceKey": SERVICE_KEY_HEADER},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
