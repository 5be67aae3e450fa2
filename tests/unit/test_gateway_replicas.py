"""The gateway in front of a model of several replicas, in memory: balancing, retries, readiness, jobs.

Each replica is a small Klein app answering like a model server, reached by
its port through an in-memory agent (or refusing the connection); the real
GatewayApp, Balancer, ReplicaProbe and job-id owners run on a Clock.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from klein import Klein
from treq.testing import RequestTraversalAgent, StubTreq
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectBindError, ConnectionLost, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseFailed
from twisted.web.client import URI

from svc.auth import decide
from svc.cluster_config import ClusterConfig
from svc.contract import jobid
from svc.gateway.app import GatewayApp
from svc.gateway.balancer import Balancer
from svc.gateway.catalog import Catalog, CatalogError, Replica, Upstream, load_catalog, unknown_ids
from svc.gateway.cluster import Cluster
from svc.gateway.credentials import Authenticator
from svc.gateway.owners import OtherHost, locate
from svc.gateway.proxy import Proxy, UpstreamReply, not_admitted
from svc.gateway.readiness import ReplicaProbe
from svc.infra.metrics import GatewayMetrics, new_registry, render
from tests.unit.test_gateway_app import TOKENS, h

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

SECRET = "s" * 64
PORTS = (9301, 9401, 9501)
ENVELOPE = {"Content-Type": "application/json; charset=utf-8"}


class FakeReplica:
    """One model-server process: answers by ``mode`` and records what reached it."""

    app = Klein()

    def __init__(self, index: int) -> None:
        self.index = index
        self.mode = "ok"
        self.received: list[tuple[str, str]] = []
        self.hanging: list[Deferred] = []
        self.ready = True
        self.mints = (index, SECRET)  # the replica index and secret its job ids are made with (SERVICE_REPLICA, ...)

    def reply(self, request, code, body):
        request.setResponseCode(code)
        for name, value in ENVELOPE.items():
            request.setHeader(name, value)
        return json.dumps(body).encode()

    @app.route("/classify", methods=["POST"])
    @app.route("/one", methods=["POST"])
    def infer(self, request):
        self.received.append(("POST", request.uri.decode()))
        if self.mode == "hang":
            d = Deferred()
            self.hanging.append(d)
            return d
        if self.mode == "not_admitted":  # loading, stopping: a process-level rejection, nothing admitted
            return self.reply(request, 503, {"status": 65, "results": [], "error": "the server is shutting down"})
        if self.mode == "busy":  # its wait queue is full
            request.setHeader("Retry-After", str(self.index + 1))
            return self.reply(request, 429, {"status": 429, "results": [], "error": "wait queue full"})
        if self.mode == "cut_short":  # admitted, then cut by the end of a shutdown grace: one result per image
            return self.reply(request, 503, {"status": 65, "results": [{"status": 65, "data": None}]})
        return self.reply(request, 200, {"status": 0, "results": [{"status": 0, "data": {"replica": self.index}}]})

    @app.route("/jobs", methods=["POST"])
    def submit(self, request):
        self.received.append(("POST", request.uri.decode()))
        if self.mode == "busy":  # its job queue is full
            request.setHeader("Retry-After", "3")
            return self.reply(request, 429, {"status": 429, "results": [], "error": "async queue full"})
        job = jobid.mint(jobid.JobOwner("", self.mints[0]), self.mints[1])
        request.setHeader("Location", f"/jobs/{job}")
        return self.reply(request, 202, {"job_id": job, "state": "pending", "poll_url": f"/jobs/{job}",
                                         "result_url": f"/jobs/{job}/result"})

    @app.route("/jobs/<job>", methods=["GET"])
    def status(self, request, job):
        self.received.append(("GET", request.uri.decode()))
        return self.reply(request, 200, {"job_id": job, "state": "running", "replica": self.index})

    @app.route("/jobs/<job>/wait", methods=["GET"])
    def wait(self, request, job):
        return self.status(request, job)

    @app.route("/jobs/<job>/result", methods=["GET"])
    def result(self, request, job):
        self.received.append(("GET", request.uri.decode()))
        return self.reply(request, 409, {"status": 409, "error": "job is running"})

    @app.route("/ready", methods=["GET"])
    def ready_route(self, request):
        self.received.append(("GET", request.uri.decode()))
        if self.ready == "hang":  # SIGSTOPped
            d = Deferred()
            self.hanging.append(d)
            return d
        return self.reply(request, 200 if self.ready else 503, {"status": 0 if self.ready else 65,
                                                                 "model": {"version": "v1"}})

    @app.route("/v2/models/CLS/config", methods=["GET"])
    def config_route(self, request):
        self.received.append(("GET", request.uri.decode()))
        return self.reply(request, 200, {"name": "CLS", "replica": self.index})


class PortAgent:
    """The upstream agent: each port reaches its replica, or refuses / breaks as a test says."""

    def __init__(self, replicas: dict[int, FakeReplica]) -> None:
        self.replicas = replicas
        self.agents = {port: RequestTraversalAgent(r.app.resource()) for port, r in replicas.items()}
        self.failures: dict[int, Exception] = {}
        self.requests: list[tuple[int, bytes]] = []

    def request(self, method, uri, headers=None, bodyProducer=None):
        port = URI.fromBytes(uri).port
        self.requests.append((port, method))
        if port in self.failures:
            return fail(self.failures[port])
        return self.agents[port].request(method, uri, headers, bodyProducer)

    def flush(self) -> None:
        for agent in self.agents.values():
            agent.flush()


class Gateway:
    """GatewayApp over a model CLS of ``len(ports)`` replicas (and ONE of one replica), in memory."""

    def __init__(self, tmp_path, ports=PORTS[:2], *, secret: str | None = SECRET, host: str = "", seed: int = 7):
        self.clock = Clock()
        self.replicas = [FakeReplica(i) for i in range(len(ports))]
        self.agent = PortAgent(dict(zip(ports, self.replicas)))
        self.one = FakeReplica(0)
        self.agent.replicas[9901] = self.one
        self.agent.agents[9901] = RequestTraversalAgent(self.one.app.resource())
        cls = tuple(Replica("CLS", i, port, f"token-{i}") for i, port in enumerate(ports))
        self.catalog = Catalog([Upstream("CLS", ports[0], "/classify", True, "token-0", replicas=cls),
                                Upstream("ONE", 9901, "/one", False, "token-one")])
        self.balancer = Balancer(random.Random(seed))
        self.registry = new_registry()
        keys = tmp_path / "none.toml"
        authenticator = Authenticator(decide(TOKENS, str(keys)))
        metrics = GatewayMetrics(self.registry)
        cluster = Cluster(reactor=self.clock, config=replace(ClusterConfig.single_host(), host_id=host),
                          authenticator=authenticator, secret=secret, metrics=metrics, recv_timeout_s=20.0)
        self.app = GatewayApp(
            clock=self.clock, catalog=self.catalog, authenticator=authenticator,
            proxy=Proxy(self.clock, self.agent, 20.0), metrics=metrics, registry=self.registry,
            upstream_recv_timeout_ms=20000, max_body_bytes=1 << 20, balancer=self.balancer, cluster=cluster)
        self.client = StubTreq(self.app.resource())

    def call(self, method, path, *, body=None, settle=True):
        d = self.client.request(method, "http://gateway" + path, headers={"Authorization": "Bearer static-tok"},
                                data=body)
        return self.settle(d) if settle else d

    def settle(self, d):
        for _ in range(5):
            self.agent.flush()
            self.client.flush()
        box = []
        d.addBoth(box.append)
        assert box, "the request did not finish"
        if isinstance(box[0], Failure):
            box[0].raiseException()
        response = box[0]
        body = []
        self.client.content(response).addBoth(body.append)
        response.body = body[0]
        response.json = json.loads(body[0]) if body[0][:1] == b"{" else None
        return response

    def infer(self, model="CLS"):
        return self.call("POST", f"/v1/models/{model}/infer", body=b'{"images":["x"]}')

    def metrics(self) -> str:
        return render(self.registry).decode()


@pytest.fixture
def gw(tmp_path):
    return Gateway(tmp_path)


# -- the balancer alone ----------------------------------------------------------------------------------


def up(n: int) -> Upstream:
    return Upstream("M", 9000, "/m", False, None, replicas=tuple(Replica("M", i, 9000 + i, None) for i in range(n)))


def test_the_fewest_outstanding_wins_and_ties_are_random():
    model, b = up(3), Balancer(random.Random(1))
    first, second, third = model.replicas
    b.started(first)
    b.started(first)
    b.started(second)
    assert {b.pick(model) for _ in range(20)} == {third}
    b.started(third)
    assert {b.pick(model) for _ in range(20)} == {second, third}  # one each: a random one of the two
    b.finished(first)
    b.finished(first)
    assert b.outstanding == {second.key: 1, third.key: 1}
    assert {b.pick(model) for _ in range(20)} == {first}


def test_replicas_that_are_not_ready_are_skipped_until_a_probe_says_ready():
    model, b = up(3), Balancer(random.Random(2))
    first, second, third = model.replicas
    b.mark_down(first)
    b.probed(second, False)
    assert {b.pick(model) for _ in range(20)} == {third}
    b.started(third)
    b.started(third)
    assert {b.pick(model) for _ in range(20)} == {third}  # busy but the only ready one
    b.probed(first, True)
    assert {b.pick(model) for _ in range(20)} == {first}
    # Tried replicas are never picked again for the same request; with none ready, the untried ones are.
    assert b.pick(model, tried=[first]) == third
    b.mark_down(first)
    b.mark_down(third)
    assert {b.pick(model, tried=[third]) for _ in range(20)} == {first, second}
    assert b.pick(model, tried=model.replicas) is None


def test_a_model_of_one_replica_always_gets_it():
    model, b = up(1), Balancer()
    b.mark_down(model.replicas[0])
    assert b.pick(model) is model.replicas[0] and b.pick(model, tried=model.replicas) is None


# -- spreading ---------------------------------------------------------------------------------------------


def test_requests_in_flight_spread_over_the_replicas(gw):
    for r in gw.replicas:
        r.mode = "hang"
    pending = [gw.call("POST", "/v1/models/CLS/infer", body=b"{}", settle=False) for _ in range(4)]
    gw.agent.flush()
    assert [len(r.hanging) for r in gw.replicas] == [2, 2]
    assert gw.balancer.outstanding == {("CLS", 0): 2, ("CLS", 1): 2}
    for r in gw.replicas:
        for d in r.hanging:
            d.callback(b'{"status":0,"results":[]}')
    assert [gw.settle(d).code for d in pending] == [200] * 4
    assert gw.balancer.outstanding == {}


def test_sequential_requests_reach_both_replicas_with_their_own_tokens(gw):
    seen = [gw.infer().json["results"][0]["data"]["replica"] for _ in range(40)]
    assert set(seen) == {0, 1} and 10 <= seen.count(0) <= 30
    metrics = gw.metrics()
    for i in (0, 1):
        count = f'service_gateway_upstream_duration_ms_count{{model="CLS",replica="{i}",route="infer"}} {seen.count(i)}.0'
        assert count in metrics


# -- retries -------------------------------------------------------------------------------------------------


def test_a_refused_connection_goes_to_the_other_replica_which_takes_all_traffic_until_a_probe(gw):
    gw.agent.failures[PORTS[0]] = ConnectionRefusedError()
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        replies = [gw.infer() for _ in range(10)]
    finally:
        globalLogPublisher.removeObserver(events.append)
    # Said once, as the probe says "is ready" when it comes back (a scaling probe found only the latter).
    assert [formatEvent(e) for e in events if "is not ready" in formatEvent(e)] == [
        f"CLS replica 0 (port {PORTS[0]}) is not ready: it refused a connection; skipped until its /ready answers 200"]
    assert [(r.code, r.json["results"][0]["data"]["replica"]) for r in replies] == [(200, 1)] * 10
    refused = [port for port, method in gw.agent.requests if port == PORTS[0]]
    assert len(refused) == 1  # marked not ready at once: skipped from then on
    metrics = gw.metrics()
    assert 'service_gateway_upstream_retries_total{model="CLS",reason="refused"} 1.0' in metrics
    assert 'service_gateway_upstream_errors_total{kind="unreachable",model="CLS",replica="0"} 1.0' in metrics
    del gw.agent.failures[PORTS[0]]
    gw.balancer.probed(gw.catalog.by_id["CLS"].replicas[0], True)
    assert {gw.infer().json["results"][0]["data"]["replica"] for _ in range(20)} == {0, 1}


def test_a_replica_that_admits_nothing_is_skipped_and_the_request_served_by_another(gw):
    gw.replicas[0].mode = "not_admitted"
    replies = [gw.infer() for _ in range(6)]
    assert [(r.code, r.json["status"]) for r in replies] == [(200, 0)] * 6
    assert len(gw.replicas[0].received) == 1 and len(gw.replicas[1].received) == 6
    assert 'service_gateway_upstream_retries_total{model="CLS",reason="not_admitted"} 1.0' in gw.metrics()


def test_job_submissions_are_retried_like_inference(gw):
    gw.agent.failures[PORTS[1]] = ConnectionRefusedError()
    gw.balancer.started(gw.catalog.by_id["CLS"].replicas[0])  # replica 1 looks less busy: it is picked first
    r = gw.call("POST", "/v1/models/CLS/jobs", body=b'{"images":["x"]}')
    assert r.code == 202 and jobid.parse(r.json["job_id"], SECRET) == jobid.JobOwner("", 0)
    assert [port for port, _ in gw.agent.requests] == [PORTS[1], PORTS[0]]


def test_a_replica_whose_queue_is_full_is_skipped_but_not_marked_down(gw):
    """A 429 (wait or job queue full) took nothing: another replica with room serves; the full one stays up."""
    gw.replicas[0].mode = "busy"
    gw.balancer.started(gw.catalog.by_id["CLS"].replicas[1])  # replica 0 looks less busy: it is picked first
    reply = gw.infer()
    assert (reply.code, reply.json["results"][0]["data"]["replica"]) == (200, 1)
    assert [port for port, _ in gw.agent.requests] == [PORTS[0], PORTS[1]]
    assert 'service_gateway_upstream_retries_total{model="CLS",reason="busy"} 1.0' in gw.metrics()
    submitted = gw.call("POST", "/v1/models/CLS/jobs", body=b'{"images":["x"]}')
    assert submitted.code == 202 and jobid.parse(submitted.json["job_id"], SECRET) == jobid.JobOwner("", 1)
    gw.replicas[0].mode = "ok"
    gw.balancer.finished(gw.catalog.by_id["CLS"].replicas[1])
    served = {gw.infer().json["results"][0]["data"]["replica"] for _ in range(20)}
    assert served == {0, 1}  # never marked down: it serves again at once, no probe needed


def test_when_every_replica_is_full_the_last_429_is_the_answer(gw):
    for r in gw.replicas:
        r.mode = "busy"
    reply = gw.infer()
    assert (reply.code, reply.json["status"], reply.json["error"]) == (429, 429, "wait queue full")
    assert h(reply, "Retry-After") in ("1", "2") and [len(r.received) for r in gw.replicas] == [1, 1]
    assert gw.infer("ONE").code == 200  # a model of one replica is untouched


def test_a_full_replica_s_429_is_not_sent_on_to_a_replica_that_is_not_ready(gw):
    """A replica probe: one replica full, the other SIGSTOPped and marked not ready; the request went on to the
    hung one and came back 502 after upstream_recv_timeout_ms.  Once a replica answered 429 only ready ones are
    tried: none is left, so the 429 and its Retry-After are the answer, at once."""
    gw.replicas[0].mode = "busy"
    gw.balancer.probed(gw.catalog.by_id["CLS"].replicas[1], False)
    reply = gw.infer()
    assert (reply.code, reply.json["status"], reply.json["error"]) == (429, 429, "wait queue full")
    assert h(reply, "Retry-After") in ("1", "2") and [port for port, _ in gw.agent.requests] == [PORTS[0]]
    assert 'service_gateway_upstream_retries_total{model="CLS",reason="busy"} 1.0' in gw.metrics()


def test_a_full_replica_s_429_beside_a_stopped_one_is_still_the_answer(gw):
    """The same probe: one replica full, the other stopped (its port refuses) before any probe noticed: the
    client got 503 "model server CLS (no replica took the request) is not reachable: it is not running", for a
    model that runs and is only full."""
    gw.replicas[0].mode = "busy"
    gw.agent.failures[PORTS[1]] = ConnectionRefusedError()
    gw.balancer.started(gw.catalog.by_id["CLS"].replicas[1])  # replica 0 looks less busy: it is picked first
    reply = gw.infer()
    assert (reply.code, reply.json["status"], reply.json["error"]) == (429, 429, "wait queue full")
    assert [port for port, _ in gw.agent.requests] == [PORTS[0], PORTS[1]]
    assert not gw.balancer.is_ready(gw.catalog.by_id["CLS"].replicas[1])  # marked down by the refusal
    gw.agent.requests.clear()
    assert gw.infer().code == 429 and [port for port, _ in gw.agent.requests] == [PORTS[0]]


def test_a_replica_that_admits_nothing_beside_one_not_ready_is_the_answer_at_once(gw):
    """The other answer a request holds (503 status 65 with no results: loading, stopping) is kept as a 429 is:
    a replica marked not ready is not tried after it, so the client gets that 503 at once, not a hang."""
    gw.replicas[0].mode = "not_admitted"
    gw.balancer.probed(gw.catalog.by_id["CLS"].replicas[1], False)
    reply = gw.infer()
    assert (reply.code, reply.json) == (503, {"status": 65, "results": [], "error": "the server is shutting down"})
    assert [port for port, _ in gw.agent.requests] == [PORTS[0]]
    assert 'service_gateway_upstream_retries_total{model="CLS",reason="not_admitted"} 1.0' in gw.metrics()


def test_an_admitted_request_cut_short_is_passed_through_not_retried(gw):
    for r in gw.replicas:
        r.mode = "cut_short"
    reply = gw.infer()
    assert (reply.code, reply.json["status"], len(reply.json["results"])) == (503, 65, 1)
    assert sum(len(r.received) for r in gw.replicas) == 1


def test_a_transport_failure_is_502_and_never_retried(gw):
    for port in PORTS[:2]:
        gw.agent.failures[port] = ResponseFailed([Failure(ConnectionLost("gone"))])
    reply = gw.infer()
    assert (reply.code, reply.json["status"]) == (502, 502)
    assert len(gw.agent.requests) == 1
    assert "upstream_retries_total{" not in gw.metrics()
    # It names the replica that failed (a replicas probe: "model server CLS: ..." said neither).
    index = PORTS.index(gw.agent.requests[0][0])
    assert reply.json["error"].startswith(f"model server CLS replica {index}: "), reply.json


def test_when_every_replica_refuses_it_is_503_not_running(gw):
    for port in PORTS[:2]:
        gw.agent.failures[port] = ConnectionRefusedError()
    reply = gw.infer()
    assert (reply.code, reply.json["status"]) == (503, 65)
    assert "no replica took the request" in reply.json["error"] and "not running" in reply.json["error"]
    assert sorted(port for port, _ in gw.agent.requests) == sorted(PORTS[:2])
    # Both are now marked not ready; the next request still tries both (the page the user sees is the same).
    gw.agent.requests.clear()
    assert gw.infer().code == 503 and len(gw.agent.requests) == 2


def test_a_socket_the_gateway_cannot_make_is_503_retry_after_and_marks_no_replica_down(gw):
    """Out of descriptors (EMFILE) or local ports, the gateway's own connect fails with ConnectBindError, a
    ConnectError: it said the model "is not reachable ... it is not running" and marked it down."""
    for port in PORTS[:2]:
        gw.agent.failures[port] = ConnectBindError(24, "Too many open files")
    reply = gw.infer()
    assert (reply.code, reply.json["status"], reply.headers.getRawHeaders(b"retry-after")) == (503, 65, [b"1"])
    assert reply.json["error"].startswith("the gateway cannot open a connection to model server CLS now (")
    assert "out of file descriptors or local ports; try again" in reply.json["error"]
    assert len(gw.agent.requests) == 1  # no second replica tried: it would fail the same way
    metrics = gw.metrics()
    assert 'service_gateway_upstream_errors_total{kind="local",model="CLS",replica="' in metrics
    assert 'kind="unreachable"' not in metrics
    for port in PORTS[:2]:
        del gw.agent.failures[port]
    assert {gw.infer().json["results"][0]["data"]["replica"] for _ in range(20)} == {0, 1}  # none marked down


def test_when_every_replica_admits_nothing_the_last_answer_is_passed_through(gw):
    for r in gw.replicas:
        r.mode = "not_admitted"
    reply = gw.infer()
    assert (reply.code, reply.json) == (503, {"status": 65, "results": [], "error": "the server is shutting down"})
    assert [len(r.received) for r in gw.replicas] == [1, 1]


def test_a_model_of_one_replica_behaves_as_before(gw):
    gw.one.mode = "not_admitted"
    reply = gw.infer("ONE")
    assert (reply.code, reply.json["status"]) == (503, 65) and len(gw.one.received) == 1
    gw.agent.failures[9901] = ConnectionRefusedError()
    for _ in range(2):
        reply = gw.infer("ONE")
        assert (reply.code, reply.json["status"]) == (503, 65)
        assert reply.json["error"].startswith("model server ONE is not reachable")
    assert [port for port, _ in gw.agent.requests].count(9901) == 3  # each request tried once, never skipped
    assert "upstream_retries_total{" not in gw.metrics()


@pytest.mark.parametrize("code, body, expected", [
    (503, b'{"status":65,"results":[]}', True),
    (503, b'{"status":65,"results":[{"status":65}]}', False),
    (503, b'{"status":65}', False),
    (503, b"<html>", False),
    (503, b'[65]', False),
    (500, b'{"status":65,"results":[]}', False),
    (429, b'{"status":429,"results":[]}', False),
    (503, b'{"error":"the model is loading"}', True),  # the Open Inference Protocol's shape (a /v2 route)
    (503, b'{"error":"loading","status":65}', False),
    (429, b'{"error":"wait queue full"}', False),
    (500, b'{"error":"row 0 of 1 failed"}', False),
])
def test_not_admitted_is_only_a_process_level_503_status_65(code, body, expected):
    from twisted.web.http_headers import Headers

    assert not_admitted(UpstreamReply(code, Headers(), body)) is expected


# -- jobs go to their replica ---------------------------------------------------------------------------------


def job_of(replica: int, host: str = "", secret: str = SECRET) -> str:
    return jobid.mint(jobid.JobOwner(host, replica), secret)


@pytest.mark.parametrize("suffix, route", [("", "/jobs/{job}"), ("/wait?timeout=1000", "/jobs/{job}/wait?timeout=1000"),
                                           ("/result", "/jobs/{job}/result")])
def test_poll_wait_and_result_go_to_the_replica_that_owns_the_job(gw, suffix, route):
    for owner in (1, 0, 1):
        job = job_of(owner)
        reply = gw.call("GET", f"/v1/models/CLS/jobs/{job}{suffix}")
        assert reply.code == (409 if suffix == "/result" else 200)
        assert gw.replicas[owner].received[-1] == ("GET", route.format(job=job))
    assert [len(r.received) for r in gw.replicas] == [1, 2]
    assert gw.balancer.outstanding == {}  # polls are not counted as work


@pytest.mark.parametrize("suffix", ["", "/wait?timeout=1000", "/result"])
def test_jobs_of_a_model_whose_jobs_were_off_at_the_gateways_start_go_to_their_replica(gw, suffix):
    """An operator probe: a model restarted with ``async_enabled`` turned on served jobs, but the gateway, which
    read it off at its start, sent polls to any replica: every other one was 404 "job not found".  An id that
    verifies goes to its owner; an id that does not is the model's own answer, as the contract has it."""
    gw.catalog.by_id["CLS"] = replace(gw.catalog.by_id["CLS"], async_enabled=False)
    for owner in (1, 0, 1, 1, 0):
        job = job_of(owner)
        reply = gw.call("GET", f"/v1/models/CLS/jobs/{job}{suffix}")
        assert reply.code == (409 if suffix == "/result" else 200)
        assert gw.replicas[owner].received[-1][1].startswith(f"/jobs/{job}")
    assert [len(r.received) for r in gw.replicas] == [2, 3]
    unknown = gw.call("GET", f"/v1/models/CLS/jobs/job_zzz{suffix}")  # not ours: a replica's own answer
    assert unknown.code == (409 if suffix == "/result" else 200) and sum(len(r.received) for r in gw.replicas) == 6


def test_submitted_jobs_come_back_to_their_replica(gw):
    for _ in range(10):
        submitted = gw.call("POST", "/v1/models/CLS/jobs", body=b'{"images":["x"]}')
        owner = jobid.parse(submitted.json["job_id"], SECRET).replica
        assert h(submitted, "Location") == f"/v1/models/CLS/jobs/{submitted.json['job_id']}"
        polled = gw.call("GET", submitted.json["poll_url"])
        assert (polled.code, polled.json["replica"]) == (200, owner)


def test_a_replica_that_refuses_a_poll_is_503_never_another_replica(gw):
    gw.agent.failures[PORTS[1]] = ConnectionRefusedError()
    reply = gw.call("GET", f"/v1/models/CLS/jobs/{job_of(1)}")
    assert (reply.code, reply.json["status"]) == (503, 65)
    assert gw.replicas[0].received == []
    # It names the replica that holds the job ("no replica took the request" while replica 0 served).
    assert reply.json["error"].startswith("model server CLS replica 1, which holds the job, is not reachable (")


@pytest.mark.parametrize("make", [
    lambda: job_of(1, secret="t" * 64),  # signed with another secret: forged
    lambda: (lambda job: job[:-2] + ("00" if job[-2:] != "00" else "11"))(job_of(1)),  # tag edited (one mint)
    lambda: (lambda raw: "job_" + (raw[:24] + "00" + raw[26:]))(job_of(1)[4:]),  # replica byte edited to 0
    lambda: job_of(2),  # a replica this model does not run (gone)
    lambda: job_of(0, host="other-host"),  # another host of a cluster
    lambda: "job_1",
    lambda: "nope",
])
def test_an_unknown_forged_or_gone_job_is_404_job_not_found_without_asking_a_replica(gw, make):
    job = make()
    for suffix in ("", "/wait?timeout=10", "/result"):
        reply = gw.call("GET", f"/v1/models/CLS/jobs/{job}{suffix}")
        assert (reply.code, reply.json["status"], reply.json["results"]) == (404, 63, [])
        why = " (host other-host is not among this host's [cluster] peers)" if b"other-host".hex() in job else ""
        assert reply.json["error"] == f"job not found: {job[:80]}{why}" and reply.json["model"]["name"] == "gateway"
    assert [len(r.received) for r in gw.replicas] == [0, 0]


def test_without_a_secret_the_claimed_owner_routes_and_the_model_answers(tmp_path):
    gw = Gateway(tmp_path, secret=None)
    assert gw.call("GET", f"/v1/models/CLS/jobs/{job_of(1, secret='any')}").code == 200
    assert len(gw.replicas[1].received) == 1
    assert gw.call("GET", "/v1/models/CLS/jobs/job_1").code == 200  # not this layout: replica 0 answers
    assert gw.replicas[0].received == [("GET", "/jobs/job_1")]
    assert gw.call("GET", f"/v1/models/CLS/jobs/{job_of(5, secret='any')}").code == 404


def test_locate_decides_this_replica_another_host_or_nothing():
    model = up(2)
    assert locate(model, job_of(1, "h1"), secret=SECRET, host="h1") == model.replicas[1]
    assert locate(model, job_of(1, "h2"), secret=SECRET, host="h1") == OtherHost("h2", 1)
    assert locate(model, job_of(1, "h2"), secret="x", host="h1") is None
    assert locate(model, job_of(3), secret=SECRET, host="") is None
    assert locate(model, "job_zz", secret=None, host="") == model.replicas[0]


def test_a_gateway_of_another_host_id_finds_its_own_jobs(tmp_path):
    gw = Gateway(tmp_path, host="host-b")
    assert gw.call("GET", f"/v1/models/CLS/jobs/{job_of(1, 'host-b')}").code == 200
    assert gw.call("GET", f"/v1/models/CLS/jobs/{job_of(1)}").code == 404  # the single-host id is another host's


# -- the readiness probe ------------------------------------------------------------------------------------------


def test_the_probe_asks_every_replica_of_models_with_several_each_interval(gw):
    probe = ReplicaProbe(clock=gw.clock, agent=gw.agent, catalog=gw.catalog, balancer=gw.balancer, interval_s=0.5)
    probe.startService()
    gw.agent.flush()
    assert sorted(port for port, _ in gw.agent.requests) == sorted(PORTS[:2])  # not ONE: it has one replica
    cls = gw.catalog.by_id["CLS"].replicas
    assert all(gw.balancer.is_ready(r) for r in cls) and probe.out == {}
    gw.replicas[1].ready = False
    gw.clock.advance(0.5)
    gw.agent.flush()
    assert (gw.balancer.is_ready(cls[0]), gw.balancer.is_ready(cls[1])) == (True, False)
    assert {gw.infer().json["results"][0]["data"]["replica"] for _ in range(10)} == {0}
    gw.replicas[1].ready = True
    gw.agent.failures[PORTS[0]] = ConnectionRefusedError()
    gw.clock.advance(0.5)
    gw.agent.flush()
    assert (gw.balancer.is_ready(cls[0]), gw.balancer.is_ready(cls[1])) == (False, True)
    probe.stopService()
    gw.clock.advance(5)
    assert len(gw.agent.requests) == 6 + 10  # three rounds of two probes, ten requests; none after the stop


def test_a_probe_without_an_answer_within_the_interval_is_not_ready_and_not_doubled(gw):
    class Silent:
        def __init__(self):
            self.asked = []

        def request(self, method, uri, headers=None, body=None):
            d = Deferred()
            self.asked.append(d)
            return d

    silent = Silent()
    probe = ReplicaProbe(clock=gw.clock, agent=silent, catalog=gw.catalog, balancer=gw.balancer, interval_s=1.0)
    probe.startService()
    assert len(silent.asked) == 2
    gw.clock.advance(0.99)
    assert len(silent.asked) == 2 and all(gw.balancer.is_ready(r) for r in gw.catalog.by_id["CLS"].replicas)
    gw.clock.advance(0.01)  # the deadline and the next round at once: timed out first, then asked again
    assert not any(gw.balancer.is_ready(r) for r in gw.catalog.by_id["CLS"].replicas)
    assert len(silent.asked) == 4 and all(d.called for d in silent.asked[:2])
    probe.stopService()
    assert all(d.called for d in silent.asked) and probe.out == {}


def test_a_probe_that_raises_does_not_stop_the_timer(gw):
    class Broken:
        calls = 0

        def request(self, *args):
            Broken.calls += 1
            raise RuntimeError("boom")

    probe = ReplicaProbe(clock=gw.clock, agent=Broken(), catalog=gw.catalog, balancer=gw.balancer, interval_s=1.0)
    probe.startService()
    gw.clock.advance(1)
    assert Broken.calls == 4
    probe.stopService()


# -- the catalog's replicas from the environment -----------------------------------------------------------------


def test_catalog_replicas_from_the_environment(tmp_path):
    (tmp_path / "A.toml").write_text('id = "A"\nport = 9300\nserver_uri = "/a"\n')
    (tmp_path / "B.toml").write_text('id = "B"\nport = 9301\nserver_uri = "/b"\n')
    env = {"SERVICE_UPSTREAM_PORTS": '{"A": [9300, 9400]}', "SERVICE_UPSTREAM_TOKENS": '{"A": ["t0", "t1"]}',
           "SERVICE_UPSTREAM_TOKEN": "fallback"}
    catalog = load_catalog(str(tmp_path), env)
    assert [(r.index, r.port, r.token) for r in catalog.by_id["A"].replicas] == [(0, 9300, "t0"), (1, 9400, "t1")]
    assert [(r.port, r.token) for r in catalog.by_id["B"].replicas] == [(9301, "fallback")]
    old_shape = load_catalog(str(tmp_path), {"SERVICE_UPSTREAM_PORTS": '{"A": [9300, 9400]}',
                                             "SERVICE_UPSTREAM_TOKENS": '{"A": "one", "B": "two"}'})
    assert [r.token for r in old_shape.by_id["A"].replicas] == ["one", "one"]
    assert old_shape.by_id["A"].url("/x") == b"http://127.0.0.1:9300/x"
    with pytest.raises(CatalogError, match="port 9301 is used twice: by A replica 1 and by B"):
        load_catalog(str(tmp_path), {"SERVICE_UPSTREAM_PORTS": '{"A": [9300, 9301]}'})


def test_ids_of_the_layout_variables_that_no_config_has_are_named(tmp_path):
    """A misspelt id left its model without a token or on its config's port, said only as "no upstream token"."""
    (tmp_path / "A.toml").write_text('id = "A"\nport = 9300\nserver_uri = "/a"\n')
    env = {"SERVICE_UPSTREAM_PORTS": '{"A": [9300], "GONE": [9500], "AA": [9600]}',
           "SERVICE_UPSTREAM_TOKENS": '{"A": "t", "NOPE": "x"}'}
    assert unknown_ids(load_catalog(str(tmp_path), env), env) == [
        "SERVICE_UPSTREAM_TOKENS names NOPE, which no model config has: not used",
        "SERVICE_UPSTREAM_PORTS names AA, GONE, which no model config has: not used"]
    assert unknown_ids(load_catalog(str(tmp_path), {}), {}) == []


def test_an_upstream_without_replicas_has_one_on_its_port():
    one = Upstream("M", 9000, "/m", False, "t")
    assert one.replicas == (Replica("M", 0, 9000, "t"),)


# -- the Open Inference Protocol's readiness with replicas -------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/models/CLS/ready", "/v2/health/ready", "/v2/models/CLS/config"])
def test_a_hung_replica_does_not_make_a_model_with_a_ready_one_unready(tmp_path, path):
    """A replicas probe: one replica SIGSTOPped, the /v2 readiness routes asked one replica, the balancer's pick,
    and half the time it was the hung one: 503 after 5 s while the other served, and the config was asked of
    whichever replica came next (502 after 5 s).  Every replica is asked at once; the first 200 answers, and
    the config is the ready replica's."""
    for seed in range(6):  # the balancer's ties are random: each seed a new draw
        gw = Gateway(tmp_path, seed=seed)
        gw.replicas[0].ready = "hang"
        reply = gw.call("GET", path)  # no clock advanced: at once
        assert reply.code == 200, (seed, reply.body)
        if path.endswith("/config"):
            assert reply.json == {"name": "CLS", "replica": 1}
            assert ("GET", "/v2/models/CLS/config") not in gw.replicas[0].received
        gw.clock.advance(5)  # the hung replica's question times out: its answer, not an upstream error
        gw.agent.flush()
        assert "service_gateway_upstream_errors_total{" not in gw.metrics()


def test_a_replica_the_gateway_knows_is_down_is_not_asked_while_another_is_ready(tmp_path):
    """A regression probe: each /v2 readiness request asked a replica the gateway's probe had marked down (hung),
    and counted its timeout 5 s later, an upstream error per request of a load balancer's probe."""
    gw = Gateway(tmp_path)
    gw.replicas[0].ready = "hang"
    gw.balancer.probed(gw.catalog.by_id["CLS"].replicas[0], False)
    assert gw.call("GET", "/v2/models/CLS/ready").code == 200
    assert gw.replicas[0].received == [] and gw.replicas[0].hanging == []
    gw.balancer.probed(gw.catalog.by_id["CLS"].replicas[1], False)  # none ready to the probe: every one is asked
    assert gw.call("GET", "/v2/models/CLS/ready").code == 200
    assert gw.replicas[0].received == [("GET", "/ready")]


def test_with_none_ready_a_replicas_own_answer_is_given_before_a_failure(tmp_path):
    """One replica loading (its 503 with the reason), the other stopped: the reply is the model server's own
    words, whichever answer came last (a failure said "no replica is running" while one was loading)."""
    for stopped in (0, 1):
        gw = Gateway(tmp_path)
        gw.replicas[1 - stopped].ready = False
        gw.agent.failures[PORTS[stopped]] = ConnectionRefusedError()
        reply = gw.call("GET", "/v2/models/CLS/ready")
        assert (reply.code, reply.json) == (503, {"error": "service not ready"}), stopped  # the loading one's


def test_a_model_whose_replicas_are_all_stopped_is_not_ready_said_as_the_models(tmp_path):
    """The readiness question asks each replica by name, and the forwarder's words for that are a job's ("replica
    1, which holds the job, is not reachable"): the model's words instead."""
    gw = Gateway(tmp_path)
    for port in PORTS[:2]:
        gw.agent.failures[port] = ConnectionRefusedError()
    for path in ("/v2/models/CLS/ready", "/v2/models/CLS/config", "/v2/models/CLS"):
        reply = gw.call("GET", path)
        assert (reply.code, reply.json) == (503, {"error": "model server CLS: no replica is running"}), path
    reply = gw.call("GET", "/v2/health/ready")
    assert (reply.code, reply.json["error"].split(" (")[0]) == (503, "not every model is ready: CLS")
    assert "service_gateway_upstream_errors_total{" not in gw.metrics()


def test_a_model_whose_replicas_all_hang_is_not_ready_after_5_s(tmp_path):
    gw = Gateway(tmp_path)
    for replica in gw.replicas:
        replica.ready = "hang"
    d = gw.call("GET", "/v2/models/CLS/ready", settle=False)
    box: list = []
    d.addBoth(lambda r: box.append(r) or r)
    gw.clock.advance(4.999)
    gw.agent.flush()
    gw.client.flush()
    assert box == []
    gw.clock.advance(0.001)
    reply = gw.settle(d)
    assert reply.code == 503 and reply.json["error"].endswith("(the readiness routes' bound): it is not ready")



def test_a_job_id_made_here_that_the_gateway_would_not_find_again_says_which_setting_differs():
    """A regression probe of the submit's 502: a model server with another host id passed as a 202 whose every
    poll was 404, and one with a replica index the gateway does not know was blamed on a secret it did not have."""
    from svc.gateway.owners import unreachable

    two = up(2)
    assert unreachable(two, job_of(1, "h1"), secret=SECRET, host="h1") is None
    assert unreachable(two, job_of(1, "h2"), secret=SECRET, host="h1") == (
        "it names host 'h2', not this gateway's 'h1' (SERVICE_HOST_ID, [cluster] host_id)")
    assert unreachable(two, job_of(0, "h1", secret="another-secret-value"), secret=SECRET, host="h1") == (
        "it does not verify with this gateway's SERVICE_JOB_SECRET (the model server has another, or none)")
    for secret in (SECRET, None):
        assert unreachable(up(1), job_of(1, "h1"), secret=secret, host="h1") == (
            "it names replica 1, and this gateway knows 1 of M (SERVICE_REPLICA, SERVICE_UPSTREAM_PORTS)")
    made_by = two.replicas[1]  # a replica whose ids name another replica it knows: polls go there, 404
    assert unreachable(two, job_of(0, "h1"), secret=SECRET, host="h1", made_by=made_by) == (
        "it names replica 0, and replica 1 made it (its SERVICE_REPLICA, or SERVICE_UPSTREAM_PORTS' order)")
    assert unreachable(two, job_of(1, "h1"), secret=SECRET, host="h1", made_by=made_by) is None


def test_a_replica_making_job_ids_the_gateway_would_not_find_again_gets_no_submit_and_the_others_take_them(gw):
    """A regression probe: one replica started with another secret (or without SERVICE_REPLICA, so that its ids
    named replica 0) made the whole model's submits 502 for 60 s, or passed 202s whose every poll was 404. Its
    submit goes to another replica, and it gets none for 60 s; with every replica so, the 502 says when to retry."""
    bad, good = gw.replicas[1], gw.replicas[0]
    bad.mints = (0, SECRET)  # started by hand without SERVICE_REPLICA: its ids name replica 0
    for _ in range(6):
        reply = gw.call("POST", "/v1/models/CLS/jobs", body=b'{"images":["x"]}')
        assert reply.code == 202 and jobid.parse(reply.json["job_id"], SECRET).replica == 0
    assert len([r for r in bad.received if r[0] == "POST"]) <= 1  # tried at most once, then skipped
    assert len([r for r in good.received if r[0] == "POST"]) >= 6
    gw.clock.advance(61)  # the block ends: the bad replica is tried again, and blocked again
    good.mints = (0, "another-secret-value-0123")  # now both make ids the gateway cannot find
    for _ in range(3):
        reply = gw.call("POST", "/v1/models/CLS/jobs", body=b'{"images":["x"]}')
    assert reply.code == 502 and reply.json["error"].endswith(": not sent"), reply.json
    assert 1 <= int(reply.headers.getRawHeaders("Retry-After")[0]) <= 60
