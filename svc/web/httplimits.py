"""The connection-level limits of an HTTP listener, as configured (``header_timeout_ms``, ``max_connections``,
``listen_backlog``, ``body_timeout_ms``): what :mod:`svc.web.limits` and :mod:`svc.web.bodylimits` enforce."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HttpLimits:
    """Connection-level limits of one process's HTTP listener.

    ``header_timeout_ms``: a request's headers must be complete this long
    after its first byte (the first request: after the connection opened),
    else 408 and close.  ``max_connections``: open connections served at
    once; past it the one idle longest between requests is closed for the
    next (:mod:`svc.web.idle`), and with none idle the next one gets the
    process's 503 and is closed.
    ``listen_backlog``: the kernel's queue of connections not yet accepted
    (capped by ``net.core.somaxconn``), passed to each process's
    ``TCPServer``; twisted's default of 50 makes the kernel drop SYNs under
    a burst of new connections (ListenOverflows), and those clients wait a
    second or more for the retransmission.  ``body_timeout_ms``: a
    request's body must be complete this long after its headers, else 408
    and close.
    """

    header_timeout_ms: int = 10000
    max_connections: int = 1024
    listen_backlog: int = 1024
    body_timeout_ms: int = 60000

    @classmethod
    def from_config(cls, config: Any) -> "HttpLimits":
        """The limits from any config object that has the four keys as attributes."""
        return cls(config.header_timeout_ms, config.max_connections, config.listen_backlog, config.body_timeout_ms)
