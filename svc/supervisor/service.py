"""The supervisor's service tree: the management listener and the children.

On start the listener comes up, then the gateway and the profile's model
servers are started.  On stop (SIGTERM/SIGINT) every child is stopped (TERM
to its process group, KILL after the grace) before the process exits 0, so
no child is left behind; the logs folder's lock is let go only then.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.application.internet import TCPServer
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from svc.contract.protocol import SUPERVISOR_PROGRAM as PROGRAM
from svc.contract.protocol import http_url
from svc.infra.metrics import HttpMetrics, new_registry
from svc.infra.process import ListeningMultiService, freeze_heap
from svc.infra.reactors import IServiceReactor
from svc.supervisor.api import ManagementApi
from svc.supervisor.logsink import LogDirLock
from svc.supervisor.manager import GATEWAY, ChildManager
from svc.supervisor.metrics import ChildCollector
from svc.supervisor.series import SeriesCollector
from svc.web.httplimits import HttpLimits
from svc.web.site import JsonSite

log = Logger()

#: How often the logs folder's lock file is checked (a stat): removed with its folder, it is made and locked again.
LOCK_CHECK_S = 1.0


class SupervisorService(ListeningMultiService):
    program = PROGRAM

    def __init__(self, *, reactor: IServiceReactor, manager: ChildManager, token: str, host: str, port: int,
                 ui_dir: str, fetch: Callable[[int, str, str | None], Deferred], limits: HttpLimits | None = None,
                 log_lock: LogDirLock | None = None) -> None:
        super().__init__()
        self.log_lock = log_lock  # held until every child has stopped
        self._lock_loop = LoopingCall(self._keep_log_lock)
        self._lock_problem: str | None = None
        self.reactor = reactor
        self.manager = manager
        self.host, self.port = host, port
        self.registry = new_registry()
        self.registry.register(ChildCollector(manager))
        self.series = SeriesCollector(reactor=reactor, children=lambda: manager.children, tokens=manager.metrics_token,
                                      fetch=fetch, gateway=GATEWAY)
        self.api = ManagementApi(manager=manager, token=token, registry=self.registry,
                                 metrics=HttpMetrics(self.registry), ui_dir=ui_dir, series=self.series, fetch=fetch)
        limits = limits or HttpLimits(max_connections=128)
        self.site = JsonSite.for_app(self.api, self.api.resource(), max_body_bytes=64 * 1024, limits=limits,
                                     reactor=reactor)
        self.listen_address = f"{host}:{port}"
        self.listener = TCPServer(port, self.site, backlog=limits.listen_backlog, interface=host)
        self.listener.setServiceParent(self)

    def startService(self) -> None:
        super().startService()
        log.info("supervisor on {url}/ (profile {profile}, device {device})",
                 url=http_url(self.host, self.port), profile=self.manager.profile.name, device=self.manager.profile.device)
        if self.log_lock is not None:
            self.log_lock.claim()  # a daemon's pid, now that twistd has forked
            self._lock_loop.clock = self.reactor
            self._lock_loop.start(LOCK_CHECK_S, now=False)
        freeze_heap()  # everything the supervisor keeps for life exists now (svc.infra.process.freeze_heap)
        self.manager.start_all()
        self.series.start()

    def _keep_log_lock(self) -> None:
        """The logs folder's lock, taken again if the folder or its lock file was removed (said once if not)."""
        assert self.log_lock is not None
        try:
            problem = self.log_lock.keep()
        except OSError as e:
            problem = f"cannot lock {self.log_lock.path} again: {e.strerror or e}"
        if problem is not None and problem != self._lock_problem:
            log.warn("the logs folder's lock file was removed and could not be taken again: {problem}", problem=problem)
        self._lock_problem = problem

    def stopService(self) -> Deferred:
        return ensureDeferred(self._stop())

    async def _stop(self) -> None:
        log.info("stopping every child")
        self.series.stop()
        await self.manager.stop_all()
        if self._lock_loop.running:
            self._lock_loop.stop()
        if self.log_lock is not None:
            self.log_lock.release()
        await super().stopService()
