"""The headers of real refusals, from a real gateway and a real model server, against those their OpenAPI
documents list for the same operation and status.

A probe found the documents and the wire apart: every gateway 401 was documented with `X-Service-Key`,
which a 401 never carries, and without the `X-Request-ID`, `Cache-Control` and `WWW-Authenticate` it does
carry (`realm="gateway-metrics"` on `/metrics`); the job submit's 429 lacked `X-Request-ID` and
`Cache-Control`; and the listener's own replies, which answer any path (408, 414, 431), were in no
document at all.  Here each sampled reply's headers must be exactly the documented ones (less those the
document gives for another case of the same status, named where it is checked), with every documented
constant value (`WWW-Authenticate`, `Cache-Control`, `Connection`) as sent.

The gateway's catalog is the shipped one (conf/server), so its document is the committed
openapi/gateway.json; no model server runs behind it: every reply sampled is the gateway's own.  The model
server is TESTFAULTS, checked against the document it serves.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.http import get, raw_exchange, request
from tests.support.processes import REPO, SHIPPED_CONF, start_model_server, wait_until, write_config

TIMEOUT_MS = 1000  # header_timeout_ms and body_timeout_ms of both processes: a 408 takes a second
SLOW_KEY = "slow-key"  # rate_limit_qps = 1: its second request within the second is 429
#: Headers no operation lists: the framing, and the gateway's CORS `Vary` (stated in the document's description).
UNLISTED = {"content-type", "content-length", "transfer-encoding", "date", "server", "vary"}
GATEWAY_DOC = json.loads((REPO / "openapi" / "gateway.json").read_text())
STATIC = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("reply-headers")
    keys = f'[keys.slow]\nhash = "{hashlib.sha256(SLOW_KEY.encode()).hexdigest()}"\nrate_limit_qps = 1\n'
    proc = start_gateway(root, SHIPPED_CONF, keys, gateway_table=f"header_timeout_ms = {TIMEOUT_MS}\n"
                                                                 f"body_timeout_ms = {TIMEOUT_MS}\n")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("reply-headers-model")
    proc = start_model_server(write_config(root, "TESTFAULTS", name="TESTFAULTS.toml", async_enabled=True,
                                           rate_limit_qps=1, header_timeout_ms=TIMEOUT_MS, body_timeout_ms=TIMEOUT_MS))
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


def parse_raw(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lowercase names) and body of one raw HTTP/1.1 reply."""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split(" ")[1]), headers, body


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


def raw(port: int, method: str, path: str, *headers: str, body_promised: int = 0) -> tuple[int, dict[str, str], bytes]:
    """A request whose head is sent whole, with ``body_promised`` bytes of body promised and none sent."""
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *headers]
    if body_promised:
        lines += ["Content-Type: application/json", f"Content-Length: {body_promised}"]
    return parse_raw(raw_exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")))


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
    # The served document is the committed one, but for the port its servers name (this gateway's); reading it
    # spends the key's one token of this second.
    served = call(gateway.url, "GET", "/openapi.json", slow)
    assert served[0] == 200 and json.loads(served[2]) == {**GATEWAY_DOC, "servers": [{"url": gateway.url}]}
    reply = wait_until(lambda: (r := call(gateway.url, "POST", "/v1/models/DDPM/jobs", slow, {"images": ["x"]}))[0]
                       == 429 and r, "a 429 of the key's bucket")
    # X-Service-Weights: the model's own 429 (async queue full), passed through, has it; the gateway's has not.
    headers = check(GATEWAY_DOC, "/v1/models/DDPM/jobs", "post", 429, reply, unsent=("X-Service-Weights",))
    assert (headers["x-request-id"], headers["x-service-key"], headers["retry-after"]) == ("probe-429", "slow", "1")


@pytest.mark.parametrize(("path", "shape"), [("/v1/models/MOBILENETV2/infer", "status"),
                                             ("/v2/models/MOBILENETV2/infer", "error")])
def test_a_gateway_408_of_a_body_too_slow_carries_what_its_document_lists(gateway, path, shape):
    reply = raw(gateway.port, "POST", path, "X-Request-ID: probe-408", *[f"{k}: {v}" for k, v in STATIC.items()],
                body_promised=10)
    headers = check(GATEWAY_DOC, path, "post", 408, reply)
    assert headers["x-request-id"] == "probe-408" and shape in json.loads(reply[2])


def test_the_bare_408_of_a_head_too_slow_has_only_connection_and_the_request_id_read(gateway):
    """The document's 408 says so: no body, and of its headers only ``Connection: close`` and the client's valid
    ``X-Request-ID`` once its line was read (it had none: docs/api.md promised it)."""
    data = raw_exchange(gateway.port, b"GET /v1/models/DDPM/jobs/job_00 HTTP/1.1\r\nHost: x\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    first, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    assert (first, body) == ("HTTP/1.1 408 Request Timeout", b"")
    # of the documented headers only Connection; besides, what every reply of the gateway has (Date, Vary)
    assert set(headers) == {"connection", "content-length", "date", "vary"}, headers
    assert (headers["connection"], headers["content-length"], headers["vary"]) == ("close", "0", "Origin")
    listed = documented(GATEWAY_DOC, "/v1/models/DDPM/jobs/{job_id}", "get", 408)
    assert listed["connection"]["schema"]["const"] == "close" and "header_timeout_ms" in resolve(
        GATEWAY_DOC, GATEWAY_DOC["paths"]["/v1/models/DDPM/jobs/{job_id}"]["get"]["responses"]["408"])["description"]
    assert "x-request-id" in listed
    data = raw_exchange(gateway.port, b"GET /healthz HTTP/1.1\r\nX-Request-ID: lim-408b\r\nX-A: 1\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    first, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    assert (first, body, headers["x-request-id"]) == ("HTTP/1.1 408 Request Timeout", b"", "lim-408b"), headers
    assert set(headers) == {"connection", "content-length", "date", "vary", "x-request-id"}, headers
    wait_until(lambda: re.search(r"GET /healthz 408 [0-9.]+ms key=- rid=lim-408b$", gateway.output(), re.M),
               "the 408's access line with its rid", timeout=10)


GATEWAY_LISTENER = [
    (414, "/v1/models/DDPM/jobs/{job_id}", "get", "/v1/models/DDPM/jobs/" + "j" * 17000, (), 0),
    (414, "/v2/models/MOBILENETV2/infer", "post", "/v2/models/MOBILENETV2/infer?" + "q" * 17000, (), 0),
    (431, "/v1/models/MOBILENETV2/infer", "post", "/v1/models/MOBILENETV2/infer", ("A: " + "a" * 9000,) * 2, 0),
    (431, "/metrics", "get", "/metrics", ("A: a",) * 600, 0),
    (413, "/v1/models/DDPM/jobs/{job_id}", "get", "/v1/models/DDPM/jobs/job_00", (), 70_000_000),
    (400, "/healthz", "get", "/healthz", ("Host: y",), 0),  # two Host headers: not valid HTTP/1.1
]
#: The envelope's status of each listener reply.
STATUS = {400: 50, 408: 408, 413: 61, 414: 61, 431: 61}


@pytest.mark.parametrize(("code", "path", "method", "target", "extra", "promised"), GATEWAY_LISTENER,
                         ids=[f"{c} {m} {p}" for c, p, m, _, _, _ in GATEWAY_LISTENER])
def test_a_gateway_listener_reply_carries_what_its_document_lists(gateway, code, path, method, target, extra,
                                                                  promised):
    reply = raw(gateway.port, method.upper(), target, *extra, body_promised=promised)
    check(GATEWAY_DOC, path, method, code, reply)
    body = json.loads(reply[2])
    assert set(body) == {"error"} if path.startswith("/v2/") else body["status"] == STATUS[code]


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


MODEL_LISTENER = [
    (408, "/testfaults/predict", "post", "/testfaults/predict", (), 10),
    (408, "/v2/models/TESTFAULTS/infer", "post", "/v2/models/TESTFAULTS/infer", (), 10),
    (414, "/jobs/{job_id}", "get", "/jobs/" + "j" * 17000, (), 0),
    (431, "/testfaults/predict", "post", "/testfaults/predict", ("A: " + "a" * 9000,) * 2, 0),
]


@pytest.mark.parametrize(("code", "path", "method", "target", "extra", "promised"), MODEL_LISTENER,
                         ids=[f"{c} {m} {p}" for c, p, m, _, _, _ in MODEL_LISTENER])
def test_a_model_server_listener_reply_carries_what_its_document_lists(model, code, path, method, target, extra,
                                                                      promised):
    reply = raw(model.port, method.upper(), target, *extra, body_promised=promised)
    check(model.extra["doc"], path, method, code, reply)
    body = json.loads(reply[2])
    assert set(body) == {"error"} if path.startswith("/v2/") else body["status"] == STATUS[code]


def test_a_model_servers_own_400_carries_what_its_document_lists_for_each_case(model):
    """The route's 400 shares its status with the listener's 400 (``Connection: close``, which the route never
    sends) and is either a rejection or an envelope of results (only the latter with ``X-Service-Weights``): the
    document listed both headers unqualified, ``Connection`` as "Always `close`" (metrics probe)."""
    doc = model.extra["doc"]
    listed = documented(doc, "/testfaults/predict", "post", 400)
    assert listed["connection"]["description"].startswith("On the listener's reply only. ")
    assert "With an envelope of results only " in listed["x-service-weights"]["description"]

    def sent(body: bytes) -> tuple[int, dict[str, str], bytes]:  # rate_limit_qps = 1: until this second's token
        return wait_until(lambda: (r := call(model.url, "POST", "/testfaults/predict", {
            **model.auth, "Content-Type": "application/json"}, body))[0] != 429 and r, "a reply that is not 429")

    rejection = sent(b"not json")
    check(doc, "/testfaults/predict", "post", 400, rejection, unsent=("Connection", "X-Service-Weights"))
    assert json.loads(rejection[2])["status"] == 50
    results = sent(b'{"images": ["not base64!"]}')
    headers = check(doc, "/testfaults/predict", "post", 400, results, unsent=("Connection",))
    assert headers["x-service-weights"] == "demo"
    assert json.loads(results[2])["status"] in (3, 5)


def test_a_scrape_carries_what_its_document_lists_and_is_counted_as_the_metrics_tokens_request(gateway, model):
    """A scrape's 200 had no ``X-Request-ID`` (sent or not) where every other reply of the gateway and the model
    server has one, and the gateway did not count it in ``key_requests_total`` though the metrics token's name is in
    its ``X-Service-Key`` and access line (metrics probe)."""
    scrape = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_METRICS_TOKEN']}", "X-Request-ID": "probe-scrape"}
    first = check(GATEWAY_DOC, "/metrics", "get", 200, call(gateway.url, "GET", "/metrics", scrape))
    assert (first["x-request-id"], first["x-service-key"]) == ("probe-scrape", "metrics-token")
    second = call(gateway.url, "GET", "/metrics", {"Authorization": scrape["Authorization"]})
    assert len(check(GATEWAY_DOC, "/metrics", "get", 200, second)["x-request-id"]) == 32  # a new one
    assert 'service_gateway_key_requests_total{key="metrics-token"} 2.0' in second[2].decode().splitlines()
    reply = wait_until(lambda: (r := call(model.url, "GET", "/metrics", {**scrape, **model.auth}))[0] != 429 and r,
                       "a reply that is not 429")
    assert check(model.extra["doc"], "/metrics", "get", 200, reply)["x-request-id"] == "probe-scrape"
