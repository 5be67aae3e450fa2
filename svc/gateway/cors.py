"""CORS for the supervisor's web UI, which calls the gateway from another origin.

Only the configured origins (default: the supervisor's own address on
127.0.0.1 and localhost) are reflected; any other origin gets no CORS header
at all, so the browser keeps its same-origin rule.  Every reply carries
``Vary: Origin`` because it depends on the request's origin.  A preflight
``OPTIONS`` is answered here, without credentials (browsers never send them
on a preflight), before the routes and their authentication run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.web.resource import Resource

from svc.web.routes import allowed_header

ALLOWED_HEADERS = (b"Authorization, Content-Type, Accept, X-Request-ID, X-Service-Params, X-Service-Options, "
                   b"Inference-Header-Content-Length")
EXPOSED_HEADERS = b"X-Service-Key, X-Request-ID, Retry-After, Location, Inference-Header-Content-Length"
MAX_AGE_S = b"600"


class CorsResource(Resource):
    """Wraps the gateway's resource: CORS headers on the way out, preflights answered here."""

    isLeaf = True

    def __init__(self, inner: Any, origins: tuple[str, ...] | list[str],
                 methods: Callable[[str], set[str]] = lambda path: {"GET", "POST"}) -> None:
        """``methods(path)``: the methods the routes accept on ``path`` (for ``Allow``)."""
        super().__init__()
        self.inner = inner
        self.origins = frozenset(o.encode("latin-1") for o in origins)
        self.methods = methods

    @classmethod
    def around(cls, app: Any, origins: tuple[str, ...] | list[str]) -> CorsResource:
        """CORS around the gateway's ``app``, which also puts its headers on the listener's early replies.

        A preflight's ``Allow`` names the fixed routes' methods, and POST for
        any other path, the methods of a legacy model path (``server_uri``):
        an unknown path answering otherwise told an unauthenticated caller
        which of those exist.
        """
        cors = cls(app.resource(), origins, lambda path: app.methods(path, configured=False) or {"POST"})
        app.early_headers = cors.headers_for
        return cors

    def headers_for(self, request: Any | None) -> dict[str, str]:
        """The CORS headers of a reply to ``request``: ``Vary`` always, the origin's when it is allowed.

        Also for the listener's early replies (413, 408, 400, 431: ``JsonApp.early_headers``), which no
        resource renders: without them a browser showed a refused upload as "Failed to fetch".  ``request`` is
        None for a reply before any request was read (a 414, the 503 past ``max_connections``): ``Vary`` only.
        """
        origin = None if request is None else (request.requestHeaders.getRawHeaders(b"origin") or [None])[0]
        if origin is None or origin not in self.origins:
            return {"Vary": "Origin"}
        return {"Vary": "Origin", "Access-Control-Allow-Origin": origin.decode("latin-1"),
                "Access-Control-Expose-Headers": EXPOSED_HEADERS.decode()}

    def render(self, request: Any) -> Any:
        cors = self.headers_for(request)
        allowed = "Access-Control-Allow-Origin" in cors
        request.responseHeaders.addRawHeader(b"Vary", b"Origin")
        for name in ("Access-Control-Allow-Origin", "Access-Control-Expose-Headers"):
            if name in cors:
                request.setHeader(name.encode(), cors[name].encode("latin-1"))
        if request.method == b"OPTIONS":
            request.service_route = "preflight"
            request.setResponseCode(204)
            path = request.path.decode("latin-1", "replace")
            served = set(self.methods(path)) - {"HEAD", "OPTIONS"}
            methods = ", ".join(sorted(served) + ["OPTIONS"]).encode()  # CORS: HEAD is a simple method, never asked
            # Allow lists HEAD with GET, as a 405's does (svc.web.routes.allowed_header): every GET route serves it.
            request.setHeader(b"Allow", f"{allowed_header(served)}, OPTIONS".encode())
            if allowed and request.requestHeaders.hasHeader(b"access-control-request-method"):
                request.setHeader(b"Access-Control-Allow-Methods", methods)
                request.setHeader(b"Access-Control-Allow-Headers", ALLOWED_HEADERS)
                request.setHeader(b"Access-Control-Max-Age", MAX_AGE_S)
            request.setHeader(b"Content-Length", b"0")
            return b""
        return self.inner.render(request)
