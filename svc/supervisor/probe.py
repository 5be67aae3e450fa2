"""Readiness probe: GET http://127.0.0.1:<port><path>, true on 200.

One deadline covers the request and the body (a slow body cannot outlive it); connections
are not kept (a probe every few seconds gains nothing from a pool).
"""

from __future__ import annotations

from typing import Any

from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.web.client import Agent

from svc.http import QuietConnectionPool


class HttpProbe:
    def __init__(self, reactor: Any, timeout: float = 2.0) -> None:
        self.reactor = reactor
        self.timeout = timeout
        pool = QuietConnectionPool(reactor, persistent=False)
        self.client = HTTPClient(Agent(reactor, pool=pool, connectTimeout=timeout))

    def __call__(self, port: int, path: str) -> Deferred:
        d = self.client.get(f"http://127.0.0.1:{port}{path}")
        d.addCallback(lambda response: response.content().addCallback(lambda _: response.code == 200))
        d.addTimeout(self.timeout, self.reactor)
        d.addErrback(lambda _: False)
        return d
