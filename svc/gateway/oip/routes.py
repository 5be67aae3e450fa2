"""The ``/v2`` routes of the gateway (Open Inference Protocol, KServe v2 REST).

    GET  /v2                                          server metadata
    GET  /v2/health/live, /v2/health/ready            the gateway's liveness and readiness
    GET  /v2/models/{id}[/versions/{version}]         model metadata (its model server's document and /ready)
    GET  /v2/models/{id}[/versions/{version}]/ready   200 when a replica of the model is ready, else 503
    POST /v2/models/{id}[/versions/{version}]/infer   inference through the model's inference route

They are methods of :class:`svc.gateway.app.GatewayApp` (:class:`OipRoutes`
is its base; :func:`declare` adds them to its Klein) and run through the
same steps as the contract's routes: ``admit`` (the credential and its
scope, 401; the key's bucket, 429 with ``Retry-After``), ``upstream`` (404
for an id not in the catalog), ``exchange`` (the balancer, the replicas, 503
for a model that is not running, 502, the upstream metrics), one reply
shape for every error (svc.gateway.oip.replies), and the request metrics
with ``protocol="oip"``.  Every route needs a credential, the health routes
too: ``GET /healthz`` is the probe without one.

A version in the path must be the version the model serves (the
``model.version`` of its replies), else 404; inference checks it against
the reply, so a request for another version has run when it is refused.
"""

from __future__ import annotations

import json
from typing import Any

from klein import Klein
from twisted.web.http_headers import Headers

from svc import __version__
from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.contract.oip import EXTENSIONS, INPUTS, PLATFORM, PREFIX, SERVER_NAME, ModelShape, shape_from_document
from svc.contract.protocol import OPENAPI_PATH, READY_PATH
from svc.gateway.catalog import Upstream
from svc.gateway.oip import codec, translate
from svc.gateway.oip.replies import OIP
from svc.web.declare import route
from svc.web.replies import JSON_CONTENT_TYPE, dumps, header, send_encoded

#: Model-server statuses that the protocol, which has one "bad request", answers 400.
AS_BAD_REQUEST = frozenset({415, 422})


def _ok(request: Any, body: dict) -> bytes:
    return send_encoded(request, 200, dumps(body))


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
                    http=400 if reply.code in AS_BAD_REQUEST else reply.code)


class OipRoutes:
    """The route methods; ``self`` is the GatewayApp, whose ``upstream`` and ``forwarder`` they use.

    :func:`declare` names each route and admits its caller with the GatewayApp's ``admit``, as the
    contract's routes are."""

    oip_shapes: dict[str, ModelShape]

    async def oip_server_metadata(self: Any, request: Any) -> bytes:
        return _ok(request, {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})

    async def oip_live(self: Any, request: Any) -> bytes:
        return _ok(request, {"live": True})

    async def oip_ready(self: Any, request: Any) -> bytes:
        """Ready while the gateway serves; whether a model is ready is its own route's answer."""
        return _ok(request, {"ready": True})

    async def oip_shape(self: Any, request: Any, upstream: Upstream) -> ModelShape:
        """The model's tensors, from its model server's document (read once per model)."""
        shape = self.oip_shapes.get(upstream.id)
        if shape is None:
            reply = await self.forwarder.exchange(request, upstream, "openapi", OPENAPI_PATH, Headers(), None, method=b"GET")
            if reply.code != 200:
                raise upstream_error(reply)
            try:
                shape = self.oip_shapes[upstream.id] = shape_from_document(upstream.id, reply.body)
            except (ValueError, AttributeError) as e:
                raise ApiError(st.BAD_GATEWAY, f"model server {upstream.id}: unreadable OpenAPI document: {e}") from None
        return shape

    async def oip_version(self: Any, request: Any, upstream: Upstream, version: str | None) -> str:
        """The version the model serves, from a ready replica (503 when none is); 404 for another ``version``."""
        reply = await self.forwarder.exchange(request, upstream, "ready", READY_PATH, Headers(), None, method=b"GET")
        if reply.code != 200:
            raise upstream_error(reply)
        served = str(json.loads(reply.body).get("model", {}).get("version", ""))
        check_version(upstream.id, version, served)
        return served

    async def oip_model_metadata(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        upstream = self.upstream(model_id)
        served = await self.oip_version(request, upstream, version)
        shape = await self.oip_shape(request, upstream)
        return _ok(request, {"name": model_id, "versions": [served], "platform": PLATFORM,
                             "inputs": [s.to_json() for s in INPUTS], "outputs": [s.to_json() for s in shape.outputs]})

    async def oip_model_ready(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        upstream = self.upstream(model_id)
        await self.oip_version(request, upstream, version)
        return _ok(request, {"name": model_id, "ready": True})

    async def oip_infer(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        upstream = self.upstream(model_id)
        started = self.clock.seconds()
        try:
            parsed = codec.parse_request(request.content.getvalue(), header(request, codec.HEADER_LENGTH))
            shape = await self.oip_shape(request, upstream)
            plan = translate.plan(shape, parsed, header(request, b"x-request-id"))
        except codec.CodecError as e:
            raise ApiError(st.INVALID_REQUEST, str(e), http=400) from None
        headers = Headers({name: [value] for name, value in plan.headers.items()})
        reply = await self.forwarder.exchange(request, upstream, "infer", upstream.server_uri, headers, plan.body,
                                    method=b"POST")
        try:
            envelope = codec.loads(reply.body)
        except ValueError:
            envelope = None
        results = envelope.get("results") if isinstance(envelope, dict) else None
        if not isinstance(results, list) or len(results) != plan.rows:  # not admitted: a rejection
            raise upstream_error(reply)
        failed = translate.failed_item(results)
        if failed is not None:
            raise failed
        served = str(envelope.get("model", {}).get("version", ""))
        check_version(model_id, version, served)
        head = {"model_name": model_id, "model_version": served}
        if parsed.id is not None:
            head["id"] = parsed.id
        try:
            outputs = translate.outputs(shape, [item["data"] for item in results], plan.outputs)
        except (KeyError, TypeError, ValueError) as e:
            raise ApiError(st.CONTRACT_FAILURE, f"model server {model_id}: a reply the protocol cannot carry: {e}") from None
        data, header_length = codec.encode_reply(head, outputs)
        task_id = reply.headers.getRawHeaders(b"x-request-id")
        request.setResponseCode(200)
        request.setHeader(b"Content-Type", codec.BINARY_CONTENT_TYPE if header_length else JSON_CONTENT_TYPE)
        if header_length:
            request.setHeader(b"Inference-Header-Content-Length", str(header_length).encode())
        if task_id:
            request.setHeader(b"X-Request-ID", task_id[0])
        request.setHeader(b"Cache-Control", b"no-store")
        request.setHeader(b"Content-Length", str(len(data)).encode())
        self.forwarder.labelled(self.metrics.duration, "infer", OIP).observe((self.clock.seconds() - started) * 1000.0)
        return data


def check_version(model_id: str, asked: str | None, served: str) -> None:
    if asked is not None and asked != served:
        raise ApiError(st.NOT_FOUND, f"model {model_id} serves version {served!r}, not {asked[:80]!r}")


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
        route(app, base + "/infer", methods=["POST"], name="infer", admit="admit",
              endpoint=f"oip_infer{base}")(OipRoutes.oip_infer)
