"""The gateway's readiness probe of model replicas: ``GET /ready`` on each, every probe interval.

Only models of more than one replica are probed (a model of one replica
always gets its process, svc.gateway.balancer).  Every ``interval`` seconds
(``[gateway] replica_probe_interval_ms``, on the injected clock) each such
replica's ``/ready`` is asked once, with a deadline of one interval; 200
marks it ready, anything else (503 while loading or stopping, connection
refused, no answer in time) not ready.  A probe still out when the next round
is due is not doubled.

The probes go through the gateway's own upstream agent with the
supervisor's probe User-Agent, so a model's access log keeps them at debug
level like the supervisor's own (svc.web.site.is_supervisor_probe).  The
timer's body catches everything: a LoopingCall stops at its first exception.
"""

from __future__ import annotations

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.client import readBody
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from svc.contract.protocol import READY_PATH
from svc.gateway.balancer import Balancer
from svc.gateway.catalog import Catalog, Replica
from svc.web.site import SUPERVISOR_USER_AGENT

log = Logger()


class ReplicaProbe(Service):
    """Probes every replica of the models that have several, reporting to the balancer."""

    def __init__(self, *, clock: IReactorTime, agent: IAgent, catalog: Catalog, balancer: Balancer,
                 interval_s: float) -> None:
        self.clock = clock
        self.agent = agent
        self.balancer = balancer
        self.interval = interval_s
        self.replicas = [r for up in catalog if len(up.replicas) > 1 for r in up.replicas]
        self.out: dict[tuple[str, int], Deferred] = {}
        self._loop: LoopingCall | None = None

    def startService(self) -> None:
        super().startService()
        if not self.replicas:
            return
        self._loop = LoopingCall(self.tick)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=True)

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        for d in list(self.out.values()):
            d.cancel()

    def tick(self) -> None:
        """One round: a probe to each replica that has none out."""
        for replica in self.replicas:
            if replica.key in self.out:
                continue
            try:
                d = self.probe(replica)
            except Exception:  # noqa: BLE001 - one bad probe must not stop the timer
                log.failure("probe of {model} replica {index} could not start", model=replica.model,
                            index=replica.index)
                continue
            self.out[replica.key] = d  # before the answer, which may come at once
            d.addCallback(self._answered, replica)

    def probe(self, replica: Replica) -> Deferred:
        """Deferred[bool]: whether ``replica``'s ``/ready`` answered 200 within the interval (never fails)."""
        headers = Headers({b"user-agent": [SUPERVISOR_USER_AGENT.encode()]})
        d = self.agent.request(b"GET", replica.url(READY_PATH), headers, None)
        d.addCallback(lambda response: readBody(response).addCallback(lambda _: response.code == 200))
        d.addTimeout(self.interval, self.clock)
        d.addErrback(lambda _: False)
        return d

    def _answered(self, ready: bool, replica: Replica) -> None:
        self.out.pop(replica.key, None)
        was = self.balancer.is_ready(replica)
        self.balancer.probed(replica, ready)
        if was != ready:
            log.info("{model} replica {index} (port {port}) is {now}", model=replica.model, index=replica.index,
                     port=replica.port, now="ready" if ready else "not ready: skipped until its /ready answers 200")
