"""The body limits of every process's HTTP listener: its size and its time.

twisted.web buffers a whole request body before any handler runs, and has no
limit on its size or on the time it takes.  :class:`LimitedRequest` enforces
the site's ``max_body_bytes`` while reading: an oversized ``Content-Length``
is answered with the site's 413 at once, and a chunked body as soon as the
bytes received pass the limit (a huge chunk size alone is no body yet: it
waits for the body deadline); the rest of the body is discarded unread into
memory, and the connection is closed.  A request that its head alone refuses (the app's
``refusal_before_body``: the gateway's 401 for a missing or wrong credential) is answered the same way, before
any of its body is read.  A body must also be complete ``body_timeout_ms`` after
the headers (a client dripping it held its connection at will), else 408 in
the process's reply shape and close.  The connection's own limits are
svc.web.limits.LimitedChannel's.
"""

from __future__ import annotations

from io import BytesIO
from typing import TYPE_CHECKING, Any

from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure
from twisted.web import server

from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.web.paths import origin_form
from svc.web.replies import header, raw_reply, reason

if TYPE_CHECKING:
    from svc.web.limits import LimitedChannel

#: How long a refused upload (or head) may keep sending after its answer before we close.
LINGER_SECONDS = 5.0

#: The access log's code for a request whose client closed the connection before its reply (nginx's 499).
CLIENT_CLOSED = 499

#: The largest body a data-plane process reads from a request without a valid credential before its 401 (larger
#: ones, chunked ones and those awaiting ``100 Continue`` are refused unread: the apps' ``refusal_before_body``).
BODY_READ_WITHOUT_CREDENTIAL = 64 * 1024


def read_without_credential(request: Any, length: int | None) -> bool:
    """Whether a body of ``length`` bytes (None: chunked) is read before its credential is judged: at most
    :data:`BODY_READ_WITHOUT_CREDENTIAL`, and no ``Expect`` (a client awaiting ``100 Continue`` is answered
    from the head).  Larger bodies are judged from the head, so that a client without a credential cannot make a
    process hold ``max_body_bytes`` per connection."""
    small = length is not None and length <= BODY_READ_WITHOUT_CREDENTIAL
    return small and not request.requestHeaders.hasHeader(b"expect")


def head_method(request: Any) -> str:
    """The method of a request whose body is not complete (``request.method`` is set only then), as its head
    gave it: the label of a reply written from the head."""
    return (getattr(request.channel, "_command", None) or b"-").decode("latin-1", "replace")


class LimitedRequest(server.Request):
    """A request whose body is held in memory up to its site's limit, and must arrive within its deadline."""

    channel: LimitedChannel  # its site: the limits, the 413 and the 408 (svc.web.site.JsonSite)
    content: BytesIO  # type: ignore[assignment]  # twisted.web declares it None, its class default
    _refused = False
    _received = 0
    _linger: IDelayedCall | None = None
    _body_deadline: IDelayedCall | None = None
    started: float | None = None
    _head_done = 0.0  # when the head was complete (the duration of an early 413 or 408)
    _head_read = False  # the head is complete: from then on this is a request the access log names

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        """twisted's reason phrases, and ours where its table has none (422 "Unprocessable Content", 429)."""
        super().setResponseCode(code, message if message is not None else reason(code))

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        super().requestReceived(command, origin_form(path), version)  # an absolute-form target: its path

    def _handleStar(self) -> None:  # noqa: N802 (twisted's name)
        """The asterisk-form target ``*`` is for OPTIONS (RFC 9112 section 3.2.4), which keeps twisted's empty
        200.  twisted answered any other method with a bare 405 and ``Allow: OPTIONS``: no envelope, no
        ``X-Request-ID``, no authentication.  Now the site's routes answer it as a path that is no route
        (svc.web.paths.RoutablePaths): the process's 404, or 401 first on the gateway."""
        if self.method == b"OPTIONS":
            super()._handleStar()
            return
        try:
            self.render(self.channel.site.getResourceFor(self))
        except BaseException:  # as twisted's process(): any failure is the request's 500
            self.processingFailed(Failure())

    def gotLength(self, length: int | None) -> None:
        self._head_done = self.channel.site.reactor.seconds()
        self._head_read = True
        self.content = BytesIO()
        self._received = 0
        if length is not None and length > self.channel.site.max_body_bytes:
            self._refuse()
        elif length is None or length > 0:  # a body follows (chunked when None): it has body_timeout_ms
            site = self.channel.site
            refusal = site.refusal_before_body(self, length)
            if refusal is not None:  # its head alone refuses it (the gateway's 401): the body is never read
                self.answer_early(*refusal)
                return
            self._body_deadline = site.reactor.callLater(site.body_timeout_s, self.body_too_slow)

    def unvouched(self) -> None:
        """Its body is read before its credential is judged, and it has none valid (the gateway's 401 comes once the
        body is here): the connection may be closed for a new one at ``max_connections`` (svc.web.idle) until
        then, as one still reading its head may."""
        channel = self.channel
        channel.site.idle.reading(channel, channel._head_started)

    def postpone_continue(self) -> bool:
        """Take back the ``100 Continue`` twisted writes once the head is read, for an answer still to come (the
        gateway's Redis bucket): whether the client awaits one (:meth:`send_continue` then writes it)."""
        expect = self.requestHeaders.getRawHeaders(b"expect") or []
        if not expect or expect[0].lower() != b"100-continue" or self.channel._version != b"HTTP/1.1":
            return False
        self.requestHeaders.removeHeader(b"expect")
        return True

    def send_continue(self) -> None:
        """The postponed ``100 Continue``, the body now welcome (nothing once the request was answered or gone)."""
        if self.reading_body:
            self.channel.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def body_too_slow(self) -> None:
        """The body is still incomplete at its deadline: 408 in the process's shape, and close."""
        self._body_deadline = None
        site = self.channel.site
        timeout_ms = round(site.body_timeout_s * 1000)
        error = ApiError(st.REQUEST_TIMEOUT, f"the request body did not arrive within {timeout_ms} ms "
                                             f"(body_timeout_ms); {self._received} bytes came")
        self.answer_early(*site.limit_reply(self, error, head_method(self)))

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        if self._received > self.channel.site.max_body_bytes:
            self.content = BytesIO()
            self._refuse()
            return
        self.content.write(data)

    def _refuse(self) -> None:
        """Answer 413 now, before the body is read, and close the connection.

        The write side is shut first and the rest of the upload is read and
        dropped for a short while, so that a client still sending sees the
        413 instead of a connection reset.
        """
        self.answer_early(*self.channel.site.oversize_reply(self))

    @property
    def reading_body(self) -> bool:
        """Its body is still coming: not answered, not processed, its client not gone."""
        return self.started is None and not self._refused and not self._disconnected

    def answer_early(self, code: int, headers: dict[str, str], body: bytes) -> None:
        """Answer before the body is complete, shut the write side, drop what still comes for a while, close (also
        from the gateway, when its key's bucket answers an upload's head late: svc.gateway.keylimits)."""
        self._refused = True
        self._stop_body_deadline()
        if self.channel._counted:  # its slot is the first a new connection takes (svc.web.idle)
            self.channel.site.idle.answered(self.channel)
        # No "100 Continue" after a final answer.
        self.requestHeaders.removeHeader(b"expect")
        site = self.channel.site
        transport = self.channel.transport
        transport.write(raw_reply(code, headers, body))
        lose_write = getattr(transport, "loseWriteConnection", None)
        if lose_write is not None:
            lose_write()
            self._linger = site.reactor.callLater(LINGER_SECONDS, transport.abortConnection)
        else:
            transport.loseConnection()
        self._log_unprocessed(code, headers.get("X-Request-ID") or header(self, b"x-request-id"))
        # Answered: what waits for its end (the gateway's in-flight slot of its key) need not wait for the close,
        # up to LINGER_SECONDS later (a regression probe: a key's 413s held its slots that long).
        notifications, self.notifications = self.notifications, []
        for finished in notifications:
            finished.callback(None)

    def _log_unprocessed(self, code: int, request_id: str | None) -> None:
        """The access line of a request that ended before its body was complete (no route saw it): its method and
        path as its head gave them, the time since its head."""
        site = self.channel.site
        path = getattr(self.channel, "_path", b"?")
        command = getattr(self.channel, "_command", b"?")
        key = getattr(self, "service_key", None) or "-"  # the gateway names an upload's key from its head
        site.log_line(command, path, code, (site.reactor.seconds() - self._head_done) * 1000.0, request_id, key)

    def _stop_body_deadline(self) -> None:
        if self._body_deadline is not None and self._body_deadline.active():
            self._body_deadline.cancel()
        self._body_deadline = None

    def process(self) -> None:
        if self._refused:
            return  # the 413 or 408 is already out; drop the rest
        self._stop_body_deadline()
        self.channel.site.idle.done_reading(self.channel)  # an unvouched body is here
        self.started = self.channel.site.reactor.seconds()
        super().process()

    def connectionLost(self, reason: Any) -> None:
        self._stop_body_deadline()
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        if not self.finished and not self._refused:  # the client went before its reply: still one access line
            if self.started is not None:
                self.channel.site.log_abandoned(self)
            elif self._head_read and not getattr(self.channel, "_refused", False):
                # mid-upload: logged nowhere before, though its head named it (logs probe); unless the channel
                # refused its body's framing (a bad chunk size) with a 400 it logged: the close was the server's
                # (an HTTP probe: a second line, "499", for the same request)
                self._log_unprocessed(CLIENT_CLOSED, header(self, b"x-request-id"))
        super().connectionLost(reason)
