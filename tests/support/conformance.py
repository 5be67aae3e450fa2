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
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from schemathesis.config import SchemathesisConfig

#: 401: a credential of the wrong kind (the gateway's /metrics takes the metrics token only);
#: 404: an unknown job id (any string is a valid ``job_id``); 409: the result of an unfinished job;
#: 429: a full job queue; 5xx: judged by not_a_server_error where it applies.
ACCEPTED_STATUSES = ["2xx", "400", "401", "404", "409", "429", "5xx"]


def config() -> SchemathesisConfig:
    """The schemathesis configuration of the conformance tests: every check on, positive acceptance as above."""
    return SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"enabled": True, "expected-statuses": ACCEPTED_STATUSES}}}
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
    results = body.get("results") if isinstance(body, dict) else None
    assert results, f"a schema-valid request was rejected before admission (400, status {body.get('status')}): {body}"
    items = case.body.get("images") if isinstance(case.body, dict) else None
    expected = len(items) if isinstance(items, list) else 1  # a raw body is one item
    assert len(results) == expected, f"{len(results)} results for {expected} images: {body}"
    assert all(item["status"] != 0 for item in results), f"a 400 with a successful item: {body}"



def call_and_validate(case: Any, base_url: str, credential: dict[str, str], **kwargs: Any) -> None:
    """Send ``case`` with the test's credential and run every check, :func:`admitted_when_valid` included."""
    case.call_and_validate(base_url=base_url, headers=credential, additional_checks=[admitted_when_valid], **kwargs)
