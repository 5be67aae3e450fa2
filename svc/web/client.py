"""Outgoing HTTP connections: pools that do not log every connection (the gateway's upstreams, the supervisor's
probes), and requests to an IPv6 address (the supervisor's probes of a gateway on ``::1``, ``svcctl --gateway
http://[::1]:8080``)."""

from __future__ import annotations

from typing import Any

from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, wrapClientTLS
from twisted.web.client import BrowserLikePolicyForHTTPS, HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from svc.contract.protocol import LOOPBACK


class _QuietClientFactory(_HTTP11ClientFactory):
    noisy = False


class QuietConnectionPool(HTTPConnectionPool):
    """A client connection pool that does not log "Starting factory" for every connection.

    The gateway opens connections to model servers and the supervisor probes
    its children every few seconds: the default factories would fill the logs
    with two lines per connection.
    """

    _factory = _QuietClientFactory


@implementer(IAgentEndpointFactory)
class AddressByPort:
    """Where a request connects, by its URL's port: the address ``hosts`` names for the port, else loopback.

    Every request URL names 127.0.0.1 and this picks the address to connect to: treq cannot take an IPv6
    literal in a URL (hyperlink runs it through IDNA: ``InvalidCodepoint: Codepoint U+003A``), so a gateway
    bound to ``::1`` had every probe and scrape of the supervisor raise, and ``svcctl --gateway
    http://[::1]:8080`` could make no request.  A caller that needs the ``Host`` header of the address sends it
    itself (svcctl does; the probes' children take any).  An ``https`` URL is TLS to that address, checked as the agent's default policy checks it.
    """

    def __init__(self, reactor: Any, hosts: dict[int, str], timeout: float) -> None:
        self.reactor = reactor
        self.hosts = hosts
        self.timeout = timeout

    def endpointForURI(self, uri: Any) -> Any:
        host = self.hosts.get(uri.port)
        if host is None:
            return TCP4ClientEndpoint(self.reactor, LOOPBACK, uri.port, timeout=self.timeout)
        address = host.strip("[]")
        endpoint = HostnameEndpoint(self.reactor, address, uri.port, timeout=self.timeout)
        if uri.scheme == b"https":
            return wrapClientTLS(BrowserLikePolicyForHTTPS().creatorForNetloc(address.encode("ascii"), uri.port),
                                 endpoint)
        return endpoint
