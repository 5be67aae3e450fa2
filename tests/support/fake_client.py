"""An in-memory stand-in for svcctl's HTTP client (``svc.cli.http.Client``), on a fake clock.

Tests pass it to ``svc.cli.commands.main(argv, client=...)`` and the commands run
in-process: no server, no thread, no real reactor.  It records every request
(method, URL, body, Bearer token) and answers the canned reply set by the
test: a status, a JSON body (or bytes) and a ``Retry-After``, a transport
error, a reply that never comes (the command's deadline fires on the clock),
or an interrupt (the reactor's shutdown, as Ctrl-C would start it).  ``script``
holds replies answered first, one per request in order (a conversation such
as submit, wait, wait, result); ``reply`` answers the rest.

What it does not cover, the real client's own work (treq, headers, sockets),
is covered by the tests that run ``svcctl`` as a process against real
listeners (tests/unit/test_cli.py, tests/integration/test_gateway.py).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.address import HostnameAddress
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred
from twisted.internet.error import ConnectingCancelledError, DNSLookupError
from twisted.internet.task import Clock, deferLater
from twisted.python.failure import Failure
from twisted.web.client import RequestGenerationFailed, ResponseNeverReceived

from svc.cli.http import HttpCall
from svc.cli.http import Reply as HttpReply


@dataclass(frozen=True)
class Recorded:
    """One request as the client was asked to make it."""

    method: str
    url: str
    body: bytes | None
    token: str
    timeout: float

    @property
    def path(self) -> str:
        """The path with its query, as a server would see it."""
        parts = urlsplit(self.url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    def json(self) -> Any:
        return json.loads(self.body or b"")


@dataclass
class Reply:
    """What the client answers.

    ``error``: an exception the exchange raises instead (a transport failure).
    ``stall``: None, ``"forever"`` (no reply: the command's deadline decides)
    or ``"interrupt"`` (no reply, and the reactor shuts down as on Ctrl-C);
    ``"connecting"`` and ``"resolving"`` never reply either, and fail when
    cancelled as the real agent does in those phases
    (``ConnectingCancelledError``, ``DNSLookupError``); ``"own-timeout"``
    fails at the request's own timeout as treq's does (the agent's
    ``ResponseNeverReceived`` of a cancellation), before the command's
    deadline at the same moment; ``"own-timeout-connecting"``,
    ``"own-timeout-resolving"`` and ``"own-timeout-sending"`` the same, in
    the phase whose error the agent then raises (as :data:`OWN_TIMEOUT`).  ``delay``: the
    reply comes that many seconds of the fake clock later (cancellable).
    """

    status: int = 200
    body: Any = field(default_factory=dict)
    retry_after: str | None = None
    weights: str | None = None  # the X-Service-Weights header
    location: str | None = None  # a redirect's Location header
    error: BaseException | None = None
    stall: str | None = None
    delay: float = 0.0  # seconds of the fake clock before the reply comes (a wait that takes its budget)


#: How the real agent fails when cancelled while it connects or resolves the host name.
CANCELLED: dict[str | None, Callable[[Deferred], None]] = {
    "connecting": lambda d: d.errback(ConnectingCancelledError(HostnameAddress(b"gw.test", 8080))),
    "resolving": lambda d: d.errback(DNSLookupError("gw.test")),
}


#: How the real agent fails when treq's own timeout (or its connect timeout) cancels the request first, by stall.
OWN_TIMEOUT: dict[str, Callable[[], BaseException]] = {
    "own-timeout": lambda: ResponseNeverReceived([Failure(CancelledError())]),
    "own-timeout-connecting": lambda: ConnectingCancelledError(HostnameAddress(b"127.0.0.1", 8080)),
    "own-timeout-resolving": lambda: DNSLookupError("127.0.0.1"),
    "own-timeout-sending": lambda: RequestGenerationFailed([Failure(CancelledError())]),
}


class FakeReactor(Clock):
    """A clock with the system-event triggers the commands register for shutdown."""

    def __init__(self) -> None:
        super().__init__()
        self.triggers: dict[int, Callable[[], object]] = {}

    def addSystemEventTrigger(self, phase: str, event: str, callable: Callable[[], object]) -> int:
        assert (phase, event) == ("before", "shutdown")
        ident = len(self.triggers) + 1
        self.triggers[ident] = callable
        return ident

    def removeSystemEventTrigger(self, ident: int) -> None:
        del self.triggers[ident]

    def shutdown(self) -> None:
        for trigger in list(self.triggers.values()):
            trigger()


class FakeClient:
    """``svc.cli.commands.main(argv, client=FakeClient())``: answers from ``script``, then ``reply``."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.reply = Reply()
        self.script: list[Reply] = []
        self.reactor = FakeReactor()

    def react(self, main: Callable[[Any], Awaitable[None]]) -> None:
        """Run ``main`` on the fake clock, moving time to each next timer until it ends (as task.react)."""
        done = ensureDeferred(main(self.reactor))
        while not done.called:
            calls = self.reactor.getDelayedCalls()
            assert calls, "the command waits for something that nothing will ever do"
            self.reactor.advance(max(0.0, min(c.getTime() for c in calls) - self.reactor.seconds()))
        failures: list[Any] = []
        done.addErrback(failures.append)
        if failures:
            failures[0].raiseException()
        raise SystemExit(0)

    async def exchange(self, reactor: Any, call: HttpCall, token: str) -> HttpReply:
        self.requests.append(Recorded(call.method, call.url, call.body, token, call.timeout))
        reply = self.script.pop(0) if self.script else self.reply
        if reply.delay:
            await deferLater(reactor, reply.delay)
        if reply.error is not None:
            raise reply.error
        if reply.stall in OWN_TIMEOUT:
            await deferLater(reactor, call.timeout)
            raise OWN_TIMEOUT[reply.stall]()
        if reply.stall is not None:
            if reply.stall == "interrupt":
                reactor.callLater(0, reactor.shutdown)
            await Deferred(CANCELLED.get(reply.stall))  # never fires; a deadline or an interrupt cancels it
        body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        return HttpReply(reply.status, HTTPStatus(reply.status).phrase, body, reply.retry_after, reply.weights,
                         reply.location)
