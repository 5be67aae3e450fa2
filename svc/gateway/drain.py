"""The gateway's listening socket when the supervisor hands one over, and a
graceful stop that lets requests in flight finish.

Under the supervisor the gateway does not bind its port: the supervisor
holds the listening socket for the gateway's whole life and passes it to
every gateway process it starts (``--listen-fd``).  A restart starts the new
process on the same socket while the old one still accepts, so the kernel's
backlog always has a process behind it and no connection is refused.  The
new process says it is accepting by writing one line on ``--ready-fd`` (a
pipe to the supervisor): a probe through the shared socket could be answered
by the old process.  On stop it writes a second line once it no longer
accepts, so the supervisor knows when every new connection reaches the new
process.

On SIGTERM the gateway stops accepting, answers what it already received
with ``Connection: close``, closes keep-alive connections that stay idle,
and exits when no connection is left (or after ``drain_timeout``).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IListeningPort, IReactorSocket
from twisted.internet.protocol import ServerFactory, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.web.limits import LimitedChannel
from svc.web.site import JsonSite

log = Logger()

#: A connection idle when the drain starts may still carry a request the
#: client is sending right now (it was accepted just before the stop): it is
#: closed only after staying idle this long.
IDLE_GRACE_S = 1.0
POLL_S = 0.05


def listening_family(fd: int) -> socket.AddressFamily:
    """The address family of the listening socket on ``fd``; OSError if it is not one."""
    probe = socket.socket(fileno=os.dup(fd))
    try:
        if probe.type != socket.SOCK_STREAM or not probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise OSError(f"fd {fd} is not a listening stream socket")
        return probe.family
    finally:
        probe.close()


class AdoptedListener(Service):
    """Accepts on a listening socket this process inherited (``reactor.adoptStreamPort``).

    The reactor works on its own duplicate, so the inherited descriptor is
    closed once adopted; stopping closes the duplicate and leaves the socket
    open in the processes that share it (the supervisor, a newer gateway).
    """

    def __init__(self, reactor: IReactorSocket, fd: int, factory: ServerFactory[Any]) -> None:
        self.reactor, self.fd, self.factory = reactor, fd, factory
        self.port: IListeningPort | None = None

    def startService(self) -> None:
        super().startService()
        family = listening_family(self.fd)
        self.port = self.reactor.adoptStreamPort(self.fd, family, self.factory)
        os.close(self.fd)

    def stopService(self) -> Any:
        super().stopService()
        port, self.port = self.port, None
        return port.stopListening() if port is not None else succeed(None)


def signal_ready(fd: int) -> None:
    """Tell the supervisor that this process accepts (``ready <pid>`` on the pipe)."""
    os.write(fd, f"ready {os.getpid()}\n".encode())


def signal_closed(fd: int) -> None:
    """Tell the supervisor that this process accepts no more (``closed <pid>``), then close the pipe.

    A restart answers only after this line from the old process: from then on
    every new connection reaches the new process and its key file.
    """
    try:
        os.write(fd, f"closed {os.getpid()}\n".encode())
    except OSError:
        pass  # the supervisor is gone: nobody waits for the line
    finally:
        os.close(fd)


class DrainingChannel(LimitedChannel):
    """An HTTP channel (with the site's limits) that its site can ask to finish its request and close."""

    site: DrainingSite
    idle_since: float | None = None

    def connectionMade(self) -> None:
        super().connectionMade()
        self.site.channels.add(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.site.channels.discard(self)
        super().connectionLost(reason)

    def checkPersistence(self, request: Any, version: bytes) -> bool:
        if self.site.draining:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        return super().checkPersistence(request, version)

    def close_after_response(self) -> None:
        """The request in flight is the last one: its reply says ``Connection: close``."""
        self.persistent = False
        for request in self.requests:
            if not request.startedWriting:
                request.responseHeaders.setRawHeaders(b"connection", [b"close"])


class DrainingSite(JsonSite):
    """A JsonSite that knows its connections, so a stop can wait for the requests in flight."""

    protocol = DrainingChannel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.channels: set[DrainingChannel] = set()
        self.draining = False

    def drain(self, timeout: float) -> Deferred:
        """Fires once every connection is closed: busy ones after their reply, idle ones
        after ``IDLE_GRACE_S`` of idleness, every one after ``timeout``."""
        self.draining = True
        started = self.reactor.seconds()
        done: Deferred = Deferred()
        busy = sum(1 for c in self.channels if c.requests)
        if self.channels:
            log.info("draining {n} connections ({busy} with a request in flight)", n=len(self.channels), busy=busy)

        def check() -> None:
            now = self.reactor.seconds()
            for channel in list(self.channels):
                if channel.requests:
                    channel.idle_since = None
                    if channel._handlingRequest:
                        channel.close_after_response()
                    if now - started >= timeout:
                        channel.transport.abortConnection()
                    continue
                if channel.idle_since is None:
                    channel.idle_since = now
                if now - channel.idle_since >= IDLE_GRACE_S or now - started >= timeout:
                    channel.transport.loseConnection()
            if not self.channels:
                done.callback(None)
                return
            self.reactor.callLater(POLL_S, check)

        check()
        return done
