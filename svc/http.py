"""HTTP plumbing shared by every process: JSON replies, body limits, access log.

twisted.web buffers a whole request body before any handler runs and has no
size limit (STYLE trap 4).  :class:`LimitedRequest` enforces the site's
``max_body_bytes`` while reading: an oversized ``Content-Length`` (or a
chunked body that grows past the limit) is answered with the site's 413 at
once, the rest of the body is discarded unread into memory, and the
connection is closed.  :class:`JsonSite` also replaces twisted's access log
with one structured line per request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from io import BytesIO
from typing import Any

from twisted.internet import reactor as _default_reactor
from twisted.logger import Logger
from twisted.web import server
from twisted.web.client import HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.http import RESPONSES

JSON_CONTENT_TYPE = b"application/json; charset=utf-8"

#: How long a refused upload may keep sending after its 413 before we close.
LINGER_SECONDS = 5.0

log = Logger(namespace="svc.access")


def dumps(body: Any) -> bytes:
    """Compact JSON, never NaN (which is not JSON)."""
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")


def send_json(request: Any, code: int, body: Any, headers: Mapping[str, str] | None = None) -> bytes:
    """Set code and headers of a JSON reply and return its bytes.

    Every JSON reply of every process goes through here, so the content type
    is always ``application/json; charset=utf-8`` (twisted's default is
    text/html, STYLE trap 5).
    """
    request.setResponseCode(code)
    request.setHeader(b"Content-Type", JSON_CONTENT_TYPE)
    for name, value in (headers or {}).items():
        request.setHeader(name.encode("latin-1"), value.encode("latin-1"))
    data = dumps(body)
    request.setHeader(b"Content-Length", str(len(data)).encode())
    return data


def header(request: Any, name: bytes) -> str | None:
    """A request header as text (latin-1), or None."""
    value = request.requestHeaders.getRawHeaders(name)
    return value[0].decode("latin-1") if value else None


def bearer_token(request: Any) -> str | None:
    """The token of ``Authorization: Bearer <token>``, or None."""
    value = header(request, b"authorization")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def content_type(request: Any) -> tuple[str, dict[str, str]]:
    """The media type (lowercase) and its parameters; ('', {}) when absent."""
    value = header(request, b"content-type")
    if not value:
        return "", {}
    parts = [p.strip() for p in value.split(";")]
    params: dict[str, str] = {}
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k:
            params[k.strip().lower()] = v.strip().strip('"')
    return parts[0].lower(), params


class LimitedRequest(server.Request):
    """A request whose body is held in memory up to the site's limit.

    The site provides ``max_body_bytes`` and ``oversize_reply(request) ->
    (code, headers, body)``.
    """

    _refused = False
    _received = 0
    _linger = None
    started: float | None = None

    def gotLength(self, length: int | None) -> None:
        self.content = BytesIO()
        self._received = 0
        if length is not None and length > self.channel.site.max_body_bytes:
            self._refuse()

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
        self._refused = True
        # No "100 Continue" after a final answer.
        self.requestHeaders.removeHeader(b"expect")
        site = self.channel.site
        code, headers, body = site.oversize_reply(self)
        lines = [f"HTTP/1.1 {code} {RESPONSES.get(code, b'').decode()}"]
        for name, value in {**headers, "Content-Type": JSON_CONTENT_TYPE.decode(), "Content-Length": str(len(body)),
                            "Connection": "close"}.items():
            lines.append(f"{name}: {value}")
        transport = self.channel.transport
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        transport.loseWriteConnection()
        self._linger = site.reactor.callLater(LINGER_SECONDS, transport.abortConnection)
        path = getattr(self.channel, "_path", b"?")
        command = getattr(self.channel, "_command", b"?")
        site.log_line(command, path, code, 0.0, header(self, b"x-request-id"), "-")

    def process(self) -> None:
        if self._refused:
            return  # the 413 is already out; drop the rest
        self.started = self.channel.site.reactor.seconds()
        super().process()

    def connectionLost(self, reason: Any) -> None:
        if self._linger is not None and self._linger.active():
            self._linger.cancel()
        super().connectionLost(reason)


class JsonSite(server.Site):
    """A Site with a body limit, an early 413, and a structured access log."""

    def __init__(
        self,
        resource: Any,
        *,
        max_body_bytes: int,
        oversize_reply: Callable[[LimitedRequest], tuple[int, dict[str, str], bytes]],
        timeout: float | None = None,
        reactor: Any = None,
        on_logged: Callable[[Any], None] | None = None,
    ) -> None:
        kwargs = {"timeout": timeout} if timeout is not None else {}
        super().__init__(resource, requestFactory=LimitedRequest, parsePOSTFormSubmission=False, **kwargs)
        self.max_body_bytes = max_body_bytes
        self.oversize_reply = oversize_reply
        self.reactor = reactor or _default_reactor
        self.on_logged = on_logged
        self.noisy = False

    def log(self, request: Any) -> None:
        started = getattr(request, "started", None)
        duration = (self.reactor.seconds() - started) * 1000.0 if started is not None else 0.0
        rid = request.responseHeaders.getRawHeaders(b"x-request-id") or request.requestHeaders.getRawHeaders(
            b"x-request-id"
        )
        key = getattr(request, "service_key", None) or "-"
        self.log_line(request.method, request.uri, request.code, duration, rid[0].decode("latin-1") if rid else None, key)
        if self.on_logged is not None:
            self.on_logged(request)

    def log_line(self, method: bytes, path: bytes, code: int, duration_ms: float, request_id: str | None, key: str) -> None:
        log.info(
            "{method} {path} {code} {duration_ms:.1f}ms key={key} rid={request_id}",
            method=method.decode("latin-1", "replace"),
            path=path.decode("latin-1", "replace")[:300],
            code=code,
            duration_ms=duration_ms,
            key=key,
            request_id=request_id or "-",
        )


class _QuietClientFactory(_HTTP11ClientFactory):
    noisy = False


class QuietConnectionPool(HTTPConnectionPool):
    """A client connection pool that does not log "Starting factory" for every connection.

    The gateway opens connections to model servers and the supervisor probes
    its children every few seconds: the default factories would fill the logs
    with two lines per connection.
    """

    _factory = _QuietClientFactory
