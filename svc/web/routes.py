"""What the three Klein apps share: error replies, configured routes, request counting, metrics.

Every app class declares its routes once, as in Klein's own example:
``app = Klein()`` in the class body, ``@app.route(...)`` on methods, and
``self.app.resource()`` binds the instance.  Each class derives from
:class:`JsonApp` and ends its body with :func:`install`, which adds, in this
order, the handlers every process answers errors with:

1. :class:`svc.contract.errors.ApiError` -> the instance's reply shape
   (``self.replies``): the unified envelope (gateway and model server, each
   with its own identity and task id, :class:`EnvelopeReplies`) or the
   supervisor's ``{ok: false, error}`` (:class:`OkErrorReplies`), with the
   error's HTTP code and headers;
2. werkzeug's routing errors -> ``before_routing_error`` (the gateway
   authenticates there: an unauthenticated caller gets 401 on every path),
   then one method-not-allowed answer (405 with ``Allow``, HEAD with GET) or
   404 in the same shape;
3. any other exception -> logged, 500 in the same shape.

Paths that come from configuration (a model server's ``server_uri``, the
gateway's legacy ``{server_uri}`` route per catalog model, the job routes
of a model server with ``async_enabled``) cannot be class-level rules: the
class is one, the configurations many.  ``install(app, configured=True)``
adds one catch-all route of lowest priority; werkzeug tries every declared
route first (static parts before converters, and a ``path`` converter
last), so the catch-all only sees a request no declared route accepts.  It
asks the instance's :class:`svc.web.configured.ConfiguredRoutes` (a werkzeug map of its own),
and when that has nothing either, it raises the declared routes' own
verdict, matched again without the catch-all: a path known with another
method is 405 with that method in ``Allow``, anything else 404, exactly as if
every route had been one map.  The routes it finds run inside the
catch-all's own Deferred, so a client that goes away cancels them like any
other route.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from klein import Klein
from klein.interfaces import IKleinRequest
from twisted.logger import Logger
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map

from svc.contract import status as st
from svc.contract.envelope import ModelIdentity, new_task_id, rejection
from svc.contract.errors import ApiError
from svc.contract.request import REQ_ID_RE
from svc.infra.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from svc.infra.metrics import render
from svc.web.configured import ConfiguredRoutes
from svc.web.methods import CaseSensitiveMap, case_sensitive
from svc.web.paths import RoutablePaths
from svc.web.replies import dumps, envelope_headers, header, send_encoded

#: The ``method`` label values of ``service_http_requests_total``: HTTP's registered methods; any other token
#: (a client may send any, before it is authenticated) is counted as :data:`OTHER_METHOD`.
METHOD_LABELS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE", "-"})
OTHER_METHOD = "other"

#: Endpoints of the catch-all routes added by ``install(app, configured=True)``.
CATCH_ALL = ("configured_root", "configured")


def allowed_header(methods: Any) -> str:
    """The ``Allow`` value of a 405: the route's methods, with the HEAD werkzeug adds to every GET, which is served
    (RFC 9110 lists every method the resource supports; an OIP probe's HEAD got 200 and a 405 without it)."""
    methods = set(methods or ())
    return ", ".join(sorted(methods | {"HEAD"} if "GET" in methods else methods))


def task_id_of(request: Any) -> str:
    """The task id a reply to ``request`` carries: the one its handler settled on (``service_task_id``, a
    parsed ``req_id``), else its ``X-Request-ID`` when that is a valid one, else a new one."""
    known = getattr(request, "service_task_id", None)
    if known:
        return known
    rid = header(request, b"x-request-id")
    return rid if rid is not None and REQ_ID_RE.fullmatch(rid) else new_task_id()


# -- reply shapes ------------------------------------------------------------------------------


def envelope_reply(error: ApiError, task_id: str, identity: ModelIdentity) -> tuple[int, dict[str, str], bytes]:
    """An error as the unified envelope: code, headers (``X-Request-ID`` first, and ``Cache-Control: no-store``
    as on every data-plane reply), body."""
    body = rejection(error.status, error.message, task_id=task_id, model=identity, errors=error.errors)
    return error.code, {**envelope_headers(task_id), **error.headers}, dumps(body)


def ok_error_reply(error: ApiError) -> tuple[int, dict[str, str], bytes]:
    """An error as the management API's ``{ok: false, error}``: code, headers, body."""
    return error.code, dict(error.headers), dumps({"ok": False, "error": error.message})


class Replies:
    """A process's error reply shape; ``not_found`` and ``internal`` are its 404 and 500 texts."""

    not_found = "no route for {path}"
    internal = "internal server error"

    def raw(self, request: Any | None, error: ApiError, path: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        """Code, headers and body of ``error``; ``request`` is None for a reply before any request, with the
        ``path`` read so far if any (a head too large)."""
        raise NotImplementedError

    def echoed(self, request: Any | None) -> dict[str, str]:
        """The headers that echo ``request``'s own on a reply without a body (the bare 408); none here."""
        return {}

    def error(self, request: Any, error: ApiError) -> bytes:
        """Answer ``request`` with ``error``: code and headers set, the body returned."""
        code, headers, body = self.raw(request, error)
        return send_encoded(request, code, body, headers)


class EnvelopeReplies(Replies):
    """The unified envelope of the data plane; the app supplies its identity and how it names a request."""

    def __init__(self, identity: Callable[[], ModelIdentity], task_id: Callable[[Any], str], *,
                 not_found: str = Replies.not_found) -> None:
        self.identity = identity
        self.task_id = task_id
        self.not_found = not_found

    def raw(self, request: Any | None, error: ApiError, path: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        task_id = error.task_id or (self.task_id(request) if request is not None else new_task_id())
        return envelope_reply(error, task_id, self.identity())

    def echoed(self, request: Any | None) -> dict[str, str]:
        """The client's ``X-Request-ID`` when it sent a valid one (a reply with no envelope generates none)."""
        rid = header(request, b"x-request-id") if request is not None else None
        return {"X-Request-ID": rid} if rid is not None and REQ_ID_RE.fullmatch(rid) else {}


class OkErrorReplies(Replies):
    """The management API's ``{ok: false, error}``."""

    not_found = "no such route: {path}"
    internal = "internal error"

    def raw(self, request: Any | None, error: ApiError, path: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        return ok_error_reply(error)


_DECLARED: dict[int, Map] = {}


def declared_map(app: Klein) -> Map:
    """``app``'s declared routes without the catch-all (built once per class)."""
    found = _DECLARED.get(id(app.url_map))
    if found is None:
        found = _DECLARED[id(app.url_map)] = CaseSensitiveMap([r.empty() for r in app.url_map.iter_rules()
                                                  if r.endpoint not in CATCH_ALL])
    return found


# -- the base of the three apps ----------------------------------------------------------------


class JsonApp:
    """Routes, error handling, counting and metrics shared by the gateway, model server and supervisor apps.

    A subclass sets ``app`` (its class-level Klein, finished by
    :func:`install`) and, per instance, ``replies`` (its reply shape),
    ``metrics`` (with a ``requests`` counter) and ``registry``;
    ``configured`` when it has routes from configuration.
    """

    app: Klein
    replies: Replies
    metrics: Any
    registry: Any
    configured: ConfiguredRoutes | None = None
    #: Headers for a listener's early reply to a request no route saw (its 413, 408, 400, 414, 431 and 503; the
    #: request is None where none was read yet): the gateway's CORS.
    early_headers: Callable[[Any | None], dict[str, str]] | None = None

    def resource(self) -> Any:
        """The twisted resource of this instance's routes, behind the check of the paths they may see."""
        return RoutablePaths(self, self.app.resource())

    def methods(self, path: str, configured: bool = True) -> set[str]:
        """The methods the routes accept on ``path`` (empty for an unknown path); CORS answers with them.

        ``configured`` False leaves out the routes from configuration (the
        gateway's legacy model paths), whose methods would tell which exist.
        """
        try:
            methods = set(declared_map(self.app).bind("app").allowed_methods(path))
            if configured and self.configured is not None:
                methods |= self.configured.allowed_methods(path)
        except Exception:  # noqa: BLE001 - a path werkzeug cannot parse has no methods
            return set()
        return methods

    def before_routing_error(self, request: Any) -> None:
        """Runs before a 404 or 405 is answered; may raise ApiError instead (the gateway authenticates here)."""

    def known_target(self, args: Mapping[str, Any]) -> bool:
        """Whether a route's arguments name something that exists; a wrong method on one that does not is 404,
        not 405 (the gateway: a model id its catalog lacks).  Everything exists here."""
        return True

    def route_args(self, request: Any, methods: Any) -> Mapping[str, Any]:
        """The arguments of the declared route that ``request``'s path matches with one of ``methods``."""
        mapper = IKleinRequest(request).mapper
        adapter = declared_map(self.app).bind(mapper.server_name, mapper.script_name, path_info=mapper.path_info,
                                              url_scheme=mapper.url_scheme)
        for method in methods:
            try:
                return adapter.match(method=method)[1]
            except HTTPException:
                continue
        return {}

    def count(self, request: Any) -> None:
        """Called by the site for every finished request: ``service_http_requests_total``."""
        route = getattr(request, "service_route", "unmatched")
        self.count_as(route, request.method.decode("latin-1"), request.code, *self.count_labels(request))

    def count_labels(self, request: Any) -> tuple[str, ...]:
        """Values of the labels an app's ``requests`` counter has after route, method and code (none here)."""
        return ()

    def count_as(self, route: str, method: str, code: int, *extra: str) -> None:
        """Count one request by route, method and code, and ``extra`` labels (also for a 413 answered before routing).

        The labelled counters are kept per metrics object: a ``labels()``
        lookup costs about 5 us on the reactor, the cached child's ``inc()`` 1.5.
        """
        if method not in METHOD_LABELS:
            method = OTHER_METHOD  # any token is a method to HTTP: a label each would grow without bound
        cache = self.__dict__.get("_request_counters")
        if cache is None or cache[0] is not self.metrics:
            cache = self.__dict__["_request_counters"] = (self.metrics, {})
        counters: dict[tuple[Any, ...], Any] = cache[1]
        key = (route, method, code, *extra)
        counter = counters.get(key)
        if counter is None:
            counter = counters[key] = self.metrics.requests.labels(route, method, str(code), *extra)
        counter.inc()

    def limit_reply(self, request: Any | None, error: ApiError, method: str = "-",
                    path: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        """A request refused by a listener limit before any route saw it (svc.web.limits): counted, in this
        process's reply shape; ``request`` is None when none was made yet (a head too large, whose ``path``
        chooses the shape where it was read)."""
        self.count_as("unmatched", method, error.code, *self.count_labels(request))
        return self.with_early_headers(request, self.replies.raw(request, error, path))

    def with_early_headers(self, request: Any | None,
                           reply: tuple[int, dict[str, str], bytes]) -> tuple[int, dict[str, str], bytes]:
        """``reply`` with :attr:`early_headers` added, also where no request was read yet (the gateway's
        ``Vary: Origin``, which every one of its replies carries, was missing from its early 400, 414 and 431)."""
        if self.early_headers is None:
            return reply
        code, headers, body = reply
        return code, {**headers, **self.early_headers(request)}, body

    #: The texts of the listener's own 413 and 503 (``max_body_bytes`` is filled in).
    oversize_text = "request body larger than {max_body_bytes} bytes (max_body_bytes)"
    busy_text = "too many open connections (max_connections); retry shortly"

    def oversize_reply(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        """The early 413 of the listener's body limit (svc.web.limits.LimitedRequest), counted."""
        message = self.oversize_text.format(max_body_bytes=getattr(self, "max_body_bytes", None))
        return self.limit_reply(request, ApiError(st.ENTITY_TOO_LARGE, message), "POST")

    def busy_reply(self) -> tuple[int, dict[str, str], bytes]:
        """The 503 status 65 for a connection past ``max_connections`` (svc.web.limits.LimitedChannel)."""
        return self.with_early_headers(None, self.replies.raw(None, ApiError(st.NOT_READY, self.busy_text,
                                                                              headers={"Retry-After": "1"})))

    def bare_headers(self, request: Any | None) -> dict[str, str]:
        """The headers of the listener's bare 408 (its header deadline; ``request``: the one whose head was being
        read, if any): the early ones (the gateway's CORS headers for an ``Origin`` line read: a browser read the
        408 without them as a failed fetch), and the client's valid ``X-Request-ID`` where the reply shape echoes
        it (docs/api.md; a log pipeline follows a request by it)."""
        return {**self.replies.echoed(request), **self.with_early_headers(request, (408, {}, b""))[1]}

    def refusal_before_body(self, request: Any, length: int | None) -> tuple[int, dict[str, str], bytes] | None:
        """The reply to a request that its head alone refuses, written before its body (``length`` bytes; None:
        chunked) is read; None reads the body (within the listener's limits) and routes it.  The gateway refuses a
        large body without a valid credential here: an unauthenticated client could otherwise make it hold
        ``max_body_bytes`` per connection."""
        return None

    def count_refused(self, method: str, code: int) -> None:
        """Count a reply the listener sent before any request was routed (the bare 408 of headers that did not
        arrive in time, the 503 past ``max_connections``): every reply is counted, or a slowloris or a connection
        flood is invisible to the metrics."""
        self.count_as("unmatched", method, code, *self.count_labels(None))

    def metrics_body(self, request: Any) -> bytes:
        """The registry as Prometheus text: the body of ``GET /metrics`` once its caller is admitted."""
        request.setHeader(b"Content-Type", METRICS_CONTENT_TYPE.encode())
        return render(self.registry)

    # -- what install() registers ------------------------------------------------------------

    def configured_route(self, request: Any, path: str = "") -> Any:
        """The catch-all: a route from configuration, else the declared routes' own 404 or 405."""
        mapper = IKleinRequest(request).mapper
        if self.configured is not None:
            try:
                return self.configured.dispatch(request, mapper)
            except MethodNotAllowed:
                raise
            except HTTPException:
                pass
        declared = declared_map(self.app).bind(mapper.server_name, mapper.script_name, path_info=mapper.path_info,
                                               default_method=mapper.default_method, url_scheme=mapper.url_scheme)
        declared.match()  # raises: a declared route that matched would have been chosen before the catch-all
        raise NotFound()

    def api_error(self, request: Any, failure: Any) -> bytes:
        return self.replies.error(request, failure.value)

    def routing_error(self, request: Any, failure: Any) -> bytes:
        """404 and 405 (every other werkzeug routing answer, a redirect for merged slashes, is 404 too; so is a
        wrong method on a route whose arguments name nothing that exists, ``known_target``)."""
        request.service_route = "unmatched"
        try:
            self.before_routing_error(request)
        except ApiError as e:
            return self.replies.error(request, e)
        err = failure.value
        if isinstance(err, MethodNotAllowed) and self.known_target(self.route_args(request, err.valid_methods or ())):
            allowed = allowed_header(err.valid_methods)
            return self.replies.error(request, ApiError(
                st.METHOD_NOT_ALLOWED, f"method {request.method.decode('latin-1')} not allowed; allowed: {allowed}",
                headers={"Allow": allowed}))
        return self.replies.error(request, self.not_found(request))

    def not_found(self, request: Any) -> ApiError:
        """The 404 of ``request``'s path: for a path no route takes, and for a route's unknown model alike, counted
        alike as ``route="unmatched"`` (an unknown model's was counted under its route's name)."""
        request.service_route = "unmatched"
        path = request.path.decode("latin-1", "replace")[:200]
        return ApiError(st.NOT_FOUND, self.replies.not_found.format(path=path))

    def unexpected_error(self, request: Any, failure: Any) -> bytes:
        Logger(namespace=type(self).__module__).failure("unexpected error answering {path}", failure,
                                                        path=request.path)
        return self.replies.error(request, ApiError(st.INTERNAL_ERROR, self.replies.internal))


def install(app: Klein, *, configured: bool = False) -> None:
    """Finish a :class:`JsonApp` subclass's Klein: the error handlers, and the catch-all when it has configured routes.

    Called once at the end of the class body, after every ``@app.route``.
    """
    if configured:
        app.route("/", endpoint=CATCH_ALL[0])(JsonApp.configured_route)
        app.route("/<path:path>", endpoint=CATCH_ALL[1])(JsonApp.configured_route)
    case_sensitive(app.url_map)
    app.handle_errors(ApiError)(JsonApp.api_error)
    app.handle_errors(HTTPException)(JsonApp.routing_error)
    app.handle_errors(Exception)(JsonApp.unexpected_error)
