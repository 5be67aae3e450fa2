"""Jobs across hosts, in memory: two gateways with their models, each forwarding to the other on a Clock.

Each "host" is a real GatewayApp with its own fake model server behind
StubTreq; the peer agent delivers a forwarded request to the other host's
gateway resource, so a poll travels h1 gateway -> h2 gateway -> h2 model and
back.  Faults no in-memory peer can cause by itself (refused, silent) are a
failing or never-firing agent for one host id.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from treq.testing import RequestTraversalAgent, StubTreq
from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseNeverReceived

from svc.auth import decide, hash_key
from svc.cluster_config import ClusterConfig
from svc.contract import jobid
from svc.gateway.app import GatewayApp
from svc.gateway.catalog import Catalog, Upstream
from svc.gateway.cluster import Cluster
from svc.gateway.cors import CorsResource
from svc.gateway.credentials import Authenticator
from svc.gateway.proxy import Proxy
from svc.infra.metrics import GatewayMetrics, new_registry, render
from tests.unit.test_gateway_app import KEY, SLOW_KEY, TOKENS, FakeModel, Harness, assert_envelope, h

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

SECRET = "cluster-job-secret"
CLUSTER_TOKEN = "cluster-tok"
PEERS = {"h1": "http://10.0.0.1:8080", "h2": "http://10.0.0.2:8080", "h3": "http://10.0.0.3:8080",
         "h4": "http://10.0.0.4:8080", "h5": "http://10.0.0.5:8080"}
RECV_TIMEOUT_MS = 20000
PEER_TIMEOUT_MS = 3000


class PeerAgent:
    """Delivers a forwarded request to the gateway of the host its URL names; h3 refuses, h4 never answers, h5
    closes the connection without answering (its gateway killed mid-exchange)."""

    def __init__(self) -> None:
        self.hosts: dict[str, RequestTraversalAgent] = {}
        self.sent: list[tuple[str, bytes]] = []
        self.silent: list[Deferred] = []

    def request(self, method, uri, headers=None, bodyProducer=None):
        address = urlsplit(uri.decode()).hostname
        host = {urlsplit(url).hostname: name for name, url in PEERS.items()}[address]
        self.sent.append((host, uri))
        if host == "h3":
            return fail(ConnectionRefusedError())
        if host == "h4":
            d = Deferred()
            self.silent.append(d)
            return d
        if host == "h5":
            return fail(ResponseNeverReceived([Failure(ConnectionDone())]))
        return self.hosts[host].request(method, uri, headers, bodyProducer)

    def flush(self) -> None:
        for agent in self.hosts.values():
            agent.flush()


class Host(Harness):
    """One host: the gateway test's harness with a [cluster] table, the job secret and the peer agent."""

    def __init__(self, tmp_path, name: str, peers: PeerAgent, clock: Clock, cluster_token: str = CLUSTER_TOKEN):
        self.name = name
        keys = tmp_path / f"keys-{name}.toml"
        keys.write_text(f'[keys.tenant-a]\nhash = "{hash_key(KEY)}"\n'
                        f'[keys.slow]\nhash = "{hash_key(SLOW_KEY)}"\nrate_limit_qps = 2\n')
        self.clock = clock
        self.model = FakeModel()
        self.upstream_agent = RequestTraversalAgent(self.model.app.resource())
        self.registry = new_registry()
        metrics = GatewayMetrics(self.registry)
        auth = Authenticator(decide({**TOKENS, "SERVICE_CLUSTER_TOKEN": cluster_token}, str(keys)))
        config = ClusterConfig(host_id=name, peers=PEERS, peer_timeout_ms=PEER_TIMEOUT_MS, peer_connect_timeout_ms=500)
        self.cluster = Cluster(reactor=clock, config=config, authenticator=auth, secret=SECRET, metrics=metrics,
                               recv_timeout_s=RECV_TIMEOUT_MS / 1000.0, agent=peers)
        self.app = GatewayApp(
            clock=clock, catalog=Catalog([Upstream("GEN", 9004, "/generate", True, "up-token")]), authenticator=auth,
            proxy=Proxy(clock, self.upstream_agent, RECV_TIMEOUT_MS / 1000.0), metrics=metrics,
            registry=self.registry, upstream_recv_timeout_ms=RECV_TIMEOUT_MS, max_body_bytes=1 << 20,
            cluster=self.cluster)
        resource = CorsResource.around(self.app, ("http://127.0.0.1:8787",))
        self.client = StubTreq(resource)
        peers.hosts[name] = RequestTraversalAgent(resource)
        self.peers = peers

    def settle(self, d):
        for _ in range(8):
            self.peers.flush()
            self.upstream_agent.flush()
            self.client.flush()
        return super().settle(d)

    def metrics(self) -> str:
        return render(self.registry).decode()


@pytest.fixture
def hosts(tmp_path):
    clock, peers = Clock(), PeerAgent()
    return Host(tmp_path, "h1", peers, clock), Host(tmp_path, "h2", peers, clock)


def job_of(host: str) -> str:
    return jobid.mint(jobid.JobOwner(host, 0), SECRET)


def forged(job: str) -> str:
    """``job`` with the last byte of its tag changed (set to "00", it was the id itself once in 256: a CI failure)."""
    return job[:-2] + ("11" if job.endswith("00") else "00")


def forwarded_headers(model: FakeModel) -> dict:
    return model.received[-1]["headers"]


def test_a_poll_for_a_peers_job_is_answered_by_the_peer(hosts):
    h1, h2 = hosts
    job = job_of("h2")
    r = h1.call("GET", f"/v1/models/GEN/jobs/{job}", headers={"X-Request-ID": "poll-1"})
    assert r.code == 200 and r.json["job_id"] == job and r.json["state"] == "running"
    assert r.json["poll_url"] == f"/v1/models/GEN/jobs/{job}"  # rewritten by h2's gateway, passed through
    assert h(r, "X-Service-Key") == "tenant-a"  # the client's key, checked by h1
    assert h1.model.received == [] and [x["uri"] for x in h2.model.received] == [f"/jobs/{job}"]
    assert h1.peers.sent == [("h2", f"http://10.0.0.2:8080/v1/models/GEN/jobs/{job}".encode())]
    # What reached h2's model: its own upstream token and the client's request id; nothing of the cluster's.
    assert forwarded_headers(h2.model)["authorization"] == ["Bearer up-token"]
    assert forwarded_headers(h2.model)["x-request-id"] == ["poll-1"]
    assert 'service_gateway_forwarded_total{outcome="answered",peer="h2"} 1.0' in h1.metrics()
    assert 'service_gateway_key_requests_total{key="tenant-a"} 1.0' in h1.metrics()
    # h2 admitted it as the cluster: no API key was checked there, no bucket spent.
    assert 'service_gateway_key_requests_total{key="tenant-a"}' not in h2.metrics()


def test_wait_and_result_are_forwarded_with_their_query_and_status(hosts):
    h1, h2 = hosts
    job = job_of("h2")
    w = h1.call("GET", f"/v1/models/GEN/jobs/{job}/wait?timeout=1500")
    assert w.code == 200 and w.json["state"] == "running"
    result = h1.call("GET", f"/v1/models/GEN/jobs/{job}/result")
    assert result.code == 409 and result.json["error"] == "job is running"
    assert [x["uri"] for x in h2.model.received] == [f"/jobs/{job}/wait?timeout=1500", f"/jobs/{job}/result"]
    assert h1.model.received == []


def test_own_jobs_stay_on_this_host_and_unverifiable_ones_are_404_here(hosts):
    h1, h2 = hosts
    own, plain = job_of("h1"), "job_1"
    assert h1.call("GET", f"/v1/models/GEN/jobs/{own}").code == 200
    for job in (forged(job_of("h2")), plain):  # a tag that does not verify names no host: unknown, not forwarded
        body = assert_envelope(h1.call("GET", f"/v1/models/GEN/jobs/{job}"), 404, 63)
        assert body["error"] == f"job not found: {job}"
    assert [x["uri"] for x in h1.model.received] == [f"/jobs/{own}"]
    assert h2.model.received == [] and h1.peers.sent == []


def test_a_job_id_signed_with_another_secret_is_logged_at_most_once_a_minute(hosts):
    """Hosts with different SERVICE_JOB_SECRETs 404 each other's jobs: nothing said why.  An id of this service's
    shape that does not verify now gets a line, at most one a minute (a client's forgery costs no more)."""
    from twisted.logger import capturedLogs

    h1, _ = hosts
    other = jobid.mint(jobid.JobOwner("h2", 0), "another-secret-" + "x" * 40)
    with capturedLogs() as events:
        for _ in range(3):
            assert_envelope(h1.call("GET", f"/v1/models/GEN/jobs/{other}"), 404, 63)
        assert_envelope(h1.call("GET", "/v1/models/GEN/jobs/job_1"), 404, 63)  # not of the shape: no line
        h1.clock.advance(60)
        assert_envelope(h1.call("GET", f"/v1/models/GEN/jobs/{other}/wait?timeout=10"), 404, 63)
    lines = [e["log_format"] for e in events if "SERVICE_JOB_SECRET" in e.get("log_format", "")]
    assert len(lines) == 2
    assert [e["job_id"] for e in events if "job_id" in e] == [other, other]
    assert "the secret must be the same on every host" in lines[0]


@pytest.mark.parametrize("query", ["", "?timeout=999999999", "?timeout=abc"])
def test_an_unverifiable_job_is_404_on_wait_whatever_the_budget(hosts, query):
    """An unknown job is 404 whatever N is, through the gateway too: the id is checked before the budget (a
    budget at or above upstream_recv_timeout_ms was answered 502 first)."""
    h1, h2 = hosts
    body = assert_envelope(h1.call("GET", f"/v1/models/GEN/jobs/job_1/wait{query}"), 404, 63)
    assert body["error"] == "job not found: job_1"
    assert h1.model.received == h2.model.received == []


def test_a_job_of_a_host_that_is_no_peer_is_404(hosts):
    h1, _ = hosts
    job = job_of("h9")
    body = assert_envelope(h1.call("GET", f"/v1/models/GEN/jobs/{job}/result"), 404, 63)
    assert body["error"].startswith(f"job not found: {job}") and "host h9 is not among" in body["error"]
    assert h1.model.received == [] and h1.peers.sent == []


def test_a_peer_that_refuses_the_connection_makes_the_job_404_at_once(hosts):
    h1, _ = hosts
    job = job_of("h3")
    for path in ("", "/wait?timeout=5000", "/result"):
        body = assert_envelope(h1.call("GET", f"/v1/models/GEN/jobs/{job}{path}"), 404, 63)
        assert body["error"].startswith(f"job not found: {job}") and "host h3 is not reachable" in body["error"]
    assert 'service_gateway_forwarded_total{outcome="unreachable",peer="h3"} 3.0' in h1.metrics()


def test_a_peer_gateway_that_closes_without_answering_is_named_as_the_gateway(hosts):
    """The 404's reason blamed "the model server" when it was the peer's gateway that closed the connection (a
    scaling probe killed a gateway with a forwarded wait in flight)."""
    h1, _ = hosts
    job = job_of("h5")
    body = assert_envelope(h1.call("GET", f"/v1/models/GEN/jobs/{job}"), 404, 63)
    assert body["error"] == (f"job not found: {job} (the exchange with its host h5 failed: its gateway closed the "
                             "connection without answering (did it stop or crash?))")
    assert 'service_gateway_forwarded_total{outcome="transport",peer="h5"} 1.0' in h1.metrics()


def pending(host: Host, path: str) -> tuple[Deferred, list]:
    """A request left in flight, and the list its reply lands in."""
    d = host.call("GET", path, settle=False)
    answered: list = []
    d.addBoth(lambda r: answered.append(r) or r)
    host.client.flush()
    return d, answered


def test_a_silent_peer_makes_a_poll_502_after_the_peer_timeout(hosts):
    """A peer gateway that took the request and did not answer in time is up: its job may be there (an operator
    probe: a done job was 404 "job not found" on every other host while its model server was stopped for a while,
    and 502 from its own gateway).  502, as a gateway answers a model server that hangs, never 404."""
    h1, _ = hosts
    d, answered = pending(h1, f"/v1/models/GEN/jobs/{job_of('h4')}")
    h1.clock.advance(PEER_TIMEOUT_MS / 1000.0 - 0.01)
    h1.client.flush()
    assert answered == []
    h1.clock.advance(0.02)
    body = assert_envelope(h1.settle(d), 502, 502)
    assert body["error"] == ("its host h4 did not answer within 3000 ms ([cluster] peer_timeout_ms): the job may "
                             "still be there; ask again later")
    assert 'service_gateway_forwarded_total{outcome="timeout",peer="h4"} 1.0' in h1.metrics()


def test_a_forwarded_wait_gets_its_budget_on_top(hosts):
    h1, _ = hosts
    job = job_of("h4")
    d, answered = pending(h1, f"/v1/models/GEN/jobs/{job}/wait?timeout=15000")
    h1.clock.advance(15 + PEER_TIMEOUT_MS / 1000.0 - 0.5)  # 17.5 s: within budget + peer timeout (18 s)
    h1.client.flush()
    assert answered == []
    h1.clock.advance(0.51)
    assert "did not answer within 18000 ms" in assert_envelope(h1.settle(d), 502, 502)["error"]
    # Just below the 20 s receive timeout (the most a wait may ask): 19 + 3 s, not capped at 20 s, where the
    # peer's own answer at the end of its budget raced the deadline (a jobs probe found that race on one host).
    long, answered = pending(h1, f"/v1/models/GEN/jobs/{job}/wait?timeout=19000")
    h1.clock.advance(19 + PEER_TIMEOUT_MS / 1000.0 - 0.01)
    h1.client.flush()
    assert answered == []
    h1.clock.advance(0.02)
    assert_envelope(h1.settle(long), 502, 502)


def test_the_cluster_token_is_accepted_only_on_a_forwarded_get_of_a_job_of_this_host(hosts):
    _, h2 = hosts
    forwarded = {"X-Service-Forwarded-By": "h1"}
    own = job_of("h2")
    ok = h2.call("GET", f"/v1/models/GEN/jobs/{own}", token=CLUSTER_TOKEN, headers=forwarded)
    assert ok.code == 200 and h(ok, "X-Service-Key") == "cluster-token"
    refused = [
        ("GET", f"/v1/models/GEN/jobs/{own}", {}),  # not marked as forwarded
        ("GET", f"/v1/models/GEN/jobs/{job_of('h1')}", forwarded),  # another host's job
        ("GET", f"/v1/models/GEN/jobs/{forged(own)}", forwarded),  # a forged id
        ("POST", "/v1/models/GEN/jobs", forwarded),
        ("POST", "/v1/models/GEN/infer", forwarded),
        ("GET", "/nowhere", forwarded),
    ]
    for method, path, headers in refused:
        r = h2.call(method, path, token=CLUSTER_TOKEN, headers=headers, body=b"{}" if method == "POST" else None)
        assert_envelope(r, 401, 401)
    assert h2.call("GET", "/metrics", token=CLUSTER_TOKEN).code == 401
    assert len(h2.model.received) == 1


def test_a_forwarded_request_is_never_forwarded_again_and_a_clients_marker_is_ignored(hosts):
    """A peer's forwarded request carries the cluster token, which is no credential for another host's job (401):
    it never goes further. The marker alone, from a client with its own key, was honoured: 404 "a forwarded
    request is not forwarded again" for a job that exists (a scaling probe). Such a request is forwarded as any."""
    h1, h2 = hosts
    job = job_of("h1")
    marker = {"X-Service-Forwarded-By": "h3"}
    assert_envelope(h2.call("GET", f"/v1/models/GEN/jobs/{job}", token=CLUSTER_TOKEN, headers=marker), 401, 401)
    assert h2.peers.sent == [] and h1.model.received == [] and h2.model.received == []
    r = h2.call("GET", f"/v1/models/GEN/jobs/{job}", headers=marker)
    assert r.code == 200 and r.json["job_id"] == job
    assert h2.peers.sent == [("h1", f"http://10.0.0.1:8080/v1/models/GEN/jobs/{job}".encode())]


def test_the_clients_bucket_is_spent_once_at_the_first_gateway(hosts):
    h1, h2 = hosts
    job = job_of("h2")
    codes = [h1.call("GET", f"/v1/models/GEN/jobs/{job}", token=SLOW_KEY).code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert len(h2.model.received) == 2


def test_a_peer_with_another_cluster_token_is_502(tmp_path):
    clock, peers = Clock(), PeerAgent()
    h1 = Host(tmp_path, "h1", peers, clock)
    Host(tmp_path, "h2", peers, clock, cluster_token="another-token")
    body = assert_envelope(h1.call("GET", f"/v1/models/GEN/jobs/{job_of('h2')}"), 502, 502)
    assert "SERVICE_CLUSTER_TOKEN differs between hosts" in body["error"]
    assert 'service_gateway_forwarded_total{outcome="refused",peer="h2"} 1.0' in h1.metrics()


def test_without_a_job_secret_every_job_is_this_hosts(tmp_path):
    """A gateway started by hand without SERVICE_JOB_SECRET cannot read owners: its model answers every job."""
    clock, peers = Clock(), PeerAgent()
    h1 = Host(tmp_path, "h1", peers, clock)
    h1.cluster.secret = None
    assert h1.call("GET", f"/v1/models/GEN/jobs/{job_of('h2')}").code == 200
    assert len(h1.model.received) == 1 and peers.sent == []
