"""The document of one model-server process, served at ``GET /openapi.json``.

Built from the server's config and its plugin's factory when the model
server starts, and for the committed ``openapi/model-<ID>.json``.
"""

from __future__ import annotations

from typing import Any

from svc import __version__
from svc.config import ModelServerConfig
from svc.contract.protocol import HEALTH_PATH, METRICS_PATH, MODEL_SERVER_REALM, OPENAPI_PATH, READY_PATH
from svc.model.plugincheck import checked_config
from svc.openapi import oip
from svc.openapi.components import job_components, model_components, ref, status_components
from svc.openapi.operations import (
    ENVELOPE_HEADERS,
    REQUEST_ID_HEADER,
    add_listener_replies,
    infer_operation,
    job_paths,
    json_reply,
    listener_components,
    not_found_405,
    rate_limited,
    unauthorized,
)


def model_server_document(config: ModelServerConfig, factory: Any, table: dict | None = None) -> dict:
    """The contract of one model-server process (served at /openapi.json).

    ``table``: the completed [model] table (``svc.model.api.model_config``);
    computed from ``config``, with the plugin's declarations checked
    (``svc.model.plugincheck``, PluginError), when not given.
    """
    mid = config.id
    if table is None:
        table = checked_config(factory, config.model, config.path).config
    auth = (
        "Needs `Authorization: Bearer <SERVICE_AUTH_TOKEN>` when the process has a token "
        "(authentication comes before the per-client rate limit)."
    )
    simple: dict[str, Any] = {"security": [], "responses": {}}
    paths: dict[str, Any] = {
        HEALTH_PATH: {
            "get": {
                **simple,
                "operationId": "healthz",
                "summary": "Liveness: 200 while the process runs.",
                "responses": {"200": json_reply("Alive.", ref("Health"), ENVELOPE_HEADERS)},
            }
        },
        READY_PATH: {
            "get": {
                **simple,
                "operationId": "ready",
                "summary": "Readiness: 200 once the model is loaded and one warm-up batch at max_batch_size has run.",
                "responses": {
                    "200": json_reply("Ready (status 0).", ref("Health"), ENVELOPE_HEADERS),
                    "503": json_reply("Status 65: loading, warming up, or shutting down.", ref("Health"),
                                      ENVELOPE_HEADERS),
                },
            }
        },
        METRICS_PATH: {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (text exposition format). " + auth,
                "responses": {
                    "200": {
                        "description": "Metrics text.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                        "headers": {"X-Request-ID": REQUEST_ID_HEADER},
                    },
                    "401": unauthorized(MODEL_SERVER_REALM),
                    "429": rate_limited(),
                },
            }
        },
        OPENAPI_PATH: {
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
    # The protocol's inference and model configuration (svc.modelserver.oip_route).
    for path, item in oip.oip_paths(config, factory, MODEL_SERVER_REALM).items():
        if path.endswith(("/infer", "/config")):
            for op in item.values():
                op["responses"].pop("502")  # the gateway's: no upstream here
            paths[path] = item
    for path, item in paths.items():
        for op in item.values():
            op["responses"].update({k: v for k, v in not_found_405().items() if k not in op["responses"]})
            add_listener_replies(op["responses"], path)
    components = {**status_components(), **model_components(config, factory, table)}
    components.update({name: oip.components()[name] for name in ("OipError", "OipInferResponse", "OipModelConfig")})
    components[f"{mid}_OipRequest"] = oip.model_request(config, factory, factory.params_schema(table))
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
            "responses": listener_components(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
