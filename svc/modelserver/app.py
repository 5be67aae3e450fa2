"""HTTP routes of a model server (Klein): the glue between HTTP and the data plane.

Authentication (``SERVICE_AUTH_TOKEN``) comes before the per-IP rate limit,
so unauthenticated callers get 401 and spend no budget.  ``/healthz``,
``/ready`` and ``/openapi.json`` are exempt.  Every reply is JSON with the
unified envelope except ``/metrics`` (Prometheus text) and the Open
Inference Protocol's ``POST /v2/models/{id}[/versions/{v}]/infer``
(:mod:`svc.modelserver.oip_route`: its replies and errors are the
protocol's).

The fixed routes are declared once in the class body.  The inference route's
path is the config's ``server_uri`` and the job routes exist only with
``async_enabled``: each instance adds those to its
:class:`svc.web.configured.ConfiguredRoutes` (``enable_jobs`` mounts the routes
:class:`svc.modelserver.job_routes.JobRoutes` declares), which the class's
catch-all asks when no declared route matches.  So ``GET {server_uri}`` is
405 with ``Allow: POST``, ``GET /jobs`` is 405 with jobs enabled and 404
without, and an unknown path is 404, as if every route were declared.
"""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.internet.interfaces import IReactorTime

from svc.contract import status as st
from svc.contract.envelope import ModelIdentity, new_task_id, rejection, result_envelope
from svc.contract.errors import ApiError
from svc.contract.protocol import (
    HEALTH_PATH,
    METRICS_PATH,
    MODEL_SERVER_REALM,
    OPENAPI_PATH,
    READY_PATH,
    SERVICE_REQUEST_HEADERS,
    WEIGHTS_HEADER,
    bearer_challenge,
)
from svc.infra.ratelimit import KeyedLimiter, retry_after_header
from svc.modelserver.batching import QueueFull
from svc.modelserver.job_routes import JobRoutes
from svc.modelserver.jobs import JobTable
from svc.modelserver.oip_route import OipRoute
from svc.modelserver.oip_route import declare as declare_oip
from svc.web import declare, routes
from svc.web.bodylimits import head_method, read_without_credential
from svc.web.configured import ConfiguredRoutes
from svc.web.oip.replies import ProtocolReplies
from svc.web.replies import (
    bearer_matches,
    content_type,
    dumps,
    envelope_headers,
    header,
    send_encoded,
    send_json,
    unauthorized_reason,
)


class ModelServerApp(OipRoute, routes.JsonApp):
    """Routes of one model server (the Open Inference Protocol's: svc.modelserver.oip_route); ``resource()`` is
    served by a JsonSite."""

    app = Klein()
    configured: ConfiguredRoutes

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
        self.optimize = "eager"
        self.ready = False
        self.draining = False
        self.not_ready_reason = "the model is loading"
        self.in_flight = 0
        self.job_routes: JobRoutes | None = None
        self.replies = ProtocolReplies(lambda: self.identity, self.task_id)  # {"error"} under /v2
        self.configured = ConfiguredRoutes()
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

    def set_ready(self, version: str, optimize: str = "eager") -> None:
        """Loaded and warmed up: ``version`` is the weights', ``optimize`` the execution mode in use."""
        self.identity = ModelIdentity(self.config.id, version)
        self.optimize = optimize
        self.ready = True

    # -- helpers -------------------------------------------------------------------

    def task_id(self, request: Any) -> str:
        return routes.task_id_of(request)

    def authenticate(self, request: Any, **_route_args: Any) -> None:
        """401 unless the bearer token matches; then the per-IP rate limit."""
        if self.auth_token is not None and not bearer_matches(request, self.auth_token):
            raise self.unauthorized(request)
        wait = self.ip_limiter.take(request.getClientAddress().host)
        if wait:
            raise ApiError(
                st.RATE_LIMITED,
                f"rate limit of {self.config.rate_limit_qps:g} requests/s per client exceeded",
                headers={"Retry-After": retry_after_header(wait)},
            )

    def unauthorized(self, request: Any) -> ApiError:
        """The 401 of a request without the token (missing, wrong, or sent twice)."""
        return ApiError(st.UNAUTHORIZED, unauthorized_reason(request, "missing or wrong bearer token"),
                        headers={"WWW-Authenticate": bearer_challenge(MODEL_SERVER_REALM)})

    def refusal_before_body(self, request: Any, length: int | None) -> tuple[int, dict[str, str], bytes] | None:
        """The 401 of a request without the token, from its head, when its body is over 64 KiB, chunked or awaits
        ``100 Continue`` (svc.web.bodylimits.read_without_credential), whatever its method and path; the body is
        never read and the connection closes.  A local process without the token could otherwise make the model
        server hold ``max_body_bytes`` per connection, as the gateway's clients could before it did the same.
        Smaller bodies are read and routed as before."""
        if self.auth_token is None or bearer_matches(request, self.auth_token):
            return None
        if read_without_credential(request, length):  # read, then 401; its slot may go to a new connection once
            request.unvouched()  # stalled (svc.web.idle): trickled bodies held every slot (a regression probe)
            return None
        return self.limit_reply(request, self.unauthorized(request), head_method(request))

    def admit_inference(self, request: Any, **_route_args: Any) -> None:
        """:meth:`authenticate`, then :meth:`check_admitting`: what an inference request passes first."""
        self.authenticate(request)
        self.check_admitting()

    def check_admitting(self) -> None:
        """503 status 65 while the model loads or the server stops."""
        if not self.ready or self.draining:
            raise ApiError(st.NOT_READY, self.not_ready_reason)

    def reply(self, request: Any, status: st.Status, message: str | None = None, *, code: int | None = None) -> bytes:
        """An envelope with empty results (health, readiness, rejections)."""
        body = rejection(status, message or status.meaning, task_id=self.task_id(request), model=self.identity)
        if status is st.SUCCESS:
            del body["error"]
        return send_json(request, code or status.http, body, envelope_headers(body["task_id"]))

    # -- routes ----------------------------------------------------------------------

    @declare.route(app, HEALTH_PATH, methods=["GET"], name="healthz")
    def healthz(self, request: Any) -> bytes:
        return self.reply(request, st.SUCCESS)

    @declare.route(app, READY_PATH, methods=["GET"], name="ready")
    def ready_route(self, request: Any) -> bytes:
        if self.ready and not self.draining:
            return self.reply(request, st.SUCCESS)
        return self.reply(request, st.NOT_READY, self.not_ready_reason)

    @declare.route(app, METRICS_PATH, methods=["GET"], name="metrics", admit="authenticate")
    def metrics_route(self, request: Any) -> bytes:
        request.setHeader(b"X-Request-ID", self.task_id(request).encode())  # as every other reply of the server
        return self.metrics_body(request)

    @declare.route(app, OPENAPI_PATH, methods=["GET"], name="openapi")
    def openapi_route(self, request: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        return self.openapi_bytes

    @declare.guarded("infer", admit="admit_inference")
    async def infer(self, request: Any) -> bytes:
        """``POST {server_uri}`` (a configured route, see the module docstring)."""
        started = self.clock.seconds()
        self.in_flight += 1
        try:
            media_type, type_params = content_type(request)
            headers = {name: header(request, name.encode()) for name in SERVICE_REQUEST_HEADERS}
            parsed = await self.inference.parse(request.content.getvalue(), media_type, type_params, headers)
            task_id, results = await self.run_inference(request, parsed, started)
            elapsed_ms = (self.clock.seconds() - started) * 1000.0
            code, body = result_envelope(task_id=task_id, model=self.identity, items=results, server_time_ms=elapsed_ms)
            self.infer_duration.observe(elapsed_ms)
            return send_encoded(request, code, body, {**envelope_headers(task_id), **self.weights_headers})
        finally:
            self.in_flight -= 1

    async def run_inference(self, request: Any, parsed: Any, started: float) -> tuple[str, list]:
        """Run an admitted, parsed inference request under ``run_timeout_ms`` from ``started``: its task id (set
        on ``request`` for the access line) and its items' results; a full wait queue is 429 with Retry-After.
        ``POST {server_uri}`` and the Open Inference Protocol's route (svc.modelserver.oip_route) share it."""
        task_id = request.service_task_id = parsed.req_id = parsed.req_id or new_task_id()  # its items carry it
        try:
            results = await self.inference.run(parsed, deadline=started + self.config.run_timeout_ms / 1000.0)
        except QueueFull as e:
            raise ApiError(
                st.RATE_LIMITED,
                f"wait queue full: {e.waiting} image items waiting (max_queue_depth {e.limit})",
                headers={"Retry-After": str(e.retry_after)},
            ) from None
        return task_id, results

    # -- accounting ----------------------------------------------------------------------

    @property
    def max_body_bytes(self) -> int:
        """The body limit the listener's 413 names (``oversize_text``)."""
        return self.config.max_body_bytes

    declare_oip(app)  # before install: its catch-all comes last
    routes.install(app, configured=True)
