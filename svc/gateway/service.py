"""The gateway's service tree: the listener, the upstream connection pool, the replicas' probe and the
rate-limit store.

The listener binds the configured address, or adopts the listening socket
the supervisor hands over (``listen_fd``, see svc.gateway.drain).  The
per-key buckets are local or in Redis (``rate_limit_store``,
svc.gateway.ratestore: a child service that connects on start); job
requests for other hosts' jobs go to their gateways (``[cluster]``,
svc.gateway.cluster).  On stop it stops accepting, lets the requests in
flight finish (``drain_timeout``), then closes the pools' cached
connections (the pools are the gateway's own, never the global one) and
the Redis connection, so SIGTERM exits promptly once the replies are out.
"""

from __future__ import annotations

from twisted.application.internet import TCPServer
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.logger import Logger
from twisted.web.iweb import IAgent

from svc.auth import AuthSetup
from svc.cluster_config import own_entry_problem
from svc.contract.protocol import GATEWAY_PROGRAM as PROGRAM
from svc.contract.protocol import http_url, local_url
from svc.gateway.app import GatewayApp
from svc.gateway.balancer import Balancer
from svc.gateway.catalog import Catalog
from svc.gateway.cluster import Cluster
from svc.gateway.config import GatewayConfig
from svc.gateway.cors import CorsResource
from svc.gateway.credentials import Authenticator, describe
from svc.gateway.drain import AdoptedListener, DrainingSite, signal_closed, signal_ready
from svc.gateway.jobcounts import JobCounts
from svc.gateway.proxy import Proxy, make_agent, make_pool
from svc.gateway.ratestore import RedisRates, make_rates
from svc.gateway.readiness import ReplicaProbe
from svc.infra.metrics import GatewayMetrics, new_registry
from svc.infra.process import ORPHAN_EXIT_S, ListeningMultiService, freeze_heap, supervisor_gone
from svc.infra.reactors import IServiceReactor
from svc.web.httplimits import HttpLimits
from svc.web.replies import dumps

log = Logger()


#: Orphaned: requests in flight get this long (svc.infra.process.ORPHAN_EXIT_S bounds the exit).
ORPHAN_DRAIN_S = 0.5


class GatewayService(ListeningMultiService):
    program = PROGRAM

    def __init__(self, *, reactor: IServiceReactor, config: GatewayConfig, setup: AuthSetup, catalog: Catalog,
                 agent: IAgent | None = None, listen_fd: int | None = None, ready_fd: int | None = None,
                 job_secret: str | None = None, peer_agent: IAgent | None = None, openapi: dict | None = None) -> None:
        super().__init__()
        self.reactor = reactor
        self.config = config
        self.setup = setup
        self.registry = new_registry()
        self.metrics = GatewayMetrics(self.registry)
        self.pool = None
        if agent is None:
            self.pool = make_pool(reactor, max_per_host=config.upstream_max_connections,
                                  idle_timeout_s=catalog.pool_idle_timeout(config.upstream_idle_timeout_s))
            agent = make_agent(reactor, self.pool, config.upstream_connect_timeout_ms / 1000.0)
        self.balancer = Balancer()
        authenticator = Authenticator(setup)
        self.rates = make_rates(reactor, config, self.metrics.ratelimit_store_up)
        if isinstance(self.rates, RedisRates):
            self.rates.setServiceParent(self)  # connects on start, closes on stop
        self.cluster = Cluster(reactor=reactor, config=config.cluster, authenticator=authenticator,
                               secret=job_secret, metrics=self.metrics,
                               recv_timeout_s=config.upstream_recv_timeout_ms / 1000.0, agent=peer_agent)
        self.app = GatewayApp(
            clock=reactor,
            catalog=catalog,
            authenticator=authenticator,
            proxy=Proxy(reactor, agent, config.upstream_recv_timeout_ms / 1000.0),
            metrics=self.metrics,
            registry=self.registry,
            upstream_recv_timeout_ms=config.upstream_recv_timeout_ms,
            key_max_in_flight=config.key_max_in_flight,
            max_body_bytes=config.max_body_bytes,
            balancer=self.balancer,
            rates=self.rates,
            cluster=self.cluster,
            openapi=openapi,
        )
        self.catalog = catalog
        self.openapi = openapi
        # service_async_jobs_total{model, state}: the model servers' own, read at each scrape (svc.gateway.jobcounts).
        self.app.job_counts = JobCounts(clock=reactor, agent=agent, catalog=catalog)
        self.registry.register(self.app.job_counts)
        # Probes the replicas of the models that have several (svc.gateway.readiness); stopped first.
        self.probe = ReplicaProbe(clock=reactor, agent=agent, catalog=catalog, balancer=self.balancer,
                                  interval_s=config.replica_probe_interval_ms / 1000.0)
        self.site = DrainingSite.for_app(
            self.app,
            CorsResource.around(self.app, config.cors_origins),
            max_body_bytes=config.max_body_bytes,
            limits=HttpLimits.from_config(config),
            timeout=config.idle_timeout_s,
            reactor=reactor,
        )
        self.listen_address = f"{config.host}:{config.port}"
        self.ready_fd = ready_fd
        self.listener: TCPServer | AdoptedListener
        if listen_fd is None:
            self.listener = TCPServer(config.port, self.site, backlog=config.listen_backlog, interface=config.host)
        else:
            self.listen_address = f"{config.host}:{config.port} (socket on fd {listen_fd} from the supervisor)"
            self.listener = AdoptedListener(reactor, listen_fd, self.site)
        self.listener.setServiceParent(self)
        self.probe.setServiceParent(self)
        # In-flight requests may wait for a model up to the upstream receive timeout.
        self.drain_timeout = config.upstream_recv_timeout_ms / 1000.0 + 1.0

    def startService(self) -> None:
        super().startService()
        if self.openapi is not None:  # its servers name this gateway's port (the kernel's choice for --port 0)
            self.app.openapi_bytes = dumps({**self.openapi, "servers": [{"url": local_url(self.bound_port())}]})
        for warning in self.setup.warnings:
            log.warn("{warning}", warning=warning)
        info = describe(self.setup)
        log.info("gateway on {url}/ in {mode} mode ({keys} keys, {enabled} enabled; static tokens: "
                 "{static}); routing {models} models: {ids}",
                 url=http_url(self.config.host, self.bound_port()), mode=info["mode"], keys=info["keys"],
                 enabled=info["enabled_keys"], static=", ".join(info["static_tokens"]) or "none",
                 models=len(self.catalog), ids=", ".join(u.id if len(u.replicas) == 1 else f"{u.id} x{len(u.replicas)}"
                                                          for u in self.catalog))
        log.info("rate limits: {store}; cluster: {cluster}", store=self.config.rate_limit_store,
                 cluster=self.cluster.describe())
        own_entry = own_entry_problem(self.config.cluster, self.bound_port())
        if own_entry:
            log.warn("{problem}", problem=own_entry)
        idle = self.catalog.pool_idle_timeout(self.config.upstream_idle_timeout_s)
        if idle < self.config.upstream_idle_timeout_s:
            log.warn("upstream_idle_timeout_s {configured} is not below every model's peer_resp_timeout: "
                     "idle upstream connections close after {idle:g} s", configured=self.config.upstream_idle_timeout_s,
                     idle=idle)
        for problem in self.catalog.connection_problems(self.config.upstream_max_connections,
                                                        self.config.key_max_in_flight):
            log.warn("{problem}", problem=problem)
        missing = [u.id for u in self.catalog if not all(r.token for r in u.replicas)]
        if missing:
            log.warn("no upstream token for {ids}: requests to them carry no Authorization "
                     "(set SERVICE_UPSTREAM_TOKENS or SERVICE_UPSTREAM_TOKEN)", ids=", ".join(missing))
        freeze_heap()  # everything the gateway keeps for life exists now (svc.infra.process.freeze_heap)
        if self.ready_fd is not None:
            # Accepting starts with the reactor; the supervisor waits for this line, not for a
            # probe that the previous gateway on the same socket could answer.
            self.reactor.callWhenRunning(signal_ready, self.ready_fd)

    def bound_port(self) -> int:
        """The port accepted on: the configured one, or the kernel's choice for ``--port 0``."""
        if isinstance(self.listener, TCPServer):
            port = self.listener._port
            assert port is not None  # listening (asked once the service started)
            return port.getHost().port
        return self.config.port

    def stopService(self) -> Deferred:
        return ensureDeferred(self._stop())

    async def _stop(self) -> None:
        drain_timeout = self.drain_timeout
        if supervisor_gone():
            # Orphaned (the supervisor died; its SIGTERM is the kernel's parent-death signal): a new
            # supervisor wants the port back at once, so the requests in flight get little time.
            drain_timeout = min(drain_timeout, ORPHAN_DRAIN_S)
            log.warn("the supervisor is gone: stopping within {bound:g} s", bound=ORPHAN_EXIT_S)
        await super().stopService()  # no more accepting
        if self.ready_fd is not None:
            signal_closed(self.ready_fd)
            self.ready_fd = None
        await self.site.drain(drain_timeout)
        if self.pool is not None:
            await self.pool.closeCachedConnections()
        if self.cluster.pool is not None:
            await self.cluster.pool.closeCachedConnections()
