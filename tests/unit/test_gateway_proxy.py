"""How the gateway's proxy classifies the end of an upstream exchange (svc.gateway.proxy)."""

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectingCancelledError, ConnectionLost
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived
from twisted.web.http_headers import Headers

from svc.gateway.proxy import Proxy, UpstreamFailed


class CancellableAgent:
    """An agent whose request never answers; cancelling it fails it with ``reason`` (how Agent wraps a cancel)."""

    def __init__(self, reason):
        self.reason = reason

    def request(self, method, uri, headers=None, bodyProducer=None):  # noqa: N803 (IAgent's name)
        return Deferred(lambda d: d.errback(self.reason))


def outcome(reason, *, cancel: bool):
    clock = Clock()
    d = Proxy(clock, CancellableAgent(reason), 30.0).forward(b"POST", b"http://127.0.0.1:1/x", Headers(), b"{}")
    if cancel:
        d.cancel()
    else:
        clock.advance(30)  # the deadline cancels it
    failures = []
    d.addErrback(failures.append)
    return failures[0]


@pytest.mark.parametrize("reason", [
    Failure(CancelledError()),
    ResponseNeverReceived([Failure(CancelledError())]),  # cancelled before the reply's head
    ResponseFailed([Failure(CancelledError())]),  # cancelled while the body came
    # cancelled before the connection was made: a client that sent its request and closed at once (an HTTP
    # probe found each one logged as an upstream failure, a critical "Unhandled Error", and counted)
    Failure(ConnectingCancelledError(IPv4Address("TCP", "127.0.0.1", 1))),
], ids=["bare", "before-the-head", "during-the-body", "while-connecting"])
def test_a_client_that_went_away_is_a_cancellation_not_an_upstream_failure(reason):
    """The model server did nothing wrong: counting it as a transport failure (502) raised false alerts."""
    failure = outcome(reason, cancel=True)
    assert failure.check(CancelledError) and not failure.check(UpstreamFailed)


def test_a_lost_connection_is_a_transport_failure_and_the_deadline_a_timeout():
    lost = outcome(ResponseNeverReceived([Failure(ConnectionLost())]), cancel=True)
    assert lost.check(UpstreamFailed) and lost.value.kind == "transport"
    late = outcome(ResponseNeverReceived([Failure(CancelledError())]), cancel=False)
    assert late.check(UpstreamFailed) and late.value.kind == "timeout"
