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
time.  Before any idle one, a connection already answered early (a 401,
413 or 429 written before its body was read) that lingers to drop what its
client still sends is closed.  With none of those, the connection that has
been reading a request head longest (or a body sent without a valid
credential, which the processes read before they answer 401) is closed for
the new one, once it has been at it :data:`STALLED_S`: a head arrives in one
or two packets, so one still coming after a second is a client holding the
slot (a security probe: one client with 1,100 half-sent requests locked
every other client out of the gateway, the supervisor too, each re-sent at
its deadline).  It gets the 408 its deadline would have given it.  A request
with a valid credential whose body is coming is never closed for another:
only when none is answered, idle or stalled does a new connection get the
503.
"""

from __future__ import annotations

from typing import Any

#: How long a connection may have been reading a head (or an unvouched body) before a full listener closes it for
#: a new one.
STALLED_S = 1.0


class IdleConnections:
    """The channels of one listener that may be closed for a new one: answered early, idle between requests (oldest
    first), and reading a head (or an unvouched body)."""

    def __init__(self) -> None:
        self._idle: dict[Any, None] = {}  # insertion order: the order they became idle
        self._reading: dict[Any, float] = {}  # channel -> when its head began (an unvouched body: its head's start)
        self._answered: dict[Any, None] = {}  # answered early, reading and dropping the rest for a while
        self.closed = 0  # closed to admit another

    def answered(self, channel: Any) -> None:
        """``channel`` answered its request early (a 401, 413, 429, 408 or 431 written before its body or head was
        read) and lingers, dropping what still comes, so that its client reads the answer: the first to close for a
        new connection (a regression probe: such connections, opened again every 5 s, held every slot)."""
        self._reading.pop(channel, None)
        self._answered[channel] = None

    def forget(self, channel: Any) -> None:
        """``channel`` is gone."""
        for held in (self._idle, self._reading, self._answered):
            held.pop(channel, None)

    def reading(self, channel: Any, since: float) -> None:
        """``channel`` reads a head (or a body sent without a valid credential) begun at ``since``."""
        self._reading[channel] = since

    def done_reading(self, channel: Any) -> None:
        """``channel``'s head (or unvouched body) is complete, refused, or gone."""
        self._reading.pop(channel, None)

    def mark(self, channel: Any) -> None:
        """``channel`` has sent its last reply whole and waits for a next request."""
        self._idle.pop(channel, None)
        self._idle[channel] = None

    def unmark(self, channel: Any) -> None:
        """``channel`` reads a request again, or is gone."""
        self._idle.pop(channel, None)

    def make_room(self, now: float) -> Any | None:
        """Close a channel that answered early, else the one idle longest, else the one reading a head longest if it
        began :data:`STALLED_S` ago or more, to admit a new connection; it, or None.  The caller takes its slot
        (:meth:`svc.web.limits.LimitedChannel.connectionMade`)."""
        if self._answered:
            channel = next(iter(self._answered))
            del self._answered[channel]
            self.closed += 1
            channel.transport.abortConnection()  # its answer was written; what it still sends is dropped anyway
            return channel
        if self._idle:
            channel = next(iter(self._idle))
            del self._idle[channel]
            self.closed += 1
            channel.transport.loseConnection()  # its last reply was sent: nothing is cut
            return channel
        if not self._reading:
            return None
        channel, since = min(self._reading.items(), key=lambda item: item[1])  # only when full: a scan is cheap
        if now - since < STALLED_S:
            return None
        del self._reading[channel]
        self.closed += 1
        channel.stalled_out()  # its 408, as its deadline would have answered
        return channel
