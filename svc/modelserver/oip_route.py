"""A model server's Open Inference Protocol routes: ``POST /v2/models/{id}[/versions/{v}]/infer``, and
``GET /v2/models/{id}[/versions/{v}]/config`` (the model's configuration in Triton's shape).

The model server answers the protocol itself, so the gateway's ``/v2``
inference route passes the client's bytes through as its contract route
does (the gateway's CPU per request is then the same for both, issue 29's
goal), and a binary image reaches the server as raw bytes, not base64.

The request becomes the server's own inference request
(:func:`svc.web.oip.translate.plan`: one image per row, ``parameters`` as
params, checked by ``RequestValidator.from_parts``), parsed where the
inference route parses its bodies (``Inference.parse_with``) and run by the
same :class:`svc.modelserver.inference.Inference` as ``POST {server_uri}``: batching, deadlines, per-item isolation and the
bounded queue apply, and admission (token, per-IP limit, readiness) is the
inference route's.  The protocol fails a request as a whole: the first item
that did not succeed becomes the error (:func:`svc.web.oip.translate.failed_item`).
Errors under ``/v2`` take the protocol's ``{"error"}`` shape
(:class:`svc.web.oip.replies.ProtocolReplies`).

A model id other than this server's is 404; a version other than the one
it serves is 404, checked before anything runs.

The configuration (:func:`svc.contract.oip.model_config`) states what this
server's config and its warm-up decided: the rows a request may carry, its
batching, its workers, its device, the execution mode in use and its
weights; the gateway forwards ``/config`` here, as it forwards inference.
"""

from __future__ import annotations

from typing import Any

from klein import Klein

from svc.contract import status as st
from svc.contract.errors import ApiError
from svc.contract.oip import PREFIX, ModelShape, Serving, model_config, shape_from_document
from svc.contract.protocol import WEIGHTS_HEADER
from svc.web.declare import route
from svc.web.oip import codec, encode, replies, translate
from svc.web.replies import OIP_JSON_CONTENT_TYPE, check_content_encoding, header


class OipRoute:
    """The route's method; ``self`` is the ModelServerApp (its config, inference, identity and replies)."""

    _oip_shape: ModelShape | None = None

    @property
    def oip_shape(self: Any) -> ModelShape:
        """The model's tensors, from this server's own OpenAPI document (read once)."""
        if self._oip_shape is None:
            self._oip_shape = shape_from_document(self.config.id, self.openapi_bytes)
        return self._oip_shape

    def oip_check_model(self: Any, model_id: str, version: str | None) -> None:
        """404 for a model other than this server's, or a version other than the one it serves."""
        if model_id != self.config.id:
            raise ApiError(st.NOT_FOUND, f"model {model_id[:80]!r} is not served here (this server serves "
                                         f"{self.config.id})")
        translate.check_version(model_id, version, self.identity.version)

    def oip_config(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        self.oip_check_model(model_id, version)
        config, backend = self.config, self.config.backend
        serving = Serving(max_rows=config.max_request_items, batch_size=config.max_batch_size,
                          batch_delay_ms=config.max_batch_delay_ms, device=backend.device, workers=backend.workers,
                          parameters={"version": self.identity.version, "optimize": self.optimize,
                                      "weights": self.weights_headers[WEIGHTS_HEADER],
                                      "batch_size": str(config.max_batch_size)})
        return replies.ok(request, model_config(model_id, self.oip_shape, serving))

    async def oip_infer(self: Any, request: Any, model_id: str, version: str | None = None) -> bytes:
        self.oip_check_model(model_id, version)
        started = self.clock.seconds()
        self.in_flight += 1
        try:
            shape = self.oip_shape
            # Its lines joined, as every header is read (docs/api.md), then its values: two lines of one value
            # and "186, 186" are that value alike (as RFC 9110 section 8.6 allows of Content-Length).
            joined = header(request, codec.HEADER_LENGTH)
            lengths = {value.strip() for value in joined.split(",")} if joined is not None else set()
            if len(lengths) > 1:
                # which one splits the body is ambiguous (the first counted): refused, as two Content-Lengths are
                raise ApiError(st.INVALID_REQUEST, "two different Inference-Header-Content-Length headers", http=400)
            length = lengths.pop() if lengths else None
            request_id = header(request, b"x-request-id")
            validator = self.inference.validator

            def parse(body: bytes) -> tuple[codec.InferRequest, translate.Plan, Any]:
                asked = codec.parse_request(body, length)
                try:
                    translate.check_named(asked, model_id)
                    plan = translate.plan(shape, asked, request_id)
                except codec.CodecError as e:
                    e.request_id = asked.id
                    raise
                return asked, plan, validator.from_parts(plan.images, plan.req_id, plan.params, plan.options,
                                                         translate.SET_PARAMS.get(shape.kind, frozenset()),
                                                         translate.SET_OPTIONS.get(shape.kind, frozenset()))

            try:
                check_content_encoding(request)  # its 415 is the protocol's 400, like a 422
                asked, plan, parsed = await self.inference.parse_with(parse, request.content.getvalue())
            except codec.CodecError as e:  # the body's id, when valid, names the 400 as it names a 200
                raise ApiError(st.INVALID_REQUEST, str(e), http=400,
                               task_id=translate.request_id_of(request_id, e.request_id)) from None
            except ApiError as e:
                if e.code in translate.AS_BAD_REQUEST:
                    raise ApiError(e.status, e.message, headers=e.headers, http=400, task_id=e.task_id) from None
                raise
            task_id, results = await self.run_inference(request, parsed, started)
            items = [result.to_json() for result in results]
            failed = translate.failed_item(items)
            if failed is not None:
                raise failed
            try:
                outputs = translate.outputs(shape, [item["data"] for item in items], plan.outputs)
            except (KeyError, TypeError, ValueError) as e:
                raise ApiError(st.CONTRACT_FAILURE, f"a reply the protocol cannot carry: {e}") from None
            head = {"model_name": model_id, "model_version": self.identity.version}
            if asked.id is not None:
                head["id"] = asked.id
            data, header_length = encode.encode_reply(head, outputs)
            request.setResponseCode(200)
            request.setHeader(b"Content-Type", codec.BINARY_CONTENT_TYPE if header_length else OIP_JSON_CONTENT_TYPE)
            if header_length:
                request.setHeader(b"Inference-Header-Content-Length", str(header_length).encode())
            request.setHeader(b"X-Request-ID", task_id.encode("latin-1"))
            request.setHeader(b"Cache-Control", b"no-store")
            for name, value in self.weights_headers.items():
                request.setHeader(name.encode(), value.encode())
            request.setHeader(b"Content-Length", str(len(data)).encode())
            self.infer_duration.observe((self.clock.seconds() - started) * 1000.0)
            return data
        finally:
            self.in_flight -= 1


def declare(app: Klein) -> None:
    """Add the routes (with and without a version) to the ModelServerApp's Klein, admitted as ``infer`` is
    (the configuration too: it names the version, known once the model is loaded)."""
    model = PREFIX + "/models/<string:model_id>"
    for base in (model, model + "/versions/<string:version>"):
        route(app, base + "/infer", methods=["POST"], name="infer", admit="admit_inference",
              endpoint=f"oip_infer{base}")(OipRoute.oip_infer)
        route(app, base + "/config", methods=["GET"], name="oip_config", admit="admit_inference",
              endpoint=f"oip_config{base}")(OipRoute.oip_config)
