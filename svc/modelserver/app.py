"""HTTP routes of a model server (Klein): the glue between HTTP and the data plane.

Authentication (``SERVICE_AUTH_TOKEN``) comes before the per-IP rate limit,
so unauthenticated callers get 401 and spend no budget.  ``/healthz``,
``/ready`` and ``/openapi.json`` are exempt.  Every reply is JSON with the
unified envelope except ``/metrics`` (Prometheus text).

The fixed routes are declared once in the class body.  The inference route's
path is the config's ``server_uri`` and the job routes exist only with
``async_enabled``: each instance adds those to its
:class:`svc.web.routes.ConfiguredRoutes` (``enable_jobs`` mounts the routes
:class:`svc.modelserver.job_routes.JobRoutes` declares), which the class's
catch-all asks when no declared route matches.  So ``GET {server_uri}`` is
405 with ``Allow: POST``, ``GET /jobs`` is 405 with jobs enabled and 404
without, and an unknown path is 404, as if every route were declared.
"""

from __future__ import annotations

import hmac
from typing import Any

from klein import Klein
from twisted.internet.interfaces import IReactorTime

from svc.contract import status as st
from svc.contract.envelope import ModelIdentity, new_task_id, rejection, result_envelope
from svc.contract.errors import ApiError
from svc.contract.protocol import (
    HEALTH_PATH,
    METRICS_PATH,
    OPENAPI_PATH,
    READY_PATH,
    SERVICE_REQUEST_HEADERS,
    WEIGHTS_HEADER,
)
from svc.contract.request import REQ_ID_RE
from svc.infra.ratelimit import KeyedLimiter, retry_after_header
from svc.modelserver.batching import QueueFull
from svc.modelserver.job_routes import JobRoutes
from svc.modelserver.jobs import JobTable
from svc.web import routes
from svc.web.replies import bearer_token, content_type, dumps, header, send_encoded, send_json


class ModelServerApp(routes.JsonApp):
    """Routes of one model server; ``resource()`` is served by a JsonSite."""

    app = Klein()
    configured: routes.ConfiguredRoutes

    def __init__(
        self,
        *,
        clock: IReactorTime,
        config: Any,
        inference: Any,
        metrics: Any,
        registry: Any,
        auth_token: str | None,
        openapi: dict,
        weights: str = "demo",
    ) -> None:
        self.clock = clock
        self.config = config
        self.inference = inference
        self.metrics = metrics
        self.infer_duration = metrics.duration.labels("infer")
        self.registry = registry
        self.auth_token = auth_token
        self.openapi_bytes = dumps(openapi)
        self.weights_headers = {WEIGHTS_HEADER: weights}  # demo, pretrained or file (svc.model.weights.weights_kind)
        self.ip_limiter = KeyedLimiter(clock, config.rate_limit_qps)
        self.identity = ModelIdentity(config.id, "loading")
        self.ready = False
        self.draining = False
        self.not_ready_reason = "the model is loading"
        self.in_flight = 0
        self.job_routes: JobRoutes | None = None
        self.replies = routes.EnvelopeReplies(lambda: self.identity, self.task_id)
        self.configured = routes.ConfiguredRoutes()
        self.configured.add(config.server_uri, ["POST"], self.infer)

    def enable_jobs(self, jobs: JobTable) -> JobRoutes:
        """Serve the /jobs routes over ``jobs`` (only with ``async_enabled``; without, /jobs... is 404)."""
        self.job_routes = JobRoutes(jobs, clock=self.clock, identity=lambda: self.identity, task_id=self.task_id,
                                    authenticate=self.authenticate, check_admitting=self.check_admitting,
                                    draining=lambda: self.draining, parse=self.inference.parse,
                                    headers=self.weights_headers)
        self.configured.mount(self.job_routes.app)
        return self.job_routes

    @property
    def waiting(self) -> int:
        """Requests parked in /jobs/{job}/wait."""
        return self.job_routes.waiting if self.job_routes is not None else 0

    def set_ready(self, version: str) -> None:
        self.identity = ModelIdentity(self.config.id, version)
        self.ready = True

    # -- helpers -------------------------------------------------------------------

    def task_id(self, request: Any) -> str:
        known = getattr(request, "service_task_id", None)
        if known:
            return known
        rid = header(request, b"x-request-id")
        return rid if rid is not None and REQ_ID_RE.fullmatch(rid) else new_task_id()

    def authenticate(self, request: Any) -> None:
        """401 unless the bearer token matches; then the per-IP rate limit."""
        if self.auth_token is not None:
            token = bearer_token(request)
            if token is None or not hmac.compare_digest(token.encode(), self.auth_token.encode()):
                raise ApiError(
                    st.UNAUTHORIZED,
                    "missing or wrong bearer token",
                    headers={"WWW-Authenticate": 'Bearer realm="model-server"'},
                )
        wait = self.ip_limiter.take(request.getClientAddress().host)
        if wait:
            raise ApiError(
                st.RATE_LIMITED,
                f"rate limit of {self.config.rate_limit_qps:g} requests/s per client exceeded",
                headers={"Retry-After": retry_after_header(wait)},
            )

    def check_admitting(self) -> None:
        """503 status 65 while the model loads or the server stops."""
        if not self.ready or self.draining:
            raise ApiError(st.NOT_READY, self.not_ready_reason)

    def reply(self, request: Any, status: st.Status, message: str | None = None, *, code: int | None = None) -> bytes:
        """An envelope with empty results (health, readiness, rejections)."""
        body = rejection(status, message or status.meaning, task_id=self.task_id(request), model=self.identity)
        if status is st.SUCCESS:
            del body["error"]
        return send_json(request, code or status.http, body, {"X-Request-ID": body["task_id"]})

    # -- routes ----------------------------------------------------------------------

    @app.route(HEALTH_PATH, methods=["GET"])
    def healthz(self, request: Any) -> bytes:
        request.service_route = "healthz"
        return self.reply(request, st.SUCCESS)

    @app.route(READY_PATH, methods=["GET"])
    def ready_route(self, request: Any) -> bytes:
        request.service_route = "ready"
        if self.ready and not self.draining:
            return self.reply(request, st.SUCCESS)
        return self.reply(request, st.NOT_READY, self.not_ready_reason)

    @app.route(METRICS_PATH, methods=["GET"])
    def metrics_route(self, request: Any) -> bytes:
        return self.metrics_reply(request, self.authenticate)

    @app.route(OPENAPI_PATH, methods=["GET"])
    def openapi_route(self, request: Any) -> bytes:
        request.service_route = "openapi"
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        return self.openapi_bytes

    async def infer(self, request: Any) -> bytes:
        """``POST {server_uri}`` (a configured route, see the module docstring)."""
        request.service_route = "infer"
        started = self.clock.seconds()
        self.authenticate(request)
        self.check_admitting()
        self.in_flight += 1
        try:
            media_type, type_params = content_type(request)
            headers = {name: header(request, name.encode()) for name in SERVICE_REQUEST_HEADERS}
            parsed = await self.inference.parse(request.content.getvalue(), media_type, type_params, headers)
            task_id = request.service_task_id = parsed.req_id or new_task_id()
            try:
                results = await self.inference.run(parsed, deadline=started + self.config.run_timeout_ms / 1000.0)
            except QueueFull as e:
                raise ApiError(
                    st.RATE_LIMITED,
                    f"wait queue full: {e.waiting} image items waiting (max_queue_depth {e.limit})",
                    headers={"Retry-After": str(e.retry_after)},
                ) from None
            elapsed_ms = (self.clock.seconds() - started) * 1000.0
            code, body = result_envelope(task_id=task_id, model=self.identity, items=results, server_time_ms=elapsed_ms)
            self.infer_duration.observe(elapsed_ms)
            return send_encoded(request, code, body, {"X-Request-ID": task_id, "Cache-Control": "no-store",
                                                      **self.weights_headers})
        finally:
            self.in_flight -= 1

    # -- accounting ----------------------------------------------------------------------

    def oversize_reply(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        """The early 413 of the body limit (see svc.web.limits.LimitedRequest)."""
        self.count_as("unmatched", "POST", st.ENTITY_TOO_LARGE.http)
        return self.replies.raw(request, ApiError(
            st.ENTITY_TOO_LARGE, f"request body larger than {self.config.max_body_bytes} bytes (max_body_bytes)"))

    def busy_reply(self) -> tuple[int, dict[str, str], bytes]:
        """The 503 status 65 for a connection past ``max_connections`` (svc.web.limits.LimitedChannel)."""
        return routes.envelope_reply(ApiError(st.NOT_READY, "too many open connections (max_connections); retry "
                                              "shortly", headers={"Retry-After": "1"}), new_task_id(), self.identity)

    routes.install(app, configured=True)
