"""Which host owns a job, and forwarding a job request to that host's gateway.

A job lives in the model server of the host that admitted it (jobs are kept
in memory only), and its id names that host, signed with the job secret
every host shares (svc.contract.jobid).  Behind HAProxy a poll, wait or result may
reach any host's gateway, so the gateway reads the owner from the id:

* an id of this host: the replica it names answers it (svc.gateway.owners,
  which also answers 404 "job not found" for an id that does not verify);
* an id of a peer (``[cluster] peers``): the request is forwarded to that
  peer's gateway, the same gateway path, with the cluster token as Bearer
  (``SERVICE_CLUSTER_TOKEN``, the same on every host) and
  ``X-Service-Forwarded-By: <this host>``.  The peer's status, body and the
  headers a gateway passes back are the reply (the peer already rewrote the
  job URLs);
* an id of a host that is not a peer, or a peer that refuses the connection
  or does not accept it within ``peer_connect_timeout_ms``: 404 with
  ``error`` "job not found: ..." in the envelope of a model server's
  unknown-job 404, since the job is gone with its host;
* a peer that takes the request but does not answer in time
  (``peer_timeout_ms``; a wait gets its budget on top, at most
  ``upstream_recv_timeout_ms``): 502, as its own gateway answers a model
  server that hangs: the host is up, and its job may be there (an operator
  probe: a job that was done was 404 while its model server was stopped
  for a while).  Never a hang.

A gateway accepts the cluster token only on these job GETs, only with the
forwarded header, and only for a job of its own host (:meth:`Cluster.admits`);
anywhere else it is a wrong token (401).  A forwarded request is answered by
its receiver, never forwarded again, so two hosts whose configurations
disagree cannot pass a request back and forth.  The client's API key was
checked, and its bucket spent, by the first gateway; the peer does not
check it again.

Peers are reached through their own connection pool (not the model
servers'), with a short connect timeout.  Unlike requests to model servers,
a GET that meets a pooled connection the peer closed meanwhile (a peer
gateway restarting closes its idle connections) is retried once on a new
connection: job GETs are idempotent, and without the retry a live job would
be reported as not found.
"""

from __future__ import annotations

from typing import Any, cast

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from svc.auth import CLUSTER_TOKEN_NAME
from svc.cluster_config import ClusterConfig
from svc.contract import jobid
from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.contract.protocol import FORWARDED_BY_HEADER, PASSED_REPLY_HEADERS
from svc.gateway.credentials import Authenticator, Principal
from svc.gateway.proxy import Proxy, UpstreamFailed, UpstreamUnreachable, make_agent, make_pool
from svc.infra.metrics import GatewayMetrics
from svc.infra.reactors import IClientReactor
from svc.web.replies import bearer_token, header

log = Logger()

#: Seconds between two lines about job ids that do not verify (:meth:`Cluster.unverified`).
UNVERIFIED_LOG_S = 60.0

#: The principal of a peer gateway's forwarded job request (the ``X-Service-Key`` of its reply).
CLUSTER_PRINCIPAL = Principal(CLUSTER_TOKEN_NAME)
#: Of the client's request headers, those a forwarded request carries.
FORWARDED_REQUEST_HEADERS = (b"accept", b"x-request-id")
_PASSED = tuple(n.encode() for n in PASSED_REPLY_HEADERS)
#: Persistent connections kept per peer gateway, and how long an idle one is kept (below a gateway's
#: own idle_timeout_s, 660 s by default, so that the peer rarely closes one first).
PEER_CONNECTIONS = 16
PEER_IDLE_S = 30.0


def job_not_found(job_id: str, why: str) -> ApiError:
    """The 404 of a job whose host cannot answer, worded like a model server's unknown job."""
    return ApiError(st.NOT_FOUND, f"job not found: {job_id[:80]} ({why})")


class Cluster:
    """This host among its peers: who owns a job, and the forwarding to a peer's gateway."""

    def __init__(self, *, reactor: IReactorTime, config: ClusterConfig, authenticator: Authenticator,
                 secret: str | None, metrics: GatewayMetrics, recv_timeout_s: float,
                 agent: IAgent | None = None) -> None:
        self.reactor = reactor
        self.config = config
        self.host_id = config.host_id
        self.peers = {host: url for host, url in config.peers.items() if host != config.host_id}
        self.auth = authenticator
        self.secret = secret
        self.metrics = metrics
        self.recv_timeout_s = recv_timeout_s
        self.peer_timeout_s = config.peer_timeout_ms / 1000.0
        self._quiet_until = float("-inf")  # no line about an id that does not verify before then
        self.pool: HTTPConnectionPool | None = None
        if agent is None and self.peers:
            # Peers to reach and no agent given: the gateway's own reactor, which connects (IClientReactor).
            reactor = cast(IClientReactor, reactor)
            self.pool = make_pool(reactor, max_per_host=PEER_CONNECTIONS, idle_timeout_s=PEER_IDLE_S)
            self.pool.retryAutomatically = True  # job GETs only (module docstring)
            agent = make_agent(reactor, self.pool, config.peer_connect_timeout_ms / 1000.0)
        self.agent = agent

    # -- whose job -----------------------------------------------------------------------------

    def unverified(self, job_id: str) -> None:
        """``job_id`` has the shape of this service's ids but does not verify (404): on several hosts, say why
        at most once a minute.  Forged, or made by a host whose ``SERVICE_JOB_SECRET`` differs: every read of
        that host's jobs through another host is then 404, and nothing else says so."""
        if not self.peers or self.secret is None or jobid.parse_unverified(job_id) is None:
            return
        if jobid.parse(job_id, self.secret) is not None:
            return  # it verifies: its replica is gone, which is no one's mistake
        now = self.reactor.seconds()
        if now < self._quiet_until:
            return
        self._quiet_until = now + UNVERIFIED_LOG_S
        log.warn("job id {job_id} does not verify with this gateway's SERVICE_JOB_SECRET (404): forged, or made by a "
                 "host with another secret; the secret must be the same on every host (at most one such line a "
                 "minute)", job_id=job_id[:80])

    def owner(self, job_id: str) -> str | None:
        """The host id a verified job id names ("" on a single host); None when it does not verify."""
        if self.secret is None:
            return None
        owner = jobid.parse(job_id, self.secret)
        return owner.host if owner is not None else None

    def admits(self, request: Any, job_id: str) -> Principal | None:
        """The cluster principal for a peer's forwarded request for a job of this host, else None.

        None sends the request through the usual credentials, where the
        cluster token is no key and no static token: 401.
        """
        if not self.host_id or header(request, FORWARDED_BY_HEADER.encode()) is None:
            return None
        if not self.auth.is_cluster(bearer_token(request)) or self.owner(job_id) != self.host_id:
            return None
        return CLUSTER_PRINCIPAL

    def peer_for(self, request: Any, job_id: str, host: str) -> str:
        """The peer whose gateway answers a request for a job of ``host`` (another host's, per
        svc.gateway.owners).

        Raises the 404 of a job whose host is not a peer.  A request a peer
        forwarded never comes here (:meth:`admits` takes it, or its cluster
        token is refused as a credential: 401), so it is never forwarded
        again; the forwarded-by header of a client's own request is ignored
        (it answered 404 for a job that exists: a scaling probe).
        """
        if host not in self.peers:
            raise job_not_found(job_id, f"host {host or '(none)'} is not among this host's [cluster] peers")
        return host

    # -- forwarding ----------------------------------------------------------------------------

    def deadline_s(self, budget_ms: int | None) -> float:
        """How long a forwarded request may take: ``peer_timeout_ms`` (within the receive timeout), plus a wait's
        budget (capped at the receive timeout, a wait asked for just below it, the documented most, raced that
        deadline and was a 502)."""
        return min(self.recv_timeout_s, self.peer_timeout_s) + (budget_ms or 0) / 1000.0

    async def forward(self, request: Any, host: str, job_id: str, route: str, path: str, query: bytes = b"",
                      budget_ms: int | None = None) -> bytes:
        """Answer ``request`` with what ``host``'s gateway answers to ``path`` (a gateway job path).

        ``budget_ms``: the budget of a wait (its deadline is longer by it).
        """
        request.service_route = route
        headers = Headers({b"authorization": [b"Bearer " + (self.auth.setup.cluster_token or "").encode("latin-1")],
                           FORWARDED_BY_HEADER.encode(): [self.host_id.encode("ascii")]})
        for name in FORWARDED_REQUEST_HEADERS:
            values = request.requestHeaders.getRawHeaders(name)
            if values:
                headers.setRawHeaders(name, values)
        url = (self.peers[host] + path).encode("ascii") + (b"?" + query if query else b"")
        deadline = self.deadline_s(budget_ms)
        assert self.agent is not None  # a peer to ask: the agent was made (or given) with the peers
        try:
            reply = await Proxy(self.reactor, self.agent, deadline, upstream="its gateway").forward(
                b"GET", url, headers, None)
        except UpstreamUnreachable as e:
            self._count(host, "unreachable")
            raise job_not_found(job_id, f"its host {host} is not reachable: {e}") from None
        except UpstreamFailed as e:
            self._count(host, e.kind)
            if e.kind == "timeout":  # its gateway took the request: the host is up, the job may well be there
                raise ApiError(st.BAD_GATEWAY, f"its host {host} did not answer within {deadline * 1000:.0f} ms "
                                               "([cluster] peer_timeout_ms): the job may still be there; ask again "
                                               "later") from None
            raise job_not_found(job_id, f"the exchange with its host {host} failed: {e}") from None
        if reply.code == 401:
            self._count(host, "refused")
            log.error("peer {host} refused this gateway's cluster token: is SERVICE_CLUSTER_TOKEN the same on "
                      "every host?", host=host)
            raise ApiError(st.BAD_GATEWAY, f"the gateway of host {host}, which holds this job, refused this "
                                           "host's cluster token (SERVICE_CLUSTER_TOKEN differs between hosts)")
        self._count(host, "answered")
        request.setResponseCode(reply.code)
        for name in _PASSED:
            values = reply.headers.getRawHeaders(name)
            if values:
                request.responseHeaders.setRawHeaders(name, values)
        request.setHeader(b"Content-Length", str(len(reply.body)).encode())
        return reply.body

    def _count(self, host: str, outcome: str) -> None:
        self.metrics.forwarded.labels(host, outcome).inc()

    def describe(self) -> str:
        """The startup log's words for this host's place in the cluster (never a secret)."""
        if not self.peers:
            return "a single host" if not self.host_id else f"host {self.host_id} without peers"
        return f"host {self.host_id} with peers {', '.join(sorted(self.peers))}"
