"""The gateway's routes in memory: StubTreq in front, a fake model server behind, a Clock for time."""

from __future__ import annotations

import json
import re

import pytest
from klein import Klein
from treq.testing import RequestTraversalAgent, StubTreq
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web._newclient import RequestTransmissionFailed, ResponseFailed, ResponseNeverReceived

from svc.auth import decide, hash_key
from svc.contract.errors import ApiError
from svc.gateway.app import GatewayApp
from svc.gateway.catalog import Catalog, Upstream
from svc.gateway.cors import EXPOSED_HEADERS, CorsResource
from svc.gateway.proxy import Proxy
from svc.infra.metrics import GatewayMetrics, new_registry, render

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

KEY, SLOW_KEY, OFF_KEY = "1" * 64, "2" * 64, "3" * 64
TOKENS = {"SERVICE_GATEWAY_AUTH_TOKEN": "static-tok", "SERVICE_API_TOKEN": "mgmt-tok", "SERVICE_METRICS_TOKEN": "metrics-tok"}
ORIGIN = "http://127.0.0.1:8787"
RECV_TIMEOUT_MS = 20000


class FakeModel:
    """Answers like a model server and records what reached it."""

    app = Klein()

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.hanging: list[Deferred] = []

    def record(self, request):
        self.received.append({
            "method": request.method.decode(),
            "uri": request.uri.decode(),
            "headers": {k.decode().lower(): [x.decode() for x in v] for k, v in request.requestHeaders.getAllRawHeaders()},
            "body": request.content.read(),
        })

    def reply(self, request, body: bytes, headers: tuple) -> bytes:
        """Record the request and answer 200 with ``headers`` (name, value pairs) and ``body``."""
        self.record(request)
        request.setResponseCode(200)
        for name, value in headers:
            request.setHeader(name, value)
        return body

    @app.route("/classify", methods=["POST"])
    def infer(self, request):
        return self.reply(request, b'{"status":0,"results":[]}', (
            ("Content-Type", "application/json; charset=utf-8"), ("X-Request-ID", "t-1"), ("Cache-Control", "no-store"),
            ("Set-Cookie", "a=b"), ("Server-Timing", "x;dur=1")))

    @app.route("/v2/models/<string:model_id>/infer", methods=["POST"])
    @app.route("/v2/models/<string:model_id>/versions/<string:version>/infer", methods=["POST"])
    def oip_infer(self, request, model_id, version=None):
        return self.reply(request, b"{}\x01\x02", (
            ("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", "2"),
            ("X-Request-ID", "t-2"), ("Cache-Control", "no-store"), ("Set-Cookie", "a=b")))

    @app.route("/ready", methods=["GET"])
    def ready(self, request):
        return self.reply(request, b'{"status":0,"model":{"name":"CLS","version":"v1"}}',
                          (("Content-Type", "application/json; charset=utf-8"),))

    @app.route("/busy", methods=["POST"])
    def busy(self, request):
        self.record(request)
        request.setResponseCode(429)
        request.setHeader("Retry-After", "7")
        request.setHeader("Content-Type", "application/json; charset=utf-8")
        return b'{"status":429,"error":"wait queue full"}'

    @app.route("/hang", methods=["POST"])
    def hang(self, request):
        self.record(request)
        d = Deferred()
        self.hanging.append(d)
        return d

    @app.route("/jobs", methods=["POST"])
    def submit(self, request):
        self.record(request)
        request.setResponseCode(202)
        request.setHeader("Location", "/jobs/job_1")
        request.setHeader("Content-Type", "application/json; charset=utf-8")
        return json.dumps({"job_id": "job_1", "state": "pending", "poll_url": "/jobs/job_1",
                           "result_url": "/jobs/job_1/result"}).encode()

    @app.route("/jobs/<job>", methods=["GET"])
    def status(self, request, job):
        self.record(request)
        request.setHeader("Content-Type", "application/json; charset=utf-8")
        return json.dumps({"job_id": job, "state": "running", "elapsed_ms": 5, "poll_url": f"/jobs/{job}",
                           "result_url": f"/jobs/{job}/result"}).encode()

    @app.route("/jobs/<job>/wait", methods=["GET"])
    def wait(self, request, job):
        if job.startswith("parked"):  # a wait that answers when the test says its budget is spent
            self.record(request)
            d = Deferred()
            self.hanging.append(d)
            return d
        return self.status(request, job)

    @app.route("/jobs/<job>/result", methods=["GET"])
    def result(self, request, job):
        self.record(request)
        request.setResponseCode(409)
        request.setHeader("Content-Type", "application/json; charset=utf-8")
        return json.dumps({"status": 409, "error": "job is running", "poll_url": "/jobs/x"}).encode()


class FailingAgent:
    def __init__(self, error):
        self.error = error

    def request(self, *args, **kwargs):
        return fail(self.error)

    def flush(self):
        pass


class Harness:
    def __init__(self, tmp_path, agent=None, upstreams=None, recv_timeout_ms=RECV_TIMEOUT_MS, key_max_in_flight=0):
        keys = tmp_path / "keys.toml"
        keys.write_text(
            f'[keys.tenant-a]\nhash = "{hash_key(KEY)}"\n'
            f'[keys.slow]\nhash = "{hash_key(SLOW_KEY)}"\nrate_limit_qps = 2\n'
            f'[keys.off]\nhash = "{hash_key(OFF_KEY)}"\nenabled = false\n'
        )
        self.clock = Clock()
        self.model = FakeModel()
        self.upstream_agent = agent or RequestTraversalAgent(self.model.app.resource())
        from svc.gateway.credentials import Authenticator

        self.registry = new_registry()
        catalog = Catalog(upstreams or [
            Upstream("CLS", 9001, "/classify", False, "up-token"),
            Upstream("BUSY", 9002, "/busy", False, "up-token"),
            Upstream("SLOW", 9003, "/hang", True, "up-token"),
            Upstream("GEN", 9004, "/generate", True, None),
        ])
        self.app = GatewayApp(
            clock=self.clock, catalog=catalog, authenticator=Authenticator(decide(TOKENS, str(keys))),
            proxy=Proxy(self.clock, self.upstream_agent, recv_timeout_ms / 1000.0),
            metrics=GatewayMetrics(self.registry), registry=self.registry,
            upstream_recv_timeout_ms=recv_timeout_ms, max_body_bytes=1 << 20, key_max_in_flight=key_max_in_flight,
        )
        self.client = StubTreq(CorsResource.around(self.app, (ORIGIN, "http://localhost:8787")))

    def call(self, method, path, *, token=KEY, headers=None, body=None, settle=True):
        headers = dict(headers or {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        d = self.client.request(method, "http://gateway" + path, headers=headers, data=body)
        if settle:
            return self.settle(d)
        return d

    def settle(self, d):
        for _ in range(5):
            self.upstream_agent.flush()
            self.client.flush()
        response = self.result(d)
        body = self.result(self.client.content(response))
        response.body = body
        is_json = (response.headers.getRawHeaders(b"content-type") or [b""])[0].startswith(b"application/json")
        response.json = json.loads(body) if is_json and body else None  # a HEAD has no body
        return response

    @staticmethod
    def result(d):
        box = []
        d.addBoth(box.append)
        assert box, "the request did not finish"
        if isinstance(box[0], Failure):
            box[0].raiseException()
        return box[0]


def h(response, name):
    values = response.headers.getRawHeaders(name.encode())
    return values[0].decode() if values else None


@pytest.fixture
def gw(tmp_path):
    return Harness(tmp_path)


def assert_envelope(response, http, status):
    assert response.code == http, response.body
    assert h(response, "Content-Type") == "application/json; charset=utf-8"
    assert h(response, "Cache-Control") == "no-store"  # as on every data-plane reply
    body = response.json
    assert body["status"] == status and body["results"] == [] and body["partial"] is False
    assert body["model"]["name"] == "gateway" and body["error"]
    return body


# -- authentication, before anything else ----------------------------------------------------------


def test_healthz_needs_no_credential(gw):
    r = gw.call("GET", "/healthz", token=None)
    assert r.code == 200 and r.json["status"] == 0 and r.json["status_str"] == "SUCCESS" and "error" not in r.json


@pytest.mark.parametrize("path, method", [("/v1/models/CLS/infer", "POST"), ("/classify", "POST"),
                                          ("/v1/models/CLS/jobs", "POST"), ("/v1/models/CLS/jobs/job_1", "GET"),
                                          ("/v1/models/NOPE/infer", "POST"), ("/nowhere", "GET"), ("/jobs", "POST"),
                                          ("/v1/models/CLS/infer", "GET")])
@pytest.mark.parametrize("token", [None, "", "wrong", OFF_KEY, "metrics-tok", KEY[:-1]])
def test_missing_or_wrong_credentials_are_401_everywhere(gw, path, method, token):
    r = gw.call(method, path, token=token, body=b"{}" if method == "POST" else None)
    assert_envelope(r, 401, 401)
    assert h(r, "WWW-Authenticate") == 'Bearer realm="gateway"'
    assert h(r, "X-Service-Key") is None
    assert gw.model.received == []


def test_key_and_static_tokens_name_themselves(gw):
    for token, name in ((KEY, "tenant-a"), ("static-tok", "static-token"), ("mgmt-tok", "management-token")):
        r = gw.call("POST", "/v1/models/CLS/infer", token=token, body=b'{"images":["x"]}')
        assert r.code == 200 and h(r, "X-Service-Key") == name


# -- forwarding ------------------------------------------------------------------------------------


def test_request_forwarding_keeps_the_body_and_only_allowed_headers(gw):
    body = b'{ "images" : ["aGk="],\n "params":{"top_k": 3}}  '
    r = gw.call("POST", "/v1/models/CLS/infer", body=body, headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip", "Accept": "application/json",
        "X-Request-ID": "rid-1",
        "X-Service-Params": '{"top_k":1}', "X-Service-Options": "{}", "Cookie": "s=1", "X-Forwarded-For": "1.2.3.4",
        "User-Agent": "evil", "X-Other": "no"})
    assert r.code == 200
    seen = gw.model.received[-1]
    assert seen["method"] == "POST" and seen["uri"] == "/classify" and seen["body"] == body
    forwarded = {k: v for k, v in seen["headers"].items() if k not in ("host", "connection", "content-length")}
    assert forwarded == {
        "authorization": ["Bearer up-token"], "content-type": ["application/json"], "accept": ["application/json"],
        "content-encoding": ["gzip"],  # the model server refuses it (415): no route decodes one
        "x-request-id": ["rid-1"], "x-service-params": ['{"top_k":1}'], "x-service-options": ["{}"]}


def test_headers_the_connection_header_names_are_not_forwarded(gw):
    """RFC 9110 section 7.6.1: a header named in ``Connection`` is hop-by-hop, dropped by a proxy even where the
    gateway forwards it otherwise (an HTTP probe saw ``Connection: close, X-Service-Params`` forwarded)."""
    r = gw.call("POST", "/v1/models/CLS/infer", body=b'{"images": ["aGk="]}', headers={
        "Content-Type": "application/json", "Connection": "keep-alive, X-Service-Params,x-request-id",
        "X-Service-Params": '{"top_k":1}', "X-Request-ID": "rid-hop", "X-Service-Options": "{}"})
    assert r.code == 200
    seen = gw.model.received[-1]["headers"]
    assert "x-service-params" not in seen and "x-request-id" not in seen and seen["x-service-options"] == ["{}"]


def test_a_head_of_a_proxied_route_has_the_content_length_of_its_get(gw):
    """RFC 9110 section 9.3.2: a HEAD's headers are the GET's. The gateway forwarded the HEAD, and set the length of
    the empty body it got back (0); it asks the GET upstream and sends its length, without the body."""
    get, head = gw.call("GET", "/v1/models/CLS/jobs/abc/result"), gw.call("HEAD", "/v1/models/CLS/jobs/abc/result")
    assert (get.code, head.code, head.body) == (409, 409, b"")
    assert h(head, "Content-Length") == str(len(get.body)) and gw.model.received[-1]["method"] == "GET"


@pytest.mark.parametrize("suffix", ["/wait?timeout=999999", "/wait?timeout=-1", "/wait", "", "/result"])
def test_a_job_get_for_a_model_with_jobs_off_is_the_models_own_answer(gw, suffix):
    """The contract: with async disabled, the model's 404 for /jobs passes through unchanged.  The gateway
    checked the wait budget first (a probe got its 502 "at or above the gateway's upstream receive timeout")
    and, with a cluster secret, the job id (its own 404 "job not found", model.name gateway)."""
    r = gw.call("GET", f"/v1/models/CLS/jobs/job_zzz{suffix}")  # CLS: async_enabled false
    assert gw.model.received and gw.model.received[-1]["uri"] == f"/jobs/job_zzz{suffix}"
    assert r.code == (409 if suffix == "/result" else 200)  # what this fake model says, passed through


def test_raw_body_content_type_is_forwarded_verbatim(gw):
    gw.call("POST", "/v1/models/CLS/infer", body=b"\x89PNG...", headers={"Content-Type": "image/png"})
    assert gw.model.received[-1]["headers"]["content-type"] == ["image/png"]
    assert gw.model.received[-1]["body"] == b"\x89PNG..."


def test_reply_passes_status_body_and_listed_headers_only(gw):
    r = gw.call("POST", "/v1/models/CLS/infer", body=b"{}")
    assert (r.code, r.body) == (200, b'{"status":0,"results":[]}')
    assert (h(r, "X-Request-ID"), h(r, "Cache-Control"), h(r, "Content-Type")) == (
        "t-1", "no-store", "application/json; charset=utf-8")
    assert h(r, "Set-Cookie") is None and h(r, "Server-Timing") is None
    busy = gw.call("POST", "/v1/models/BUSY/infer", body=b"{}")
    assert (busy.code, h(busy, "Retry-After"), busy.json["error"]) == (429, "7", "wait queue full")


def test_legacy_server_uri_and_unknown_paths(gw):
    assert gw.call("POST", "/classify", body=b"{}").code == 200
    unknown_id = assert_envelope(gw.call("POST", "/v1/models/NOPE/infer", body=b"{}"), 404, 63)
    unknown_uri = assert_envelope(gw.call("POST", "/nope/predict", body=b"{}"), 404, 63)
    assert {k: v for k, v in unknown_id.items() if k not in ("task_id", "error")} == \
        {k: v for k, v in unknown_uri.items() if k not in ("task_id", "error")}
    # the same words but for the path: a caller cannot tell an unknown model from a path that is no route
    assert unknown_id["error"] == "no route for /v1/models/NOPE/infer: unknown model or path"
    assert unknown_uri["error"] == "no route for /nope/predict: unknown model or path"
    for method, path in (("POST", "/v1/models/NOPE/jobs"), ("GET", "/v1/models/NOPE/jobs/job_1"),
                         ("GET", "/v1/models/NOPE/jobs/job_1/wait"), ("GET", "/v1/models/NOPE/jobs/job_1/result")):
        body = assert_envelope(gw.call(method, path, body=b"{}" if method == "POST" else None), 404, 63)
        assert body["error"] == f"no route for {path}: unknown model or path"
    assert_envelope(gw.call("POST", "/jobs", body=b"{}"), 404, 63)
    assert_envelope(gw.call("GET", "/jobs/job_1"), 404, 63)
    assert_envelope(gw.call("POST", "/v1/models/CLS/classify", body=b"{}"), 404, 63)
    assert len(gw.model.received) == 1


@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/models/CLS%2Finfer"), ("POST", "/v1/models/CLS%2finfer"), ("POST", "/v1%2Fmodels/CLS/infer"),
    ("POST", "/v1/models/SLOW%2Fjobs"), ("GET", "/v1/models/SLOW/jobs/job_1%2Fresult"),
    ("POST", "/v1/models/%E9/infer"), ("POST", "/classify%FF"),
    ("POST", "//v1/models/CLS/infer"), ("POST", "//classify"), ("POST", "///classify"), ("GET", "//healthz"),
])
def test_an_encoded_slash_or_a_path_that_is_not_utf8_is_no_route(gw, method, path):
    """twisted decodes each segment before the routes see the path joined again: an encoded slash would reach
    the route it spells, and Klein answered a segment that is not UTF-8 with an HTML 400, unauthenticated.
    A leading ``//`` reached the route with one slash: the legacy path matches exactly, or not at all."""
    body = b"{}" if method == "POST" else None
    assert_envelope(gw.call(method, path, body=body, token=None), 401, 401)
    assert assert_envelope(gw.call(method, path, body=body), 404, 63)["error"] == \
        f"no route for {path}: unknown model or path"
    assert gw.model.received == []


@pytest.mark.parametrize("method, path, allow", [("GET", "/v1/models/CLS/infer", "POST"), ("GET", "/classify", "POST"),
                                                 ("POST", "/v1/models/CLS/jobs/job_1", "GET, HEAD"),
                                                 ("PUT", "/v1/models/CLS/jobs", "POST"), ("POST", "/healthz", "GET, HEAD")])
def test_wrong_method_is_405_with_allow(gw, method, path, allow):
    r = gw.call(method, path, body=b"{}" if method != "GET" else None)
    assert_envelope(r, 405, 62)
    assert h(r, "Allow") == allow and h(r, "X-Service-Key") == "tenant-a"


@pytest.mark.parametrize("method, path", [("GET", "/v1/models/NOPE/infer"), ("GET", "/v1/models/NOPE/jobs"),
                                          ("PUT", "/v1/models/NOPE/jobs"), ("POST", "/v1/models/NOPE/jobs/job_1"),
                                          ("DELETE", "/v1/models/NOPE/jobs/job_1/wait"), ("GET", "/v2/models/NOPE/infer")])
def test_a_wrong_method_on_an_unknown_model_is_its_404_not_405(gw, method, path):
    """The contract: an unknown catalog id gives the 404 of an unknown path (``GET /nope/predict``); a probe
    found ``GET /v1/models/NOPE/infer`` answered 405 with ``Allow: POST``, as if the model were there."""
    r = gw.call(method, path, body=b"{}" if method != "GET" else None)
    assert r.code == 404 and h(r, "Allow") is None and h(r, "X-Service-Key") == "tenant-a"
    expected = ({"error": f"no route for {path}: unknown model or path"} if path.startswith("/v2/")
                else {"status": 63, "error": f"no route for {path}: unknown model or path"})
    assert {k: r.json.get(k) for k in expected} == expected
    assert gw.model.received == []


def test_gateway_errors_echo_the_request_id(gw):
    r = gw.call("POST", "/v1/models/NOPE/infer", body=b"{}", headers={"X-Request-ID": "my-req-7"})
    assert h(r, "X-Request-ID") == "my-req-7" and r.json["task_id"] == "my-req-7"


# -- jobs --------------------------------------------------------------------------------------------


def test_job_urls_are_rewritten_onto_the_gateway_prefix(gw):
    r = gw.call("POST", "/v1/models/SLOW/jobs", body=b'{"images":["x"]}')
    assert r.code == 202 and h(r, "Location") == "/v1/models/SLOW/jobs/job_1"
    assert r.json == {"job_id": "job_1", "state": "pending", "poll_url": "/v1/models/SLOW/jobs/job_1",
                      "result_url": "/v1/models/SLOW/jobs/job_1/result"}
    for suffix in ("", "/wait?timeout=1500"):
        s = gw.call("GET", "/v1/models/SLOW/jobs/job_1" + suffix)
        assert s.code == 200 and s.json["poll_url"] == "/v1/models/SLOW/jobs/job_1"
        assert s.json["result_url"] == "/v1/models/SLOW/jobs/job_1/result"
    assert [x["uri"] for x in gw.model.received] == ["/jobs", "/jobs/job_1", "/jobs/job_1/wait?timeout=1500"]
    result = gw.call("GET", "/v1/models/SLOW/jobs/job_1/result")
    assert result.code == 409 and result.json["error"] == "job is running"


@pytest.mark.parametrize("query, forwarded", [("?timeout=19999", "/jobs/j/wait?timeout=19999"),
                                              ("?timeout=abc", "/jobs/j/wait?timeout=abc"),
                                              ("?timeout=-5", "/jobs/j/wait?timeout=-5"),
                                              ("?timeout=1&timeout=2", "/jobs/j/wait?timeout=1"),
                                              ("?timeout=%B2", "/jobs/j/wait?timeout=%B2"),
                                              ("?timeout=%C2%B2", "/jobs/j/wait?timeout=%C2%B2"),
                                              ("?timeout=%201", "/jobs/j/wait?timeout=%201"),
                                              ("?timeout=a%26b%3Dc", "/jobs/j/wait?timeout=a%26b%3Dc"),
                                              ("?timeout=" + "1" * 5000, "/jobs/j/wait?timeout=" + "1" * 19)])
def test_waits_below_the_receive_timeout_are_forwarded(gw, query, forwarded):
    """The timeout value is percent-encoded again (a bad one, cut to 19 bytes, stays bad): the model answers it."""
    assert gw.call("GET", "/v1/models/SLOW/jobs/j/wait" + query).code == 200
    assert gw.model.received[-1]["uri"] == forwarded


def test_a_wait_just_below_the_receive_timeout_gets_the_models_answer(gw):
    """docs/api.md: through the gateway a wait of at most upstream_recv_timeout_ms - 1 is a 200 (the job's state,
    still running or not). The model answers when that budget is spent, and the gateway's own deadline was the
    receive timeout itself: the documented most raced it and was a 502 every time (a jobs probe). The deadline of
    a wait is its budget plus WAIT_MARGIN_S; one the model never answers is still a 502 then."""
    from svc.gateway.proxy import WAIT_MARGIN_S

    flushed = lambda: (gw.upstream_agent.flush(), gw.client.flush())  # noqa: E731
    answered, hung = [], []
    gw.call("GET", f"/v1/models/SLOW/jobs/parked/wait?timeout={RECV_TIMEOUT_MS - 1}", settle=False).addBoth(
        answered.append)
    gw.call("GET", f"/v1/models/SLOW/jobs/parked2/wait?timeout={RECV_TIMEOUT_MS - 1}", settle=False).addBoth(
        hung.append)
    flushed()
    assert len(gw.model.hanging) == 2
    gw.clock.advance(RECV_TIMEOUT_MS / 1000.0 + 0.5)  # past the receive timeout: the model answers the first now
    flushed()
    assert answered == hung == []
    gw.model.hanging[0].callback(json.dumps({"job_id": "parked", "state": "running"}).encode())
    for _ in range(3):
        flushed()
    assert answered[0].code == 200 and hung == []
    gw.clock.advance(WAIT_MARGIN_S)
    for _ in range(3):
        flushed()
    body = assert_envelope(gw.settle(succeed(hung[0])), 502, 502)
    assert f"no complete reply within {RECV_TIMEOUT_MS - 1 + WAIT_MARGIN_S * 1000:.0f} ms (the wait's budget" in \
        body["error"]


@pytest.mark.parametrize("query", ["?timeout=20000", "?timeout=300000", "?timeout=999999999"])
def test_waits_at_or_above_the_receive_timeout_are_502(gw, query):
    body = assert_envelope(gw.call("GET", "/v1/models/SLOW/jobs/j/wait" + query), 502, 502)
    assert "upstream_recv_timeout_ms" in body["error"]
    assert gw.model.received == []


def test_the_default_wait_budget_counts_too(gw):
    """Without ?timeout the model waits 30000 ms: above this gateway's 20000 ms receive timeout."""
    assert_envelope(gw.call("GET", "/v1/models/SLOW/jobs/j/wait"), 502, 502)
    assert gw.model.received == []


# -- upstream failures ---------------------------------------------------------------------------------


def test_unreachable_upstream_is_503(tmp_path):
    gw = Harness(tmp_path, agent=FailingAgent(ConnectionRefusedError()))
    body = assert_envelope(gw.call("POST", "/v1/models/CLS/infer", body=b"{}", headers={"X-Request-ID": "r-9"}), 503, 65)
    assert "not reachable" in body["error"] and body["task_id"] == "r-9"
    assert 'service_gateway_upstream_errors_total{kind="unreachable",model="CLS",replica="0"} 1.0' in render(gw.registry).decode()
    # the gateway's own 503 is a sample of the whole-request histogram: an outage shows in its percentiles
    assert 'service_http_request_duration_ms_count{protocol="contract",route="infer"} 1.0' in render(gw.registry).decode()


def test_broken_reply_is_502(tmp_path):
    gw = Harness(tmp_path, agent=FailingAgent(ResponseFailed([Failure(ConnectionLost("gone"))])))
    body = assert_envelope(gw.call("POST", "/v1/models/CLS/infer", body=b"{}"), 502, 502)
    assert body["error"] == ("model server CLS: the model server's reply was cut short: Connection to the other "
                             "side was lost in a non-clean fashion: gone.")
    assert 'service_gateway_upstream_errors_total{kind="transport",model="CLS",replica="0"} 1.0' in render(gw.registry).decode()


@pytest.mark.parametrize("error, words", [
    (ResponseNeverReceived([Failure(ConnectionDone())]),
     "the model server closed the connection without answering (did it stop or crash?)"),
    (ResponseFailed([Failure(ConnectionDone()), Failure(Exception())]), "the model server's reply was cut short"),
    (RequestTransmissionFailed([Failure(ConnectionLost("reset"))]), "the request could not be sent to the model "
     "server: Connection to the other side was lost in a non-clean fashion: reset."),
])
def test_a_connection_closed_without_a_whole_reply_is_said_in_words(tmp_path, error, words):
    """A model server killed mid-request read "ResponseNeverReceived: Connection was closed cleanly." and a reply
    cut short "ResponseFailed: Connection was closed cleanly.; " (logs probe): neither was clean."""
    gw = Harness(tmp_path, agent=FailingAgent(error))
    assert assert_envelope(gw.call("POST", "/v1/models/CLS/infer", body=b"{}"), 502, 502)["error"] == \
        f"model server CLS: {words}"


def test_no_reply_within_the_receive_timeout_is_502(gw):
    d = gw.call("POST", "/v1/models/SLOW/infer", body=b"{}", settle=False)
    answered = []
    d.addBoth(lambda r: answered.append(r) or r)
    gw.upstream_agent.flush()
    assert len(gw.model.hanging) == 1 and answered == []
    gw.clock.advance(RECV_TIMEOUT_MS / 1000.0 - 0.01)
    gw.upstream_agent.flush()
    gw.client.flush()
    assert answered == []
    gw.clock.advance(0.02)
    body = assert_envelope(gw.settle(d), 502, 502)
    assert "upstream_recv_timeout_ms" in body["error"]
    assert 'service_gateway_upstream_errors_total{kind="timeout",model="SLOW",replica="0"} 1.0' in render(gw.registry).decode()
    text = render(gw.registry).decode()
    assert 'service_http_request_duration_ms_count{protocol="contract",route="infer"} 1.0' in text
    sample = re.search(r'^service_http_request_duration_ms_sum\{protocol="contract",route="infer"\} (\S+)$', text, re.M)
    assert sample and float(sample.group(1)) == pytest.approx(RECV_TIMEOUT_MS, abs=20)


# -- rate limits -----------------------------------------------------------------------------------------


def test_a_request_whose_client_went_away_frees_its_keys_slot(tmp_path):
    gw = Harness(tmp_path, key_max_in_flight=1)

    class Request:  # what hold() uses of a request: notifyFinish errbacks when the connection is lost
        def __init__(self) -> None:
            self.finished: Deferred = Deferred()

        def notifyFinish(self) -> Deferred:
            return self.finished

    gone = Request()
    gw.app.hold(gone, "tenant-a")
    with pytest.raises(ApiError):
        gw.app.hold(Request(), "tenant-a")
    gone.finished.errback(Failure(ConnectionLost("the client went away")))
    assert gw.app.in_flight == {}
    gw.app.hold(Request(), "tenant-a")  # room again


def test_a_key_past_key_max_in_flight_is_429_and_other_keys_are_served(tmp_path):
    """Within its rate one key parked waits until the model server's connections were all taken, and every
    other key got 503: a key now has at most key_max_in_flight requests in flight at the gateway."""
    gw = Harness(tmp_path, key_max_in_flight=2)
    held = [gw.call("POST", "/v1/models/SLOW/infer", body=b"{}", settle=False) for _ in range(2)]
    gw.upstream_agent.flush()
    assert len(gw.model.hanging) == 2 and gw.app.in_flight == {"tenant-a": 2}
    refused = gw.call("POST", "/v1/models/CLS/infer", body=b"{}")
    body = assert_envelope(refused, 429, 429)
    assert h(refused, "Retry-After") == "1" and h(refused, "X-Service-Key") == "tenant-a"
    assert body["error"] == ("key tenant-a has 2 requests in flight, the most one key may have (key_max_in_flight): "
                             "retry when one has been answered")
    assert gw.call("POST", "/v1/models/CLS/infer", body=b"{}", token=SLOW_KEY).code == 200  # another key
    gw.model.hanging.pop(0).callback(b'{"status":0,"results":[]}')
    assert gw.settle(held[0]).code == 200 and gw.app.in_flight == {"tenant-a": 1}
    assert gw.call("POST", "/v1/models/CLS/infer", body=b"{}").code == 200  # room again, and answered: freed
    assert gw.app.in_flight == {"tenant-a": 1}
    metrics = render(gw.registry).decode()
    assert 'service_gateway_key_rejections_total{key="tenant-a",reason="in_flight"} 1.0' in metrics


def test_a_request_refused_past_key_max_in_flight_spends_no_token(tmp_path):
    """The in-flight 429 asks for a retry "when one has been answered"; it spent a token of the key's bucket, so
    that retry met the rate limit (a key of 2 requests/s: one held, two refused, then a 429 for the rate)."""
    gw = Harness(tmp_path, key_max_in_flight=1)
    held = gw.call("POST", "/v1/models/SLOW/infer", body=b"{}", token=SLOW_KEY, settle=False)
    gw.upstream_agent.flush()
    for _ in range(2):
        refused = gw.call("POST", "/v1/models/CLS/infer", body=b"{}", token=SLOW_KEY)
        assert "requests in flight" in assert_envelope(refused, 429, 429)["error"]
    gw.model.hanging.pop(0).callback(b'{"status":0,"results":[]}')
    assert gw.settle(held).code == 200
    assert gw.call("POST", "/v1/models/CLS/infer", body=b"{}", token=SLOW_KEY).code == 200  # the burst's second
    metrics = render(gw.registry).decode()
    assert 'service_gateway_key_rejections_total{key="slow",reason="in_flight"} 2.0' in metrics
    assert 'service_gateway_key_rejections_total{key="slow",reason="rate_limited"}' not in metrics


def test_an_uploads_token_answered_late_refuses_it_mid_body(tmp_path):
    """With Redis the key's bucket answers a moment after the upload's head: a key over its rate is then answered
    429 mid-upload, on the connection the body was coming on, not once the body had arrived (a security probe:
    large uploads of a 1 request/s key were each read whole). An answer that comes with the body complete is the
    route's to give (its admit reads the same token)."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    from svc.web.httplimits import HttpLimits
    from svc.web.site import JsonSite

    gw = Harness(tmp_path)
    answers: list[Deferred] = []
    gw.app.rates = type("Later", (), {"take": lambda self, key, rate: answers.append(Deferred()) or answers[-1]})()
    site = JsonSite.for_app(gw.app, gw.app.resource(), max_body_bytes=1 << 20, limits=HttpLimits(),
                            reactor=gw.clock)

    def upload() -> tuple[object, StringTransport]:
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(b"POST /v1/models/CLS/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                             + SLOW_KEY.encode() + b"\r\nContent-Length: 100000\r\n\r\n" + b"{" * 1000)
        return channel, transport

    channel, transport = upload()
    assert transport.value() == b"" and len(answers) == 1  # asked from the head; the body keeps coming
    answers[0].callback(1.0)  # over the rate
    status, _, rest = transport.value().partition(b"\r\n")
    assert status == b"HTTP/1.1 429 Too Many Requests", transport.value()[:200]
    assert b"rate limit of 2 requests/s for key slow exceeded" in rest and b"X-Service-Key: slow" in rest
    assert gw.app.in_flight == {}  # its slot given back with the answer
    channel.dataReceived(b"{" * 99_000)  # the rest is dropped unread: no second reply
    assert transport.value().count(b"HTTP/1.1 ") == 1
    channel, transport = upload()  # the next: its body complete before the bucket answers
    channel.dataReceived(b"{" * 99_000)
    assert transport.value() == b"" and len(answers) == 2
    answers[1].callback(0.0)  # within the rate: its route, which read the same answer, forwards it
    gw.upstream_agent.flush()
    assert transport.value().startswith(b"HTTP/1.1 200 OK\r\n"), transport.value()[:200]
    assert len(answers) == 2  # no second token taken
    metrics = render(gw.registry).decode()
    assert 'service_gateway_key_rejections_total{key="slow",reason="rate_limited"} 1.0' in metrics

    # A client awaiting "100 Continue" is invited to send its body only once the bucket answered (a regression
    # probe: each got its 100 at once, then a 429 after megabytes); over the rate it gets the 429 alone.
    for wait, first in ((0.0, b"HTTP/1.1 100 Continue\r\n\r\n"), (1.0, b"HTTP/1.1 429 Too Many Requests\r\n")):
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(b"POST /v1/models/CLS/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                             + SLOW_KEY.encode() + b"\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n")
        assert transport.value() == b""  # no 100 before the bucket answers
        answers[-1].callback(wait)
        assert transport.value().startswith(first) and transport.value().count(b"100 Continue") == (wait == 0.0)
    # A client gone before the bucket answers gets nothing written; an HTTP/1.0 client awaits no 100.
    for version, gone in ((b"1.1", True), (b"1.0", False)):
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(b"POST /v1/models/CLS/infer HTTP/" + version + b"\r\nHost: x\r\nAuthorization: Bearer "
                             + SLOW_KEY.encode() + b"\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n")
        if gone:
            channel.connectionLost(Failure(ConnectionLost()))
        answers[-1].callback(0.0)
        assert b"100 Continue" not in transport.value()


def test_a_body_without_a_credential_loses_its_slot_to_a_new_client_past_a_second(tmp_path):
    """A security probe: 1,100 connections each sending the head of a 60 KB body (read before its 401) and one byte
    of it held every slot of the gateway, and every client got 503. Such an unvouched body may be closed for a new
    connection once its head began a second ago, as a stalled head may; an upload with a valid key never is."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    from svc.web.httplimits import HttpLimits
    from svc.web.idle import STALLED_S
    from svc.web.site import JsonSite

    gw = Harness(tmp_path)
    site = JsonSite.for_app(gw.app, gw.app.resource(), max_body_bytes=1 << 20,
                            limits=HttpLimits(max_connections=1), reactor=gw.clock)

    def connect() -> tuple[object, StringTransport]:
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        transport = StringTransport()
        channel.makeConnection(transport)
        return channel, transport

    def upload(channel, authorization: bytes) -> None:
        channel.dataReceived(b"POST /v1/models/CLS/infer HTTP/1.1\r\nHost: x\r\n" + authorization
                             + b"Content-Length: 60000\r\n\r\n{")

    keyed, keyed_transport = connect()
    upload(keyed, b"Authorization: Bearer " + KEY.encode() + b"\r\n")
    gw.clock.advance(STALLED_S)
    _, refused = connect()  # a key's upload is not stalled, however long its body takes
    assert refused.value().startswith(b"HTTP/1.1 503 ") and not keyed_transport.disconnecting
    keyed.dataReceived(b" " * 59_998 + b"}")
    assert not keyed_transport.disconnecting
    keyed.connectionLost(Failure(ConnectionLost()))

    anonymous, anonymous_transport = connect()
    upload(anonymous, b"")
    _, refused = connect()  # within the second
    assert refused.value().startswith(b"HTTP/1.1 503 ") and not anonymous_transport.disconnecting
    gw.clock.advance(STALLED_S)
    healthy, transport = connect()
    assert anonymous_transport.value().startswith(b"HTTP/1.1 408 Request Timeout") and anonymous_transport.disconnecting
    healthy.dataReceived(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 200 OK"), transport.value()[:200]


def test_token_bucket_per_key(gw):
    infer = lambda token=SLOW_KEY: gw.call("POST", "/v1/models/CLS/infer", token=token, body=b"{}")  # noqa: E731
    assert [infer().code, infer().code] == [200, 200]
    limited = infer()
    body = assert_envelope(limited, 429, 429)
    assert h(limited, "Retry-After") == "1" and h(limited, "X-Service-Key") == "slow"
    assert "rate limit of 2 requests/s for key slow" in body["error"]
    assert [infer(KEY).code for _ in range(10)] == [200] * 10  # other keys and unlimited keys are unaffected
    gw.clock.advance(0.5)
    assert infer().code == 200
    assert infer().code == 429
    metrics = render(gw.registry).decode()
    assert 'service_gateway_key_rejections_total{key="slow",reason="rate_limited"} 2.0' in metrics
    assert 'service_gateway_key_requests_total{key="slow"} 3.0' in metrics
    assert 'service_gateway_key_requests_total{key="tenant-a"} 10.0' in metrics


def test_a_path_that_matches_no_route_is_authenticated_but_spends_no_token(gw):
    """The bucket may live in Redis (svc.gateway.ratestore): the routing-error answer cannot wait for it."""
    for _ in range(4):
        r = gw.call("GET", "/nowhere", token=SLOW_KEY)
        assert_envelope(r, 404, 63)
        assert h(r, "X-Service-Key") == "slow"
    assert [gw.call("POST", "/v1/models/CLS/infer", token=SLOW_KEY, body=b"{}").code for _ in range(3)] == [
        200, 200, 429]


@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/models/NOPE/infer"), ("POST", "/v1/models/NOPE/jobs"), ("GET", "/v1/models/NOPE/jobs/abc"),
    ("GET", "/v1/models/NOPE/jobs/abc/wait"), ("GET", "/v1/models/NOPE/jobs/abc/result"),
    ("POST", "/v2/models/NOPE/infer"), ("GET", "/v2/models/NOPE"), ("GET", "/v2/models/NOPE/ready"),
])
def test_an_unknown_model_id_is_404_and_spends_no_token_as_an_unknown_path(gw, method, path):
    """docs/processes.md: an unknown id and an unknown path give the same 404, and spend no token; an HTTP probe
    found the unknown id charged (404, 404, then 429 for a 2 requests/s key)."""
    for _ in range(4):
        r = gw.call(method, path, token=SLOW_KEY, body=b"{}" if method == "POST" else None)
        assert r.code == 404 and h(r, "X-Service-Key") == "slow"
    assert [gw.call("POST", "/v1/models/CLS/infer", token=SLOW_KEY, body=b"{}").code for _ in range(3)] == [
        200, 200, 429]
    assert 'service_gateway_key_requests_total{key="slow"} 6.0' in render(gw.registry).decode()


def test_every_request_that_authenticated_is_counted_once_by_its_key(gw):
    """A 404 or 405 with a valid key counts like a routed request, once; a 401 counts for no key."""
    key_requests = lambda key: gw.registry.get_sample_value(  # noqa: E731
        "service_gateway_key_requests_total", {"key": key})
    assert_envelope(gw.call("GET", "/nothing"), 404, 63)
    assert key_requests("tenant-a") == 1.0
    assert_envelope(gw.call("GET", "/v1/models/CLS/infer"), 405, 62)
    assert_envelope(gw.call("FOO", "/v1/models/CLS/infer"), 405, 62)
    assert_envelope(gw.call("GET", "//v1/models/CLS/infer"), 404, 63)  # no route for RoutablePaths either
    assert key_requests("tenant-a") == 4.0
    assert gw.call("POST", "/v1/models/CLS/infer", body=b"{}").code == 200
    assert_envelope(gw.call("POST", "/v1/models/NOPE/infer", body=b"{}"), 404, 63)  # a route's own 404
    assert key_requests("tenant-a") == 6.0
    assert_envelope(gw.call("GET", "/nothing", token=SLOW_KEY), 404, 63)
    assert_envelope(gw.call("GET", "/nothing", token=None), 401, 401)
    assert_envelope(gw.call("GET", "/nothing", token=OFF_KEY), 401, 401)
    assert (key_requests("tenant-a"), key_requests("slow"), key_requests("off")) == (6.0, 1.0, None)


def test_rate_limited_requests_never_reach_the_model(gw):
    for _ in range(5):
        gw.call("POST", "/v1/models/CLS/infer", token=SLOW_KEY, body=b"{}")
    assert len(gw.model.received) == 2


# -- CORS ------------------------------------------------------------------------------------------------


def test_preflight_from_the_ui_origin_needs_no_credentials(gw):
    r = gw.call("OPTIONS", "/v1/models/CLS/infer", token=None, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.code == 204 and r.body == b""
    assert h(r, "Access-Control-Allow-Origin") == ORIGIN and h(r, "Vary") == "Origin"
    assert h(r, "Access-Control-Allow-Methods") == "POST, OPTIONS" and h(r, "Allow") == "POST, OPTIONS"
    assert "Authorization" in h(r, "Access-Control-Allow-Headers")
    assert gw.model.received == []


@pytest.mark.parametrize("path, allow", [("/healthz", "GET, HEAD, OPTIONS"), ("/v1/models/CLS/jobs/j", "GET, HEAD, OPTIONS"),
                                         ("/metrics", "GET, HEAD, OPTIONS"),
                                         ("/classify", "POST, OPTIONS"), ("/nowhere", "POST, OPTIONS")])
def test_options_lists_the_methods_of_the_path(gw, path, allow):
    """A model's legacy path (``/classify``) and a path that is nowhere get the same answer: a preflight, which
    needs no credential, must not tell which model paths exist.  A GET path's ``Allow`` lists HEAD, as its 405's
    does (a regression probe: ``OPTIONS /metrics`` said ``GET, OPTIONS``, its 405 ``GET, HEAD``)."""
    r = gw.call("OPTIONS", path, token=None)
    assert (r.code, h(r, "Allow"), h(r, "Access-Control-Allow-Origin")) == (204, allow, None)


def test_actual_request_from_the_ui_origin_is_reflected(gw):
    r = gw.call("POST", "/v1/models/CLS/infer", body=b"{}", headers={"Origin": "http://localhost:8787"})
    assert h(r, "Access-Control-Allow-Origin") == "http://localhost:8787" and h(r, "Vary") == "Origin"
    assert "X-Service-Key" in h(r, "Access-Control-Expose-Headers")


@pytest.mark.parametrize("origin", ["http://evil.example", "http://127.0.0.1:8788", "null"])
def test_other_origins_get_no_cors_headers(gw, origin):
    for method in ("OPTIONS", "POST"):
        r = gw.call(method, "/v1/models/CLS/infer", body=b"{}", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert h(r, "Access-Control-Allow-Origin") is None and h(r, "Access-Control-Allow-Methods") is None
        assert h(r, "Vary") == "Origin"


def test_the_listeners_replies_before_any_request_carry_vary_origin(gw):
    """processes.md: every gateway reply carries ``Vary: Origin``, also those its listener writes before a request
    was read (svc.web.limits): the bare 408 of ``header_timeout_ms`` and the 503 past ``max_connections``."""
    assert gw.app.bare_headers(None) == {"Vary": "Origin"}
    # The bare 408 of a head whose Origin line was read carries that origin's headers, as the 431 does.
    from twisted.web.http_headers import Headers

    class Reading:  # a request whose head is being read: its lines so far
        requestHeaders = Headers({b"origin": [ORIGIN.encode()], b"x-request-id": [b"rid-408"]})

    assert gw.app.bare_headers(Reading()) == {"Vary": "Origin", "Access-Control-Allow-Origin": ORIGIN,
                                              "Access-Control-Expose-Headers": EXPOSED_HEADERS.decode(), "X-Request-ID": "rid-408"}
    code, headers, _ = gw.app.busy_reply()
    assert (code, headers["Vary"], "Access-Control-Allow-Origin" in headers) == (503, "Origin", False)


# -- metrics ---------------------------------------------------------------------------------------------


def test_metrics_need_the_metrics_token(gw):
    for token in (None, KEY, "static-tok", "mgmt-tok"):
        assert_envelope(gw.call("GET", "/metrics", token=token), 401, 401)
    gw.call("POST", "/v1/models/CLS/infer", body=b"{}")
    r = gw.call("GET", "/metrics", token="metrics-tok")
    assert r.code == 200 and h(r, "Content-Type").startswith("text/plain") and h(r, "X-Service-Key") == "metrics-token"
    text = r.body.decode()
    assert 'service_gateway_key_requests_total{key="tenant-a"} 1.0' in text
    assert 'service_gateway_auth_failures_total{reason="missing"} 1.0' in text
    assert 'service_gateway_auth_failures_total{reason="wrong"} 3.0' in text
    assert 'service_gateway_upstream_duration_ms_count{model="CLS",replica="0",route="infer"} 1.0' in text
    assert "service_http_request_duration_ms_count{protocol=\"contract\",route=\"infer\"} 1.0" in text


def test_a_wrong_method_on_metrics_with_the_metrics_token_is_405_not_a_wrong_token(gw):
    """A keys probe: ``POST /metrics`` with the right metrics token was 401 "wrong bearer token: send ... API key",
    counted as an authentication failure; an API key got 405.  The scrape token on its own route is 405 too, and is
    counted as the metrics token's request; on another route it is still refused."""
    for method in ("POST", "DELETE"):
        r = gw.call(method, "/metrics", token="metrics-tok")
        assert_envelope(r, 405, 62)
        assert (h(r, "Allow"), h(r, "X-Service-Key"), h(r, "WWW-Authenticate")) == ("GET, HEAD", "metrics-token", None)
    assert_envelope(gw.call("POST", "/metrics", token="wrong-tok"), 401, 401)
    assert_envelope(gw.call("GET", "/v1/models/CLS/infer", token="metrics-tok"), 401, 401)
    for token in (KEY, "static-tok", "mgmt-tok"):  # as the OpenAPI document says (it said the metrics token only)
        assert_envelope(gw.call("PUT", "/metrics", token=token), 405, 62)
    text = gw.call("GET", "/metrics", token="metrics-tok").body.decode()
    assert 'service_gateway_auth_failures_total{reason="wrong"} 2.0' in text
    assert 'service_gateway_key_requests_total{key="metrics-token"} 3.0' in text


@pytest.mark.parametrize("job, forwarded", [("job_ü", "/jobs/job_%C3%BC"), ("a%2Fb", "/jobs/a%252Fb"),
                                            ("x y", "/jobs/x%20y")])
def test_job_ids_are_percent_encoded_upstream(gw, job, forwarded):
    from urllib.parse import quote

    r = gw.call("GET", "/v1/models/SLOW/jobs/" + quote(job, safe=""))
    assert r.code == 200 and gw.model.received[-1]["uri"] == forwarded
