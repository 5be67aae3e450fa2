"""Property-based conformance of real model servers to their OpenAPI documents."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, settings

from svc.config import load_model_server_config
from svc.model.api import find_factory
from svc.openapi.modelserver import model_server_document
from tests.support.conformance import call_and_validate, load
from tests.support.processes import REPO, SHIPPED_CONF, start_model_server, write_config

SHIPPED = load(json.loads((REPO / "openapi" / "model-MOBILENETV2.json").read_text()))
# The same model with jobs enabled: the document the server itself generates and serves.
ASYNC_CONFIG = load_model_server_config(str(SHIPPED_CONF / "MOBILENETV2.toml")).replace(async_enabled=True)
ASYNC = load(model_server_document(ASYNC_CONFIG, find_factory("MOBILENETV2")))

# Every check runs, "schema-valid request rejected" (positive_data_acceptance) included, on every route
# (tests/support/conformance.py).
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def shipped_mobilenet(tmp_path_factory):
    server = start_model_server(write_config(tmp_path_factory.mktemp("st"), "MOBILENETV2"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def async_mobilenet(tmp_path_factory):
    server = start_model_server(write_config(tmp_path_factory.mktemp("sta"), "MOBILENETV2", async_enabled=True))
    yield server
    server.stop()


@SHIPPED.parametrize()
@SETTINGS
def test_model_server_conforms_to_its_openapi_document(case, shipped_mobilenet):
    call_and_validate(case, shipped_mobilenet.url, shipped_mobilenet.auth)


@ASYNC.parametrize()
@SETTINGS
def test_job_routes_conform_to_the_served_document(case, async_mobilenet):
    call_and_validate(case, async_mobilenet.url, async_mobilenet.auth, timeout=30)


def test_the_served_document_is_the_generated_one(async_mobilenet):
    from tests.support.http import get

    served = get(async_mobilenet.url + "/openapi.json").json
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/wait", "/jobs/{job_id}/result"} <= set(served["paths"])
    assert served["components"]["schemas"]["JobStatus"] == ASYNC.raw_schema["components"]["schemas"]["JobStatus"]
