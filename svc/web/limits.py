"""Connection limits of every process's HTTP listener (the body's are svc.web.bodylimits).

twisted.web's connection handling has gaps that :class:`LimitedChannel`
closes (see :class:`svc.web.httplimits.HttpLimits` for the knobs):

* its idle timeout is reset by every byte, so a client that sends one header byte every few seconds holds a
  connection forever (slowloris): a request's headers must now be complete within ``header_timeout_ms``;
* it accepts any number of connections: past ``max_connections`` the connection idle longest between requests,
  else one stalled in its head, is closed for a new one (:mod:`svc.web.idle`), and with none the new one gets
  the process's 503 and is closed;
* a request line or a header line longer than ``MAX_LENGTH`` (16 KiB), or a head (request line and headers, their
  CRLFs counted) larger than ``totalHeadersSize`` (16 KiB), got the connection dropped without a word, or a bare
  400: now a path too long is answered 414 and a head too large 431, in the process's reply shape (the envelope,
  status 61), and the connection is closed;
* a client that pipelines requests and never reads the replies grows the
  process without bound, and the replies are computed in one reactor turn
  (``HTTPChannel.pauseProducing`` does not stop reading while a request is
  being handled, and buffered pipelined requests are replayed all at once):
  now reading stops while a connection's replies are unsent, and at most
  :data:`PIPELINE_BURST` pipelined requests are answered per reactor turn.
* a request twisted cannot parse (a bad request line or version, a bad
  ``Content-Length`` or chunk size, two framings) got a bare 400 that no
  counter and no access line saw, and one with a ``Transfer-Encoding`` other
  than ``chunked`` was served: now each is the process's 400 (status 50),
  counted and logged, and the connection is closed.

The site these work for is :class:`svc.web.site.JsonSite`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IDelayedCall, ITCPTransport
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel

from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.web.bodylimits import LINGER_SECONDS
from svc.web.chunked import StrictChunkedDecoder
from svc.web.replies import bare_reply, connection_options, head_too_large, raw_reply, request_line, valid_host

if TYPE_CHECKING:
    from svc.web.site import JsonSite

#: How long a connection refused past ``max_connections`` may keep sending (read and dropped) after its 503, so the
#: client reads the 503 rather than a reset; short, because such connections come in floods.
REFUSED_LINGER_SECONDS = 2.0

#: Pipelined requests answered one after another on one connection before the reactor serves others.
PIPELINE_BURST = 16


class LimitedChannel(HTTPChannel):
    """An HTTPChannel with a header deadline, a connection cap, head limits and pipelining backpressure."""

    site: JsonSite  # set by the site that builds it: the limits, the 503, 414 and 431, the connections counted
    transport: ITCPTransport  # TCP (the listener's or an adopted one's); it has `disconnecting`, undeclared there
    _refused = False  # answered already (503 past max_connections, 414, 431): the rest is read and dropped
    _head_lines = 0  # lines of the current request's head received so far
    _empty_lines = 0  # empty lines before the current request's line (ignored, counted in the head's size)
    _counted = False
    _header_deadline: IDelayedCall | None = None
    _head_started = 0.0  # when the current request's head began (its first byte; the first: the connection)
    _between_requests = False  # the next byte starts a request (and its header deadline)
    _held = False  # replies unsent or burst used up: pipelined requests wait
    _burst = 0
    _release_call: IDelayedCall | None = None
    _linger: IDelayedCall | None = None

    def connectionMade(self) -> None:
        site = self.site
        if site.open_connections >= site.max_connections:
            idle = site.idle.make_room(site.reactor.seconds())
            if idle is None:
                self._refuse_connection()
                return
            idle._counted = False  # its slot is this one's now
            site.open_connections -= 1
            site.warn_limit("idle or stalled connections closed to admit new ones at max_connections ({limit}): "
                            "{count} so far", limit=site.max_connections, count=site.idle.closed)
        site.open_connections += 1
        self._counted = True
        super().connectionMade()
        self._start_header_deadline()

    # --- max_connections ---------------------------------------------------

    def _refuse_connection(self) -> None:
        """Answer the process's 503 at once and close: the write side is shut after the reply and whatever the
        client sends is read and dropped for a moment, so that it reads the 503 instead of a connection reset."""
        self._refused = True
        site = self.site
        site.refused_connections += 1
        code, headers, body = site.busy_reply()
        site.count_refused("-", code)  # no request was read: method "-"
        self._reply_and_close(raw_reply(code, headers, body), REFUSED_LINGER_SECONDS)
        site.warn_limit("connections past max_connections ({limit}) refused with {code}: {count} so far",
                        limit=site.max_connections, code=code, count=site.refused_connections)

    def _reply_and_close(self, reply: bytes, linger_s: float) -> None:
        """Write ``reply``, shut the write side, read and drop what comes for ``linger_s``, then abort."""
        if self._counted:  # its slot is the first a new connection takes (svc.web.idle)
            self.site.idle.answered(self)
        self.transport.write(reply)
        lose_write = getattr(self.transport, "loseWriteConnection", None)
        if lose_write is not None:
            lose_write()
            self._linger = self.site.reactor.callLater(linger_s, self.transport.abortConnection)
        else:
            self.transport.loseConnection()

    # --- header_timeout_ms -------------------------------------------------

    def _start_header_deadline(self) -> None:
        self._between_requests = False
        self._head_started = self.site.reactor.seconds()
        self._header_deadline = self.site.reactor.callLater(self.site.header_timeout_s, self._headers_too_slow)
        self.site.idle.reading(self, self._head_started)  # closed for a new connection once stalled (svc.web.idle)

    def _head_ms(self) -> float:
        """How long the current request's head has taken so far (the access line's duration of its refusal)."""
        return (self.site.reactor.seconds() - self._head_started) * 1000.0

    def _stop_header_deadline(self) -> None:
        self.site.idle.done_reading(self)
        if self._header_deadline is not None and self._header_deadline.active():
            self._header_deadline.cancel()
        self._header_deadline = None

    def stalled_out(self) -> None:
        """Closed for a new connection at ``max_connections`` (svc.web.idle): the 408 of its head's deadline, or of
        its body's (an unvouched one, svc.web.bodylimits.LimitedRequest.unvouched), now."""
        if self._header_deadline is not None:
            self._stop_header_deadline()
            self._headers_too_slow()
        elif self.requests:
            self.requests[-1].body_too_slow()

    def _headers_too_slow(self) -> None:
        """The request's headers are still incomplete: 408 and close.  No reply is in progress here (twisted parses a
        request only after the previous one was answered), so the 408 cannot interleave with one."""
        self._header_deadline = None
        self._refused = True  # what comes after the 408 is dropped
        self._read_held_line()
        site = self.site
        site.header_timeouts += 1
        method = getattr(self, "_command", None) or b"-"
        site.count_refused(method.decode("latin-1", "replace"), 408)
        # No JSON body (no envelope status fits a head never read whole); a valid X-Request-ID read is echoed.
        headers = site.bare_headers(self._request_read())
        site.log_line(method, getattr(self, "_path", b"-"), 408, self._head_ms(), headers.get("X-Request-ID"), "-")
        self.transport.write(bare_reply(408, headers))
        self.persistent = False
        self.loseConnection()
        if self.abortTimeout is not None:
            # A client that does not read either would keep the connection. (twisted declares the attribute None.)
            self._abortingCall = site.reactor.callLater(  # type: ignore[assignment]
                self.abortTimeout, self.forceAbortClient)

    def dataReceived(self, data: bytes) -> None:
        if self._refused:
            return
        self.site.idle.unmark(self)
        if self._between_requests and not self._handlingRequest:
            self._start_header_deadline()
        super().dataReceived(data)
        if self._bare_lf_in_head():
            self._refuse_unparsable("malformed HTTP request: a line of its head ends in a bare LF; HTTP/1.1 "
                                    "lines end in CRLF")

    def _bare_lf_in_head(self) -> bool:
        """Whether the head being read has a line that ends in LF alone.  Every CRLF-ended line was taken out
        of LineReceiver's buffer, so an LF left there has no CR before it: such a head was never complete, and
        the client got nothing until the header deadline's bare 408.  (A line with an LF inside and a CRLF at
        its end is already refused: an LF is valid in no request line or field value.)"""
        return bool(self.line_mode and not self.paused and not self._busyReceiving and not self._refused
                and not self.transport.disconnecting and b"\n" in self._buffer)  # type: ignore[attr-defined]

    def checkPersistence(self, request: Any, version: bytes) -> bool:
        """Closed after its reply when the request asks it (``close`` among the options of any ``Connection``
        line, RFC 9112 section 9.6), or while the process is stopping (``site.closing``), so that a client's pool
        opens its next request elsewhere instead of on a connection the stop is about to cut."""
        if self.site.closing or b"close" in connection_options(request):
            request.responseHeaders.setRawHeaders(b"Connection", [b"close"])
            return False
        return super().checkPersistence(request, version)

    def allHeadersReceived(self) -> None:
        self._stop_header_deadline()
        self._head_lines = self._empty_lines = 0
        problem = self._host_problem(self.requests[-1].requestHeaders.getRawHeaders(b"Host") or [])
        if problem is not None:
            self._refuse_unparsable("malformed HTTP request: " + problem)
            self.length = 0  # no body is read: twisted calls allContentReceived next, which drops the request
            return
        super().allHeadersReceived()

    def _host_problem(self, hosts: list[bytes]) -> str | None:
        """Why the request's ``Host`` lines make it a 400, or None (RFC 9112, section 3.2: an HTTP/1.1 request
        carries one, any request at most one, and its value is a host and optional port; twisted served them all).
        """
        if len(hosts) > 1:
            return "an HTTP/1.1 request carries exactly one Host header"
        if not hosts:
            return "an HTTP/1.1 request needs a Host header" if self._version == b"HTTP/1.1" else None
        return None if valid_host(hosts[0]) else "its Host header is not a valid host[:port]"

    def allContentReceived(self) -> None:
        if self._refused:  # answered at the end of its head (no Host): the request is not handled
            return
        super().allContentReceived()

    # --- the head's size -----------------------------------------------------

    def lineReceived(self, line: bytes) -> None:
        if self._refused:
            return
        if self._head_lines == 0 and not line:
            self._skip_empty_line()
            return
        self._head_lines += 1
        too_many = bool(line) and self._head_lines > self.maxHeaders + 1  # twisted: a bare 400 for the 501st
        # The head's bytes as sent: twisted counts the lines without their CRLFs (450 lines: 900 bytes over).
        sent = self._receivedHeaderSize + len(line) + 2 * (self._head_lines + self._empty_lines)
        if sent > self.totalHeadersSize or too_many:
            self._refuse_head(self._head_lines == 1, line, too_many)
            return
        if self._head_lines == 1 and (line := request_line(line)) == b"":
            self._refuse_unparsable("malformed HTTP request: its target is not a path, an absolute URL or * (RFC "
                                    "9112 section 3.2), or it carries a #fragment")
            return
        super().lineReceived(line)

    def _skip_empty_line(self) -> None:
        """An empty line before a request line is ignored (RFC 9112 section 2.2: a client may send a CRLF after a
        body).  twisted ignored one only, and answered a second with a 400, losing the requests pipelined after
        it.  They count in the head's size, so an endless run of them is a 431, not a loop."""
        self._empty_lines += 1
        if 2 * self._empty_lines > self.totalHeadersSize:
            self._refuse_head(False, b"")

    def lineLengthExceeded(self, line: bytes) -> None:
        """A line longer than MAX_LENGTH (whole or still arriving): 414 for the request line, else 431."""
        self._refuse_head(self._head_lines == 0, line)

    def _refuse_head(self, request_line: bool, line: bytes, too_many: bool = False) -> None:
        """Answer a head too large with the process's 414 or 431 and close, as the early 413 does (lingering)."""
        self._refused = True
        self._stop_header_deadline()
        self._read_held_line()
        site = self.site
        limit = self.MAX_LENGTH if len(line) > self.MAX_LENGTH else self.totalHeadersSize
        error = head_too_large(request_line, limit, self.maxHeaders if too_many else None)
        method = getattr(self, "_command", None) or line.split(b" ", 1)[0][:20]  # counted as "other" if no method
        path = getattr(self, "_path", None) or (line.split(b" ", 2)[1][:300] if request_line and b" " in line
                                                 else b"-")
        code, headers, body = site.limit_reply(self._request_read(), error, method.decode("latin-1", "replace"),
                                               path)
        self.persistent = False
        self._reply_and_close(raw_reply(code, headers, body), LINGER_SECONDS)
        site.log_line(method, path, code, self._head_ms(), headers.get("X-Request-ID"), "-")  # the reply's id

    def _read_held_line(self) -> None:
        """Add the header line twisted holds back until the next line starts (a line starting with a space continues
        it) to the request: a refusal before that next line (431, the header deadline's 408) ignored its
        ``X-Request-ID`` or ``Origin``.  Called once refused, so that a held line twisted cannot read is dropped
        rather than answered with a 400."""
        held: bytes = self._HTTPChannel__header  # type: ignore[has-type]  # twisted's private (name-mangled)
        if held and self.requests:
            self._HTTPChannel__header = b""
            self.headerReceived(held)

    def _request_read(self) -> Any | None:
        """The request whose head is being read (None before its request line), so that an early reply keeps
        its valid ``X-Request-ID`` (docs/api.md) and gets the gateway's CORS headers, as the early 413 did."""
        return self.requests[-1] if self.requests else None

    # --- a request twisted cannot parse -------------------------------------

    def _respondToBadRequestAndDisconnect(self) -> None:
        """twisted's answer to a request it cannot parse (a bad request line, version, ``Content-Length`` or
        chunk size, two framings): its bare 400 was seen by no counter and no access line.  Now the process's
        400 (status 50: the request is not one it can read), counted with the method read so far, logged, and
        the connection closed as after a 414."""
        self._refuse_unparsable("malformed HTTP request: its request line, a header or its body's framing "
                                "(Content-Length, chunked) is not valid HTTP/1.1")

    def _maybeChooseTransferDecoder(self, header: bytes, data: bytes) -> bool:  # noqa: N802 (twisted's name)
        """A ``Transfer-Encoding`` line that is not exactly ``chunked`` is a 400 and close (RFC 9112 section 6.3:
        chunked must be the final coding).  twisted ignored ``identity``: with a ``Content-Length`` the body was
        framed by it, without one the body was read as the next request; and after a ``chunked`` line it
        ignored a second ``identity`` line.  In an HTTP/1.0 request any ``Transfer-Encoding`` is faulty framing
        (RFC 9112 section 6.1: 1.0 has none), which was read as chunked (a security probe)."""
        if header == b"Transfer-Encoding" and getattr(self, "_version", None) == b"HTTP/1.0":
            self._refuse_unparsable("malformed HTTP request: Transfer-Encoding in an HTTP/1.0 request")
            self.length = None
            return False
        if header == b"Transfer-Encoding" and data.lower() != b"chunked":
            self._refuse_unparsable("malformed HTTP request: Transfer-Encoding other than chunked (chunked must be "
                                    "its one and final coding)")
            self.length = None  # as twisted's own refusal: no body is read
            return False
        chosen = bool(super()._maybeChooseTransferDecoder(header, data))
        self._transferDecoder = StrictChunkedDecoder.replacing(self._transferDecoder)  # bare LFs: 400 at once
        return chosen

    def _target_unread(self) -> bytes | None:
        """The target of a request line still in the buffer (one ending in a bare LF was never parsed): it
        chooses the reply's shape, so that ``/v2`` gets the protocol's ``{"error"}`` (an OIP probe)."""
        line = getattr(self, "_buffer", b"").split(b"\n", 1)[0].split(b" ")
        return line[1] if len(line) == 3 and line[1].startswith(b"/") else None

    def _refuse_unparsable(self, message: str) -> None:
        """The process's 400 (status 50) for a request it cannot read, counted, logged, and the connection closed."""
        if self._refused:
            return
        self._refused = True
        self._stop_header_deadline()
        site = self.site
        method = getattr(self, "_command", None) or b"-"
        error = ApiError(st.JSON_PARSE_ERROR, message)
        path = getattr(self, "_path", None) or self._target_unread() or b"-"
        code, headers, body = site.limit_reply(self._request_read(), error, method.decode("latin-1", "replace"),
                                               path)
        self.persistent = False
        self._reply_and_close(raw_reply(code, headers, body), LINGER_SECONDS)
        site.log_line(method, path, code, self._head_ms(), headers.get("X-Request-ID"), "-")  # the reply's id

    # --- pipelining ----------------------------------------------------------

    def pauseProducing(self) -> None:
        """The transport's buffer of unsent replies is full: stop reading too.  twisted stops reading here only
        between requests; while a request is being handled it kept reading and buffering pipelined requests without
        bound, then answered them all at once."""
        super().pauseProducing()
        self._networkProducer.pauseProducing()

    def resumeProducing(self) -> None:
        super().resumeProducing()
        self._release()

    def requestDone(self, request: Any) -> None:
        """Answer the next pipelined request now, or later when the client reads (or next turn)."""
        # Pipelined bytes wait in twisted's buffer (_dataBuffer) or, when the
        # request was answered at once, in LineReceiver's (_buffer).
        pipelined = bool(self._dataBuffer or self._buffer)
        if self.persistent and (self._waitingForTransport or (pipelined and self._burst >= PIPELINE_BURST)):
            if request is not self.requests[0]:
                raise TypeError("requestDone for a request that is not the first")
            del self.requests[0]
            # _handlingRequest stays True: whatever arrives is buffered, not parsed.
            self._held = True
            self._networkProducer.pauseProducing()
            if self._savedTimeOut:
                # A client that never reads its replies is closed after the idle timeout.
                self.setTimeout(self._savedTimeOut)
            if not self._waitingForTransport:
                self._release_call = self.site.reactor.callLater(0, self._release)
            return
        self._burst = self._burst + 1 if pipelined else 0
        self._between_requests = True
        super().requestDone(request)
        self._idle_if_done()

    def _release(self) -> None:
        """Go on with the buffered pipelined requests once the replies were sent."""
        self._release_call = None
        if not self._held or self._waitingForTransport or self.transport.disconnecting:  # type: ignore[attr-defined]
            return
        self._held = False
        self._burst = 0
        self._handlingRequest = False
        self._between_requests = True
        self._networkProducer.resumeProducing()
        data = b"".join(self._dataBuffer)
        self._dataBuffer = []
        self.setLineMode(data)
        self._idle_if_done()

    def _idle_if_done(self) -> None:
        """Its replies sent and nothing of a next request read: idle, the first to close when the listener is full
        (:mod:`svc.web.idle`)."""
        if self.persistent and not (self._handlingRequest or self._buffer or self._dataBuffer):
            self.site.idle.mark(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._stop_header_deadline()
        for call in (self._release_call, self._linger):
            if call is not None and call.active():
                call.cancel()
        self._release_call = self._linger = None
        self.site.idle.forget(self)
        if self._counted:
            self._counted = False
            self.site.open_connections -= 1
        super().connectionLost(reason)

