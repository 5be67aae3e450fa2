"""HTTP routes of the gateway (Klein): authenticate, limit, route, forward.

    GET  /healthz                                 no credential
    GET  /metrics                                 the metrics token only
    POST /v1/models/{id}/infer                    -> {server_uri} of the model
    POST {server_uri}                             (legacy, exact match) -> the same
    POST /v1/models/{id}/jobs                     -> /jobs
    GET  /v1/models/{id}/jobs/{job}               -> /jobs/{job}
    GET  /v1/models/{id}/jobs/{job}/wait?timeout= -> /jobs/{job}/wait?timeout=
    GET  /v1/models/{id}/jobs/{job}/result        -> /jobs/{job}/result

Order on every other route: authentication (401), the key's token bucket
(429 with ``Retry-After``), then routing (404 for an unknown id or path,
405 for a wrong method), so that an unauthenticated caller learns nothing
about the catalog.  The model's status, body and the headers SPEC lists
pass through unchanged; job URLs are rewritten onto ``/v1/models/<id>/jobs``.
Errors made here use the unified envelope with ``model.name`` ``gateway``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from klein import Klein
from twisted.logger import Logger
from twisted.web.http_headers import Headers
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from svc import __version__, protocol
from svc import status as st
from svc.auth import METRICS_TOKEN_NAME, Authenticator, Principal, Unauthorized
from svc.envelope import ModelIdentity, new_task_id, rejection
from svc.errors import ApiError
from svc.gateway.catalog import Catalog, Upstream
from svc.gateway.proxy import Proxy, UpstreamFailed, UpstreamUnreachable
from svc.http import bearer_token, dumps, header, send_json
from svc.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from svc.metrics import GatewayMetrics, render
from svc.protocol import (
    HEALTH_PATH,
    JOB,
    JOB_RESULT,
    JOB_WAIT,
    JOBS,
    METRICS_PATH,
    MODEL_INFER,
    MODEL_PREFIX,
    klein_rule,
    model_path,
)
from svc.query import MAX_DIGITS, wait_budget_ms
from svc.ratelimit import KeyedLimiter, retry_after_header
from svc.request import REQ_ID_RE

log = Logger()

#: Client request headers passed to the model server; every other one is dropped.
FORWARDED_REQUEST_HEADERS = tuple(n.encode() for n in ("content-type", "accept", *protocol.SERVICE_REQUEST_HEADERS))
#: Model reply headers passed back (svc.protocol); Location is rewritten.
PASSED_REPLY_HEADERS = tuple(n.encode() for n in protocol.PASSED_REPLY_HEADERS)

GATEWAY_IDENTITY = ModelIdentity("gateway", __version__)


def rewrite_job_path(model_id: str, path: str) -> str | None:
    """A model-port job path as the gateway path of the same job (None: not a job path)."""
    if path.startswith(JOBS + "/"):
        return model_path(model_id, path)
    return None


def wait_query(raw: bytes | None) -> bytes:
    """The query of a forwarded wait: the client's ``timeout`` value percent-encoded again.

    Twisted decoded it; put back as it is, a byte such as 0xB2 (``%B2``)
    makes the upstream URL invalid and the agent refuses it (a 502 for the
    client's mistake).  Re-encoded, the model server reads the same value
    and gives its own answer: 422 for a bad number, or 404 first when the
    job is unknown.  A value longer than MAX_DIGITS + 1 bytes is cut there:
    it is invalid either way (too long, or a non-digit among those bytes),
    and the upstream request line stays short.
    """
    if raw is None:
        return b""
    return b"timeout=" + quote(raw[:MAX_DIGITS + 1], safe="").encode("ascii")


class GatewayApp:
    """Routes of the gateway; ``resource()`` is served by a JsonSite."""

    def __init__(
        self,
        *,
        clock: Any,
        catalog: Catalog,
        authenticator: Authenticator,
        proxy: Proxy,
        metrics: GatewayMetrics,
        registry: Any,
        upstream_recv_timeout_ms: int,
        max_body_bytes: int,
    ) -> None:
        self.clock = clock
        self.catalog = catalog
        self.auth = authenticator
        self.proxy = proxy
        self.metrics = metrics
        self.registry = registry
        self.recv_timeout_ms = upstream_recv_timeout_ms
        self.max_body_bytes = max_body_bytes
        self.limiter = KeyedLimiter(clock, 0)
        self.app = app = Klein()

        app.route(HEALTH_PATH, methods=["GET"])(self.healthz)
        app.route(METRICS_PATH, methods=["GET"])(self.metrics_route)
        app.route(klein_rule(MODEL_INFER), methods=["POST"])(self.infer)
        app.route(klein_rule(MODEL_PREFIX + JOBS), methods=["POST"])(self.submit)
        app.route(klein_rule(MODEL_PREFIX + JOB), methods=["GET"])(self.job_status)
        app.route(klein_rule(MODEL_PREFIX + JOB_WAIT), methods=["GET"])(self.job_wait)
        app.route(klein_rule(MODEL_PREFIX + JOB_RESULT), methods=["GET"])(self.job_result)
        for upstream in catalog:
            app.route(upstream.server_uri, methods=["POST"], endpoint=f"legacy_{upstream.id}")(
                self._legacy(upstream))
        app.handle_errors(ApiError)(self.api_error)
        app.handle_errors(HTTPException)(self.routing_error)
        app.handle_errors(Exception)(self.unexpected_error)

    def resource(self) -> Any:
        return self.app.resource()

    def methods(self, path: str) -> set[str]:
        """The methods the routes accept on ``path`` (empty for an unknown path)."""
        try:
            return set(self.app.url_map.bind("gateway").allowed_methods(path))
        except Exception:  # noqa: BLE001 - a path werkzeug cannot parse has no methods
            return set()

    # -- helpers -------------------------------------------------------------------------

    def task_id(self, request: Any) -> str:
        rid = header(request, b"x-request-id")
        return rid if rid is not None and REQ_ID_RE.fullmatch(rid) else new_task_id()

    def admit(self, request: Any) -> Principal:
        """Authenticate, then spend one token of the key's bucket; 401 or 429 otherwise."""
        try:
            principal = self.auth.authenticate(bearer_token(request))
        except Unauthorized as e:
            if e.key is not None:
                self.metrics.key_rejections.labels(e.key, "disabled").inc()
            else:
                self.metrics.auth_failures.labels("missing" if "missing" in e.reason else "wrong").inc()
            raise ApiError(st.UNAUTHORIZED, f"{e.reason}: send Authorization: Bearer <API key or token>",
                           headers={"WWW-Authenticate": 'Bearer realm="gateway"'}) from None
        request.service_key = principal.name
        request.setHeader(b"X-Service-Key", principal.name.encode("latin-1"))
        wait = self.limiter.take(principal.name, principal.rate_limit_qps)
        if wait:
            self.metrics.key_rejections.labels(principal.name, "rate_limited").inc()
            raise ApiError(st.RATE_LIMITED,
                           f"rate limit of {principal.rate_limit_qps} requests/s for key {principal.name} exceeded",
                           headers={"Retry-After": retry_after_header(wait)})
        self.metrics.key_requests.labels(principal.name).inc()
        return principal

    def upstream(self, model_id: str) -> Upstream:
        found = self.catalog.by_id.get(model_id)
        if found is None:
            raise ApiError(st.NOT_FOUND, f"no model {model_id[:80]!r} in the catalog")
        return found

    async def forward(self, request: Any, upstream: Upstream, route: str, path: str, *, query: bytes = b"",
                      rewrite: bool = False) -> bytes:
        """Send the request to ``upstream`` and answer with its reply."""
        request.service_route = route
        headers = Headers()
        for name in FORWARDED_REQUEST_HEADERS:
            values = request.requestHeaders.getRawHeaders(name)
            if values:
                headers.setRawHeaders(name, values)
        if upstream.token:
            headers.setRawHeaders(b"authorization", [b"Bearer " + upstream.token.encode("latin-1")])
        body = request.content.getvalue() if request.method == b"POST" else None
        started = self.clock.seconds()
        try:
            reply = await self.proxy.forward(request.method, upstream.url(path, query), headers, body)
        except UpstreamUnreachable as e:
            self.metrics.upstream_errors.labels(upstream.id, "unreachable").inc()
            raise ApiError(st.NOT_READY, f"model server {upstream.id} is not reachable ({e}): it is not running") from None
        except UpstreamFailed as e:
            self.metrics.upstream_errors.labels(upstream.id, e.kind).inc()
            log.warn("{model}: upstream failure on {path}: {error}", model=upstream.id, path=path, error=str(e))
            raise ApiError(st.BAD_GATEWAY, f"model server {upstream.id}: {e}") from None
        elapsed_ms = (self.clock.seconds() - started) * 1000.0
        self.metrics.upstream_duration.labels(upstream.id, route).observe(elapsed_ms)
        if reply.code == 401:
            log.error("{model} refused the gateway's token: is SERVICE_UPSTREAM_TOKENS right?", model=upstream.id)
        request.setResponseCode(reply.code)
        for name in PASSED_REPLY_HEADERS:
            values = reply.headers.getRawHeaders(name)
            if values:
                request.responseHeaders.setRawHeaders(name, values)
        location = reply.headers.getRawHeaders(b"location")
        if location:
            rewritten = rewrite_job_path(upstream.id, location[0].decode("latin-1"))
            if rewritten is not None:
                request.setHeader(b"Location", rewritten.encode("latin-1"))
        data = reply.body
        if rewrite and reply.code in (200, 202):
            data = self._rewrite_job_body(upstream.id, data)
        request.setHeader(b"Content-Length", str(len(data)).encode())
        if route == "infer":
            self.metrics.duration.labels(route).observe((self.clock.seconds() - started) * 1000.0)
        return data

    @staticmethod
    def _rewrite_job_body(model_id: str, data: bytes) -> bytes:
        """``poll_url`` and ``result_url`` of a job body onto the gateway prefix."""
        try:
            body = json.loads(data)
        except ValueError:
            return data
        if not isinstance(body, dict):
            return data
        for field in ("poll_url", "result_url"):
            value = body.get(field)
            if isinstance(value, str):
                rewritten = rewrite_job_path(model_id, value)
                if rewritten is None:
                    body.pop(field)  # never hand out a model-port path
                else:
                    body[field] = rewritten
        return dumps(body)

    # -- routes --------------------------------------------------------------------------

    def healthz(self, request: Any) -> bytes:
        request.service_route = "healthz"
        body = rejection(st.SUCCESS, "", task_id=self.task_id(request), model=GATEWAY_IDENTITY)
        del body["error"]
        return send_json(request, 200, body)

    def metrics_route(self, request: Any) -> bytes:
        request.service_route = "metrics"
        if not self.auth.is_metrics(bearer_token(request)):
            self.metrics.auth_failures.labels("wrong" if bearer_token(request) else "missing").inc()
            raise ApiError(st.UNAUTHORIZED, "GET /metrics needs Authorization: Bearer <SERVICE_METRICS_TOKEN>",
                           headers={"WWW-Authenticate": 'Bearer realm="gateway-metrics"'})
        request.service_key = METRICS_TOKEN_NAME
        request.setHeader(b"X-Service-Key", METRICS_TOKEN_NAME.encode())
        request.setHeader(b"Content-Type", METRICS_CONTENT_TYPE.encode())
        return render(self.registry)

    async def infer(self, request: Any, model_id: str) -> bytes:
        request.service_route = "infer"
        self.admit(request)
        upstream = self.upstream(model_id)
        return await self.forward(request, upstream, "infer", upstream.server_uri)

    def _legacy(self, upstream: Upstream) -> Any:
        async def legacy_infer(request: Any) -> bytes:
            request.service_route = "infer"
            self.admit(request)
            return await self.forward(request, upstream, "infer", upstream.server_uri)

        return legacy_infer

    async def submit(self, request: Any, model_id: str) -> bytes:
        request.service_route = "jobs_submit"
        self.admit(request)
        return await self.forward(request, self.upstream(model_id), "jobs_submit", JOBS, rewrite=True)

    async def job_status(self, request: Any, model_id: str, job_id: str) -> bytes:
        request.service_route = "jobs_status"
        self.admit(request)
        return await self.forward(request, self.upstream(model_id), "jobs_status", JOB.format(job_id=quote(job_id, safe="")), rewrite=True)

    async def job_wait(self, request: Any, model_id: str, job_id: str) -> bytes:
        request.service_route = "jobs_wait"
        self.admit(request)
        upstream = self.upstream(model_id)
        raw = (request.args.get(b"timeout") or [None])[0]
        budget = wait_budget_ms(raw)
        if budget is not None and budget >= self.recv_timeout_ms:
            raise ApiError(st.BAD_GATEWAY,
                           f"a wait budget of {budget} ms is at or above the gateway's upstream receive timeout "
                           f"({self.recv_timeout_ms} ms, upstream_recv_timeout_ms): ask for less and wait again")
        return await self.forward(request, upstream, "jobs_wait", JOB_WAIT.format(job_id=quote(job_id, safe="")),
                                  query=wait_query(raw), rewrite=True)

    async def job_result(self, request: Any, model_id: str, job_id: str) -> bytes:
        request.service_route = "jobs_result"
        self.admit(request)
        return await self.forward(request, self.upstream(model_id), "jobs_result", JOB_RESULT.format(job_id=quote(job_id, safe="")))

    # -- errors ----------------------------------------------------------------------------

    def error_reply(self, request: Any, status: st.Status, message: str, headers: dict[str, str] | None = None,
                    errors: list | None = None) -> bytes:
        task_id = self.task_id(request)
        body = rejection(status, message, task_id=task_id, model=GATEWAY_IDENTITY, errors=errors or ())
        return send_json(request, status.http, body, {"X-Request-ID": task_id, **(headers or {})})

    def api_error(self, request: Any, failure: Any) -> bytes:
        err: ApiError = failure.value
        return self.error_reply(request, err.status, err.message, err.headers, err.errors)

    def routing_error(self, request: Any, failure: Any) -> bytes:
        """404 and 405, after authentication: an unauthenticated caller gets 401 on every path."""
        request.service_route = "unmatched"
        try:
            self.admit(request)
        except ApiError as e:
            return self.error_reply(request, e.status, e.message, e.headers)
        err = failure.value
        if isinstance(err, MethodNotAllowed):
            allowed = ", ".join(sorted(set(err.valid_methods or ()) - {"HEAD"}))
            return self.error_reply(request, st.METHOD_NOT_ALLOWED,
                                    f"method {request.method.decode('latin-1')} not allowed; allowed: {allowed}",
                                    {"Allow": allowed})
        return self.error_reply(request, st.NOT_FOUND,
                                f"no route for {request.path.decode('latin-1', 'replace')[:200]}: unknown model or path")

    def unexpected_error(self, request: Any, failure: Any) -> bytes:
        log.failure("unexpected error answering {path}", failure, path=request.path)
        return self.error_reply(request, st.INTERNAL_ERROR, "internal server error")

    # -- accounting ------------------------------------------------------------------------

    def count(self, request: Any) -> None:
        """Called by the site for every finished request."""
        route = getattr(request, "service_route", "unmatched")
        self.metrics.requests.labels(route, request.method.decode("latin-1"), str(request.code)).inc()

    def oversize_reply(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        """The early 413 of the gateway's body limit (svc.http.LimitedRequest)."""
        status = st.ENTITY_TOO_LARGE
        task_id = self.task_id(request)
        body = rejection(status, f"request body larger than {self.max_body_bytes} bytes (gateway max_body_bytes)",
                         task_id=task_id, model=GATEWAY_IDENTITY)
        self.metrics.requests.labels("unmatched", "POST", str(status.http)).inc()
        return status.http, {"X-Request-ID": task_id}, dumps(body)

    def busy_reply(self) -> tuple[int, dict[str, str], bytes]:
        """The 503 status 65 for a connection past ``max_connections`` (svc.http.LimitedChannel)."""
        task_id = new_task_id()
        body = rejection(st.NOT_READY, "too many open connections (gateway max_connections); retry shortly",
                         task_id=task_id, model=GATEWAY_IDENTITY)
        return st.NOT_READY.http, {"X-Request-ID": task_id, "Retry-After": "1"}, dumps(body)
