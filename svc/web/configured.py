"""The routes of one app instance whose paths come from its configuration.

A model server's ``server_uri``, the gateway's legacy ``{server_uri}`` route
per catalog model, and the job routes of a model server with
``async_enabled`` cannot be class-level Klein rules: the class is one, the
configurations many.  The app's catch-all (:func:`svc.web.routes.install`
with ``configured=True``) asks the instance's :class:`ConfiguredRoutes`
when no declared route matches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from inspect import iscoroutine
from typing import Any

from klein import Klein
from twisted.internet.defer import ensureDeferred
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, MapAdapter, Rule

from svc.web.methods import CaseSensitiveMap, case_sensitive


class ConfiguredRoutes:
    """The routes of one app instance whose paths come from its configuration.

    ``add`` takes one path and its handler; ``mount`` takes every route
    another class declares (its bound Klein, e.g. the job routes of a model
    server with jobs enabled).  Matched with werkzeug's own rules, like the
    declared routes.
    """

    #: At most this many (path, method) pairs are remembered (:meth:`dispatch`).
    STATIC_CACHE_SIZE = 256

    def __init__(self) -> None:
        self._map = CaseSensitiveMap()
        self._handlers: dict[str, Callable[..., Any]] = {}
        self._mounted: list[Klein] = []
        self._static: dict[tuple[str, str], tuple[Callable[..., Any], str]] = {}

    def add(self, path: str, methods: list[str], handler: Callable[..., Any]) -> None:
        endpoint = f"configured:{len(self._handlers)}"
        self._map.add(Rule(path, methods=methods, endpoint=endpoint))
        self._handlers[endpoint] = handler
        self._static.clear()

    def mount(self, app: Klein) -> None:
        case_sensitive(app.url_map)
        self._mounted.append(app)
        self._static.clear()

    def _run(self, endpoint: str, request: Any, **kwargs: Any) -> Any:
        result = self._handlers[endpoint](request, **kwargs)
        return ensureDeferred(result) if iscoroutine(result) else result

    def _tables(self) -> Iterator[tuple[Map, Callable[..., Any]]]:
        yield self._map, self._run
        for app in self._mounted:
            yield app.url_map, app.execute_endpoint

    def allowed_methods(self, path: str) -> set[str]:
        """The methods these routes accept on ``path``."""
        methods: set[str] = set()
        for url_map, _ in self._tables():
            methods.update(url_map.bind("configured").allowed_methods(path))
        return methods

    def dispatch(self, request: Any, mapper: MapAdapter) -> Any:
        """Run the route matching the request (as ``mapper`` saw it); else raise werkzeug's verdict.

        A path and method that matched a rule without arguments (``POST
        /jobs``, ``POST {server_uri}``) are remembered with what they matched:
        werkzeug's answer depends on nothing else here (no host or subdomain
        rules), and binding and matching each table again cost about a
        tenth of the reactor's work per job submit (bench/README.md,
        jobs_burst).  Paths with arguments (a job id) are matched each time.
        """
        key = (mapper.path_info, mapper.default_method)
        known = self._static.get(key)
        if known is not None:
            return known[0](known[1], request)
        allowed: set[str] = set()
        other: HTTPException | None = None
        for url_map, run in self._tables():
            adapter = url_map.bind(mapper.server_name, mapper.script_name, path_info=mapper.path_info,
                                   default_method=mapper.default_method, url_scheme=mapper.url_scheme)
            try:
                endpoint, kwargs = adapter.match()
            except MethodNotAllowed as e:
                allowed.update(e.valid_methods or ())
                continue
            except NotFound:
                continue
            except HTTPException as e:  # a redirect (merged slashes): answered 404 like any routing error
                other = other or e
                continue
            if not kwargs and len(self._static) < self.STATIC_CACHE_SIZE:
                self._static[key] = (run, endpoint)
            return run(endpoint, request, **kwargs)
        if allowed:
            raise MethodNotAllowed(sorted(allowed))
        raise other or NotFound()
