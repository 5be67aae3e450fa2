"""The gateway's OpenAPI document: every catalog route, the gateway's own replies, unique operations."""

from __future__ import annotations

import collections

from svc.config import model_server_configs
from svc.model.api import factories
from svc.openapi.gateway import gateway_document
from svc.weightstore.cache import WEIGHTS_DIR_ENV
from tests.support.processes import REPO


def document() -> tuple[dict, list]:
    configs = model_server_configs(str(REPO / "conf" / "server"))
    return gateway_document(configs, factories()), configs


def test_every_catalog_model_has_its_routes():
    doc, configs = document()
    for config in configs:
        assert "post" in doc["paths"][f"/v1/models/{config.id}/infer"]
        assert doc["paths"][config.server_uri]["post"]["operationId"] == f"legacy_infer_{config.id}"
        jobs = f"/v1/models/{config.id}/jobs"
        assert (jobs in doc["paths"]) is config.async_enabled
        if config.async_enabled:
            for suffix in ("/{job_id}", "/{job_id}/wait", "/{job_id}/result"):
                assert "get" in doc["paths"][jobs + suffix]
    assert "/jobs" not in doc["paths"]
    assert doc["paths"]["/healthz"]["get"]["security"] == []


def test_operation_ids_are_unique_and_gateway_replies_documented():
    doc, _ = document()
    ops = [op for item in doc["paths"].values() for op in item.values()]
    counts = collections.Counter(op["operationId"] for op in ops)
    assert [k for k, v in counts.items() if v > 1] == []
    infer = doc["paths"]["/v1/models/MOBILENETV2/infer"]["post"]
    assert {"200", "401", "404", "405", "413", "415", "422", "429", "502", "503", "504"} <= set(infer["responses"])
    # A credential's name on every reply that can follow authentication; never on a 401, nor on the listener's
    # own replies, made before it (shared under components/responses).
    assert [code for code, reply in infer["responses"].items() if "X-Service-Key" in reply.get("headers", {})] == [
        code for code in infer["responses"] if code not in ("401", "408", "414", "431")]
    assert {code: reply["$ref"] for code, reply in infer["responses"].items() if "$ref" in reply} == {
        "408": "#/components/responses/RequestTimeout", "414": "#/components/responses/RequestLineTooLong",
        "431": "#/components/responses/HeadTooLarge"}
    assert list(infer["responses"]["401"]["headers"]) == ["X-Request-ID", "Cache-Control", "WWW-Authenticate"]
    assert "Retry-After" in infer["responses"]["429"]["headers"]


def test_every_operation_lists_the_listeners_replies():
    doc, _ = document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            assert {"400", "408", "413", "414", "431", "503"} <= set(op["responses"]), (method, path)
    oip = doc["paths"]["/v2/health/live"]["get"]["responses"]
    assert (oip["408"], oip["503"]) == ({"$ref": "#/components/responses/OipRequestTimeout"},
                                        {"$ref": "#/components/responses/OipTooManyConnections"})
    # The 503 past max_connections is the envelope whatever the path (no path was read).
    assert doc["components"]["responses"]["OipTooManyConnections"]["content"]["application/json"]["schema"] == {
        "anyOf": [{"$ref": "#/components/schemas/OipError"}, {"$ref": "#/components/schemas/Rejection"}]}


def test_the_document_states_what_the_server_enforces():
    doc, configs = document()
    mobilenet = next(c for c in configs if c.id == "MOBILENETV2")
    images = doc["components"]["schemas"]["MOBILENETV2_Request"]["properties"]["images"]
    # More images than max_request_items is a 413, so the schema must not allow them; an empty string is
    # admitted (its item fails with status 3), so the items carry no minLength.
    assert (images["minItems"], images["maxItems"]) == (1, mobilenet.max_request_items)
    assert images["items"]["type"] == "string" and "minLength" not in images["items"]
    headers = {p["name"]: p for p in doc["paths"]["/v1/models/MOBILENETV2/infer"]["post"]["parameters"]}
    # The headers carry JSON objects validated like the body's params/options: any string (even "") is not valid.
    assert headers["X-Service-Params"]["content"] == {
        "application/json": {"schema": {"$ref": "#/components/schemas/MOBILENETV2_Params"}}}
    assert headers["X-Service-Options"]["content"] == {
        "application/json": {"schema": {"$ref": "#/components/schemas/MOBILENETV2_Options"}}}


def test_every_array_has_items():
    # Client generators drop a whole model (Rejection, Health, JobRejection) over an array without items.
    doc, _ = document()
    arrays = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "array":
                arrays.append((where, "items" in node or "prefixItems" in node))
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    walk(doc, "")
    assert arrays and [where for where, ok in arrays if not ok] == []


def test_weights_not_there_yet_never_stop_the_gateways_document(tmp_path, monkeypatch):
    """A weights file not copied yet, or a variant not pulled, is its model server's to report at its start. The
    gateway's document needs each model's params only: it failed with a traceback (and the gateway with it)."""
    import shutil

    servers = tmp_path / "server"
    shutil.copytree(REPO / "conf" / "server", servers)
    for model, weights in (("YOLOV8", "/nonexistent/best.pt"), ("DDPM", "pretrained")):
        path = servers / f"{model}.toml"
        text = path.read_text()
        assert text.count('weights = "random"') == 1
        path.write_text(text.replace('weights = "random"', f'weights = "{weights}"'))
    monkeypatch.setenv(WEIGHTS_DIR_ENV, str(tmp_path / "empty-cache"))  # no weights cache at all
    doc = gateway_document(model_server_configs(str(servers)), factories())
    shipped, _ = document()
    for model in ("YOLOV8", "DDPM"):
        for suffix in ("Request", "OipRequest"):
            name = f"{model}_{suffix}"
            assert doc["components"]["schemas"][name] == shipped["components"]["schemas"][name], name
        assert "post" in doc["paths"][f"/v1/models/{model}/infer"]
