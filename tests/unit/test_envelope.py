"""The status table and the outcome rule of the envelope."""

import pytest

from svc import status as st
from svc.envelope import TIMED_OUT, ItemResult, ModelIdentity, outcome, rejection, result_envelope
from svc.errors import FieldError, pointer

OK = ItemResult(st.SUCCESS, {"x": 1})
EMPTY = ItemResult(st.IMAGE_EMPTY, None, "empty")
BAD = ItemResult(st.INVALID_IMAGE, None, "bad")
ENGINE = ItemResult(st.ENGINE_ERROR, None, "boom")
CONTRACT = ItemResult(st.CONTRACT_FAILURE, None, "broken")
MODEL = ModelIdentity("M", "v1")


def test_status_table_is_consistent_with_spec():
    assert len({s.code for s in st.ALL}) == len(st.ALL)
    assert len({s.text for s in st.ALL}) == len(st.ALL)
    spec = {0: 200, 68: 200, 50: 400, 3: 400, 66: 422, 60: 415, 61: 413, 67: 413, 62: 405, 63: 404, 65: 503,
            4: 504, 6: 500, 401: 401, 429: 429}
    for code, http in spec.items():
        assert st.BY_CODE[code].http == http
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
    code, body = result_envelope(task_id="t1", model=MODEL, items=[OK, BAD], server_time_ms=1.23456)
    assert code == 200
    assert list(body) == ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial"]
    assert body["results"] == [{"status": 0, "data": {"x": 1}}, {"status": 5, "data": None, "error": "bad"}]
    assert body["model"] == {"name": "M", "version": "v1"}
    assert body["server_time_ms"] == 1.235


def test_timeout_envelope_is_504():
    code, body = result_envelope(task_id="t", model=MODEL, items=[TIMED_OUT], server_time_ms=5)
    assert (code, body["status"], body["status_str"], body["partial"]) == (504, 4, "RUN_TIMEOUT", False)
    assert body["results"][0]["data"] is None


def test_rejection_has_empty_results_and_errors_only_when_given():
    body = rejection(st.NOT_FOUND, "nope", task_id="t", model=MODEL)
    assert body["results"] == [] and "errors" not in body and body["error"] == "nope"
    body = rejection(st.INVALID_REQUEST, "bad", task_id="t", model=MODEL, errors=[FieldError("/a", "m")])
    assert body["errors"] == [{"pointer": "/a", "message": "m"}]


def test_json_pointer_escaping():
    assert pointer("params", "a/b", "c~d", 0) == "/params/a~1b/c~0d/0"
