"""Paths no route may see: an empty segment, an encoded slash, or bytes that are not UTF-8 once percent-decoded.

twisted.web percent-decodes each segment of the path before Klein joins
them with ``/`` for werkzeug, so ``/v1/models/M%2Finfer`` reached the
``infer`` route as if it were ``/v1/models/M/infer``: a client could step
around a front proxy's rule for a path, and the contract matches a legacy
``server_uri`` exactly.  A leading ``//`` did the same: Klein's join
dropped the empty segment, so ``//v1/models/M/infer`` and the supervisor's
``//api/v1/status`` were served, and its ``//`` reached the UI's file
lookup with a path it had no file for (a 500).  No route has an empty
segment, so a path with ``//`` anywhere is no route, nor is a target that is
not a path (``GET *``).  Klein answers a segment that is not UTF-8 itself,
with an HTML 400 and no authentication.  :class:`RoutablePaths` stands in
front of the routes and answers both as a path that is no route: 401 to a
caller without credentials, else the process's 404 in its own reply shape.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

from twisted.web.resource import Resource

from svc.contract.errors import ApiError


class PathApp(Protocol):
    """What the check needs of the app behind it (svc.web.routes.JsonApp)."""

    replies: Any

    def before_routing_error(self, request: Any) -> None: ...

    def not_found(self, request: Any) -> ApiError: ...


def origin_form(target: bytes) -> bytes:
    """The path and query of a request target in the absolute form, ``http://host[:port]/path?query``.

    RFC 9112 (section 3.2.2) has a server accept that form, which clients
    configured to go through a proxy send; twisted.web took it as a path
    (``http:``, an empty segment, the host, ...), so every such request was a
    404.  Any other target is returned as it is."""
    head = target[:8].lower()
    if not (head.startswith(b"http://") or head.startswith(b"https://")):
        return target
    rest = target.split(b"://", 1)[1]
    ends = [i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0]
    if not ends:
        return b"/"
    tail = rest[min(ends):]
    return tail if tail.startswith(b"/") else b"/" + tail


def routable(path: bytes) -> bool:
    """Whether a request path may be routed: a path (``/`` first: not ``*``), no empty segment, no encoded ``/``,
    and UTF-8 once percent-decoded."""
    if b"//" in path or not path.startswith(b"/"):
        return False
    if b"%" not in path and path.isascii():
        return True  # nearly every request: nothing to decode
    if b"%2f" in path.lower():
        return False
    try:
        unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class RoutablePaths(Resource):
    """The app's routes (``inner``, Klein's resource) behind the check of :func:`routable`."""

    isLeaf = True

    def __init__(self, app: PathApp, inner: Resource) -> None:
        super().__init__()
        self.app = app
        self.inner = inner

    def render(self, request: Any) -> Any:
        if routable(request.path):
            return self.inner.render(request)
        request.service_route = "unmatched"
        try:
            self.app.before_routing_error(request)  # an unauthenticated caller gets 401 on every path
            error = self.app.not_found(request)
        except ApiError as e:
            error = e
        return self.app.replies.error(request, error)
