"""The management API under /api/v1/ and the web UI, served by the supervisor.

Every reply of the API is JSON with the ``{ok, error}`` shape; the only
credential is ``Authorization: Bearer <SERVICE_API_TOKEN>`` (an API key never
authorizes here).  ``/api/v1/health`` and the UI's files need no credential:
the page asks for the token and keeps it in the browser.  The routes::

    GET  /api/v1/health                          liveness (no credential)
    GET  /api/v1/catalog                         the catalog models
    GET  /api/v1/status                          gateway and model servers (each with its replicas)
    POST /api/v1/servers/{id}/start|stop|restart 200 {ok: true} once done, 500 {ok: false, error};
                                                 a model's restart is rolling, one replica at a time
    POST /api/v1/servers/{id}/replicas/{n}/start|stop|restart   one replica
    POST /api/v1/servers/__gateway/restart       restarts the gateway (it reloads the key file)
    GET  /api/v1/servers/{id}/logs?offset=&limit= the child's output (a model's replica 0), paged by line number
    GET  /api/v1/servers/{id}/replicas/{n}/logs  replica n's
    GET  /api/v1/servers/{id}/openapi            the running model server's /openapi.json, relayed
    GET  /api/v1/series                          every child's live figures (svc.supervisor.series)
    GET  /api/v1/servers/{id}/series             one child's (a model's replica 0)
    GET  /api/v1/servers/{id}/replicas/{n}/series replica n's
    GET  /api/v1/metrics                         Prometheus text

Errors are :class:`svc.contract.errors.ApiError` like everywhere, answered in the
``{ok: false, error}`` shape (svc.web.routes.OkErrorReplies) with the
status's HTTP code, or ``http`` where no status has the code (400).  The
UI's paths are constants, so their routes are declared in the class body
like the others.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.logger import Logger

from svc import __version__
from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.contract.protocol import OPENAPI_PATH
from svc.contract.query import MAX_DIGITS, parse_bounded_int, query_value, shown
from svc.supervisor.child import ChildError
from svc.supervisor.manager import GATEWAY, ChildManager
from svc.web import declare, routes
from svc.web.replies import bearer_matches, send_json, unauthorized_reason

log = Logger()

#: The page's ES modules: app.js wires the page and imports the others (no build step). A module
#: is served only when it is named here; the browser refuses a module without a JavaScript type.
UI_MODULES = ("app.js", "state.js", "api.js", "session.js", "status.js", "charts.js", "logs.js", "try-it.js",
              "results.js")
UI_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/favicon.svg": ("favicon.svg", "image/svg+xml"),
    **{f"/ui/{name}": (name, "text/javascript; charset=utf-8") for name in UI_MODULES},
    "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
}
UI_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; connect-src *; "
    "style-src 'self'; script-src 'self'; frame-ancestors 'none'",
}
LOG_LIMIT_DEFAULT, LOG_LIMIT_MAX = 200, 2000


class ManagementApi(routes.JsonApp):
    """The management API and the UI's files; ``resource()`` is served by a JsonSite."""

    app = Klein()
    replies = routes.OkErrorReplies()
    oversize_text = "request body too large"
    busy_text = "too many open connections; retry shortly"

    def __init__(self, *, manager: ChildManager, token: str, registry: Any, metrics: Any, ui_dir: str,
                 series: Any = None, fetch: Callable[[int, str, str | None], Deferred] | None = None) -> None:
        self.manager = manager
        self.series = series
        self.fetch = fetch
        self.token = token
        self.registry = registry
        self.metrics = metrics
        self.ui = {path: (self._read(ui_dir, name), ctype) for path, (name, ctype) in UI_FILES.items()}

    @staticmethod
    def _read(directory: str, name: str) -> bytes:
        with open(os.path.join(directory, name), "rb") as f:
            return f.read()

    # -- helpers ---------------------------------------------------------------------

    def before_routing_error(self, request: Any) -> None:
        """Under ``/api/`` a 404 or 405 comes after the credential, as on the gateway: without the management
        token a caller learns nothing of the API's paths and methods (the UI's files stay open)."""
        if request.path.startswith(b"/api/"):
            self.authenticate(request)

    def refusal_before_body(self, request: Any, length: int | None) -> tuple[int, dict[str, str], bytes] | None:
        """None (every body is read, then its route answers 401 without the token), but a body coming without the
        management token may lose its connection to a new one at ``max_connections`` once stalled (svc.web.idle):
        a local user's trickled bodies held every slot of the supervisor (a regression probe)."""
        if not bearer_matches(request, self.token):
            request.unvouched()
        return None

    def authenticate(self, request: Any, **_route_args: Any) -> None:
        """401 unless the Bearer token is the management token."""
        if not bearer_matches(request, self.token):
            reason = unauthorized_reason(request, "missing or wrong management token")
            raise ApiError(st.UNAUTHORIZED, f"{reason} (Authorization: Bearer <SERVICE_API_TOKEN>)",
                           headers={"WWW-Authenticate": 'Bearer realm="supervisor"'})

    def child(self, name: str, replica: int | None = None) -> Any:
        """One process: the gateway or a model's replica (0 unless named); 404 otherwise."""
        try:
            return self.manager.process(name, replica)
        except ChildError as e:
            raise ApiError(st.NOT_FOUND, str(e)) from None

    def target(self, name: str) -> Any:
        """What a server-level action acts on: the gateway, or a model (all its replicas); 404 otherwise."""
        try:
            return self.manager.target(name)
        except ChildError as e:
            raise ApiError(st.NOT_FOUND, str(e)) from None

    @staticmethod
    def ok(request: Any, body: dict | None = None) -> bytes:
        return send_json(request, 200, {"ok": True, **(body or {})}, {"Cache-Control": "no-store"})

    # -- routes ------------------------------------------------------------------------

    @declare.route(app, "/api/v1/health", methods=["GET"], name="health")
    def health(self, request: Any) -> bytes:
        return self.ok(request, {"version": __version__})

    @declare.route(app, "/api/v1/catalog", methods=["GET"], name="catalog", admit="authenticate")
    def catalog(self, request: Any) -> bytes:
        return self.ok(request, {"profile": self.manager.profile.name, "models": self.manager.catalog_view()})

    @declare.route(app, "/api/v1/status", methods=["GET"], name="status", admit="authenticate")
    def status(self, request: Any) -> bytes:
        return self.ok(request, {"version": __version__, **self.with_modes(self.manager.status_view())})

    def with_modes(self, view: dict[str, Any]) -> dict[str, Any]:
        """``view`` with each model's and replica's ``optimize``: the execution mode a ready replica reported in
        its last metrics scrape (``service_model_info``, through the series), null otherwise; a model's is its
        first ready replica's.  What ``auto`` chose was in the model's log alone."""
        for server in view["servers"]:
            for replica in server["replicas"]:
                ready = replica["ready"] and self.series is not None
                replica["optimize"] = self.series.mode_of(replica["name"]) if ready else None
            server["optimize"] = next((r["optimize"] for r in server["replicas"] if r["optimize"]), None)
        return view

    @declare.route(app, "/api/v1/servers/<string:name>/<any(start,stop,restart):action>",
                  methods=["POST"], name="action", admit="authenticate")
    async def action(self, request: Any, name: str, action: str) -> bytes:
        return await self._act(request, self.target(name), action)

    @declare.route(app, "/api/v1/servers/<string:name>/replicas/<int:replica>/<any(start,stop,restart):action>",
                  methods=["POST"], name="action", admit="authenticate")
    async def replica_action(self, request: Any, name: str, replica: int, action: str) -> bytes:
        child = self.child(name, replica)
        if getattr(self.target(name), "rolling", False):  # two restarts at once took the model down
            raise ApiError(st.INTERNAL_ERROR, f"{name}: a rolling restart is under way: act on replica {replica} "
                                              "once it is done")
        return await self._act(request, child, action)

    async def _act(self, request: Any, target: Any, action: str) -> bytes:
        # The action goes on even if the client disconnects; the reply waits for it.
        done = ensureDeferred(self._do(target, action))
        try:
            await _uncancellable(done)
        except ChildError as e:  # its reason in the supervisor's output and the child's log too, not the reply only
            name = getattr(target, "name", "?")
            log.warn("{name}: {action} asked through the management API failed: {why}", name=name, action=action,
                     why=str(e))
            for child in getattr(target, "children", [target]):  # a model's replicas, or the one process
                child.logs.note(f"{action} failed: {e}")
            raise ApiError(st.INTERNAL_ERROR, str(e)) from None
        return self.ok(request)

    async def _do(self, child: Any, action: str) -> None:
        await getattr(child, action)()

    @declare.route(app, "/api/v1/servers/<string:name>/logs", methods=["GET"], name="logs", admit="authenticate")
    def logs(self, request: Any, name: str) -> bytes:
        return self._logs(request, name, self.child(name))

    @declare.route(app, "/api/v1/servers/<string:name>/replicas/<int:replica>/logs",
                  methods=["GET"], name="logs", admit="authenticate")
    def replica_logs(self, request: Any, name: str, replica: int) -> bytes:
        return self._logs(request, name, self.child(name, replica), replica)

    def _logs(self, request: Any, name: str, child: Any, replica: int | None = None) -> bytes:
        offset = _int_arg(request, b"offset", None, minimum=0)
        limit = _int_arg(request, b"limit", LOG_LIMIT_DEFAULT, minimum=1, maximum=LOG_LIMIT_MAX)
        where = {} if replica is None else {"replica": replica}
        return self.ok(request, {"id": name, **where, **child.logs.page(offset, limit)})

    @declare.route(app, "/api/v1/servers/<string:name>/openapi", methods=["GET"], name="openapi", admit="authenticate")
    async def openapi(self, request: Any, name: str) -> bytes:
        """The model's contract as its running server states it (params' defaults and bounds follow its config).

        The UI reads the params' defaults from it; the gateway serves no
        OpenAPI document of the models, and the committed ones under
        ``openapi/`` describe the shipped configs, not necessarily this one.
        """
        target = self.target(name)
        if name == GATEWAY:
            raise ApiError(st.NOT_FOUND, "this route gives the model servers' documents; the gateway serves "
                                         "its own at GET /openapi.json (committed as openapi/gateway.json)")
        # Any running replica: they all run the same config.
        child = next((c for c in target.children if c.snapshot()["state"] == "running"), target.children[0])
        if child.snapshot()["state"] != "running" or self.fetch is None:
            raise ApiError(st.NOT_READY, f"{name} is not running: its OpenAPI document comes from the running server")
        body = await self.fetch(child.spec.port, OPENAPI_PATH, None)
        if body is None:
            raise ApiError(st.NOT_READY, f"{name} did not answer GET /openapi.json")
        try:
            document = json.loads(body)
        except ValueError:
            raise ApiError(st.BAD_GATEWAY, f"{name} answered GET /openapi.json with something other than JSON") from None
        return self.ok(request, {"id": name, "openapi": document})

    @declare.route(app, "/api/v1/series", methods=["GET"], name="series", admit="authenticate")
    def all_series(self, request: Any) -> bytes:
        return self.ok(request, self.series.view())

    @declare.route(app, "/api/v1/servers/<string:name>/series", methods=["GET"], name="series", admit="authenticate")
    def one_series(self, request: Any, name: str) -> bytes:
        return self._series(request, name, self.child(name))

    @declare.route(app, "/api/v1/servers/<string:name>/replicas/<int:replica>/series",
                  methods=["GET"], name="series", admit="authenticate")
    def replica_series(self, request: Any, name: str, replica: int) -> bytes:
        return self._series(request, name, self.child(name, replica), replica)

    def _series(self, request: Any, name: str, child: Any, replica: int | None = None) -> bytes:
        where = {} if replica is None else {"replica": replica}
        shift = self.series.shift()
        return self.ok(request, {"id": name, **where, "interval_s": self.series.interval,
                                 "window_s": self.series.window, "now": self.series.now(shift),
                                 **self.series.child_view(child.name, shift)})

    @declare.route(app, "/api/v1/metrics", methods=["GET"], name="metrics", admit="authenticate")
    def metrics_route(self, request: Any) -> bytes:
        return self.metrics_body(request)

    def ui_file(self, request: Any) -> bytes:
        body, ctype = self.ui[request.path.decode("latin-1")]
        request.setHeader(b"Content-Type", ctype.encode())
        for name, value in UI_HEADERS.items():
            request.setHeader(name.encode(), value.encode())
        return body

    for _path in UI_FILES:
        declare.route(app, _path, methods=["GET"], name="ui", endpoint=f"ui:{_path}")(ui_file)
    del _path

    routes.install(app)


def _int_arg(request: Any, name: bytes, default: int | None, *, minimum: int, maximum: int | None = None) -> int | None:
    """A numeric query argument by svc.contract.query's rules (the first of repeated ones); 400 otherwise."""
    raw = query_value(request.uri, name)
    if raw is None:
        return default
    value = parse_bounded_int(raw, minimum=minimum, maximum=maximum)
    if value is None:
        bounds = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}, at most {MAX_DIGITS} digits"
        raise ApiError(st.INVALID_REQUEST, f"{name.decode()} must be an integer {bounds}, got {shown(raw)}",
                       http=400)
    return value


def _uncancellable(d: Any) -> Any:
    """A Deferred that follows ``d`` but whose cancellation leaves ``d`` running."""
    from twisted.internet.defer import Deferred

    out: Deferred = Deferred()
    d.addBoth(lambda r: (out.callback(r) if not out.called else None))
    return out


__all__ = ["ManagementApi", "GATEWAY"]
