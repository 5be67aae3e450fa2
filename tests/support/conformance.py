"""How the schemathesis tests judge a reply: the rule that schema-valid requests are admitted.

A request that is valid by the OpenAPI document must not be rejected as a
whole with a 4xx before admission: if it were, the document would promise
more than the server accepts, and a client generated from it would send
requests that fail.  schemathesis's ``positive_data_acceptance`` check says
this with a list of expected statuses; ours is its default less 403 and
3xx (never answered), plus 400,
which for a schema-valid request can only be the admitted envelope whose
items all failed on their input (a string that is not an image: status 3 or
5).  :func:`admitted_when_valid` makes sure a 400 is that envelope and not a
rejection.

One documented exception to "a schema-valid request is admitted": an OIP
inference body of ``application/octet-stream`` (the binary tensor data
extension) is any bytes by the document, which cannot shape a JSON part
whose length a header gives; such a body that is not the extension's is
refused with the protocol's 400 naming its JSON part or that header
(:func:`refused_binary_body`), and nothing else is accepted.

One documented exception to "a schema-violating request is rejected": the
``X-Service-Params`` and ``X-Service-Options`` headers are for raw-body
requests only and are ignored with a JSON body (docs/api.md, and the parameters'
descriptions; the gateway forwards them for raw bodies only).  OpenAPI
cannot tie a header to one media type of the body, so a negative case whose
only broken parts are those headers, sent with a JSON body, is a valid
request.  Likewise ``X-Request-ID`` with a JSON body that has its own ``req_id``:
the body's id is used and the header is not read, so not judged (docs/api.md;
a proxy's own ids made valid bodies fail).  :func:`broken_only_in_ignored_headers`
tells such a case, and the negative-data check is skipped for it (every other
check still runs).
"""

from __future__ import annotations

import json
import re
from typing import Any

import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import negative_data_rejection

from svc.contract.request import REQ_ID_RE

#: 401: a credential of the wrong kind (the gateway's /metrics takes the metrics token only);
#: 404: an unknown job id (any string is a valid ``job_id``); 409: the result of an unfinished job;
#: 429: a full job queue; 5xx: judged by not_a_server_error where it applies.
ACCEPTED_STATUSES = ["2xx", "400", "401", "404", "409", "429", "5xx"]
#: How a schema-violating request may be refused: schemathesis's default list plus 413, the documented refusal of
#: more ``images`` than ``maxItems`` (``max_request_items``: status 67), which comes first whatever else is wrong.
REJECTED_STATUSES = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
#: Request headers that apply to raw bodies only: ignored with a JSON body.
RAW_BODY_HEADERS = {"x-service-params", "x-service-options"}


def config() -> SchemathesisConfig:
    """The schemathesis configuration of the conformance tests: every check on, positive acceptance and negative
    rejection as above."""
    return SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"enabled": True, "expected-statuses": ACCEPTED_STATUSES},
                    "negative_data_rejection": {"expected-statuses": REJECTED_STATUSES}}}
    )


def load(document: dict) -> Any:
    """A schemathesis schema of ``document`` under :func:`config`."""
    return schemathesis.openapi.from_dict(document, config=config())


def admitted_when_valid(ctx: Any, response: Any, case: Any) -> None:
    """A schema-valid request answered 400 must have been admitted: the envelope with one result per image."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"a schema-valid request got a 400 that is not JSON: {response.content[:200]!r}") from None
    if case.path.startswith("/v2/"):  # the Open Inference Protocol fails an admitted request as a whole
        if case.media_type == "application/octet-stream":
            return refused_binary_body(body)
        return admitted_oip_rows(body, case)
    results = body.get("results") if isinstance(body, dict) else None
    assert results, f"a schema-valid request was rejected before admission (400, status {body.get('status')}): {body}"
    items = case.body.get("images") if isinstance(case.body, dict) else None
    expected = len(items) if isinstance(items, list) else 1  # a raw body is one item
    assert len(results) == expected, f"{len(results)} results for {expected} images: {body}"
    assert all(item["status"] != 0 for item in results), f"a 400 with a successful item: {body}"



def admitted_oip_rows(body: Any, case: Any) -> None:
    """A schema-valid OIP request answered 400: a row that failed on its input (svc.web.oip.translate)."""
    found = re.match(r"row \d+ of (\d+) failed \((IMAGE_EMPTY|INVALID_IMAGE)\)", str(body.get("error", "")))
    assert found, f"a schema-valid OIP request was rejected before admission (400): {body}"
    assert int(found.group(1)) == len(case.body["inputs"][0]["data"]), body


def refused_binary_body(body: Any) -> None:
    """An OIP binary body (bytes, by the document) answered 400: refused as not the extension's (module docstring)."""
    error = str(body.get("error", "")) if isinstance(body, dict) else ""
    assert re.match(r"(the inference request header is not JSON|Inference-Header-Content-Length )", error), (
        f"a binary OIP body got a 400 that is not the refusal of its JSON part or header length: {body}")


def broken_only_in_ignored_headers(case: Any) -> bool:
    """A negative case with a JSON body whose only schema violation can be in headers it ignores.

    True when everything but the headers was generated valid, one of the
    ignored headers is sent (:data:`RAW_BODY_HEADERS`, and ``X-Request-ID``
    when the body has a ``req_id``), and ``X-Request-ID``, when the body has
    none, is absent or valid.
    """
    meta = case.meta
    if meta is None or not meta.generation.mode.is_negative or case.media_type != "application/json":
        return False
    if any(info.mode.is_negative for where, info in meta.components.items() if where != ParameterLocation.HEADER):
        return False
    headers = {str(k).lower(): v for k, v in (case.headers or {}).items()}
    ignored = RAW_BODY_HEADERS | ({"x-request-id"} if isinstance(case.body, dict) and "req_id" in case.body else set())
    request_id = headers.get("x-request-id")
    return bool(ignored & headers.keys()) and ("x-request-id" in ignored or request_id is None or (
        isinstance(request_id, str) and REQ_ID_RE.fullmatch(request_id) is not None))


def unique_operation_ids(items: list[Any]) -> None:
    """Give each schemathesis item (one per API operation) its own node id: ``test[GET /healthz]``.

    pytest 9 builds a test item's node id from its function name and its
    parametrization only, and schemathesis's per-operation items have none:
    every operation of one test got the same id, and xdist, which schedules
    by node id, ran the first and dropped the rest (tests/support/run_guard.py
    now fails such a run).  Node ids are immutable in pytest's public API;
    the item's ``_id`` is replaced before anything reads it (collection).
    """
    for item in items:
        label = getattr(item, "operation_label", None)
        if label is None or label in item.nodeid:
            continue
        node_id = item._id
        params = label if node_id.params is None else f"{label}-{node_id.params}"
        item._id = type(node_id)(path=node_id.path, names=node_id.names, params=params)


def call_and_validate(case: Any, base_url: str, credential: dict[str, str], **kwargs: Any) -> None:
    """Send ``case`` with the test's credential and run every check, :func:`admitted_when_valid` included.

    The negative-data check is skipped only where the module docstring says.
    """
    excluded = [negative_data_rejection] if broken_only_in_ignored_headers(case) else []
    case.call_and_validate(base_url=base_url, headers=credential, additional_checks=[admitted_when_valid],
                           excluded_checks=excluded, **kwargs)
