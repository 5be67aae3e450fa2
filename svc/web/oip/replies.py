"""Error replies in two shapes, chosen by path: the envelope, or the protocol's ``{"error"}``.

Every error the gateway or a model server answers goes through its one
:class:`ProtocolReplies` (authentication, rate limits, routing, the body
limit, admission, upstream failures), so an OIP route cannot miss a
condition the contract's routes answer: the same ApiError with the same
HTTP status and headers (``Retry-After``, ``WWW-Authenticate``, ``Allow``,
``X-Request-ID``, ``Cache-Control: no-store``), only its body is ``{"error": "<message>"}`` under
``/v2``.  The ``protocol`` label of the gateway's request metrics
(``contract`` or ``oip``) follows the same path rule.
"""

from __future__ import annotations

from typing import Any

from svc.contract import status as st
from svc.contract.envelope import new_task_id
from svc.contract.errors import ApiError
from svc.contract.oip import is_oip_path
from svc.contract.request import REQ_ID_RE, REQ_ID_RULE
from svc.web.replies import OIP_JSON_CONTENT_TYPE, dumps, envelope_headers, header, send_encoded
from svc.web.routes import EnvelopeReplies

#: Values of the ``protocol`` label of the gateway's request metrics.
CONTRACT, OIP = "contract", "oip"


def is_oip(request: Any) -> bool:
    """Whether ``request``'s path is under ``/v2`` (also for a request refused before it was parsed whole)."""
    path = getattr(request, "path", None)
    if path is None:  # an early 413: only the channel has seen the request line
        path = getattr(getattr(request, "channel", None), "_path", b"") or b""
    return is_oip_path(path)


def request_id(request: Any) -> str | None:
    """The client's ``X-Request-ID`` when it sent a valid one; 400 for one that is not (docs/oip.md: as on the
    infer route, refused rather than replaced; the metadata routes took any and echoed none)."""
    value = header(request, b"x-request-id")
    if value is not None and not REQ_ID_RE.fullmatch(value):
        raise ApiError(st.INVALID_REQUEST, "X-Request-ID header " + REQ_ID_RULE, http=400)
    return value


def ok(request: Any, body: dict) -> bytes:
    """A 200 with ``body``, the request's ``X-Request-ID`` echoed when it sent one (the metadata routes')."""
    rid = request_id(request)
    if rid is not None:
        request.setHeader(b"X-Request-ID", rid.encode("ascii"))
    return send_encoded(request, 200, dumps(body))


def protocol_of(request: Any) -> str:
    return OIP if is_oip(request) else CONTRACT


class ProtocolReplies(EnvelopeReplies):
    """The unified envelope, or ``{"error": message}`` for a request under ``/v2``."""

    def raw(self, request: Any | None, error: ApiError, path: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        if not (is_oip(request) if request is not None else is_oip_path(path or b"")):
            return super().raw(request, error, path)
        task_id = error.task_id or (self.task_id(request) if request is not None else new_task_id())
        return error.code, {**envelope_headers(task_id), **error.headers,
                            "Content-Type": OIP_JSON_CONTENT_TYPE.decode()}, dumps({"error": error.message})
