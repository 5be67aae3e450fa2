"""The gateway's graceful stop in memory: a Clock, string transports, a resource that answers late."""

from __future__ import annotations

import os
import socket

import pytest
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from svc.gateway.drain import IDLE_GRACE_S, DrainingSite, listening_family, signal_closed, signal_ready
from svc.web.httplimits import HttpLimits


class Late(Resource):
    """Holds every request until the test finishes it."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.pending: list = []

    def render_GET(self, request):
        self.pending.append(request)
        return NOT_DONE_YET


class Transport(StringTransport):
    def __init__(self) -> None:
        super().__init__()
        self.protocol = None

    def loseConnection(self) -> None:
        super().loseConnection()
        if self.protocol is not None and self.protocol in self.protocol.site.channels:
            from twisted.internet.error import ConnectionDone
            from twisted.python.failure import Failure

            self.protocol.connectionLost(Failure(ConnectionDone()))

    abortConnection = loseConnection


def site_and_reactor():
    reactor, resource = MemoryReactorClock(), Late()
    site = DrainingSite(resource, max_body_bytes=1024, oversize_reply=lambda r: (413, {}, b"{}"),
                        busy_reply=lambda: (503, {}, b"{}"), limits=HttpLimits(), reactor=reactor)
    return site, reactor, resource


def connect(site):
    channel = site.buildProtocol(None)
    transport = Transport()
    transport.protocol = channel
    channel.makeConnection(transport)
    return channel, transport


def results(d):
    out = []
    d.addBoth(out.append)
    return out


def test_requests_in_flight_finish_with_connection_close_and_idle_connections_close_after_a_grace():
    site, reactor, resource = site_and_reactor()
    busy, busy_transport = connect(site)
    idle, idle_transport = connect(site)
    busy.dataReceived(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    assert len(resource.pending) == 1 and len(site.channels) == 2
    done = results(site.drain(timeout=30))
    assert done == [] and not idle_transport.disconnecting
    reactor.advance(IDLE_GRACE_S / 2)
    idle.dataReceived(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n")  # accepted just before the stop: still served
    reactor.advance(IDLE_GRACE_S)
    assert not idle_transport.disconnecting and len(resource.pending) == 2
    for request in resource.pending:
        request.write(b"ok")
        request.finish()
    for transport in (busy_transport, idle_transport):
        assert b"connection: close" in transport.value().lower() and transport.disconnecting
    reactor.advance(0.1)
    assert site.channels == set() and done == [None]


def test_a_connection_that_stays_idle_is_closed_and_the_drain_ends():
    site, reactor, _ = site_and_reactor()
    _, transport = connect(site)
    done = results(site.drain(timeout=30))
    reactor.advance(IDLE_GRACE_S + 0.1)
    assert transport.disconnecting and done == [None]


def test_the_drain_gives_up_on_requests_after_its_timeout():
    site, reactor, resource = site_and_reactor()
    channel, transport = connect(site)
    channel.dataReceived(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    done = results(site.drain(timeout=5))
    reactor.advance(4.9)
    assert done == [] and not transport.disconnecting
    reactor.advance(0.2)
    assert transport.disconnecting and done == [None]


def test_without_a_drain_connections_stay_persistent():
    site, _, resource = site_and_reactor()
    channel, transport = connect(site)
    channel.dataReceived(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    resource.pending[0].finish()
    assert b"connection: close" not in transport.value().lower() and not transport.disconnecting


def test_listening_family_and_the_ready_pipe():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert listening_family(listening.fileno()) == socket.AF_INET
    with socket.socket() as bound_only:
        with pytest.raises(OSError, match="not a listening stream socket"):
            listening_family(bound_only.fileno())
    read, write = os.pipe()
    signal_ready(write)
    signal_closed(write)
    assert os.read(read, 100) == f"ready {os.getpid()}\nclosed {os.getpid()}\n".encode()
    with pytest.raises(OSError):
        os.write(write, b"x")  # closed after the second line
    os.close(read)
