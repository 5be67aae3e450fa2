"""HTTP routes of a model server (Klein): the glue between HTTP and the data plane.

Authentication (``SERVICE_AUTH_TOKEN``) comes before the per-IP rate limit,
so unauthenticated callers get 401 and spend no budget.  ``/healthz``,
``/ready`` and ``/openapi.json`` are exempt.  Every reply is JSON with the
unified envelope except ``/metrics`` (Prometheus text).
"""

from __future__ import annotations

import hmac
from typing import Any

from klein import Klein
from twisted.logger import Logger
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from svc import status as st
from svc.envelope import ModelIdentity, new_task_id, rejection, result_envelope
from svc.errors import ApiError
from svc.http import bearer_token, content_type, dumps, header, send_json
from svc.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from svc.metrics import render
from svc.modelserver.batching import QueueFull
from svc.protocol import HEALTH_PATH, METRICS_PATH, OPENAPI_PATH, READY_PATH, SERVICE_REQUEST_HEADERS
from svc.ratelimit import KeyedLimiter, retry_after_header
from svc.request import REQ_ID_RE

log = Logger()


class ModelServerApp:
    """Routes of one model server; ``resource()`` is served by a JsonSite."""

    def __init__(
        self,
        *,
        clock: Any,
        config: Any,
        inference: Any,
        metrics: Any,
        registry: Any,
        auth_token: str | None,
        openapi: dict,
    ) -> None:
        self.clock = clock
        self.config = config
        self.inference = inference
        self.metrics = metrics
        self.registry = registry
        self.auth_token = auth_token
        self.openapi_bytes = dumps(openapi)
        self.ip_limiter = KeyedLimiter(clock, config.rate_limit_qps)
        self.identity = ModelIdentity(config.id, "loading")
        self.ready = False
        self.draining = False
        self.not_ready_reason = "the model is loading"
        self.in_flight = 0
        self.waiting = 0  # requests parked in /jobs/{job}/wait
        self.app = app = Klein()

        app.route(HEALTH_PATH, methods=["GET"])(self.healthz)
        app.route(READY_PATH, methods=["GET"])(self.ready_route)
        app.route(METRICS_PATH, methods=["GET"])(self.metrics_route)
        app.route(OPENAPI_PATH, methods=["GET"])(self.openapi_route)
        app.route(config.server_uri, methods=["POST"])(self.infer)
        app.handle_errors(ApiError)(self.api_error)
        app.handle_errors(HTTPException)(self.routing_error)
        app.handle_errors(Exception)(self.unexpected_error)

    def resource(self) -> Any:
        return self.app.resource()

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

    def reply(self, request: Any, status: st.Status, message: str | None = None, *, code: int | None = None) -> bytes:
        """An envelope with empty results (health, readiness, rejections)."""
        body = rejection(status, message or status.meaning, task_id=self.task_id(request), model=self.identity)
        if status is st.SUCCESS:
            del body["error"]
        return send_json(request, code or status.http, body, {"X-Request-ID": body["task_id"]})

    # -- routes ----------------------------------------------------------------------

    def healthz(self, request: Any) -> bytes:
        request.service_route = "healthz"
        return self.reply(request, st.SUCCESS)

    def ready_route(self, request: Any) -> bytes:
        request.service_route = "ready"
        if self.ready and not self.draining:
            return self.reply(request, st.SUCCESS)
        return self.reply(request, st.NOT_READY, self.not_ready_reason)

    def metrics_route(self, request: Any) -> bytes:
        request.service_route = "metrics"
        self.authenticate(request)
        request.setHeader(b"Content-Type", METRICS_CONTENT_TYPE.encode())
        return render(self.registry)

    def openapi_route(self, request: Any) -> bytes:
        request.service_route = "openapi"
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        return self.openapi_bytes

    async def infer(self, request: Any) -> bytes:
        request.service_route = "infer"
        started = self.clock.seconds()
        self.authenticate(request)
        if not self.ready or self.draining:
            raise ApiError(st.NOT_READY, self.not_ready_reason)
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
            self.metrics.duration.labels("infer").observe(elapsed_ms)
            return send_json(request, code, body, {"X-Request-ID": task_id, "Cache-Control": "no-store"})
        finally:
            self.in_flight -= 1

    # -- errors ------------------------------------------------------------------------

    def api_error(self, request: Any, failure: Any) -> bytes:
        err: ApiError = failure.value
        task_id = self.task_id(request)
        body = rejection(err.status, err.message, task_id=task_id, model=self.identity, errors=err.errors)
        return send_json(request, err.status.http, body, {"X-Request-ID": task_id, **err.headers})

    def routing_error(self, request: Any, failure: Any) -> bytes:
        err = failure.value
        if isinstance(err, MethodNotAllowed):
            allowed = ", ".join(sorted(set(err.valid_methods or ()) - {"HEAD"}))
            request.setHeader(b"Allow", allowed.encode())
            return self.reply(request, st.METHOD_NOT_ALLOWED, f"method {request.method.decode()} not allowed; allowed: {allowed}")
        return self.reply(request, st.NOT_FOUND, f"no route for {request.path.decode('latin-1', 'replace')[:200]}")

    def unexpected_error(self, request: Any, failure: Any) -> bytes:
        log.failure("unexpected error answering {path}", failure, path=request.path)
        return self.reply(request, st.INTERNAL_ERROR, "internal server error")

    # -- accounting ----------------------------------------------------------------------

    def count(self, request: Any) -> None:
        """Called by the site for every finished request."""
        route = getattr(request, "service_route", "unmatched")
        self.metrics.requests.labels(route, request.method.decode("latin-1"), str(request.code)).inc()

    def oversize_reply(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        """The early 413 of the body limit (see svc.http.LimitedRequest)."""
        status = st.ENTITY_TOO_LARGE
        task_id = self.task_id(request)
        body = rejection(
            status,
            f"request body larger than {self.config.max_body_bytes} bytes (max_body_bytes)",
            task_id=task_id,
            model=self.identity,
        )
        self.metrics.requests.labels("unmatched", "POST", str(status.http)).inc()
        return status.http, {"X-Request-ID": task_id}, dumps(body)

    def busy_reply(self) -> tuple[int, dict[str, str], bytes]:
        """The 503 status 65 for a connection past ``max_connections`` (svc.http.LimitedChannel)."""
        task_id = new_task_id()
        body = rejection(st.NOT_READY, "too many open connections (max_connections); retry shortly",
                         task_id=task_id, model=self.identity)
        return st.NOT_READY.http, {"X-Request-ID": task_id, "Retry-After": "1"}, dumps(body)
