"""The supervisor's HTTP client for its children: readiness probe, metrics scrape, OpenAPI document.

Every request is a GET to http://127.0.0.1:<port><path> (or, for a port
listed in ``hosts``, that address: a gateway bound to a host's own address
on a cluster, which loopback does not reach) with the
``User-Agent`` :data:`svc.web.site.SUPERVISOR_USER_AGENT`, which the children's
access log recognises (with the path and the loopback address) and writes at
debug level: the probes every 2 s and the scrapes every 5 s would otherwise be
most of every log.  One deadline covers the request and the body; connections
are not kept (a request every few seconds gains nothing from a pool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.client import Agent

from svc.contract.envelope import error_text
from svc.contract.protocol import http_url, local_url
from svc.web.client import AddressByPort, QuietConnectionPool
from svc.web.site import SUPERVISOR_USER_AGENT

#: The most of a reply kept by :meth:`HttpProbe.fetch` (a model's /metrics is a few tens of KiB).
MAX_FETCH_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Probed:
    """A readiness probe's answer: ready or not, and why not in the child's own words (None: it did not say)."""

    ok: bool
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.ok


class HttpProbe:
    """Readiness probe (``probe(port, path)`` -> Deferred[Probed]) and a small GET client (:meth:`fetch`)."""

    def __init__(self, reactor: IReactorTime, timeout: float = 2.0, hosts: dict[int, str] | None = None) -> None:
        self.reactor = reactor
        self.timeout = timeout
        self.hosts = hosts or {}
        pool = QuietConnectionPool(reactor, persistent=False)
        self.client = HTTPClient(Agent.usingEndpointFactory(reactor, AddressByPort(reactor, self.hosts, timeout),
                                                            pool=pool))

    def __call__(self, port: int, path: str) -> Deferred:
        """Fires with a :class:`Probed`: whether the reply was 200, and a 503's reason (what a loading model
        server is doing: ``the model is loading: measuring mode 2 of 4 (compile)``)."""
        probe_headers: dict[bytes | str, bytes | str] = {"User-Agent": SUPERVISOR_USER_AGENT}
        d = self.client.get(local_url(port) + path, headers=probe_headers)  # sent where url() says: AddressByPort
        d.addCallback(lambda response: response.content().addCallback(lambda body: Probed(response.code == 200,
                                                                                          error_text(body))))
        d.addTimeout(self.timeout, self.reactor)
        d.addErrback(lambda _: Probed(False))
        return d

    def url(self, port: int, path: str) -> str:
        """Where a child on ``port`` answers ``path``: loopback, unless ``hosts`` names its address (the requests
        connect there through :class:`AddressByPort`)."""
        return http_url(self.hosts.get(port, "127.0.0.1"), port) + path

    def fetch(self, port: int, path: str, token: str | None = None) -> Deferred:
        """The body of a 200 reply to GET ``path`` (bytes), or None on any other status, error or timeout.

        None rather than a failure: a scrape that fails leaves a gap in the
        series, and callers need no errback.
        """
        headers: dict[bytes | str, bytes | str] = {"User-Agent": SUPERVISOR_USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        d = self.client.get(local_url(port) + path, headers=headers)

        def read(response: Any) -> Any:
            body = response.content()
            return body.addCallback(lambda data: data if response.code == 200 and len(data) <= MAX_FETCH_BYTES else None)

        d.addCallback(read)
        d.addTimeout(self.timeout, self.reactor)
        d.addErrback(lambda _: None)
        return d
