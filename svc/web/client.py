"""Outgoing HTTP connections that do not log every connection (the gateway's upstreams, the supervisor's probes)."""

from __future__ import annotations

from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory


class _QuietClientFactory(_HTTP11ClientFactory):
    noisy = False


class QuietConnectionPool(HTTPConnectionPool):
    """A client connection pool that does not log "Starting factory" for every connection.

    The gateway opens connections to model servers and the supervisor probes
    its children every few seconds: the default factories would fill the logs
    with two lines per connection.
    """

    _factory = _QuietClientFactory
