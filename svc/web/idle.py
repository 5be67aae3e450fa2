"""Keep-alive connections idle between requests: the first to go when a listener is full.

Past ``max_connections`` a new connection was refused (503) even when every
open one sat idle after its last reply: clients that keep connections open
between requests, or anyone who opens that many and sends one request on
each, held every slot for the idle timeout (660 s on the gateway) and no
one else, the supervisor's ``/healthz`` probe included, was served (a
security probe).  A connection is idle here from the moment its last reply
was sent whole (nothing read of a next request, nothing pipelined) until its
next byte; a full listener closes the one idle longest to admit the new one,
as RFC 9112 (section 9.6) lets a server close an idle connection at any
time.  A connection in the middle of a request is never closed for another:
only when none is idle does a new one get the 503.
"""

from __future__ import annotations

from typing import Any


class IdleConnections:
    """The channels of one listener that are idle between requests, oldest first."""

    def __init__(self) -> None:
        self._idle: dict[Any, None] = {}  # insertion order: the order they became idle
        self.closed = 0  # closed to admit another

    def mark(self, channel: Any) -> None:
        """``channel`` has sent its last reply whole and waits for a next request."""
        self._idle.pop(channel, None)
        self._idle[channel] = None

    def unmark(self, channel: Any) -> None:
        """``channel`` reads a request again, or is gone."""
        self._idle.pop(channel, None)

    def make_room(self) -> Any | None:
        """Close the channel idle longest, to admit a new connection; it, or None when none is idle.  The caller
        takes its slot (:meth:`svc.web.limits.LimitedChannel.connectionMade`)."""
        if not self._idle:
            return None
        channel = next(iter(self._idle))
        del self._idle[channel]
        self.closed += 1
        channel.transport.loseConnection()  # its last reply was sent: nothing is cut
        return channel
