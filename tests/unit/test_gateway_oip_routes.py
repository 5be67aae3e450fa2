"""The gateway's /v2 routes in memory: the protocol's error shape for the gateway's own conditions, and metrics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseFailed

from svc.infra.metrics import render
from tests.unit.test_gateway_app import OFF_KEY, SLOW_KEY, FailingAgent, Harness, h

# The harness's in-memory transport has no abortConnection (as in test_gateway_app).
pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")


@pytest.fixture
def gw(tmp_path):
    return Harness(tmp_path)


def assert_oip_error(response, code):
    assert response.code == code, response.body
    assert h(response, "Content-Type") == "application/json"  # the protocol's, as Triton and KServe send it
    assert set(response.json) == {"error"} and response.json["error"]
    assert h(response, "X-Request-ID")


@pytest.mark.parametrize("path, method", [("/v2", "GET"), ("/v2/models/CLS/infer", "POST"), ("/v2/nowhere", "GET"),
                                          ("/v2/models/NOPE/ready", "GET"), ("/v2/models/CLS/infer", "GET")])
@pytest.mark.parametrize("token", [None, "wrong", OFF_KEY, "metrics-tok"])
def test_every_v2_path_is_401_in_the_protocols_shape_without_a_credential(gw, path, method, token):
    r = gw.call(method, path, token=token)
    assert_oip_error(r, 401)
    assert h(r, "WWW-Authenticate") == 'Bearer realm="gateway"'


def test_routing_errors_are_in_the_protocols_shape(gw):
    assert_oip_error(gw.call("GET", "/v2/nowhere"), 404)
    assert_oip_error(gw.call("POST", "/v2/models/NOPE/infer", body=b"{}"), 404)
    wrong = gw.call("GET", "/v2/models/CLS/infer")
    assert_oip_error(wrong, 405)
    assert h(wrong, "Allow") == "POST"
    # The contract's paths keep the envelope.
    assert gw.call("GET", "/v1/nowhere").json["status"] == 63


@pytest.mark.parametrize("path", ["/v2/models/CLS/infer", "/v2/models/CLS/versions/v%201/infer"])
def test_an_inference_goes_to_the_model_server_as_it_came_and_its_reply_comes_back(gw, path):
    """The model server answers the protocol (svc/modelserver/oip_route.py): the gateway parses nothing."""
    body = b'{"inputs": []}\x00\x01binary'
    r = gw.call("POST", path, body=body, headers={"Inference-Header-Content-Length": "14", "X-Request-ID": "r-9"})
    assert r.code == 200
    seen = gw.model.received[-1]
    assert seen["method"] == "POST" and seen["uri"] == path and seen["body"] == body
    assert seen["headers"]["inference-header-content-length"] == ["14"]
    assert seen["headers"]["x-request-id"] == ["r-9"]
    assert seen["headers"]["authorization"] == ["Bearer up-token"]  # the upstream token, not the client's key
    assert r.body == b"{}\x01\x02"
    assert h(r, "Content-Type") == "application/octet-stream" and h(r, "Inference-Header-Content-Length") == "2"
    assert h(r, "X-Request-ID") == "t-2" and h(r, "Set-Cookie") is None
    text = render(gw.registry).decode()  # timed as an inference, under its own protocol
    assert 'service_http_request_duration_ms_count{protocol="oip",route="infer"} 1.0' in text
    assert 'service_http_request_duration_ms_count{protocol="contract",route="infer"}' not in text


def test_the_rate_limit_is_the_keys_bucket_with_retry_after(gw):
    codes = [gw.call("GET", "/v2", token=SLOW_KEY).code for _ in range(3)]
    assert codes == [200, 200, 429]
    limited = gw.call("GET", "/v2/health/live", token=SLOW_KEY)
    assert_oip_error(limited, 429)
    assert h(limited, "Retry-After") == "1"


def test_requests_are_counted_with_their_protocol(gw):
    gw.call("GET", "/v2")
    # What the site calls for each finished request (svc.web.site.JsonSite.log).
    for path, route, code in ((b"/v2", "oip_metadata", 200), (b"/v2/nowhere", "unmatched", 404),
                              (b"/healthz", "healthz", 200)):
        gw.app.count(SimpleNamespace(path=path, method=b"GET", code=code, service_route=route))
    text = render(gw.registry).decode()
    assert 'service_http_requests_total{code="200",method="GET",protocol="oip",route="oip_metadata"} 1.0' in text
    assert 'service_http_requests_total{code="404",method="GET",protocol="oip",route="unmatched"} 1.0' in text
    assert 'service_http_requests_total{code="200",method="GET",protocol="contract",route="healthz"} 1.0' in text
    assert 'service_gateway_key_requests_total{key="tenant-a"} 1.0' in text  # the same admission as /v1


@pytest.mark.parametrize("path", ["/v2", "/v2/health/live"])
def test_the_metadata_routes_echo_a_valid_request_id_and_refuse_an_invalid_one(gw, path):
    """docs/oip.md: the /v2 routes take the same request ids as /v1 (a regression probe: the metadata routes took
    any X-Request-ID and echoed none)."""
    good = gw.call("GET", path, headers={"X-Request-ID": "meta-1"})
    assert good.code == 200 and h(good, "X-Request-ID") == "meta-1"
    bad = gw.call("GET", path, headers={"X-Request-ID": "two words"})
    assert_oip_error(bad, 400)
    assert bad.json["error"] == "X-Request-ID header must be 1 to 128 printable ASCII characters without spaces"


def answered_after_5_s(gw, path: str):
    """The reply to a GET of ``path``: none at 4.999 s, one at 5 s (the readiness and metadata routes' bound)."""
    d = gw.call("GET", path, settle=False)
    answered: list = []
    d.addBoth(lambda r: answered.append(r) or r)
    gw.clock.advance(4.999)
    gw.client.flush()
    assert answered == []
    gw.clock.advance(0.001)
    return gw.settle(d)


class HungReady:
    """The upstream agent, but a model server's ``/ready`` is never answered (its process SIGSTOPped)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def request(self, method, uri, headers=None, bodyProducer=None):
        if uri.endswith(b"/ready"):
            return Deferred()
        return self.inner.request(method, uri, headers, bodyProducer)

    def flush(self) -> None:
        self.inner.flush()


@pytest.mark.parametrize("path", ["/v2/models/CLS/ready", "/v2/models/CLS", "/v2/health/ready",
                                  "/v2/models/CLS/config"])
def test_a_model_server_that_does_not_answer_is_not_ready_within_the_probe_interval(gw, path):
    """A hung model server of one replica held the ready and metadata routes for upstream_recv_timeout_ms (180 s
    by default, longer than any readiness probe waits) and then answered 502 (a regression probe): its /ready is
    asked within 5 s, and no answer in time is 503, not ready."""
    gw.app.proxy.agent = HungReady(gw.upstream_agent)
    reply = answered_after_5_s(gw, path)
    assert_oip_error(reply, 503)
    if path == "/v2/health/ready":
        assert reply.json["error"].startswith("not every model is ready: CLS, ")
    else:
        assert reply.json["error"] == ("model server CLS: no complete reply within 5000 ms (the readiness routes' "
                                       "bound): it is not ready")


class LostReady(HungReady):
    """The upstream agent, but the connection of a model server's ``/ready`` is lost before its reply (the process
    killed as it answered)."""

    def request(self, method, uri, headers=None, bodyProducer=None):
        if uri.endswith(b"/ready"):
            return fail(ResponseFailed([Failure(ConnectionLost())]))
        return self.inner.request(method, uri, headers, bodyProducer)


@pytest.mark.parametrize("path", ["/v2/models/CLS/ready", "/v2/models/CLS", "/v2/health/ready",
                                  "/v2/models/CLS/config"])
def test_a_model_server_whose_ready_connection_is_lost_is_not_ready(gw, path):
    """A transport failure of the readiness question is the model's 503, not ready, as no answer in time is: the
    forwarder's 502 of a lost connection (whose request may have run, so never sent again) is no reply a
    readiness probe can act on."""
    gw.app.proxy.agent = LostReady(gw.upstream_agent)
    reply = gw.call("GET", path)
    assert_oip_error(reply, 503)
    if path == "/v2/health/ready":
        assert reply.json["error"].startswith("not every model is ready: CLS, ")
    else:
        assert reply.json["error"].startswith("model server CLS: ") and reply.json["error"].endswith(": it is not ready")


@pytest.mark.parametrize("path", ["/v2/models/CLS/ready", "/v2/health/ready", "/v2/models/CLS"])
def test_a_model_not_running_is_not_ready_and_no_upstream_error(tmp_path, path):
    """A stopped model's readiness is the probe's answer, not a failed exchange: a load balancer probing
    /v2/health/ready every few seconds raised upstream_errors_total{kind="unreachable"} for each stopped model,
    an alert that fired while the model was stopped on purpose.  A request for inference still counts."""
    gw = Harness(tmp_path, agent=FailingAgent(ConnectionRefusedError()))
    reply = gw.call("GET", path)
    assert_oip_error(reply, 503)
    assert "service_gateway_upstream_errors_total{" not in render(gw.registry).decode()
    assert_oip_error(gw.call("POST", "/v2/models/CLS/infer", body=b"{}"), 503)
    assert ('service_gateway_upstream_errors_total{kind="unreachable",model="CLS",replica="0"} 1.0'
            in render(gw.registry).decode())


class HungConfig(HungReady):
    """The upstream agent, but a model server that answered its ``/ready`` never answers ``/config``."""

    def request(self, method, uri, headers=None, bodyProducer=None):
        if uri.endswith(b"/config"):
            return Deferred()
        return self.inner.request(method, uri, headers, bodyProducer)


class HungDocument(HungReady):
    """The upstream agent, but a model server that answered its ``/ready`` never answers ``/openapi.json``."""

    def request(self, method, uri, headers=None, bodyProducer=None):
        if uri.endswith(b"/openapi.json"):
            return Deferred()
        return self.inner.request(method, uri, headers, bodyProducer)


def test_a_document_not_answered_is_502_within_the_metadata_routes_bound(gw):
    """The metadata route read the model server's document within upstream_recv_timeout_ms (a replicas probe: it
    waited 12 to 15 s, until the hung replica woke); within the metadata routes' 5 s now."""
    gw.app.proxy.agent = HungDocument(gw.upstream_agent)
    reply = answered_after_5_s(gw, "/v2/models/CLS")
    assert_oip_error(reply, 502)
    assert reply.json["error"] == "model server CLS: no complete reply within 5000 ms (the metadata routes' bound)"


def test_a_configuration_not_answered_is_502_within_the_metadata_routes_bound(gw):
    """The configuration is asked of a ready replica within the 5 s of the metadata routes, not within
    upstream_recv_timeout_ms (180 s: a regression probe's hung model server held the route that long)."""
    gw.app.proxy.agent = HungConfig(gw.upstream_agent)
    reply = answered_after_5_s(gw, "/v2/models/CLS/config")
    assert_oip_error(reply, 502)
    assert reply.json["error"] == "model server CLS: no complete reply within 5000 ms (the metadata routes' bound)"
