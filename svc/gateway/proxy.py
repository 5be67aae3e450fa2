"""Forwarding one request to a model server, with one deadline and no retries.

The agent is ``twisted.web.client.Agent`` over a persistent
``HTTPConnectionPool`` owned by the gateway.  treq's ``HTTPClient`` is not
used on this path because it always stacks a cookie jar and a gzip decoder on
the agent (and its decoder can leave an empty ``Content-Encoding:`` header
on replies that had none), which a transparent proxy must not have; redirects
are not followed because a bare ``Agent`` never follows them.

One deadline (``upstream_recv_timeout_ms``) covers connecting, sending, the
headers and the whole body (treq's own ``timeout`` stops when the headers
arrive): on expiry the request Deferred is cancelled, which aborts the
connection.  Nothing is retried.  A request on a pooled connection that the
model server already closed would fail, so the pool's idle timeout stays
below the model servers' own, and the body of every reply is read to the end
so the connection goes back to the pool.

Failures are classified for the caller:

* :class:`UpstreamUnreachable` - nothing listens (connection refused): 503;
* :class:`UpstreamFailed` - reset, malformed reply, no reply in time: 502.
  A connection lost after it was made (a model server killed under a
  parked wait) is this kind, for every method: nothing is retried, so a
  second attempt cannot turn it into "connection refused".

Only two outcomes leave a request untouched by the model server, and only
those may be sent to another replica of the model (svc.gateway.app): a
refused connection (nothing was sent) and a reply that :func:`not_admitted`
recognises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from twisted.internet import error as net_error
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import IReactorTCP, IReactorTime
from twisted.web.client import (
    Agent,
    HTTPConnectionPool,
    RequestTransmissionFailed,
    ResponseFailed,
    ResponseNeverReceived,
    readBody,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from svc.contract.status import NOT_READY
from svc.infra.reactors import IClientReactor
from svc.web.client import QuietConnectionPool

#: How much longer than its budget a job wait may take upstream before it is a 502: the model server answers
#: when its budget is spent, so a wait asked for just below ``upstream_recv_timeout_ms`` (the documented most)
#: raced the gateway's own deadline and lost (a 502 instead of the 200 of a job still running).
WAIT_MARGIN_S = 5.0


class UpstreamUnreachable(Exception):
    """The model server did not accept the connection (not running, wrong port)."""


class LocalConnectFailed(Exception):
    """The gateway could not make a socket of its own (out of file descriptors or local ports): the model
    server is not at fault, and is neither marked down nor said not to be running."""


class UpstreamFailed(Exception):
    """The exchange broke after connecting, or took longer than the deadline."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # "transport" or "timeout": the metrics label


@dataclass
class UpstreamReply:
    code: int
    headers: Headers
    body: bytes


def not_admitted(reply: UpstreamReply) -> bool:
    """Whether a model server took nothing of the request: 503 status 65 with no results.

    That is the reply of a process that admits nothing (loading, stopping,
    past ``max_connections``); an admitted request always has one result per
    image, also when it is cut short by a shutdown.  Under ``/v2`` the
    reply is the protocol's ``{"error"}``, whose 503 says the same (a request
    cut short there fails whole, so trying another replica loses nothing).
    """
    if reply.code != NOT_READY.http:
        return False
    try:
        body = json.loads(reply.body)
    except ValueError:
        return False
    if isinstance(body, dict) and set(body) == {"error"}:
        return True
    return isinstance(body, dict) and body.get("status") == NOT_READY.code and body.get("results") == []


def busy(reply: UpstreamReply) -> bool:
    """Whether a model server refused the request as too busy: 429, its wait queue or its job queue full.

    It took nothing of the request (a 429 is always whole), and it is up:
    another replica may have room, and this one is not marked down.
    """
    return reply.code == 429



@implementer(IBodyProducer)
class BytesProducer:
    """A request body already in memory, written in one go."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: Any) -> Deferred:
        consumer.write(self.data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def make_pool(reactor: IReactorTime, *, max_per_host: int, idle_timeout_s: float) -> HTTPConnectionPool:
    """The gateway's own persistent pool (maxPersistentPerHost would default to 2).

    ``retryAutomatically`` is off: Twisted's pool otherwise sends a GET once
    more on a fresh connection when a pooled one is lost before the reply.
    For a wait parked on a model server that dies, that second try meets a
    closed port, and the client got 503 "not running" for what was a
    transport failure (502).  Every request is sent once; the idle timeout
    below the model servers' own keeps stale pooled connections rare.
    """
    pool = QuietConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = max_per_host
    # twisted declares the class default (240) as an int; any number of seconds works (a callLater delay).
    pool.cachedConnectionTimeout = idle_timeout_s  # type: ignore[assignment]
    pool.retryAutomatically = False
    return pool


@implementer(IAgentEndpointFactory)
class LoopbackEndpoints:
    """One cached ``TCP4ClientEndpoint`` per upstream port.

    Upstream URLs are always ``http://127.0.0.1:<port>``: the agent's default
    ``HostnameEndpoint`` would run IDNA encoding and a resolver step for
    every request (about 6% of the gateway's CPU per request, measured with
    py-spy), and name lookups would share the reactor's thread pool with everything else.
    """

    def __init__(self, reactor: IReactorTCP, connect_timeout_s: float) -> None:
        self.reactor = reactor
        self.connect_timeout_s = connect_timeout_s
        self._cache: dict[tuple[bytes, int], TCP4ClientEndpoint] = {}

    def endpointForURI(self, uri: Any) -> TCP4ClientEndpoint:
        key = (uri.host, uri.port)
        endpoint = self._cache.get(key)
        if endpoint is None:
            endpoint = TCP4ClientEndpoint(self.reactor, uri.host.decode("ascii"), uri.port,
                                          timeout=self.connect_timeout_s)
            self._cache[key] = endpoint
        return endpoint


def make_agent(reactor: IClientReactor, pool: HTTPConnectionPool, connect_timeout_s: float) -> Agent:
    return Agent.usingEndpointFactory(reactor, LoopbackEndpoints(reactor, connect_timeout_s), pool=pool)


#: What an agent's failure of an exchange means, in words (its own read "ResponseNeverReceived: Connection was
#: closed cleanly." for a model server killed mid-request, and "ResponseFailed: ...; " for a reply cut short).
_TRANSPORT_WORDS = {
    ResponseNeverReceived: "{upstream} closed the connection without answering (did it stop or crash?)",
    ResponseFailed: "{upstream}'s reply was cut short",
    RequestTransmissionFailed: "the request could not be sent to {upstream}",
}


def transport_failure(kind: type, reasons: list[Any], upstream: str = "the model server") -> str:
    """One line for a failed exchange with ``upstream`` (the model server, or a peer's gateway): what happened,
    then its causes that say more than that the connection closed ("cleanly", or an empty message)."""
    causes = [r.getErrorMessage() for r in reasons]
    causes = [c for c in causes if c and c != "Connection was closed cleanly."]
    what = _TRANSPORT_WORDS.get(kind, kind.__name__).format(upstream=upstream)
    return f"{what}: {'; '.join(causes)}" if causes else what


_UNREACHABLE = (net_error.ConnectionRefusedError, net_error.ConnectError, net_error.NoRouteError,
                net_error.DNSLookupError, net_error.TCPTimedOutError)


class Proxy:
    """Sends a request upstream and returns the whole reply, or raises a classified failure."""

    def __init__(self, reactor: IReactorTime, agent: IAgent, recv_timeout_s: float,
                 upstream: str = "the model server") -> None:
        self.reactor = reactor
        self.agent = agent
        self.recv_timeout_s = recv_timeout_s
        self.upstream = upstream  # what a failure's words call the other end

    def forward(self, method: bytes, url: bytes, headers: Headers, body: bytes | None,
                timeout_s: float | None = None, timeout_name: str | None = None) -> Deferred:
        """Fires with an :class:`UpstreamReply`; errbacks with UpstreamUnreachable or UpstreamFailed.

        Cancelling the returned Deferred (a client that went away) aborts the
        upstream exchange.  ``timeout_s``: this exchange's deadline, when not
        the receive timeout (a job wait's, which its budget lengthens);
        ``timeout_name``: the setting it comes from, which a timeout's words name.
        """
        timeout_s = self.recv_timeout_s if timeout_s is None else timeout_s
        d = ensureDeferred(self._exchange(method, url, headers, body))
        expired = []

        def expire() -> None:
            expired.append(True)
            d.cancel()  # aborts the connection, wherever the exchange is

        deadline = self.reactor.callLater(timeout_s, expire)

        def settle(result: Any) -> Any:
            if deadline.active():
                deadline.cancel()
            return result

        d.addBoth(settle)
        d.addErrback(self._classify, expired, timeout_s, timeout_name)
        return d

    async def _exchange(self, method: bytes, url: bytes, headers: Headers, body: bytes | None) -> UpstreamReply:
        producer = BytesProducer(body) if body is not None else None
        response = await self.agent.request(method, url, headers, producer)
        data = await readBody(response)
        return UpstreamReply(response.code, response.headers, data)

    def _classify(self, failure: Any, expired: list, timeout_s: float, timeout_name: str | None = None) -> Any:
        if expired:
            why = timeout_name or ("upstream_recv_timeout_ms" if timeout_s == self.recv_timeout_s
                                   else f"the wait's budget + {WAIT_MARGIN_S:g} s")
            raise UpstreamFailed(f"no complete reply within {timeout_s * 1000:.0f} ms ({why})", "timeout")
        reasons = getattr(failure.value, "reasons", None)  # ResponseFailed and friends wrap the real causes
        if failure.check(CancelledError):
            return failure  # the client went away: nothing to answer
        if failure.check(net_error.ConnectingCancelledError) or any(r.check(CancelledError) for r in reasons or ()):
            # The same, cancelled while connecting (the client sent its request and closed at once) or
            # mid-exchange, which the agent wraps: no failure of the model server's to count.
            raise CancelledError()
        if failure.check(net_error.ConnectBindError):  # before _UNREACHABLE: a ConnectError too
            raise LocalConnectFailed(failure.getErrorMessage())
        if failure.check(*_UNREACHABLE):
            raise UpstreamUnreachable(f"connection refused ({failure.type.__name__})")
        raise UpstreamFailed(transport_failure(failure.type, reasons or [failure], self.upstream)[:300], "transport")
