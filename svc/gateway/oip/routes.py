"""The ``/v2`` routes of the gateway (Open Inference Protocol, KServe v2 REST).

    GET  /v2                                          server metadata
    GET  /v2/health/live                              the gateway's liveness
    GET  /v2/health/ready                             200 when every model of the catalog is ready, else 503
    GET  /v2/models/{id}[/versions/{version}]         model metadata (its model server's document and /ready)
    GET  /v2/models/{id}[/versions/{version}]/ready   200 when a replica of the model is ready, else 503
    GET  /v2/models/{id}[/versions/{version}]/config  its configuration in Triton's shape (a ready replica's)
    POST /v2/models/{id}[/versions/{version}]/infer   inference: the model server's own route of that path

They are methods of :class:`svc.gateway.app.GatewayApp` (:class:`OipRoutes`
is its base; :func:`declare` adds them to its Klein) and run through the
same steps as the contract's routes: ``admit`` (the credential and its
scope, 401; the key's bucket, 429 with ``Retry-After``), ``upstream`` (404
for an id not in the catalog), ``exchange`` (the balancer, the replicas, 503
for a model that is not running, 502, the upstream metrics), one reply
shape for every error (svc.web.oip.replies), and the request metrics
with ``protocol="oip"``.  Every route needs a credential, the health routes
too: ``GET /healthz`` is the probe without one.

A version in the path must be the version the model serves (the
``model.version`` of its replies), else 404.  Inference is the model
server's (:mod:`svc.modelserver.oip_route`: it parses the tensors, runs
them through its data plane, answers the protocol and checks the version
before anything runs); the gateway forwards the request's bytes and passes
the reply back (:meth:`svc.gateway.forwarder.Forwarder.forward`), so an OIP
request costs the gateway what a contract request does.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from klein import Klein
from twisted.internet.defer import Deferred, ensureDeferred, gatherResults
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from svc import __version__
from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.contract.oip import EXTENSIONS, INPUTS, PLATFORM, PREFIX, SERVER_NAME, ModelShape, shape_from_document
from svc.contract.protocol import OPENAPI_PATH, READY_PATH
from svc.gateway.catalog import Replica, Upstream
from svc.web.declare import route
from svc.web.oip import translate
from svc.web.oip.replies import ok as _ok
from svc.web.oip.replies import request_id


def upstream_error(reply: Any) -> ApiError:
    """A model server's error reply as the protocol's: its ``error`` text, status and ``Retry-After``."""
    try:
        body = json.loads(reply.body)
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    status = translate.STATUSES.get(body.get("status"), st.INTERNAL_ERROR)
    message = body.get("error") or status.meaning  # a 422's text names its errors[] already
    retry = reply.headers.getRawHeaders(b"retry-after")
    return ApiError(status, message, headers={"Retry-After": retry[0].decode("latin-1")} if retry else {},
                    http=400 if reply.code in translate.AS_BAD_REQUEST else reply.code)


#: How long the ready, health and metadata routes wait for a model server's ``/ready``: it answers from its
#: reactor at once, so one silent this long is hung (or its machine is far past its capacity): not ready.
READY_TIMEOUT_S = 5.0


class OipRoutes:
    """The route methods; ``self`` is the GatewayApp, whose ``upstream`` and ``forwarder`` they use.

    :func:`declare` names each route and admits its caller with the GatewayApp's ``admit``, as the
    contract's routes are."""

    oip_shapes: dict[str, tuple[bytes, ModelShape]]  # per model: its document's bytes, and their tensors

    async def oip_server_metadata(self: Any, request: Any) -> bytes:
        request_id(request)
        return _ok(request, {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})

    async def oip_live(self: Any, request: Any) -> bytes:
        request_id(request)
        return _ok(request, {"live": True})

    async def oip_ready(self: Any, request: Any) -> bytes:
        """Ready when every model of the catalog is: the protocol's "server ready" says whether all the models
        are ready for inferencing (Triton's strict readiness).  Each model's ``/ready`` is asked at once, as its
        own ready route asks it; 503 names the models that are not."""
        request_id(request)
        answers = await gatherResults([ensureDeferred(self.oip_model_is_ready(request, up)) for up in self.catalog])
        waiting = [up.id for up, ready in zip(self.catalog, answers, strict=True) if not ready]
        if waiting:
            raise ApiError(st.NOT_READY, f"not every model is ready: {', '.join(waiting)} "
                                         f"(GET {PREFIX}/models/{{id}}/ready says why)")
        return _ok(request, {"ready": True})

    async def oip_model_is_ready(self: Any, request: Any, upstream: Upstream) -> bool:
        """Whether a replica of ``upstream`` answers its ``/ready`` with 200 (a refusal or a failure: not)."""
        try:
            reply, _ = await self.oip_ask_ready(request, upstream)
        except ApiError:
            return False
        return reply.code == 200

    async def oip_ask_ready(self: Any, request: Any, upstream: Upstream) -> tuple[Any, Replica | None]:
        """A ready replica's reply to ``/ready`` and that replica, else the last answer (and None).

        Each replica is asked at once, within :data:`READY_TIMEOUT_S` (a hung model server, its one replica
        SIGSTOPped, held the ready and metadata routes for ``upstream_recv_timeout_ms``, 180 s, and answered
        502); the first 200 answers.  One replica asked alone, as the balancer picks for a request, was the
        hung one half the time in the second before the gateway's probe marked it down: 503 after 5 s while
        the other served (a replicas probe).  No answer in time, or none at all, is 503: not ready.  A model
        server not running is the answer to the question, not an upstream error (``probe``).  The metadata
        and config routes ask the replica found here, the one known to answer."""
        if len(upstream.replicas) == 1:
            return await self.oip_ask_replica(request, upstream, None), None
        # Those the gateway's own probe finds ready (a hung one is asked again only when no other is ready).
        asked = [r for r in upstream.replicas if self.balancer.is_ready(r)] or list(upstream.replicas)
        result: Deferred[tuple[Any, Replica | None]] = Deferred()
        waiting = [len(asked)]
        replies: list[Any] = []
        failures: list[Failure] = []

        def answered(outcome: Any, replica: Replica) -> None:
            waiting[0] -= 1
            if result.called:
                return  # an answer after the first 200
            if not isinstance(outcome, Failure) and outcome.code == 200:
                result.callback((outcome, replica))
                return
            (failures if isinstance(outcome, Failure) else replies).append(outcome)
            if waiting[0] == 0:  # none ready: a model server's own answer (503 loading) says more than a failure
                result.callback((replies[-1], None)) if replies else result.errback(failures[-1])

        for replica in asked:
            ensureDeferred(self.oip_ask_replica(request, upstream, replica)).addBoth(answered, replica)
        return await result

    async def oip_ask_replica(self: Any, request: Any, upstream: Upstream, replica: Replica | None) -> Any:
        """``replica``'s reply to ``/ready`` (None: the one the balancer picks) within :data:`READY_TIMEOUT_S`;
        a 502 (no answer in time, a lost connection) is the ApiError of 503, not ready, and so is a replica not
        running, said as the model's (the forwarder's words for a replica asked by name are a job's)."""
        try:
            return await self.forwarder.exchange(request, upstream, "ready", READY_PATH, Headers(), None, method=b"GET",
                                                 replica=replica, timeout_s=READY_TIMEOUT_S,
                                                 timeout_name="the readiness routes' bound", probe=True)
        except ApiError as e:
            if e.status is st.NOT_READY and replica is not None:
                raise ApiError(st.NOT_READY, f"model server {upstream.id}: no replica is running") from None
            if e.status is not st.BAD_GATEWAY:
                raise
            raise ApiError(st.NOT_READY, f"{e.message}: it is not ready") from None

    async def oip_shape(self: Any, request: Any, upstream: Upstream, replica: Replica | None) -> ModelShape:
        """The model's tensors, from its model server's document (``replica``'s, one that answered its ``/ready``,
        within the metadata routes' bound: it was asked of any replica for ``upstream_recv_timeout_ms``, and a
        hung one held the route until it woke), read on every metadata request: a model
        restarted with another ``[model]`` table declares other outputs (a ``max_top_k`` that reaches its classes
        makes ``DATA`` ``PROBABILITIES``), and the gateway's metadata named the first process's outputs until the
        gateway itself restarted.  The document is parsed again only when its bytes changed."""
        reply = await self.forwarder.exchange(request, upstream, "openapi", OPENAPI_PATH, Headers(), None,
                                              method=b"GET", replica=replica, timeout_s=READY_TIMEOUT_S,
                                              timeout_name="the metadata routes' bound")
        if reply.code != 200:
            raise upstream_error(reply)
        known = self.oip_shapes.get(upstream.id)
        if known is not None and known[0] == reply.body:
            return known[1]
        try:
            shape = shape_from_document(upstream.id, reply.body)
        except (ValueError, AttributeError) as e:
            raise ApiError(st.BAD_GATEWAY, f"model server {upstream.id}: unreadable OpenAPI document: {e}") from None
        self.oip_shapes[upstream.id] = (reply.body, shape)
        return shape

    async def oip_version(self: Any, request: Any, upstream: Upstream,
                          version: str | None) -> tuple[str, Replica | None]:
        """The version the model serves, from a ready replica (503 when none is; 404 for another ``version``),
        and that replica."""
        reply, replica = await self.oip_ask_ready(request, upstream)
        if reply.code != 200:
            raise upstream_error(reply)
        served = str(json.loads(reply.body).get("model", {}).get("version", ""))
        translate.check_version(upstream.id, version, served)
        return served, replica

    async def oip_model_metadata(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        request_id(request)
        upstream = self.upstream(request, model_id)
        served, replica = await self.oip_version(request, upstream, version)
        shape = await self.oip_shape(request, upstream, replica)
        return _ok(request, {"name": model_id, "versions": [served], "platform": PLATFORM,
                             "inputs": [s.to_json() for s in INPUTS], "outputs": [s.to_json() for s in shape.outputs]})

    async def oip_model_ready(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        request_id(request)
        upstream = self.upstream(request, model_id)
        await self.oip_version(request, upstream, version)
        return _ok(request, {"name": model_id, "ready": True})

    async def oip_model_config(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        """What a ready replica's model server says of its serving (svc.modelserver.oip_route: its batching,
        workers and mode, which the gateway does not know).  As the metadata route: 503 unless a replica answers
        its ``/ready`` within :data:`READY_TIMEOUT_S` (a hung model server held this route for
        ``upstream_recv_timeout_ms``, 180 s, and answered 502), then that replica's configuration within the
        same bound."""
        request_id(request)
        upstream = self.upstream(request, model_id)
        ready, replica = await self.oip_ask_ready(request, upstream)
        if ready.code != 200:
            raise upstream_error(ready)
        reply = await self.forwarder.exchange(request, upstream, "oip_config", _model_path(upstream, version, "config"),
                                              Headers(), None, method=b"GET", replica=replica,
                                              timeout_s=READY_TIMEOUT_S, timeout_name="the metadata routes' bound")
        if reply.code != 200:
            raise upstream_error(reply)
        return _ok(request, json.loads(reply.body))

    async def oip_infer(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        """The model server answers the protocol itself (svc.modelserver.oip_route): the client's bytes go to
        the same path there, and its reply comes back as it is, as on the contract's route."""
        upstream = self.upstream(request, model_id)
        return await self.forwarder.forward(request, upstream, "infer", _model_path(upstream, version, "infer"))


def _model_path(upstream: Upstream, version: str | None, tail: str) -> str:
    """The model server's path of a model route: ``/v2/models/{id}[/versions/{version}]/{tail}``."""
    path = f"{PREFIX}/models/{quote(upstream.id, safe='')}"
    if version is not None:
        path += f"/versions/{quote(version, safe='')}"
    return f"{path}/{tail}"




def declare(app: Klein) -> None:
    """Add the routes to the GatewayApp's Klein (before ``svc.web.routes.install``)."""
    model = PREFIX + "/models/<string:model_id>"
    version = model + "/versions/<string:version>"
    route(app, PREFIX, methods=["GET"], name="oip_metadata", admit="admit")(OipRoutes.oip_server_metadata)
    route(app, PREFIX + "/health/live", methods=["GET"], name="oip_health", admit="admit")(OipRoutes.oip_live)
    route(app, PREFIX + "/health/ready", methods=["GET"], name="oip_health", admit="admit")(OipRoutes.oip_ready)
    for base in (model, version):
        route(app, base, methods=["GET"], name="oip_metadata", admit="admit",
              endpoint=f"oip_metadata{base}")(OipRoutes.oip_model_metadata)
        route(app, base + "/ready", methods=["GET"], name="oip_ready", admit="admit",
              endpoint=f"oip_ready{base}")(OipRoutes.oip_model_ready)
        route(app, base + "/config", methods=["GET"], name="oip_config", admit="admit",
              endpoint=f"oip_config{base}")(OipRoutes.oip_model_config)
        route(app, base + "/infer", methods=["POST"], name="infer", admit="admit",
              endpoint=f"oip_infer{base}")(OipRoutes.oip_infer)
