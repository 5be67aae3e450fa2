"""Property-based conformance of a real gateway (in front of a real model server) to its OpenAPI document."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, settings

from svc.config import load_model_server_config
from svc.model.api import find_factory
from svc.openapi.gateway import gateway_document
from tests.support.conformance import call_and_validate, load
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.processes import REPO, SHIPPED_CONF, free_port, start_model_server, write_config

# The committed document, limited to the model this test runs (and the gateway's own routes).
SHIPPED = load(json.loads((REPO / "openapi" / "gateway.json").read_text())).include(
    path_regex=r"^(/healthz|/metrics|/openapi\.json|/v1/models/MOBILENETV2/infer|/mobilenetv2/predict"
               r"|/v2|/v2/health/(live|ready)|/v2/models/MOBILENETV2(/versions/\{version\})?(/ready|/infer)?)$")
# The document of a gateway whose catalog has MOBILENETV2 with jobs on: the job routes through the gateway.
ASYNC_CONFIG = load_model_server_config(str(SHIPPED_CONF / "MOBILENETV2.toml")).replace(async_enabled=True)
ASYNC = load(gateway_document([ASYNC_CONFIG], {"MOBILENETV2": find_factory("MOBILENETV2")})).include(path_regex=r"/jobs")

# Every check runs, "schema-valid request rejected" (positive_data_acceptance) included, on every route
# (tests/support/conformance.py).
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
AUTH = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("gws")
    servers = root / "server"
    servers.mkdir()
    port = free_port()
    config = write_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=port, async_enabled=True)
    model = start_model_server(config, token="upstream", port=port)
    # A receive timeout above the largest wait budget (300000 ms): no legal wait is the documented 502, so
    # every 5xx is a defect and the server-error check runs on every route.
    proc = start_gateway(root, servers, None, env={"SERVICE_UPSTREAM_TOKEN": "upstream"},
                         gateway_table="upstream_recv_timeout_ms = 310000\n")
    yield proc
    proc.stop()
    model.stop()


@SHIPPED.parametrize()
@SETTINGS
def test_gateway_conforms_to_its_openapi_document(case, gateway):
    call_and_validate(case, gateway.url, AUTH, timeout=30)


@ASYNC.parametrize()
@SETTINGS
def test_job_routes_through_the_gateway_conform(case, gateway):
    call_and_validate(case, gateway.url, AUTH, timeout=30)
