"""The headers of real refusals, from a real gateway and a real model server, against those their OpenAPI
documents list for the same operation and status.

A probe found the documents and the wire apart: every gateway 401 was documented with `X-Service-Key`,
which a 401 never carries, and without the `X-Request-ID`, `Cache-Control` and `WWW-Authenticate` it does
carry (`realm="gateway-metrics"` on `/metrics`); the job submit's 429 lacked `X-Request-ID` and
`Cache-Control`.  Here each sampled reply's headers must be exactly the documented ones (less those the
document gives for another case of the same status, named where it is checked), with every documented
constant value (`WWW-Authenticate`, `Cache-Control`) as sent.

The gateway's catalog is the shipped one (conf/server), so its document is the committed
openapi/gateway.json; no model server runs behind it: every reply sampled is the gateway's own.  The model
server is TESTFAULTS, checked against the document it serves.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.http import get, request
from tests.support.processes import REPO, SHIPPED_CONF, start_model_server, wait_until, write_config

SLOW_KEY = "slow-key"  # rate_limit_qps = 1: its second request within the second is 429
#: Headers no operation lists: the framing, and the gateway's CORS `Vary` (stated in the document's description).
UNLISTED = {"content-type", "content-length", "date", "server", "vary"}
GATEWAY_DOC = json.loads((REPO / "openapi" / "gateway.json").read_text())
STATIC = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("reply-headers")
    keys = f'[keys.slow]\nhash = "{hashlib.sha256(SLOW_KEY.encode()).hexdigest()}"\nrate_limit_qps = 1\n'
    proc = start_gateway(root, SHIPPED_CONF, keys)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("reply-headers-model")
    proc = start_model_server(write_config(root, "TESTFAULTS", name="TESTFAULTS.toml", async_enabled=True,
                                           rate_limit_qps=1))
    proc.extra["doc"] = get(proc.url + "/openapi.json").json
    yield proc
    proc.stop()


def resolve(doc: dict, node: dict) -> dict:
    """``node``, or what its ``$ref`` points to in ``doc``."""
    if "$ref" not in node:
        return node
    for part in node["$ref"].removeprefix("#/").split("/"):
        doc = doc[part]
    return doc


def documented(doc: dict, path: str, method: str, code: int) -> dict[str, dict]:
    """The headers ``doc`` lists for ``code`` of ``method path``, by lowercase name."""
    reply = resolve(doc, doc["paths"][path][method]["responses"][str(code)])
    return {name.lower(): resolve(doc, header) for name, header in reply.get("headers", {}).items()}


def check(doc: dict, path: str, method: str, code: int, reply: tuple[int, dict[str, str], bytes], *,
          unsent: tuple[str, ...] = ()) -> dict[str, str]:
    """The reply is ``code`` with exactly the documented headers but ``unsent``, their constants as documented."""
    status, headers, _ = reply
    assert status == code, reply
    listed = documented(doc, path, method, code)
    assert set(headers) - UNLISTED == set(listed) - {name.lower() for name in unsent}, (path, code, headers, listed)
    for name, header in listed.items():
        if name in headers and "const" in header["schema"]:
            assert headers[name] == header["schema"]["const"], (path, code, name, headers[name])
    return headers


def call(url: str, method: str, path: str, headers: dict[str, str] | None = None,
         body: Any = None) -> tuple[int, dict[str, str], bytes]:
    reply = request(method, url + path, body, headers=headers, timeout=30)
    return reply.status, {name.lower(): value for name, value in reply.headers.items()}, reply.body


GATEWAY_401 = [
    ("/v1/models/MOBILENETV2/infer", "post", "/v1/models/MOBILENETV2/infer"),
    ("/mobilenetv2/predict", "post", "/mobilenetv2/predict"),
    ("/v1/models/DDPM/jobs", "post", "/v1/models/DDPM/jobs"),
    ("/v1/models/DDPM/jobs/{job_id}", "get", "/v1/models/DDPM/jobs/job_00"),
    ("/v2/health/live", "get", "/v2/health/live"),
    ("/v2/models/MOBILENETV2/infer", "post", "/v2/models/MOBILENETV2/infer"),
]


@pytest.mark.parametrize(("path", "method", "target"), GATEWAY_401, ids=[f"{m} {p}" for p, m, _ in GATEWAY_401])
def test_a_gateway_401_carries_what_its_document_lists(gateway, path, method, target):
    headers = check(GATEWAY_DOC, path, method, 401, call(gateway.url, method.upper(), target,
                                                          {"X-Request-ID": "probe-401"}))
    assert headers["x-request-id"] == "probe-401"
    assert headers["www-authenticate"] == 'Bearer realm="gateway"'


def test_the_gateway_metrics_401_names_its_own_realm(gateway):
    headers = check(GATEWAY_DOC, "/metrics", "get", 401, call(gateway.url, "GET", "/metrics", STATIC))
    assert headers["www-authenticate"] == 'Bearer realm="gateway-metrics"'


def test_the_gateway_job_submit_429_carries_what_its_document_lists(gateway):
    slow = {"Authorization": f"Bearer {SLOW_KEY}", "X-Request-ID": "probe-429"}
    # The served document is the committed one; reading it spends the key's one token of this second.
    served = call(gateway.url, "GET", "/openapi.json", slow)
    assert served[0] == 200 and json.loads(served[2]) == GATEWAY_DOC
    reply = wait_until(lambda: (r := call(gateway.url, "POST", "/v1/models/DDPM/jobs", slow, {"images": ["x"]}))[0]
                       == 429 and r, "a 429 of the key's bucket")
    # X-Service-Weights: the model's own 429 (async queue full), passed through, has it; the gateway's has not.
    headers = check(GATEWAY_DOC, "/v1/models/DDPM/jobs", "post", 429, reply, unsent=("X-Service-Weights",))
    assert (headers["x-request-id"], headers["x-service-key"], headers["retry-after"]) == ("probe-429", "slow", "1")


MODEL_401 = [
    ("/testfaults/predict", "post", "/testfaults/predict"),
    ("/jobs", "post", "/jobs"),
    ("/jobs/{job_id}", "get", "/jobs/job_00"),
    ("/metrics", "get", "/metrics"),
    ("/v2/models/TESTFAULTS/infer", "post", "/v2/models/TESTFAULTS/infer"),
]


@pytest.mark.parametrize(("path", "method", "target"), MODEL_401, ids=[f"{m} {p}" for p, m, _ in MODEL_401])
def test_a_model_server_401_carries_what_its_document_lists(model, path, method, target):
    headers = check(model.extra["doc"], path, method, 401, call(model.url, method.upper(), target,
                                                                 {"X-Request-ID": "probe-401"}))
    assert (headers["x-request-id"], headers["www-authenticate"]) == ("probe-401", 'Bearer realm="model-server"')


def test_a_model_server_job_submit_429_carries_what_its_document_lists(model):
    """The per-client rate limit (rate_limit_qps = 1): a scrape spends the second's token."""
    assert call(model.url, "GET", "/metrics", model.auth)[0] == 200
    reply = wait_until(lambda: (r := call(model.url, "POST", "/jobs", model.auth, {"images": ["x"]}))[0] == 429
                       and r, "a 429 of the per-client limit")
    # X-Service-Weights: a full job queue's 429 has it; the per-client limit's, made before any job, has not.
    check(model.extra["doc"], "/jobs", "post", 429, reply, unsent=("X-Service-Weights",))
