"""A request's head cut into lines without copying what follows it once per line.

twisted's ``LineReceiver`` takes each line off the front of its buffer
with ``buffer.split(delimiter, 1)``, which copies the whole rest of the
buffer.  A request that arrives in one read (its head and a 41 KB JSON
body, as a job submit or an inference request does) has its body copied
once per header line: about 18 copies and 50 us of the reactor per
request (cProfile of ``bench.admission_cpu``).  :class:`HeadLines` cuts the
lines out of that read in place and hands the rest to ``LineReceiver`` as
it is; every other case (a line cut short or too long, a buffer already
held, a paused or raw-mode channel, a small read) is ``LineReceiver``'s own,
so what the channel sees is the same.
"""

from __future__ import annotations

from typing import Any

from twisted.protocols import basic
from twisted.web.http import HTTPChannel

#: Reads shorter than this go through LineReceiver: their copies cost less than the loop here.
SMALL_READ = 2048


class HeadLines(HTTPChannel):
    """``HTTPChannel.dataReceived`` (the timeout reset, then ``LineReceiver.dataReceived``) with the head's lines
    of a large read cut in place.

    While a line is handled, the rest of the read is not in ``_buffer`` (where LineReceiver keeps it) but
    counted in ``_unparsed``: what asks whether more bytes wait (pipelined requests) looks at both."""

    _unparsed = 0

    def dataReceived(self, data: bytes) -> Any:
        if len(data) < SMALL_READ or not self.line_mode or self._busyReceiving or self._buffer or self.paused:
            return super().dataReceived(data)
        self.resetTimeout()
        delimiter, limit, pos = self.delimiter, self.MAX_LENGTH, 0
        self._busyReceiving = True
        try:
            while self.line_mode and not self.paused:
                end = data.find(delimiter, pos)
                if end < 0 or end - pos > limit:
                    break  # a line cut short or too long: LineReceiver's own handling, on the rest
                line = data[pos:end]
                pos = end + len(delimiter)
                self._unparsed = len(data) - pos
                why = self.lineReceived(line)
                if why or self.transport and self.transport.disconnecting:
                    self._buffer = data[pos:] + self._buffer  # what LineReceiver would hold: the rest, then
                    return why  # whatever arrived meanwhile
        finally:
            self._busyReceiving = False
            self._unparsed = 0
        rest, self._buffer = data[pos:] + self._buffer, b""
        return basic.LineReceiver.dataReceived(self, rest)
