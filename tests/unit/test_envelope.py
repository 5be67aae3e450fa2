"""The status table and the outcome rule of the envelope."""

import json

import pytest

from svc.contract import status as st
from svc.contract.envelope import TIMED_OUT, ItemResult, ModelIdentity, outcome, rejection, result_envelope
from svc.contract.errors import FieldError, pointer

OK = ItemResult(st.SUCCESS, {"x": 1})
EMPTY = ItemResult(st.IMAGE_EMPTY, None, "empty")
BAD = ItemResult(st.INVALID_IMAGE, None, "bad")
ENGINE = ItemResult(st.ENGINE_ERROR, None, "boom")
CONTRACT = ItemResult(st.CONTRACT_FAILURE, None, "broken")
MODEL = ModelIdentity("M", "v1")


#: The status table of docs/api.md and docs/contract.md: status -> (text, HTTP), every row.
README_STATUSES = {
    0: ("SUCCESS", 200), 68: ("PARTIAL", 200), 1: ("ENGINE_ERROR", 500), 3: ("IMAGE_EMPTY", 400),
    4: ("RUN_TIMEOUT", 504), 5: ("INVALID_IMAGE", 400), 6: ("CONTRACT_FAILURE", 500), 50: ("JSON_PARSE_ERROR", 400),
    60: ("UNSUPPORTED_MEDIA_TYPE", 415), 61: ("ENTITY_TOO_LARGE", 413), 62: ("METHOD_NOT_ALLOWED", 405),
    63: ("NOT_FOUND", 404), 65: ("NOT_READY", 503), 66: ("INVALID_REQUEST", 422), 67: ("TOO_MANY_ITEMS", 413),
    401: ("UNAUTHORIZED", 401), 408: ("REQUEST_TIMEOUT", 408), 409: ("JOB_NOT_DONE", 409), 429: ("RATE_LIMITED", 429), 500: ("INTERNAL_ERROR", 500),
    502: ("BAD_GATEWAY", 502),
}


def test_status_table_is_consistent_with_spec():
    assert len({s.code for s in st.ALL}) == len(st.ALL)
    assert len({s.text for s in st.ALL}) == len(st.ALL)
    assert {s.code: (s.text, s.http) for s in st.ALL} == README_STATUSES
    assert len(README_STATUSES) == 21
    assert st.lookup(12345).http == 500


@pytest.mark.parametrize(
    "items, expected, partial",
    [
        ([OK, OK], st.SUCCESS, False),
        ([OK, TIMED_OUT], st.PARTIAL, True),
        ([BAD, TIMED_OUT], st.PARTIAL, True),
        ([TIMED_OUT, TIMED_OUT], st.RUN_TIMEOUT, False),
        ([OK, BAD, EMPTY], st.SUCCESS, False),
        ([EMPTY, BAD], st.IMAGE_EMPTY, False),
        ([BAD, EMPTY], st.INVALID_IMAGE, False),
        ([BAD, ENGINE], st.ENGINE_ERROR, False),
        ([CONTRACT, CONTRACT], st.CONTRACT_FAILURE, False),
    ],
)
def test_outcome_rule(items, expected, partial):
    assert outcome(items) == (expected, partial)


def test_result_envelope_fields_exactly():
    code, encoded = result_envelope(task_id="t1", model=MODEL, items=[OK, BAD], server_time_ms=1.23456)
    body = json.loads(encoded)
    assert code == 200
    assert list(body) == ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial"]
    assert body["results"] == [{"status": 0, "data": {"x": 1}}, {"status": 5, "data": None, "error": "bad"}]
    assert body["model"] == {"name": "M", "version": "v1"}
    assert body["server_time_ms"] == 1.235


def test_timeout_envelope_is_504():
    code, encoded = result_envelope(task_id="t", model=MODEL, items=[TIMED_OUT], server_time_ms=5)
    body = json.loads(encoded)
    assert (code, body["status"], body["status_str"], body["partial"]) == (504, 4, "RUN_TIMEOUT", False)
    assert body["results"][0]["data"] is None


def test_result_envelope_is_compact_json_with_each_items_data_spliced_from_its_encoded_bytes():
    """The bytes are those of the envelope encoded whole (compact, keys in order); a successful item's data
    comes from the bytes the worker encoded when it checked the data, not encoded again."""
    task_id = 'quo"te \u00e9 ],"results":[1]'  # a client's req_id: escaped, never taken for the splice
    plain = [OK, BAD, TIMED_OUT]
    code, encoded = result_envelope(task_id=task_id, model=MODEL, items=plain, server_time_ms=2.5)
    whole = {"status": 68, "status_str": "PARTIAL", "task_id": task_id, "model": {"name": "M", "version": "v1"},
             "results": [i.to_json() for i in plain], "server_time_ms": 2.5, "partial": True}
    assert (code, encoded) == (200, json.dumps(whole, separators=(",", ":")).encode())
    spliced = ItemResult(st.SUCCESS, {"x": 1}, encoded=b'{"x":2}')
    code, encoded = result_envelope(task_id="t", model=MODEL, items=[spliced, BAD], server_time_ms=0)
    assert json.loads(encoded)["results"] == [{"status": 0, "data": {"x": 2}}, {"status": 5, "data": None, "error": "bad"}]
    assert spliced == ItemResult(st.SUCCESS, {"x": 1})  # the bytes are a cache of the data, not part of its value


def test_rejection_has_empty_results_and_errors_only_when_given():
    body = rejection(st.NOT_FOUND, "nope", task_id="t", model=MODEL)
    assert body["results"] == [] and "errors" not in body and body["error"] == "nope"
    body = rejection(st.INVALID_REQUEST, "bad", task_id="t", model=MODEL, errors=[FieldError("/a", "m")])
    assert body["errors"] == [{"pointer": "/a", "message": "m"}]


def test_json_pointer_escaping():
    assert pointer("params", "a/b", "c~d", 0) == "/params/a~1b/c~0d/0"
