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
then routing (404 for an unknown id or path, with any method; 405 for a wrong method), so
that an unauthenticated caller learns nothing about the catalog.  A path
that matches no route, and a route's model id that the catalog does not
have, are authenticated, then 404 or 405 without a token spent (nothing
reaches a model).  A job GET for another host's job is
answered by that host's gateway (svc.gateway.cluster).
Errors made here use the unified envelope with ``model.name`` ``gateway``.

Where an admitted request goes (which replica, what is retried, which host
holds a job) is :class:`svc.gateway.forwarder.Forwarder`'s; this module says
only whether it may pass.

The routes are declared once in the class body, each with its name and its
admission (:func:`svc.web.routes.route`); the legacy ``{server_uri}``
routes come from the catalog, so each instance adds them to its
:class:`svc.web.configured.ConfiguredRoutes`, which the class's catch-all asks
when no declared route matches (404 and 405 stay as if they were declared,
and come only after authentication, ``before_routing_error``).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any
from urllib.parse import quote

from klein import Klein
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from svc import __version__
from svc.auth import METRICS_TOKEN_NAME
from svc.cluster_config import ClusterConfig
from svc.contract import status as st
from svc.contract.envelope import ModelIdentity, rejection
from svc.contract.errors import ApiError
from svc.contract.protocol import (
    GATEWAY_METRICS_REALM,
    GATEWAY_REALM,
    HEALTH_PATH,
    JOB,
    JOB_RESULT,
    JOB_WAIT,
    JOBS,
    METRICS_PATH,
    MODEL_INFER,
    MODEL_PREFIX,
    OPENAPI_PATH,
    bearer_challenge,
    klein_rule,
)
from svc.contract.query import MAX_DIGITS, query_value, wait_budget_ms
from svc.gateway.balancer import Balancer
from svc.gateway.catalog import Catalog, Upstream
from svc.gateway.cluster import Cluster
from svc.gateway.credentials import Authenticator, Principal, Unauthorized
from svc.gateway.forwarder import Forwarder
from svc.gateway.keylimits import KeyLimits
from svc.gateway.oip import routes as oip
from svc.gateway.proxy import Proxy
from svc.gateway.ratestore import LocalRates
from svc.infra.metrics import GatewayMetrics
from svc.infra.ratelimit import KeyedLimiter
from svc.web import declare, routes
from svc.web.bodylimits import head_method, read_without_credential
from svc.web.configured import ConfiguredRoutes
from svc.web.oip.replies import ProtocolReplies, protocol_of
from svc.web.replies import bearer_token, dumps, envelope_headers, send_encoded, send_json, unauthorized_reason

log = Logger()

GATEWAY_IDENTITY = ModelIdentity("gateway", __version__)


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


#: The gateway's error replies: the unified envelope with the gateway's identity.
REPLIES = ProtocolReplies(lambda: GATEWAY_IDENTITY, routes.task_id_of, not_found="no route for {path}: unknown model or path")


class GatewayApp(oip.OipRoutes, KeyLimits, routes.JsonApp):
    """Routes of the gateway (the ``/v2`` ones: svc.gateway.oip.routes); ``resource()`` is served by a JsonSite."""

    app = Klein()
    replies = REPLIES
    oversize_text = "request body larger than {max_body_bytes} bytes (gateway max_body_bytes)"
    busy_text = "too many open connections (gateway max_connections); retry shortly"
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
        key_max_in_flight: int = 0,
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
        self.key_max_in_flight = key_max_in_flight
        self.in_flight: dict[str, int] = {}  # per key: requests admitted and not yet answered (or gone)
        #: The per-key buckets: this process's, or Redis (svc.gateway.ratestore); ``take`` returns a Deferred.
        self.rates = rates if rates is not None else LocalRates(KeyedLimiter(clock, 0))
        self.cluster = cluster if cluster is not None else Cluster(
            reactor=clock, config=ClusterConfig.single_host(), authenticator=authenticator, secret=None, metrics=metrics,
            recv_timeout_s=upstream_recv_timeout_ms / 1000.0)
        self.forwarder = Forwarder(clock=clock, balancer=self.balancer, proxy=proxy, metrics=metrics,
                                   cluster=self.cluster)
        self.oip_shapes = {}
        self.openapi_bytes = dumps(openapi) if openapi is not None else None
        self.configured = ConfiguredRoutes()
        for upstream in catalog:
            self.configured.add(upstream.server_uri, ["POST"], partial(self.legacy_infer, upstream=upstream))

    # -- helpers -------------------------------------------------------------------------

    def task_id(self, request: Any) -> str:
        return routes.task_id_of(request)

    async def admit(self, request: Any, job_id: str | None = None, model_id: str | None = None,
                    **_route_args: Any) -> Principal:
        """Authenticate, then spend one token of the key's bucket; 401 or 429 otherwise (404 first for a
        ``model_id`` the catalog does not have: the same reply as a path that is no route, without a token).

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
        if model_id is not None and model_id not in self.catalog.by_id:
            self.count_key(request, principal)
            raise self.not_found(request)  # before the bucket: an unknown id spends no token, as an unknown path
        # The in-flight slot first: a request refused for it spends no token (it spent one, so the retry its
        # 429 asks for met the rate limit). A slot held over the bucket's await is freed by the 429's finish.
        # An upload may hold it from its head already (refusal_before_body).
        if not getattr(request, "held", False):
            self.hold(request, principal.name)
        wait = await self.take_token(request, principal)  # an upload's was taken from its head
        if wait:
            raise self.rate_limited(principal, wait)
        self.count_key(request, principal)
        return principal

    def count_key(self, request: Any, principal: Principal) -> None:
        """``service_gateway_key_requests_total``: once per request that authenticated with a key, whatever it is
        answered (a route's reply, or the 404 or 405 of ``before_routing_error``); the mark on the request keeps a
        request that passes both places from being counted twice.  A 429 is not counted here but as a rejection."""
        if getattr(request, "key_counted", False):
            return
        request.key_counted = True
        self.forwarder.labelled(self.metrics.key_requests, principal.name).inc()

    def refusal_before_body(self, request: Any, length: int | None) -> tuple[int, dict[str, str], bytes] | None:
        """The 401 of a request without a credential this gateway knows, as soon as its head is read
        (svc.web.bodylimits), when its body is larger than 64 KiB, chunked, or awaits
        ``100 Continue``: that body is never read, so a client without a key cannot make the gateway hold
        ``max_body_bytes``; the connection closes after the 401.  A smaller body is read, and its route answers as
        before (401 on a connection that stays open).  Whatever the method and path: no route reads the body of a
        GET, HEAD or OPTIONS, and ``/healthz`` and a CORS preflight, which need no credential, carry none.  The
        metrics and cluster tokens count as known (their routes check them); an API key's or static token's
        principal is kept for :meth:`authenticate`.

        Such an upload with a valid credential takes its in-flight slot (:meth:`hold`) and its key's token
        (svc.gateway.keylimits) from its head, and one past ``key_max_in_flight`` or the key's rate is answered
        429 unread: counted only once its body had arrived, a key could make the gateway hold ``max_body_bytes``
        for any number of uploads kept open."""
        if read_without_credential(request, length):
            if not self.vouched(request):  # its connection may be closed for another while its body comes
                request.unvouched()
            return None
        token = bearer_token(request)
        if self.auth.is_metrics(token) or self.auth.is_cluster(token):
            return None
        method = head_method(request)
        try:
            principal = request.early_principal = self.credential(request)
        except ApiError as e:
            return self.limit_reply(request, e, method)
        request.service_key = principal.name  # its access line names the key, whatever ends it (429, 413, 499)
        def refusal(e: ApiError) -> tuple[int, dict[str, str], bytes]:  # the key named, as on its every reply
            code, headers, body = self.limit_reply(request, e, method)
            return code, {**headers, "X-Service-Key": principal.name}, body

        try:
            self.hold(request, principal.name)
        except ApiError as e:
            return refusal(e)
        over = self.take_from_head(request, principal, lambda e: request.answer_early(*refusal(e)))
        return refusal(over) if over is not None else None

    def vouched(self, request: Any) -> bool:
        """Whether the request carries a credential this gateway knows (counting nothing: its route judges it, and
        :meth:`authenticate` takes the principal found here)."""
        token = bearer_token(request)
        if self.auth.is_metrics(token) or self.auth.is_cluster(token):
            return True
        try:
            request.early_principal = self.auth.authenticate(token)
        except Unauthorized:
            return False
        return True

    def authenticate(self, request: Any) -> Principal:
        """The request's principal (``X-Service-Key`` set), or 401."""
        principal = getattr(request, "early_principal", None) or self.credential(request)
        request.service_key = principal.name
        request.setHeader(b"X-Service-Key", principal.name.encode("latin-1"))
        return principal

    def credential(self, request: Any) -> Principal:
        """The principal of the request's Bearer credential, or the 401 (counted as an authentication failure or a
        disabled key's rejection)."""
        try:
            return self.auth.authenticate(bearer_token(request))
        except Unauthorized as e:
            reason = unauthorized_reason(request, e.reason)
            if e.key is not None:
                self.metrics.key_rejections.labels(e.key, "disabled").inc()
            else:  # two Authorization headers are "wrong": a credential was sent
                self.metrics.auth_failures.labels("missing" if "missing" in reason else "wrong").inc()
            raise ApiError(st.UNAUTHORIZED, f"{reason}: send Authorization: Bearer <API key or token>",
                           headers={"WWW-Authenticate": bearer_challenge(GATEWAY_REALM)}) from None

    def upstream(self, request: Any, model_id: str) -> Upstream:
        """The catalog's model ``model_id``; else the 404 of a path that is no route, word for word (the contract:
        an unknown catalog id and an unknown ``server_uri`` give the same 404 envelope)."""
        found = self.catalog.by_id.get(model_id)
        if found is None:
            raise self.not_found(request)
        return found

    # -- routes --------------------------------------------------------------------------

    @declare.route(app, HEALTH_PATH, methods=["GET"], name="healthz")
    def healthz(self, request: Any) -> bytes:
        body = rejection(st.SUCCESS, "", task_id=self.task_id(request), model=GATEWAY_IDENTITY)
        del body["error"]
        return send_json(request, 200, body, envelope_headers(body["task_id"]))

    @declare.route(app, METRICS_PATH, methods=["GET"], name="metrics", admit="admit_metrics")
    async def metrics_route(self, request: Any) -> bytes:
        if self.job_counts is not None:  # after the credential: before it, no model is asked
            await self.job_counts.refresh()
        request.setHeader(b"X-Request-ID", self.task_id(request).encode())  # as every other reply of the gateway
        return self.metrics_body(request)

    def admit_metrics(self, request: Any) -> None:
        """The metrics token only (an API key is refused); 401 otherwise."""
        token = bearer_token(request)
        if not self.auth.is_metrics(token):
            usual = "GET /metrics needs Authorization: Bearer <SERVICE_METRICS_TOKEN>"
            reason = unauthorized_reason(request, usual)  # two Authorization headers: a credential was sent
            self.metrics.auth_failures.labels("wrong" if token or reason != usual else "missing").inc()
            raise ApiError(st.UNAUTHORIZED, usual if reason == usual else f"{reason}: {usual}",
                           headers={"WWW-Authenticate": bearer_challenge(GATEWAY_METRICS_REALM)})
        request.service_key = METRICS_TOKEN_NAME
        request.setHeader(b"X-Service-Key", METRICS_TOKEN_NAME.encode())
        self.forwarder.labelled(self.metrics.key_requests, METRICS_TOKEN_NAME).inc()  # a scrape is a key's request

    @declare.route(app, OPENAPI_PATH, methods=["GET"], name="openapi", admit="admit")
    async def openapi_route(self, request: Any) -> bytes:
        """The gateway's OpenAPI document (``openapi/gateway.json`` for the shipped catalog), with a credential."""
        if self.openapi_bytes is None:
            raise ApiError(st.NOT_FOUND, "this gateway was started without its OpenAPI document")
        return send_encoded(request, 200, self.openapi_bytes)

    @declare.route(app, klein_rule(MODEL_INFER), methods=["POST"], name="infer", admit="admit")
    async def infer(self, request: Any, model_id: str) -> bytes:
        upstream = self.upstream(request, model_id)
        return await self.forwarder.forward(request, upstream, "infer", upstream.server_uri)

    @declare.guarded("infer", admit="admit")
    async def legacy_infer(self, request: Any, upstream: Upstream) -> bytes:
        """``POST {server_uri}`` of a catalog model (a configured route, see the module docstring)."""
        return await self.forwarder.forward(request, upstream, "infer", upstream.server_uri)

    @declare.route(app, klein_rule(MODEL_PREFIX + JOBS), methods=["POST"], name="jobs_submit", admit="admit")
    async def submit(self, request: Any, model_id: str) -> bytes:
        return await self.forwarder.forward(request, self.upstream(request, model_id), "jobs_submit", JOBS, rewrite=True)

    @declare.route(app, klein_rule(MODEL_PREFIX + JOB), methods=["GET"], name="jobs_status", admit="admit")
    async def job_status(self, request: Any, model_id: str, job_id: str) -> bytes:
        return await self.forwarder.to_job(request, self.upstream(request, model_id), "jobs_status", job_id, JOB)

    @declare.route(app, klein_rule(MODEL_PREFIX + JOB_WAIT), methods=["GET"], name="jobs_wait", admit="admit")
    async def job_wait(self, request: Any, model_id: str, job_id: str) -> bytes:
        upstream = self.upstream(request, model_id)
        raw, budget = query_value(request.uri, b"timeout"), None
        if upstream.async_enabled:  # else the model's own 404 passes through (to_job), whatever the budget
            self.forwarder.check_job(upstream, job_id)  # an unknown job is 404 whatever the budget
            budget = wait_budget_ms(raw)
        if budget is not None and budget >= self.recv_timeout_ms:
            raise ApiError(st.BAD_GATEWAY,
                           f"a wait budget of {budget} ms is at or above the gateway's upstream receive timeout "
                           f"({self.recv_timeout_ms} ms, upstream_recv_timeout_ms): ask for less and wait again")
        return await self.forwarder.to_job(request, upstream, "jobs_wait", job_id, JOB_WAIT, query=wait_query(raw),
                                           budget_ms=budget)

    @declare.route(app, klein_rule(MODEL_PREFIX + JOB_RESULT), methods=["GET"], name="jobs_result", admit="admit")
    async def job_result(self, request: Any, model_id: str, job_id: str) -> bytes:
        return await self.forwarder.to_job(request, self.upstream(request, model_id), "jobs_result", job_id, JOB_RESULT,
                                           rewrite=False)

    # -- errors and accounting ----------------------------------------------------------------

    def before_routing_error(self, request: Any) -> None:
        """404 and 405 only after authentication: an unauthenticated caller gets 401 on every path, and one that
        authenticated is counted by its key as a routed request is (no token is spent: see the module docstring).
        The metrics token on ``/metrics`` is its route's credential: a wrong method with it is 405, as with an API
        key, not a 401 that calls it wrong."""
        if request.path == METRICS_PATH.encode() and self.auth.is_metrics(bearer_token(request)):
            self.admit_metrics(request)
            return
        self.count_key(request, self.authenticate(request))

    def known_target(self, args: Mapping[str, Any]) -> bool:
        """A model id the catalog lacks is 404 whatever the method (405 only for a model that exists): an unknown
        id answers as an unknown path and an unknown ``server_uri`` do."""
        model_id = args.get("model_id")
        return model_id is None or model_id in self.catalog.by_id

    def count_labels(self, request: Any) -> tuple[str, ...]:
        """The ``protocol`` label of the request metrics: ``oip`` under ``/v2``, else ``contract``."""
        return (protocol_of(request),)

    oip.declare(app)
    routes.install(app, configured=True)
