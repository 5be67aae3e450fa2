"""HTTP routes of the gateway (Klein): authenticate, limit, route, forward.

    GET  /healthz                                 no credential
    GET  /metrics                                 the metrics token only
    POST /v1/models/{id}/infer                    -> {server_uri} of the model
    POST {server_uri}                             (legacy, exact match) -> the same
    POST /v1/models/{id}/jobs                     -> /jobs
    GET  /v1/models/{id}/jobs/{job}               -> /jobs/{job}
    GET  /v1/models/{id}/jobs/{job}/wait?timeout= -> /jobs/{job}/wait?timeout=
    GET  /v1/models/{id}/jobs/{job}/result        -> /jobs/{job}/result
    GET  /openapi.json                            the gateway's document (svc.openapi.gateway)
    GET, POST /v2/...                             the Open Inference Protocol (svc.gateway.oip.routes)

Order on every other route: authentication (401), the key's token bucket
(429 with ``Retry-After``; in the configured store, svc.gateway.ratestore),
then routing (404 for an unknown id or path, 405 for a wrong method), so
that an unauthenticated caller learns nothing about the catalog.  A path
that matches no route is authenticated, then 404 or 405 without a token
spent (nothing reaches a model).  A job GET for another host's job is
answered by that host's gateway (svc.gateway.cluster).  The model's status,
body and the headers docs/contract.md lists pass through unchanged; job URLs are
rewritten onto ``/v1/models/<id>/jobs``.
Errors made here use the unified envelope with ``model.name`` ``gateway``.

A model may run as several replicas (svc.infra.replicas): inference and job
submissions go to the one :class:`svc.gateway.balancer.Balancer` picks, and
are sent to a second one only when the first did not take them: the
connection was refused (nothing was sent), or it answered 503 status 65 with
no results (it admitted nothing: loading, stopping, too many connections).
Nothing else is retried.  A job's poll, wait and result go to the replica
its id names (svc.gateway.owners, :meth:`GatewayApp.to_job`).

The routes are declared once in the class body; the legacy ``{server_uri}``
routes come from the catalog, so each instance adds them to its
:class:`svc.web.routes.ConfiguredRoutes`, which the class's catch-all asks
when no declared route matches (404 and 405 stay as if they were declared,
and come only after authentication, ``before_routing_error``).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any
from urllib.parse import quote

from klein import Klein
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.http_headers import Headers

from svc import __version__
from svc.auth import METRICS_TOKEN_NAME, Authenticator, Principal, Unauthorized
from svc.cluster_config import ClusterConfig
from svc.contract import protocol
from svc.contract import status as st
from svc.contract.envelope import ModelIdentity, new_task_id, rejection
from svc.contract.errors import ApiError
from svc.contract.protocol import (
    HEALTH_PATH,
    JOB,
    JOB_RESULT,
    JOB_WAIT,
    JOBS,
    METRICS_PATH,
    MODEL_INFER,
    MODEL_PREFIX,
    OPENAPI_PATH,
    klein_rule,
    model_path,
)
from svc.contract.query import MAX_DIGITS, wait_budget_ms
from svc.contract.request import REQ_ID_RE
from svc.gateway.balancer import Balancer
from svc.gateway.catalog import Catalog, Replica, Upstream
from svc.gateway.cluster import Cluster
from svc.gateway.oip import routes as oip
from svc.gateway.oip.replies import CONTRACT, GatewayReplies, protocol_of
from svc.gateway.owners import OtherHost, locate
from svc.gateway.proxy import Proxy, UpstreamFailed, UpstreamReply, UpstreamUnreachable, not_admitted
from svc.gateway.ratestore import LocalRates
from svc.infra.metrics import GatewayMetrics
from svc.infra.ratelimit import KeyedLimiter, retry_after_header
from svc.web import routes
from svc.web.replies import bearer_token, dumps, header, send_encoded, send_json

log = Logger()

#: Client request headers passed to the model server; every other one is dropped.
FORWARDED_REQUEST_HEADERS = tuple(n.encode() for n in ("content-type", "accept", *protocol.SERVICE_REQUEST_HEADERS))
#: Model reply headers passed back (svc.contract.protocol); Location is rewritten.
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


def task_id_of(request: Any) -> str:
    """The request's ``X-Request-ID`` when it is a valid one, else a new task id."""
    rid = header(request, b"x-request-id")
    return rid if rid is not None and REQ_ID_RE.fullmatch(rid) else new_task_id()


#: The gateway's error replies: the unified envelope with the gateway's identity.
REPLIES = GatewayReplies(lambda: GATEWAY_IDENTITY, task_id_of, not_found="no route for {path}: unknown model or path")


class GatewayApp(oip.OipRoutes, routes.JsonApp):
    """Routes of the gateway (the ``/v2`` ones: svc.gateway.oip.routes); ``resource()`` is served by a JsonSite."""

    app = Klein()
    replies = REPLIES
    #: The models' job counters read at each scrape of /metrics (svc.gateway.jobcounts); set by the service.
    job_counts: Any = None

    def __init__(
        self,
        *,
        clock: IReactorTime,
        catalog: Catalog,
        authenticator: Authenticator,
        proxy: Proxy,
        metrics: GatewayMetrics,
        registry: Any,
        upstream_recv_timeout_ms: int,
        max_body_bytes: int,
        balancer: Balancer | None = None,
        rates: Any = None,
        cluster: Cluster | None = None,
        openapi: dict | None = None,
    ) -> None:
        """``balancer``: the replicas' outstanding requests and readiness (svc.gateway.balancer);
        ``rates``: the per-key buckets (svc.gateway.ratestore); ``cluster``: this host among its peers,
        with the job secret that job ids are signed with (svc.gateway.cluster; default: a single host
        without a secret, which trusts the owner an id claims); ``openapi``: the document served at
        ``/openapi.json`` (svc.openapi.gateway; default: none, 404)."""
        self.clock = clock
        self.balancer = balancer or Balancer()
        self.catalog = catalog
        self.auth = authenticator
        self.proxy = proxy
        self.metrics = metrics
        self.registry = registry
        self.recv_timeout_ms = upstream_recv_timeout_ms
        self.max_body_bytes = max_body_bytes
        #: The per-key buckets: this process's, or Redis (svc.gateway.ratestore); ``take`` returns a Deferred.
        self.rates = rates if rates is not None else LocalRates(KeyedLimiter(clock, 0))
        self.cluster = cluster if cluster is not None else Cluster(
            reactor=clock, config=ClusterConfig.single_host(), authenticator=authenticator, secret=None, metrics=metrics,
            recv_timeout_s=upstream_recv_timeout_ms / 1000.0)
        self.oip_shapes = {}
        self.openapi_bytes = dumps(openapi) if openapi is not None else None
        self.configured = routes.ConfiguredRoutes()
        for upstream in catalog:
            self.configured.add(upstream.server_uri, ["POST"], partial(self.legacy_infer, upstream=upstream))

    # -- helpers -------------------------------------------------------------------------

    def task_id(self, request: Any) -> str:
        return task_id_of(request)

    async def admit(self, request: Any, job_id: str | None = None) -> Principal:
        """Authenticate, then spend one token of the key's bucket; 401 or 429 otherwise.

        ``job_id``: a job GET, which a peer gateway also makes with the cluster
        token for a job of this host (svc.gateway.cluster; no bucket: the
        first gateway spent the client's).
        """
        forwarded = self.cluster.admits(request, job_id) if job_id is not None else None
        principal = forwarded or self.authenticate(request)
        if forwarded is not None:
            request.service_key = forwarded.name
            request.setHeader(b"X-Service-Key", forwarded.name.encode("latin-1"))
            return forwarded
        wait = await self.rates.take(principal.name, principal.rate_limit_qps)
        if wait:
            self.metrics.key_rejections.labels(principal.name, "rate_limited").inc()
            raise ApiError(st.RATE_LIMITED,
                           f"rate limit of {principal.rate_limit_qps} requests/s for key {principal.name} exceeded",
                           headers={"Retry-After": retry_after_header(wait)})
        self.metrics.key_requests.labels(principal.name).inc()
        return principal

    def authenticate(self, request: Any) -> Principal:
        """The request's principal (``X-Service-Key`` set), or 401."""
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
        return principal

    def upstream(self, model_id: str) -> Upstream:
        found = self.catalog.by_id.get(model_id)
        if found is None:
            raise ApiError(st.NOT_FOUND, f"no model {model_id[:80]!r} in the catalog")
        return found

    async def forward(self, request: Any, upstream: Upstream, route: str, path: str, *, query: bytes = b"",
                      rewrite: bool = False, replica: Replica | None = None) -> bytes:
        """Send the request to ``replica``, or to the replica the balancer picks (:meth:`exchange`), and answer
        with its reply."""
        request.service_route = route
        headers = Headers()
        for name in FORWARDED_REQUEST_HEADERS:
            values = request.requestHeaders.getRawHeaders(name)
            if values:
                headers.setRawHeaders(name, values)
        body = request.content.getvalue() if request.method == b"POST" else None
        started = self.clock.seconds()
        reply = await self.exchange(request, upstream, route, path, headers, body, query=query, replica=replica)
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
            self.metrics.duration.labels(route, CONTRACT).observe((self.clock.seconds() - started) * 1000.0)
        return data

    async def exchange(self, request: Any, upstream: Upstream, route: str, path: str, headers: Headers,
                       body: bytes | None, *, query: bytes = b"", replica: Replica | None = None,
                       method: bytes | None = None) -> UpstreamReply:
        """The model's reply to ``body`` (a GET without one) sent to ``replica`` or to the replica the balancer picks.

        Picked (``replica`` None): the request counts as outstanding on its
        replica while it is out; a replica that refuses the connection or does
        not admit the request (:func:`not_admitted`) is marked not ready and
        the request goes to another replica not tried yet.  With no replica
        left, a refusal is 503 status 65 and a not-admitted reply is returned
        as it is, as with one process.
        """
        method = method or request.method
        tried: list[Replica] = []
        several = replica is None and len(upstream.replicas) > 1
        while True:
            target = replica if replica is not None else self.balancer.pick(upstream, tried)
            assert target is not None  # one is untried: after the last attempt the loop ends (_exchange)
            tried.append(target)
            last = not several or len(tried) == len(upstream.replicas)
            reply = await self._exchange(method, upstream, target, route, path, query, headers, body,
                                         counted=replica is None, last=last)
            if reply is None:
                self.metrics.upstream_retries.labels(upstream.id, "refused").inc()
                continue
            if several and not_admitted(reply):
                self.balancer.mark_down(target)
                if not last:
                    self.metrics.upstream_retries.labels(upstream.id, "not_admitted").inc()
                    continue
            return reply

    async def _exchange(self, method: bytes, upstream: Upstream, target: Replica, route: str, path: str,
                        query: bytes, headers: Headers, body: bytes | None, *, counted: bool,
                        last: bool) -> UpstreamReply | None:
        """One attempt on ``target``: its reply, None when it refused and another replica may be tried, or the
        gateway's own error (503 refused, 502 transport failure or timeout) as an ApiError."""
        attempt = headers.copy()
        if target.token:
            attempt.setRawHeaders(b"authorization", [b"Bearer " + target.token.encode("latin-1")])
        replica = str(target.index)
        if counted:
            self.balancer.started(target)
        started = self.clock.seconds()
        try:
            reply = await self.proxy.forward(method, target.url(path, query), attempt, body)
        except UpstreamUnreachable as e:
            self.balancer.mark_down(target)
            self.metrics.upstream_errors.labels(upstream.id, replica, "unreachable").inc()
            if not last:
                return None
            what = upstream.id if len(upstream.replicas) == 1 else f"{upstream.id} (no replica took the request)"
            raise ApiError(st.NOT_READY, f"model server {what} is not reachable ({e}): it is not running") from None
        except UpstreamFailed as e:
            self.metrics.upstream_errors.labels(upstream.id, replica, e.kind).inc()
            log.warn("{model} replica {replica}: upstream failure on {path}: {error}", model=upstream.id,
                     replica=replica, path=path, error=str(e))
            raise ApiError(st.BAD_GATEWAY, f"model server {upstream.id}: {e}") from None
        finally:
            if counted:
                self.balancer.finished(target)
        self.metrics.upstream_duration.labels(upstream.id, replica, route).observe(
            (self.clock.seconds() - started) * 1000.0)
        return reply

    async def to_job(self, request: Any, upstream: Upstream, route: str, job_id: str, template: str, *,
                     query: bytes = b"", budget_ms: int | None = None, rewrite: bool = True) -> bytes:
        """A poll, wait or result, answered by the process that holds the job.

        The one place that decides where a job is (svc.gateway.owners): a
        replica of this host, another host's gateway (svc.gateway.cluster;
        ``budget_ms``, a wait's budget, lengthens its deadline), or 404 "job
        not found" (an id that does not verify, a replica that is gone).
        """
        where = locate(upstream, job_id, secret=self.cluster.secret, host=self.cluster.host_id)
        path = template.format(job_id=quote(job_id, safe=""))
        if isinstance(where, OtherHost):
            host = self.cluster.peer_for(request, job_id, where.host)
            return await self.cluster.forward(request, host, job_id, route, model_path(upstream.id, path), query,
                                              budget_ms)
        if where is None:
            raise ApiError(st.NOT_FOUND, f"job not found: {job_id[:80]}")
        return await self.forward(request, upstream, route, path, query=query, rewrite=rewrite, replica=where)

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

    @app.route(HEALTH_PATH, methods=["GET"])
    def healthz(self, request: Any) -> bytes:
        request.service_route = "healthz"
        body = rejection(st.SUCCESS, "", task_id=self.task_id(request), model=GATEWAY_IDENTITY)
        del body["error"]
        return send_json(request, 200, body)

    @app.route(METRICS_PATH, methods=["GET"])
    async def metrics_route(self, request: Any) -> bytes:
        request.service_route = "metrics"
        self.admit_metrics(request)  # before any model is asked
        if self.job_counts is not None:
            await self.job_counts.refresh()
        return self.metrics_reply(request, lambda _: None)

    def admit_metrics(self, request: Any) -> None:
        """The metrics token only (an API key is refused); 401 otherwise."""
        if not self.auth.is_metrics(bearer_token(request)):
            self.metrics.auth_failures.labels("wrong" if bearer_token(request) else "missing").inc()
            raise ApiError(st.UNAUTHORIZED, "GET /metrics needs Authorization: Bearer <SERVICE_METRICS_TOKEN>",
                           headers={"WWW-Authenticate": 'Bearer realm="gateway-metrics"'})
        request.service_key = METRICS_TOKEN_NAME
        request.setHeader(b"X-Service-Key", METRICS_TOKEN_NAME.encode())

    @app.route(OPENAPI_PATH, methods=["GET"])
    async def openapi_route(self, request: Any) -> bytes:
        """The gateway's OpenAPI document (``openapi/gateway.json`` for the shipped catalog), with a credential."""
        request.service_route = "openapi"
        await self.admit(request)
        if self.openapi_bytes is None:
            raise ApiError(st.NOT_FOUND, "this gateway was started without its OpenAPI document")
        return send_encoded(request, 200, self.openapi_bytes)

    @app.route(klein_rule(MODEL_INFER), methods=["POST"])
    async def infer(self, request: Any, model_id: str) -> bytes:
        request.service_route = "infer"
        await self.admit(request)
        upstream = self.upstream(model_id)
        return await self.forward(request, upstream, "infer", upstream.server_uri)

    async def legacy_infer(self, request: Any, upstream: Upstream) -> bytes:
        """``POST {server_uri}`` of a catalog model (a configured route, see the module docstring)."""
        request.service_route = "infer"
        await self.admit(request)
        return await self.forward(request, upstream, "infer", upstream.server_uri)

    @app.route(klein_rule(MODEL_PREFIX + JOBS), methods=["POST"])
    async def submit(self, request: Any, model_id: str) -> bytes:
        request.service_route = "jobs_submit"
        await self.admit(request)
        return await self.forward(request, self.upstream(model_id), "jobs_submit", JOBS, rewrite=True)

    @app.route(klein_rule(MODEL_PREFIX + JOB), methods=["GET"])
    async def job_status(self, request: Any, model_id: str, job_id: str) -> bytes:
        request.service_route = "jobs_status"
        await self.admit(request, job_id)
        return await self.to_job(request, self.upstream(model_id), "jobs_status", job_id, JOB)

    @app.route(klein_rule(MODEL_PREFIX + JOB_WAIT), methods=["GET"])
    async def job_wait(self, request: Any, model_id: str, job_id: str) -> bytes:
        request.service_route = "jobs_wait"
        await self.admit(request, job_id)
        upstream = self.upstream(model_id)
        raw = (request.args.get(b"timeout") or [None])[0]
        budget = wait_budget_ms(raw)
        if budget is not None and budget >= self.recv_timeout_ms:
            raise ApiError(st.BAD_GATEWAY,
                           f"a wait budget of {budget} ms is at or above the gateway's upstream receive timeout "
                           f"({self.recv_timeout_ms} ms, upstream_recv_timeout_ms): ask for less and wait again")
        return await self.to_job(request, upstream, "jobs_wait", job_id, JOB_WAIT, query=wait_query(raw),
                                 budget_ms=budget)

    @app.route(klein_rule(MODEL_PREFIX + JOB_RESULT), methods=["GET"])
    async def job_result(self, request: Any, model_id: str, job_id: str) -> bytes:
        request.service_route = "jobs_result"
        await self.admit(request, job_id)
        return await self.to_job(request, self.upstream(model_id), "jobs_result", job_id, JOB_RESULT,
                                 rewrite=False)

    # -- errors and accounting ----------------------------------------------------------------

    def before_routing_error(self, request: Any) -> None:
        """404 and 405 only after authentication: an unauthenticated caller gets 401 on every path."""
        self.authenticate(request)

    def oversize_reply(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        """The early 413 of the gateway's body limit (svc.web.limits.LimitedRequest)."""
        self.count_as("unmatched", "POST", st.ENTITY_TOO_LARGE.http, protocol_of(request))
        return REPLIES.raw(request, ApiError(
            st.ENTITY_TOO_LARGE, f"request body larger than {self.max_body_bytes} bytes (gateway max_body_bytes)"))

    def busy_reply(self) -> tuple[int, dict[str, str], bytes]:
        """The 503 status 65 for a connection past ``max_connections`` (svc.web.limits.LimitedChannel)."""
        return REPLIES.raw(None, ApiError(st.NOT_READY, "too many open connections (gateway max_connections); "
                                          "retry shortly", headers={"Retry-After": "1"}))

    def count_labels(self, request: Any) -> tuple[str, ...]:
        """The ``protocol`` label of the request metrics: ``oip`` under ``/v2``, else ``contract``."""
        return (protocol_of(request),)

    oip.declare(app)
    routes.install(app, configured=True)
