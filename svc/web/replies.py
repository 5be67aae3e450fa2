"""JSON replies and the small readers of request headers, shared by every process.

Every JSON reply of every process goes through :func:`send_json` (or, for an
answer written before or without a Request, :func:`raw_reply`), so the
content type is always ``application/json; charset=utf-8``; under ``/v2``
(the Open Inference Protocol) plain ``application/json``, as Triton, KServe
and MLServer send it: KServe's client reads the server's error message only
from a reply of exactly that type.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from typing import Any

from twisted.web.http import RESPONSES, datetimeToString

from svc.contract import status as st
from svc.contract.envelope import dumps
from svc.contract.errors import ApiError
from svc.contract.oip import is_oip_path

JSON_CONTENT_TYPE = b"application/json; charset=utf-8"


def _spell_request_id() -> None:
    """Send ``X-Request-ID`` as the contract and the docs spell it.

    twisted.web writes every header name in its canonical capitalisation,
    ``X-Request-Id``, but for the few irregular ones in its table of
    mappings (``WWW-Authenticate``, ``ETag``); the replies written before
    any request (413, 431, 408) spelled it ``X-Request-ID``.  Names are
    case-insensitive in HTTP, but a log filter or a client matching the
    documented spelling saw two.  Added to that table (a class attribute,
    left as it is if a Twisted release drops it).
    """
    from twisted.web import http_headers

    mappings = getattr(getattr(http_headers, "_NameEncoder", None), "_caseMappings", None)
    if isinstance(mappings, dict):
        mappings[b"X-Request-Id"] = b"X-Request-ID"
        cache = getattr(getattr(http_headers, "_nameEncoder", None), "_canonicalHeaderCache", None)
        if isinstance(cache, dict):  # a name already met keeps its old spelling in the cache
            for name in [n for n, spelled in cache.items() if spelled == b"X-Request-Id"]:
                del cache[name]


_spell_request_id()
#: The Open Inference Protocol's (JSON has no charset parameter, RFC 8259; the bytes are UTF-8 all the same).
OIP_JSON_CONTENT_TYPE = b"application/json"


def json_content_type(request: Any) -> bytes:
    """The content type of ``request``'s JSON reply: plain under ``/v2``, else with its charset."""
    return OIP_JSON_CONTENT_TYPE if is_oip_path(getattr(request, "path", None) or b"") else JSON_CONTENT_TYPE

#: Reason phrases that twisted's RESPONSES table lacks (it would send "Unknown Status"): RFC 9110 and RFC 6585;
#: and 408 as RFC 9110 spells it, as the header deadline's reply does (twisted: "Request Time-out").
REASONS = {408: b"Request Timeout", 422: b"Unprocessable Content", 429: b"Too Many Requests",
           431: b"Request Header Fields Too Large"}


def reason(code: int) -> bytes:
    """The reason phrase of the status line for ``code``."""
    return REASONS.get(code) or RESPONSES.get(code, b"Unknown Status")


def raw_reply(code: int, headers: Mapping[str, str], body: bytes) -> bytes:
    """A whole HTTP/1.1 JSON reply with ``Connection: close``, for answers written before (or without) a Request."""
    return _whole_reply(code, {"Content-Type": JSON_CONTENT_TYPE.decode(), **headers}, body)


def bare_reply(code: int, headers: Mapping[str, str]) -> bytes:
    """A whole reply with no body and ``Connection: close`` (the header deadline's 408: no request was read, so
    no envelope fits)."""
    return _whole_reply(code, headers, b"")


def _whole_reply(code: int, headers: Mapping[str, str], body: bytes) -> bytes:
    """The bytes of a reply written on the transport, with the ``Date`` that twisted puts on every routed reply
    (RFC 9110 section 6.6.1: a server with a clock sends it, on a 4xx too); the listener's early replies had none."""
    lines = [f"HTTP/1.1 {code} {reason(code).decode()}", f"Date: {datetimeToString().decode()}"]
    for name, value in {**headers, "Content-Length": str(len(body)), "Connection": "close"}.items():
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def send_json(request: Any, code: int, body: Any, headers: Mapping[str, str] | None = None) -> bytes:
    """Set code and headers of a JSON reply and return its bytes.

    Every JSON reply of every process goes through here (or
    :func:`send_encoded`), so the content type is always
    ``application/json; charset=utf-8`` (twisted's default is text/html).
    """
    return send_encoded(request, code, dumps(body), headers)


def send_encoded(request: Any, code: int, data: bytes, headers: Mapping[str, str] | None = None) -> bytes:
    """:func:`send_json` for a body already encoded by :func:`dumps`."""
    request.setResponseCode(code)
    request.setHeader(b"Content-Type", json_content_type(request))
    for name, value in (headers or {}).items():
        request.setHeader(name.encode("latin-1"), value.encode("latin-1"))
    request.setHeader(b"Content-Length", str(len(data)).encode())
    return data


def header(request: Any, name: bytes) -> str | None:
    """A request header as text (latin-1), or None; its field lines joined with ``", "`` as RFC 9110 section 5.3
    combines them, so that a second line is judged with the first instead of ignored (``Content-Encoding:
    identity`` then ``gzip`` was read as identity; two ``X-Service-Params`` ran with the first's params)."""
    value = request.requestHeaders.getRawHeaders(name)
    return ", ".join(v.decode("latin-1") for v in value) if value else None


#: RFC 9112 section 3.2: ``Host`` is ``uri-host [ ":" port ]`` (RFC 3986): a bracketed IP literal, or a registered
#: name or IPv4 address of unreserved, percent-encoded and sub-delimiter characters; empty is allowed.
_HOST = re.compile(rb"(\[[0-9A-Za-z:._~!$&'()*+,;=%-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(:[0-9]*)?")


#: A request line's version HTTP/1.N with N above 1 (one digit: RFC 9112 section 2.3's grammar), a later minor
#: version this server reads as its own 1.1.
_LATER_MINOR = re.compile(rb" HTTP/1\.[2-9]$")


def request_line(line: bytes) -> bytes:
    """``line`` as twisted may parse it: a later minor version read as 1.1 (RFC 9112 section 2.3: HTTP/1.2 was a
    400); empty for a target that is no request target (``healthz`` without its ``/``, a ``#fragment``: they
    were routed, an HTTP probe).  What else is wrong with it twisted refuses."""
    line = line[:minor.start()] + b" HTTP/1.1" if (minor := _LATER_MINOR.search(line)) else line
    target = (line.split(b" ") + [b""])[1]
    return b"" if b"#" in target or not target.lower().startswith((b"/", b"*", b"http://", b"https://")) else line


def valid_host(value: bytes) -> bool:
    """Whether ``value`` is a valid ``Host`` field value; one that is not (``a b/c``) makes the request a 400."""
    return _HOST.fullmatch(value) is not None


def connection_options(request: Any) -> frozenset[bytes]:
    """The options of every ``Connection`` field line, lowercase: ``close``, and the names of hop-by-hop headers,
    which a proxy must not forward (RFC 9110, section 7.6.1).  A list across lines and commas: twisted read
    only the first line's space-separated words, so ``Connection: close, X-Foo`` did not close."""
    values = request.requestHeaders.getRawHeaders(b"connection")
    if not values:
        return frozenset()
    return frozenset(token.strip().lower() for value in values for token in value.split(b",") if token.strip())


def bearer_token(request: Any) -> str | None:
    """The token of ``Authorization: Bearer <token>``, or None.

    None too for a request with two ``Authorization`` headers: which one
    counts is ambiguous (the first won here; a proxy in front that checks the
    last would disagree), so such a request carries no credential.
    """
    values = request.requestHeaders.getRawHeaders(b"authorization")
    if not values or len(values) > 1:
        return None
    value = values[0].decode("latin-1")
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def unauthorized_reason(request: Any, usual: str) -> str:
    """The reason of a 401: ``usual``, unless the request sent two ``Authorization`` headers, which
    :func:`bearer_token` reads as no credential: the 401 said "missing bearer token" to a client that sent two."""
    if len(request.requestHeaders.getRawHeaders(b"authorization") or ()) > 1:
        return "two Authorization headers were sent"
    return usual


def bearer_matches(request: Any, expected: str) -> bool:
    """Whether the request's Bearer token is ``expected`` (compared in constant time); a missing one is not."""
    token = bearer_token(request)
    return token is not None and hmac.compare_digest(token.encode(), expected.encode())


def envelope_headers(task_id: str) -> dict[str, str]:
    """The headers of every data-plane reply of the gateway and the model servers: the request id echoed, and
    ``Cache-Control: no-store`` (docs/contract.md, The envelope)."""
    return {"X-Request-ID": task_id, "Cache-Control": "no-store"}


def check_content_encoding(request: Any) -> None:
    """415 status 60 for a body sent compressed (``Content-Encoding``): no route decodes one, and read as it is,
    a gzip body was reported as JSON that does not parse.  Every coding of every line counts (a list).  The 415
    says what is taken, ``Accept-Encoding: identity`` (RFC 9110 section 15.5.16)."""
    encoding = header(request, b"content-encoding")
    if encoding and any(c.strip().lower() not in ("identity", "") for c in encoding.split(",")):
        raise ApiError(st.UNSUPPORTED_MEDIA_TYPE,
                       f"unsupported content encoding {encoding[:40]!r}: send the body uncompressed",
                       headers={"Accept-Encoding": "identity"})


def content_type(request: Any) -> tuple[str, dict[str, str]]:
    """The media type (lowercase) and its parameters; ('', {}) when absent.  A body's route reads it first, so
    the body's encoding is checked here too (:func:`check_content_encoding`)."""
    check_content_encoding(request)
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


def head_too_large(request_line: bool, limit: int, max_headers: int | None = None) -> ApiError:
    """The 414 of a request line (its path) past ``limit`` bytes, or the 431 of a head past it or with more than
    ``max_headers`` header lines."""
    if max_headers is not None:
        return ApiError(st.ENTITY_TOO_LARGE, f"request head with more than {max_headers} header lines", http=431)
    if request_line:
        return ApiError(st.ENTITY_TOO_LARGE, f"request line longer than {limit} bytes: the path is too long",
                        http=414)
    return ApiError(st.ENTITY_TOO_LARGE, f"request head (request line and headers) larger than {limit} bytes",
                    http=431)
