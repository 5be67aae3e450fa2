"""Parsing and validation of inference requests (JSON envelope or raw body).

One function per encoding turns the body into an :class:`InferenceRequest`
or raises :class:`~svc.contract.errors.ApiError` with the exact status of
docs/contract.md, Requests: 400/50 for a body that is not a JSON object, 415/60 for
an unsupported content type, 422/66 with ``errors[]`` for every contract
rule, 413/67 for too many images.  It is pure (no I/O, no reactor), so it
runs in the decode thread pool and in property tests alike.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from svc.contract import status as st
from svc.contract.errors import ApiError, FieldError, pointer
from svc.contract.schema import ObjectSchema

ROOT_FIELDS = ("images", "req_id", "params", "options")
#: Fields of the removed ``{req_id, code, msg, data}`` envelope.
LEGACY_ENVELOPE_FIELDS = ("code", "msg", "data")
RAW_TYPES = ("application/octet-stream",)
#: One image media type, ``image/<subtype>`` of token characters (RFC 9110): ``image/png, application/json`` (two
#: Content-Type lines, joined) or one with control characters was read as an image by its prefix (a probe).
IMAGE_TYPE = re.compile(r"image/[0-9a-z!#$%&'*+.^_`|~-]+")
REQ_ID_RE = re.compile(r"[\x21-\x7e]{1,128}")
REQ_ID_RULE = "must be 1 to 128 printable ASCII characters without spaces"


@dataclass
class InferenceRequest:
    """A validated request: images (base64 text, or bytes for a raw body)."""

    images: list[str | bytes]
    req_id: str | None
    params: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)


#: The entries of a 422's ``errors[]`` at most; its message counts them all.
MAX_FIELD_ERRORS = 50


def reject_constant(name: str) -> Any:
    """``json.loads``'s ``parse_constant``: NaN, Infinity and -Infinity, which Python writes by default, are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


#: What ``json.loads`` may raise on a client's text: RecursionError for arrays or objects nested deeper than
#: the interpreter's stack (about a thousand levels), which is the client's error like any other.
JSON_ERRORS = (ValueError, UnicodeDecodeError, RecursionError)


def json_error_text(e: BaseException) -> str:
    """Why a client's JSON text did not parse, in words for the client (not Python's advice to its programmer)."""
    if isinstance(e, RecursionError):
        return "arrays or objects nested too deeply"
    text = str(e)
    if "int_max_str_digits" in text:  # "Exceeds the limit (4300 digits) ...; use sys.set_int_max_str_digits()"
        return f"a number has more than {sys.get_int_max_str_digits()} digits"
    return text


class RequestValidator:
    """Validates requests for one model: its params and options schemas."""

    def __init__(self, params: ObjectSchema, options: ObjectSchema, max_request_items: int) -> None:
        # JSON's integers: the OpenAPI document's `type: integer` admits 3.0 (svc.contract.schema).
        self.params = params.for_json()
        self.options = options.for_json()
        self.max_request_items = max_request_items

    # -- entry point ---------------------------------------------------------

    def parse(self, body: bytes, media_type: str, type_params: Mapping[str, str], headers: Mapping[str, str | None]) -> InferenceRequest:
        """Dispatch on the content type; ``headers`` holds the X-Service-* and X-Request-ID values."""
        if media_type == "application/json":
            charset = type_params.get("charset", "utf-8").lower()
            if charset not in ("utf-8", "utf8"):
                raise ApiError(st.UNSUPPORTED_MEDIA_TYPE, f"JSON bodies must be UTF-8, got charset {charset!r}")
            return self.parse_json(body, headers.get("x-request-id"))
        if IMAGE_TYPE.fullmatch(media_type) or media_type in RAW_TYPES:
            return self.parse_raw(body, headers)
        # None sent (or an empty one) is said so: "unsupported content type 'none'" read as a type called none.
        what = (f"unsupported content type {media_type!r}" if media_type else
                "no media type (Content-Type missing, empty or naming none)")
        raise ApiError(
            st.UNSUPPORTED_MEDIA_TYPE,
            f"{what}; send application/json (the envelope), or one image as image/* or application/octet-stream",
        )

    # -- JSON envelope ---------------------------------------------------------

    def parse_json(self, body: bytes, header_request_id: str | None = None) -> InferenceRequest:
        try:
            doc = json.loads(body, parse_constant=reject_constant)
        except JSON_ERRORS as e:
            raise ApiError(st.JSON_PARSE_ERROR, f"body is not valid JSON: {json_error_text(e)}") from None
        if not isinstance(doc, dict):
            raise ApiError(st.JSON_PARSE_ERROR, f"body must be a JSON object, got {type(doc).__name__}")
        images = doc.get("images")
        if isinstance(images, list):  # first: a million entries must not each become an error to send back
            self._check_count(len(images), doc.get("req_id") if "req_id" in doc else header_request_id)
        errors = self._root_errors(doc)
        errors += self._images_errors(doc)
        if "req_id" in doc:  # the header is then not read, so not judged (a proxy's own id broke valid bodies)
            req_id = doc["req_id"]
            errors += self._req_id_errors(req_id, pointer("req_id"))
        else:
            req_id = header_request_id
            if header_request_id is not None:
                errors += self._req_id_errors(header_request_id, pointer("req_id"), "X-Request-ID header ")
        params = self._object(doc, "params", self.params, errors)
        options = self._object(doc, "options", self.options, errors)
        if errors:
            named = req_id if isinstance(req_id, str) and REQ_ID_RE.fullmatch(req_id) else None
            raise invalid_request(errors, task_id=named)
        assert images is not None  # _images_errors requires them
        return InferenceRequest(images=images, req_id=req_id, params=params, options=options)

    def from_parts(self, images: list[str | bytes], req_id: str | None, params: dict,
                   options: dict, set_params: frozenset[str] = frozenset(),
                   set_options: frozenset[str] = frozenset()) -> InferenceRequest:
        """A request whose parts another encoding carried (the Open Inference Protocol's tensors: an image is
        a file's bytes or its base64): the JSON body's checks of ``req_id``, ``params`` and ``options``.
        ``set_params`` and ``set_options`` are those the encoding sets or refuses itself: an unknown one's error
        does not offer them."""
        errors = self._req_id_errors(req_id, pointer("req_id")) if req_id is not None else []
        doc = {"params": params, "options": options}
        params = self._object(doc, "params", self.params, errors, set_params)
        options = self._object(doc, "options", self.options, errors, set_options)
        if errors:  # named by its id, as the JSON body's 422 is (a valid req_id: the protocol's checked one)
            raise invalid_request(errors, task_id=req_id if req_id is not None and REQ_ID_RE.fullmatch(req_id)
                                  else None)
        self._check_count(len(images), req_id)
        return InferenceRequest(images=images, req_id=req_id, params=params, options=options)

    def _root_errors(self, doc: dict) -> list[FieldError]:
        errors: list[FieldError] = []
        for key in doc:
            if key in ROOT_FIELDS:
                continue
            if key == "img_data":
                message = "img_data was removed: send the image as images[0] (images is an array of base64 strings)"
            elif key in LEGACY_ENVELOPE_FIELDS:
                message = (
                    "the {req_id, code, msg, data} envelope was removed: "
                    "send {images, req_id, params, options}"
                )
            elif key in self.params.properties:
                message = f"{key} is a model parameter: put it inside params"
            else:
                message = f"unknown field {key!r}; accepted fields: {', '.join(ROOT_FIELDS)}"
            errors.append(FieldError(pointer(key), message))
        return errors

    @staticmethod
    def _images_errors(doc: dict) -> list[FieldError]:
        if "images" not in doc:
            return [FieldError(pointer("images"), "required: an array of base64 strings, at least one")]
        images = doc["images"]
        if not isinstance(images, list):
            return [FieldError(pointer("images"), f"must be an array of base64 strings, got {_json_type(images)}")]
        if not images:
            return [FieldError(pointer("images"), "must hold at least one image")]
        return [
            FieldError(pointer("images", i), f"must be a base64 string, got {_json_type(v)}")
            for i, v in enumerate(images)
            if not isinstance(v, str)
        ]

    @staticmethod
    def _req_id_errors(value: Any, where: str, prefix: str = "") -> list[FieldError]:
        if not isinstance(value, str):
            return [FieldError(where, f"{prefix}must be a string, got {_json_type(value)}")]
        if not REQ_ID_RE.fullmatch(value):
            return [FieldError(where, prefix + REQ_ID_RULE)]
        return []

    @staticmethod
    def _object(doc: dict, name: str, schema: ObjectSchema, errors: list[FieldError],
                unlisted: frozenset[str] = frozenset()) -> dict:
        if name not in doc:
            return schema.with_defaults({})
        value = doc[name]
        if not isinstance(value, dict):
            errors.append(FieldError(pointer(name), f"must be an object, got {_json_type(value)}"))
            return {}
        found = schema.errors(value, name, unlisted=unlisted)
        errors.extend(found)
        return schema.with_defaults(value) if not found else {}

    def _check_count(self, n: int, req_id: Any = None) -> None:
        """413 status 67 past ``max_request_items``, named by the request's ``req_id`` when it is a valid one (the
        client's id was lost on this refusal alone: a new one named it)."""
        if n > self.max_request_items:
            raise ApiError(
                st.TOO_MANY_ITEMS,
                f"{n} images in one request; at most {self.max_request_items} are accepted (max_request_items)",
                task_id=req_id if isinstance(req_id, str) and REQ_ID_RE.fullmatch(req_id) else None,
            )

    # -- raw body ----------------------------------------------------------------

    def parse_raw(self, body: bytes, headers: Mapping[str, str | None]) -> InferenceRequest:
        """One image's bytes; params/options/request id from headers."""
        errors: list[FieldError] = []
        params = self._header_object(headers.get("x-service-params"), "params", "X-Service-Params", self.params, errors)
        options = self._header_object(
            headers.get("x-service-options"), "options", "X-Service-Options", self.options, errors
        )
        req_id = headers.get("x-request-id")
        if req_id is not None:
            errors += self._req_id_errors(req_id, pointer("req_id"), "X-Request-ID header ")
        if errors:
            raise invalid_request(errors)
        return InferenceRequest(images=[bytes(body)], req_id=req_id, params=params, options=options)

    @staticmethod
    def _header_object(
        raw: str | None, name: str, header_name: str, schema: ObjectSchema, errors: list[FieldError]
    ) -> dict:
        if raw is None:
            return schema.with_defaults({})
        try:
            value = json.loads(raw, parse_constant=reject_constant)
        except JSON_ERRORS as e:
            errors.append(FieldError(pointer(name), f"{header_name} header is not valid JSON: {json_error_text(e)}"))
            return {}
        if not isinstance(value, dict):
            errors.append(FieldError(pointer(name), f"{header_name} header must be a JSON object, got {_json_type(value)}"))
            return {}
        found = schema.errors(value, name)
        errors.extend(found)
        return schema.with_defaults(value) if not found else {}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def invalid_request(errors: list[FieldError], task_id: str | None = None) -> ApiError:
    """The 422 (status 66) of ``errors``, its ``errors[]`` cut to the first :data:`MAX_FIELD_ERRORS`.

    The message counts them all.  Uncut, a 6 MB body of three million
    unknown fields or ``params`` keys was answered with one entry each: a
    reply of hundreds of MB that took a model server 84 s and gigabytes to
    build, slowing every other request (found by a security probe).
    """
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    shown = "" if len(errors) <= MAX_FIELD_ERRORS else f"; errors[] lists the first {MAX_FIELD_ERRORS}"
    return ApiError(st.INVALID_REQUEST, f"invalid request: {first.pointer}: {first.message}{more}{shown}",
                    errors[:MAX_FIELD_ERRORS], task_id=task_id)
