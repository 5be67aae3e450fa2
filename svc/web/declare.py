"""Declaring a route: its name and its caller's admission, said once where the route is declared.

In the spirit of Tahoe-LAFS's ``_authorized_route``: the head every route
used to repeat (``request.service_route = ...``, then the credential check)
is an argument of the declaration::

    @route(app, JOBS, methods=["POST"], name="jobs_submit", admit="admit_submit")
    async def submit(self, request, ...): ...

The three processes' apps (:mod:`svc.gateway.app`, :mod:`svc.modelserver.app`,
:mod:`svc.modelserver.job_routes`, :mod:`svc.supervisor.api`) and the
gateway's ``/v2`` routes declare every route this way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from inspect import isawaitable, iscoroutinefunction
from typing import Any

from klein import Klein


def guarded(name: str, admit: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a route method name itself and admit its caller before its body runs.

    In the spirit of Tahoe-LAFS's ``_authorized_route``: the head every route
    used to repeat is said once, where the route is declared.

    - ``name`` is the route's label in the request metrics and the access log
      (``request.service_route``), set first, so that a refusal is counted
      under the route it refused.
    - ``admit`` names the app's method that admits the caller, called with the
      request and the route's keyword arguments (a job route's ``job_id``);
      it raises :class:`ApiError` (401, 429, 503...) to refuse.  It may be a
      coroutine (the gateway's rate store answers later); the route must then
      be one too.  None: an open route (health, readiness).

    A configured route (:class:`ConfiguredRoutes`) uses this alone; a declared
    one uses :func:`route`.
    """

    def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
        if iscoroutinefunction(handler):

            @functools.wraps(handler)
            async def admitted_async(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
                request.service_route = name
                if admit is not None:
                    admission = getattr(self, admit)(request, **kwargs)
                    if isawaitable(admission):
                        await admission
                return await handler(self, request, *args, **kwargs)

            return admitted_async

        @functools.wraps(handler)
        def admitted(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            request.service_route = name
            if admit is not None and isawaitable(getattr(self, admit)(request, **kwargs)):
                raise TypeError(f"route {name}: {admit} answers later, so the route must be a coroutine")
            return handler(self, request, *args, **kwargs)

        return admitted

    return decorate


def route(app: Klein, path: str, *, methods: list[str], name: str, admit: str | None = None,
          **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@app.route(path, methods=...)`` of a method that names itself and admits its caller (:func:`guarded`)."""

    def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
        return app.route(path, methods=methods, **kwargs)(guarded(name, admit)(handler))

    return decorate
