"""The one table of envelope statuses: value, text, HTTP code.

The envelope builders, the request validators, the gateway and the OpenAPI
document all read this table; nothing else spells a status number.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Status:
    """One row of the status table."""

    code: int
    text: str
    http: int
    meaning: str


SUCCESS = Status(0, "SUCCESS", 200, "success")
ENGINE_ERROR = Status(1, "ENGINE_ERROR", 500, "the model raised an error while running the batch this item was in")
IMAGE_EMPTY = Status(3, "IMAGE_EMPTY", 400, "input image empty")
RUN_TIMEOUT = Status(4, "RUN_TIMEOUT", 504, "model run timeout: the deadline passed before the item finished")
INVALID_IMAGE = Status(5, "INVALID_IMAGE", 400, "input image is not valid base64, not a decodable image, or too large")
CONTRACT_FAILURE = Status(6, "CONTRACT_FAILURE", 500, "model output contract failure")
JSON_PARSE_ERROR = Status(50, "JSON_PARSE_ERROR", 400, "JSON parse error: the body is not JSON or not a JSON object")
UNSUPPORTED_MEDIA_TYPE = Status(60, "UNSUPPORTED_MEDIA_TYPE", 415, "unsupported media type")
ENTITY_TOO_LARGE = Status(61, "ENTITY_TOO_LARGE", 413, "request entity too large")
METHOD_NOT_ALLOWED = Status(62, "METHOD_NOT_ALLOWED", 405, "method not allowed")
NOT_FOUND = Status(63, "NOT_FOUND", 404, "not found")
NOT_READY = Status(65, "NOT_READY", 503, "service not ready")
INVALID_REQUEST = Status(66, "INVALID_REQUEST", 422, "invalid request (img_data, unknown keys, wrong params)")
TOO_MANY_ITEMS = Status(67, "TOO_MANY_ITEMS", 413, "too many items in one request")
PARTIAL = Status(68, "PARTIAL", 200, "deadline reached, partial results (partial: true)")
JOB_NOT_DONE = Status(409, "JOB_NOT_DONE", 409, "job result not available: the job is pending, running, failed or timed out")
UNAUTHORIZED = Status(401, "UNAUTHORIZED", 401, "unauthorized")
RATE_LIMITED = Status(429, "RATE_LIMITED", 429, "rate limited or wait queue full (with Retry-After)")
INTERNAL_ERROR = Status(500, "INTERNAL_ERROR", 500, "server error")
BAD_GATEWAY = Status(502, "BAD_GATEWAY", 502, "upstream transport failure (reset, malformed reply, receive timeout)")
REQUEST_TIMEOUT = Status(408, "REQUEST_TIMEOUT", 408, "the request body did not arrive within body_timeout_ms")

ALL: tuple[Status, ...] = (
    SUCCESS,
    PARTIAL,
    ENGINE_ERROR,
    IMAGE_EMPTY,
    RUN_TIMEOUT,
    INVALID_IMAGE,
    CONTRACT_FAILURE,
    JSON_PARSE_ERROR,
    UNSUPPORTED_MEDIA_TYPE,
    ENTITY_TOO_LARGE,
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    NOT_READY,
    INVALID_REQUEST,
    TOO_MANY_ITEMS,
    UNAUTHORIZED,
    REQUEST_TIMEOUT,
    JOB_NOT_DONE,
    RATE_LIMITED,
    INTERNAL_ERROR,
    BAD_GATEWAY,
)

BY_CODE: dict[int, Status] = {s.code: s for s in ALL}

#: Statuses an item of ``results[]`` can carry.
ITEM_STATUSES: tuple[Status, ...] = (
    SUCCESS,
    ENGINE_ERROR,
    IMAGE_EMPTY,
    RUN_TIMEOUT,
    INVALID_IMAGE,
    CONTRACT_FAILURE,
)

#: Item statuses caused by the server rather than by the input.
SERVER_SIDE: frozenset[int] = frozenset({ENGINE_ERROR.code, CONTRACT_FAILURE.code})


def lookup(code: int) -> Status:
    """The row for ``code``; an unknown code is a server error (docs/contract.md, Statuses: any other is 500)."""
    return BY_CODE.get(code, Status(code, "SERVER_ERROR", 500, "server error"))
