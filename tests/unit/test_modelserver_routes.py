"""The model server's synchronous routes in memory (tests/support/inmemory.py).

The real service tree on a Clock, StubTreq in front, and a gated worker:
a batch runs only when the test releases it, so batching, the wait queue,
deadlines and fault containment are driven step by step, without sleeps.
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import pytest

from svc.infra.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from svc.openapi.modelserver import model_server_document
from tests.support.images import b64, image_b64
from tests.support.inmemory import TOKEN, URI, GatedWorkers, build_model_server

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

RED = image_b64(color=(250, 10, 10))
BLUE = image_b64(color=(10, 10, 250))
JSON = "application/json; charset=utf-8"


def assert_rejection(reply, http, status, error=None):
    """A process-level envelope with no results."""
    assert reply.code == http, reply.body
    assert reply.headers["content-type"] == JSON
    body = reply.json
    assert (body["status"], body["results"], body["partial"]) == (status, [], False)
    assert body["model"] == {"name": "TESTFAULTS", "version": body["model"]["version"]}
    assert reply.headers["x-request-id"] == body["task_id"]
    assert reply.headers["cache-control"] == "no-store"
    if error is not None:
        assert body["error"] == error
    return body


def statuses(reply):
    return [r["status"] for r in reply.json["results"]]


# -- health, readiness, contract ---------------------------------------------------------------------


def test_health_readiness_and_openapi_need_no_token():
    server = build_model_server()
    for path in ("/healthz", "/ready"):
        reply = server.call("GET", path, token=None)
        assert reply.code == 200 and reply.headers["content-type"] == JSON
        assert reply.json == {"status": 0, "status_str": "SUCCESS", "task_id": reply.headers["x-request-id"],
                              "model": {"name": "TESTFAULTS", "version": "test-faults"}, "results": [],
                              "server_time_ms": 0.0, "partial": False}
    reply = server.call("GET", "/openapi.json", token=None)
    assert reply.code == 200 and reply.headers["content-type"] == JSON
    service = server.service
    assert reply.json == model_server_document(service.config, service.engine.factory, service.engine.model_config)


def test_a_loading_model_is_not_ready_and_refuses_inference_with_503():
    server = build_model_server(ready=False)
    assert server.call("GET", "/healthz", token=None).code == 200
    body = assert_rejection(server.call("GET", "/ready", token=None), 503, 65, "the model is loading")
    assert body["model"]["version"] == "loading"
    assert_rejection(server.settle(server.infer([RED])), 503, 65, "the model is loading")
    assert server.workers.held == 1 and server.model.batches == []  # the warm-up, still held
    server.workers.release()
    assert server.call("GET", "/ready", token=None).code == 200
    assert server.model.batches == [4]  # the warm-up: one batch of max_batch_size


# -- authentication and the per-IP limit ---------------------------------------------------------------


@pytest.mark.parametrize("method, path", [("POST", URI), ("GET", "/metrics")])
@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN[:-1], TOKEN + "x"])
def test_missing_or_wrong_token_is_401_with_www_authenticate(method, path, token):
    server = build_model_server()
    reply = server.call(method, path, token=token, body={"images": [RED]} if method == "POST" else None)
    assert_rejection(reply, 401, 401, "missing or wrong bearer token")
    assert reply.headers["www-authenticate"] == 'Bearer realm="model-server"'
    assert server.model.batches == [] and server.workers.held == 0


def test_authentication_comes_before_the_per_ip_rate_limit():
    server = build_model_server(rate_limit_qps=3.0)
    for _ in range(10):  # refused callers spend no budget
        assert server.call("POST", URI, token=None, body={"images": [RED]}).code == 401
    replies = []
    for _ in range(4):
        d = server.infer([RED])
        server.workers.release_all()
        replies.append(server.settle(d))
    assert [r.code for r in replies] == [200, 200, 200, 429]
    assert_rejection(replies[3], 429, 429, "rate limit of 3 requests/s per client exceeded")
    assert replies[3].headers["retry-after"] == "1"
    assert server.model.batches == [1, 1, 1]
    server.clock.advance(1.0 / 3.0)  # one token back
    d = server.infer([RED])
    server.workers.release_all()
    assert server.settle(d).code == 200


# -- routing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, path, allowed", [("GET", URI, "POST"), ("PUT", URI, "POST"), ("POST", "/healthz", "GET, HEAD"),
                                                   ("DELETE", "/ready", "GET, HEAD"), ("POST", "/metrics", "GET, HEAD")])
def test_wrong_method_is_405_with_allow(method, path, allowed):
    server = build_model_server()
    reply = server.call(method, path, body=b"{}" if method in ("POST", "PUT") else None)
    assert_rejection(reply, 405, 62, f"method {method} not allowed; allowed: {allowed}")
    assert reply.headers["allow"] == allowed


@pytest.mark.parametrize("path", ["/nowhere", "/jobs", "/testfaults", "/v1/models/TESTFAULTS/infer"])
def test_unknown_route_is_404(path):
    server = build_model_server()
    assert_rejection(server.call("POST", path, body=b"{}"), 404, 63, f"no route for {path}")


# -- batching ------------------------------------------------------------------------------------------


def test_items_of_concurrent_requests_share_a_batch():
    server = build_model_server()  # max_batch_size 4, one worker
    busy = server.infer([BLUE], sleep_ms=600)
    assert server.workers.held == 1  # the worker is busy: the next four requests wait together
    waiting = [server.infer([RED]) for _ in range(4)]
    assert not any(server.done(d) for d in [busy, *waiting]) and server.workers.held == 1
    server.workers.release()
    assert server.workers.held == 1  # the four waited for the worker and left as one batch
    server.workers.release()
    assert server.model.batches == [1, 4]
    assert server.settle(busy).json["results"][0]["data"]["batch_size"] == 1
    assert [server.settle(d).json["results"][0]["data"] for d in waiting] == [
        {"mean": [250.0, 10.0, 10.0], "batch_size": 4}] * 4


def test_a_multi_image_request_is_one_batch():
    server = build_model_server()
    d = server.infer([RED, BLUE, RED])
    server.workers.release()
    reply = server.settle(d)
    assert reply.code == 200 and reply.json["status"] == 0
    assert [r["data"] for r in reply.json["results"]] == [
        {"mean": [250.0, 10.0, 10.0], "batch_size": 3}, {"mean": [10.0, 10.0, 250.0], "batch_size": 3},
        {"mean": [250.0, 10.0, 10.0], "batch_size": 3}]
    assert server.model.batches == [3]


def test_items_with_different_params_never_share_a_batch():
    server = build_model_server()
    first = server.infer([RED])
    later = [server.infer([RED], sleep_ms=1), server.infer([BLUE]), server.infer([RED], sleep_ms=1)]
    server.workers.release_all()
    assert server.model.batches == [1, 2, 1]
    assert [server.settle(d).json["results"][0]["data"]["batch_size"] for d in [first, *later]] == [1, 2, 1, 2]


# -- fault containment ---------------------------------------------------------------------------------------


def test_engine_failure_fails_every_item_of_its_run_and_no_other():
    server = build_model_server()
    good = server.infer([RED, BLUE], sleep_ms=300)
    bad = server.infer([RED, BLUE], fail="engine")
    server.workers.release_all()
    reply = server.settle(bad)
    assert reply.code == 500 and (reply.json["status"], reply.json["status_str"]) == (1, "ENGINE_ERROR")
    assert statuses(reply) == [1, 1]
    assert reply.json["results"][0]["error"] == "model error: RuntimeError: injected engine failure"
    ok = server.settle(good)
    assert ok.code == 200 and statuses(ok) == [0, 0]
    assert server.model.batches == [2, 2]


@pytest.mark.parametrize("fault, code, top, items, error", [
    ("length", 500, 6, [6, 6], "model returned 1 outputs for 2 inputs"),  # the whole run fails
    ("item", 200, 0, [6, 0], "model output contract failure: data breaks its schema at ['mean']: "
                             "'not numbers' is not of type 'array'"),  # only that item fails
    ("nan", 200, 0, [6, 0], "model output contract failure: Out of range float values are not JSON compliant"),
])
def test_contract_failures_of_the_run_or_of_one_item(fault, code, top, items, error):
    server = build_model_server()
    d = server.infer([RED, BLUE], fail=fault)
    server.workers.release()
    reply = server.settle(d)
    assert (reply.code, reply.json["status"], statuses(reply)) == (code, top, items)
    assert reply.json["results"][0]["error"] == error
    d = server.infer([RED])
    server.workers.release()
    assert server.settle(d).json["status"] == 0


# -- the deadline (run_timeout_ms) ------------------------------------------------------------------------------


def test_deadline_with_some_items_done_is_200_status_68():
    server = build_model_server(max_batch_size=1, run_timeout_ms=1000)
    d = server.infer([RED, BLUE], sleep_ms=750)  # times in binary fractions: the sums are exact
    server.clock.advance(0.75)
    server.workers.release()  # the first item is done at 750 ms; the second starts
    assert not server.done(d)
    server.clock.advance(0.125)
    assert not server.done(d)
    server.clock.advance(0.125)
    reply = server.settle(d)
    assert reply.code == 200
    body = reply.json
    assert (body["status"], body["status_str"], body["partial"]) == (68, "PARTIAL", True)
    assert statuses(reply) == [0, 4] and body["results"][1]["data"] is None
    assert body["server_time_ms"] == 1000.0
    server.workers.release()  # the started batch finishes late: its result is dropped
    assert server.metric("service_items_total", '{status="SUCCESS"}') == 1.0
    assert server.metric("service_items_total", '{status="RUN_TIMEOUT"}') == 1.0


def test_deadline_with_nothing_done_is_504_status_4_and_the_server_goes_on():
    server = build_model_server(max_batch_size=1, run_timeout_ms=1000)
    d = server.infer([RED], sleep_ms=1500)
    server.clock.advance(1.0)
    reply = server.settle(d)
    assert reply.code == 504
    assert (reply.json["status"], reply.json["partial"]) == (4, False)
    assert reply.json["results"] == [{"status": 4, "data": None, "error": reply.json["results"][0]["error"]}]
    server.workers.release()
    d = server.infer([RED])
    server.workers.release()
    assert server.settle(d).json["status"] == 0


def test_an_item_past_its_deadline_leaves_the_queue_without_a_worker():
    server = build_model_server(max_batch_size=1, run_timeout_ms=1000)
    busy = server.infer([RED], sleep_ms=1)
    late = server.infer([BLUE])  # waits behind the busy worker
    server.clock.advance(1.0)
    assert server.settle(busy).code == 504 and server.settle(late).code == 504
    server.workers.release()
    assert server.workers.held == 0 and server.model.batches == [1]


@pytest.mark.parametrize("decode_in_worker", [True, False])
def test_a_bad_item_keeps_its_status_when_another_items_decoding_outlasts_the_deadline(decode_in_worker):
    """A junk (or empty) image beside an image whose decoding outlasted run_timeout_ms was answered 504 with both
    items status 4 (probe, a 6000x6000 PNG): every item is peeked at before any is decoded, so the bad one keeps
    its own status and the reply is the partial 200 of docs/api.md."""
    server = build_model_server(run_timeout_ms=1000, backend={"decode_in_worker": decode_in_worker})
    decode = server.model.preprocess

    def slow(image, params):
        server.clock.advance(1.0)  # decoding this image takes the whole deadline
        return decode(image, params)

    server.model.preprocess = slow
    timed_out = {"status": 4, "data": None, "error": "the deadline passed before this item finished"}
    junk = {"status": 5, "data": None,
            "error": "not a decodable image (JPEG, PNG, WebP, GIF, BMP, TIFF, AVIF, JPEG 2000, PNM, TGA, ICO or QOI)"}
    empty = {"status": 3, "data": None, "error": "input image is empty"}
    for images, results in (([b64(b"junk"), RED], [junk, timed_out]), ([RED, ""], [timed_out, empty])):
        d = server.infer(images)
        server.workers.release_all()
        reply = server.settle(d)
        assert reply.code == 200, reply.body
        assert (reply.json["status"], reply.json["status_str"], reply.json["partial"]) == (68, "PARTIAL", True)
        assert reply.json["results"] == results
    assert server.metric("service_items_total", '{status="RUN_TIMEOUT"}') == 2.0
    assert server.metric("service_items_total", '{status="INVALID_IMAGE"}') == 1.0
    assert server.metric("service_items_total", '{status="IMAGE_EMPTY"}') == 1.0


def test_a_bad_item_queued_behind_a_busy_worker_gets_its_own_status_at_the_deadline():
    """With decode_in_worker the worker peeks at an item only when its batch starts: a request of an empty and a
    junk image queued behind a busy worker was answered 504 status 4 after the whole deadline (a batching
    probe), so a client retried the same bad images.  At the deadline a queued item's base64 and header are
    checked: bad images get their own statuses (400 for a request of them alone, 68 beside a timed-out good
    one), and none of them takes a worker."""
    server = build_model_server(max_batch_size=1, run_timeout_ms=1000, backend={"decode_in_worker": True})
    busy = server.infer([RED], sleep_ms=1)  # the one worker, until the test releases it
    junk = {"status": 5, "data": None,
            "error": "not a decodable image (JPEG, PNG, WebP, GIF, BMP, TIFF, AVIF, JPEG 2000, PNM, TGA, ICO or QOI)"}
    empty = {"status": 3, "data": None, "error": "input image is empty"}
    timed_out = {"status": 4, "data": None, "error": "the deadline passed before this item finished"}
    bad = server.infer(["", b64(b"junk")])
    mixed = server.infer([BLUE, b64(b"junk")])
    server.clock.advance(1.0)
    assert server.settle(busy).code == 504
    reply = server.settle(bad)
    assert (reply.code, reply.json["status"], reply.json["results"]) == (400, 3, [empty, junk])
    reply = server.settle(mixed)
    assert (reply.code, reply.json["status"], reply.json["results"]) == (200, 68, [timed_out, junk])
    server.workers.release_all()
    assert server.model.batches == [1]  # only the busy request's item ever ran
    assert server.metric("service_items_total", '{status="INVALID_IMAGE"}') == 2.0
    assert server.metric("service_items_total", '{status="RUN_TIMEOUT"}') == 2.0


def test_a_request_answered_while_it_waited_for_the_decode_pool_is_not_decoded():
    """A busy decode pool decoded requests already answered 504, one after the other, while the next request's
    own junk image waited behind them and came back 504 too (a regression probe): a request whose deadline
    passed before the pool took it is not decoded."""
    decoders = GatedWorkers()
    server = build_model_server(run_timeout_ms=1000, backend={"decode_in_worker": False}, decoders=decoders)
    decode, decoded = server.model.preprocess, []
    server.model.preprocess = lambda image, params: decoded.append(image) or decode(image, params)
    d = server.infer([RED])  # validated inline (a small body); its decoding waits for the pool
    assert decoders.held == 1
    server.clock.advance(1.0)  # the deadline passes while it waits
    decoders.release()
    reply = server.settle(d)
    assert reply.code == 504 and reply.json["results"] == [
        {"status": 4, "data": None, "error": "the deadline passed before this item finished"}]
    assert decoded == [] and server.workers.held == 0
    d = server.infer([RED])  # the pool and the admission are free again
    decoders.release_all()
    server.workers.release_all()
    assert server.settle(d).json["status"] == 0 and len(decoded) == 1


# -- the wait queue (max_queue_depth) ------------------------------------------------------------------------


def test_full_wait_queue_is_429_with_retry_after():
    server = build_model_server(max_batch_size=1, max_queue_depth=2)
    running = server.infer([RED], sleep_ms=800)
    queued = server.infer([RED, BLUE])  # two items wait: the queue is full
    assert server.metric("service_queue_depth") == 2.0
    reply = server.settle(server.infer([RED]))
    assert_rejection(reply, 429, 429, "wait queue full: 2 image items waiting (max_queue_depth 2)")
    assert reply.headers["retry-after"] == "1"
    assert server.metric("service_queue_rejected_total") == 1.0
    server.workers.release_all()
    assert server.settle(running).code == 200 and server.settle(queued).code == 200
    d = server.infer([RED])
    server.workers.release()
    assert server.settle(d).code == 200 and server.metric("service_queue_depth") == 0.0


# -- metrics ----------------------------------------------------------------------------------------------------


def test_metrics_route_serves_the_registry_with_request_and_item_counts():
    server = build_model_server()
    d = server.infer([RED, BLUE], fail="item")
    server.workers.release()
    server.settle(d)
    reply = server.call("GET", "/metrics")
    assert reply.code == 200 and reply.headers["content-type"] == METRICS_CONTENT_TYPE
    samples = dict(line.rsplit(" ", 1) for line in reply.body.decode().splitlines() if not line.startswith("#"))
    expected = {
        'service_http_requests_total{code="200",method="POST",route="infer"}': "1.0",
        'service_http_request_duration_ms_count{route="infer"}': "1.0",
        'service_items_total{status="SUCCESS"}': "1.0",
        'service_items_total{status="CONTRACT_FAILURE"}': "1.0",
        'service_batch_size_count': "1.0",
        "service_model_ready": "1.0",
        'service_model_info{device="cpu",model="TESTFAULTS",optimize="eager",replica="0",version="test-faults"}': "1.0",
    }
    assert {name: samples.get(name) for name in expected} == expected


def test_an_idle_connection_is_closed_after_peer_resp_timeout():
    """``peer_resp_timeout`` (seconds) is the model server's peer I/O timeout: a kept-alive connection that stays
    silent that long after a reply is closed; one that keeps talking is not.  (A new connection's first request
    has the shorter ``header_timeout_ms``.)"""
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    server = build_model_server(peer_resp_timeout=30)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

    def served() -> tuple[Any, StringTransport]:
        transport = StringTransport()
        channel = server.service.site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        channel.makeConnection(transport)
        channel.dataReceived(request)
        assert transport.value().startswith(b"HTTP/1.1 200 OK")
        transport.clear()
        return channel, transport

    (_, silent), (channel, talking) = served(), served()
    server.clock.advance(29)
    assert not silent.disconnecting
    channel.dataReceived(request)
    assert talking.value().startswith(b"HTTP/1.1 200 OK")
    server.clock.advance(2)
    assert silent.disconnecting and not talking.disconnecting
    server.clock.advance(30)
    assert talking.disconnecting


def test_any_method_token_counts_as_other_and_adds_no_series():
    """HTTP lets a client send any token as its method, before it is authenticated: were each a label value,
    every such request would add a series to /metrics for good (memory without bound)."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport

    server = build_model_server()
    for i in range(20):
        transport = StringTransport()
        channel = server.service.site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
        channel.makeConnection(transport)
        channel.dataReceived(f"ZZQ{i} /healthz HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert transport.value().startswith(b"HTTP/1.1 405 ")
    server.call("PATCH", "/healthz")
    text = server.call("GET", "/metrics").body.decode()
    assert 'service_http_requests_total{code="405",method="other",route="unmatched"} 20.0' in text
    assert 'service_http_requests_total{code="405",method="PATCH",route="unmatched"} 1.0' in text
    assert "ZZQ" not in text


@pytest.mark.parametrize("path", [URI, "/jobs"])
@pytest.mark.parametrize("value", ["image/png, application/json", "image/", "image/png x"])
def test_a_content_type_that_is_not_one_image_type_is_415_status_60(path, value):
    """A security probe: two Content-Type lines (joined ``image/png, application/json``) were read as an image by
    the value's prefix, where a second line is never to be ignored (docs/api.md, HTTP framing)."""
    server = build_model_server(async_enabled=True)
    reply = server.call("POST", path, body=base64.b64decode(RED), headers={"Content-Type": value})
    assert_rejection(reply, 415, 60, f"unsupported content type {value!r}; send application/json (the envelope), "
                                     "or one image as image/* or application/octet-stream")
    ok = server.send("POST", path, body=base64.b64decode(RED), headers={"Content-Type": "image/png"})
    server.workers.release_all()
    assert server.settle(ok).code == (202 if path == "/jobs" else 200)


@pytest.mark.parametrize("path", [URI, "/jobs"])
def test_a_body_without_a_content_type_is_told_that_none_was_sent(path):
    """A models probe: a JSON body sent without Content-Type was told "unsupported content type 'none'", which
    reads as a type named none."""
    server = build_model_server(async_enabled=True)
    body = json.dumps({"images": [RED]}).encode()
    expected = ("no media type (Content-Type missing, empty or naming none); send application/json (the envelope), "
                "or one image as image/* or application/octet-stream")
    assert_rejection(server.call("POST", path, body=body), 415, 60, expected)
    for empty in ("", ";charset=utf-8"):  # a header that names no media type (a regression probe)
        assert_rejection(server.call("POST", path, body=body, headers={"Content-Type": empty}), 415, 60, expected)


@pytest.mark.parametrize("path", [URI, "/jobs", "/v2/models/TESTFAULTS/infer"])
def test_a_compressed_body_is_415_status_60_on_every_route_that_reads_one(path):
    """No route decodes a Content-Encoding: read as it was, a gzip body was called JSON that does not parse.
    The protocol's route answers it 400, its one "bad request" (docs/oip.md), as it does the model's 422."""
    server = build_model_server(async_enabled=True)
    body = json.dumps({"images": [RED]}).encode()
    reply = server.call("POST", path, body=gzip.compress(body),
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert reply.code == (400 if path.startswith("/v2/") else 415)
    error = reply.json["error"]
    assert error == "unsupported content encoding 'gzip': send the body uncompressed"
    if path != "/v2/models/TESTFAULTS/infer":  # the protocol's own shape: {"error"}
        assert_rejection(reply, 415, 60, error)
        assert reply.headers["accept-encoding"] == "identity"  # RFC 9110 section 15.5.16 (an HTTP probe)
    identity = server.send("POST", URI, body=body, headers={"Content-Type": "application/json",
                                                             "Content-Encoding": "identity"})
    server.workers.release_all()
    assert server.settle(identity).code == 200
