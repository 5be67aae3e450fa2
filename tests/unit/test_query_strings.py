"""Hostile query strings, in memory: the model server's wait, the gateway in front of it, the supervisor's logs.

Hypothesis writes any query (text, percent-encoded bytes, numbers of
thousands of digits, repeated and odd keys); each route must give the
documented answer for it, computed here from the query by the rules of
svc.contract.query, and never a 5xx.  The apps are the real Klein apps behind
StubTreq; the gateway forwards to the real model-server routes through a
RequestTraversalAgent, so the re-encoded upstream query is checked too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qsl, quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from treq.testing import RequestTraversalAgent, StubTreq
from twisted.internet.task import Clock

from svc.contract.query import MAX_DIGITS, WAIT_MAX_MS, parse_bounded_int, shown, wait_budget_ms
from svc.gateway.catalog import Upstream
from svc.infra.metrics import ModelServerMetrics, new_registry
from svc.modelserver.app import ModelServerApp
from svc.supervisor.api import LOG_LIMIT_DEFAULT, LOG_LIMIT_MAX, ManagementApi
from svc.supervisor.logsink import LogSink
from tests.unit.test_gateway_app import KEY, Harness
from tests.unit.test_jobs import request as job_request
from tests.unit.test_jobs import table

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

REPO = Path(__file__).resolve().parents[2]
NUMBER = re.compile(rb"[0-9]{1,%d}" % MAX_DIGITS)  # the oracle: written out again, not imported
MODEL_ID = "TESTFAULTS"
MGMT_TOKEN = "mgmt-token"
PROPERTY = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# -- the parser ------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, expected", [
    (b"0", 0), (b"000123", 123), (b"9" * MAX_DIGITS, 10**MAX_DIGITS - 1), ("42", 42),
    (b"", None), (b"\xb2", None), (b"\xb9", None), ("²", None), ("٣", None), (b"\xd9\xa3", None),
    (b"1" * (MAX_DIGITS + 1), None), (b"1" * 5000, None), (b" 1", None), (b"1 ", None), (b"1\n", None),
    (b"+1", None), (b"-1", None), (b"1_000", None), (b"1.5", None), (b"0x10", None), ("１", None),
])
def test_only_ascii_digits_of_bounded_length_are_numbers(raw, expected):
    assert parse_bounded_int(raw) == expected


def test_bounds_refuse_or_clamp():
    assert parse_bounded_int(b"5", minimum=1, maximum=10) == 5
    assert parse_bounded_int(b"0", minimum=1, maximum=10) is None
    assert parse_bounded_int(b"11", minimum=1, maximum=10) is None
    assert parse_bounded_int(b"11", minimum=1, maximum=10, clamp=True) == 10
    assert parse_bounded_int(b"0", minimum=1, maximum=10, clamp=True) is None
    assert wait_budget_ms(None) == 30000 and wait_budget_ms(b"0") == 0
    assert wait_budget_ms(b"999999999") == WAIT_MAX_MS and wait_budget_ms(b"\xb2") is None


@PROPERTY
@given(hs.one_of(hs.binary(max_size=40), hs.text(max_size=40), hs.text("0123456789", min_size=1, max_size=6000)))
def test_the_parser_never_raises_and_agrees_with_the_oracle(raw):
    data = raw.encode("latin-1", "replace") if isinstance(raw, str) else raw
    expected = int(data) if NUMBER.fullmatch(data) else None
    assert parse_bounded_int(raw) == expected


@pytest.mark.parametrize("raw, text", [(b"\xef\xbc\x91", "'１'"), (b"12x", "'12x'"), (b"\xe9", "'\\xe9'"),
                                       (b"\xb2\xff1", "'\\xb2\\xff1'"), (b"a\\udcb2", "'a\\\\udcb2'"),
                                       (b"\\\xb2", "'\\\\\\xb2'"),
                                       ("abc", "'abc'"), (b"\n" + b"9" * 60, "'\\n" + "9" * 39 + "'")])
def test_a_value_in_an_error_message_is_its_text(raw, text):
    """A fullwidth digit was echoed as mojibake ('ï¼\\x91'): the value is read as the UTF-8 a client sent. A byte that
    is no UTF-8 shows as repr shows a byte (it showed as '\\\\xb2', its backslash escaped twice: a docs probe), and
    a backslash the client sent stays escaped."""
    assert shown(raw) == text


# -- query strings -----------------------------------------------------------------------------------


def encoded(data: bytes) -> str:
    return quote(data, safe="")


values = hs.one_of(
    hs.text(max_size=30).map(lambda t: encoded(t.encode("utf-8"))),  # arbitrary text
    hs.binary(max_size=12).map(lambda b: "".join(f"%{x:02X}" for x in b)),  # every byte percent-encoded
    hs.text("0123456789", min_size=1, max_size=5000),  # small to huge numbers
    hs.integers(min_value=0, max_value=10**20).map(str),
    hs.sampled_from(["%B2", "%B9", "%C2%B2", "%D9%A3", "%EF%BC%91", "-1", "+1", "1.5", "1_000", "%201", "1e3", ""]),
    # A ';' is part of the value (twisted's request.args split there: "500;" was read as 500; a jobs probe)
    hs.sampled_from(["500;", "5;timeout=abc", "5;offset=1", ";5"]),
)


def query_strings(*names: str) -> hs.SearchStrategy[str]:
    """A query of 0 to 4 parts: the route's own keys (often repeated), other keys, bare words."""
    part = hs.one_of(
        hs.builds(lambda k, v: f"{k}={v}", hs.sampled_from(names), values),
        hs.builds(lambda k, v: f"{k}={v}", hs.sampled_from(["x", names[0].upper(), names[0] + "%00", ""]), values),
        hs.sampled_from(names + ("", "=", "&")),
    )
    return hs.lists(part, max_size=4).map("&".join)


def first(query: str, name: bytes) -> bytes | None:
    """The documented reading of a query, by the standard library's form decoding: pairs split at ``&`` only (a
    ``;`` is part of a value), a name without ``=`` an empty value, the first of repeated names."""
    pairs = parse_qsl(query, keep_blank_values=True, separator="&", encoding="latin-1")
    return next((v.encode("latin-1") for k, v in pairs if k.encode("latin-1") == name), None)


def settle(client: StubTreq, d, *agents) -> tuple[int, dict, dict]:
    for _ in range(5):
        for agent in agents:
            agent.flush()
        client.flush()
    box: list = []
    d.addBoth(box.append)
    assert box, "the request did not finish"
    response = box[0]
    body: list = []
    client.content(response).addBoth(body.append)
    client.flush()
    headers = {k.decode().lower(): v[0].decode() for k, v in response.headers.getAllRawHeaders()}
    assert headers["content-type"] == "application/json; charset=utf-8"
    return response.code, headers, json.loads(body[0])


class ModelServer:
    """The model server's app with its real job routes, one done job, in memory."""

    def __init__(self) -> None:
        self.clock = Clock()
        config = SimpleNamespace(id=MODEL_ID, server_uri="/testfaults/predict", rate_limit_qps=0.0,
                                 max_body_bytes=1 << 20)
        self.server = ModelServerApp(clock=self.clock, config=config, inference=SimpleNamespace(parse=None),
                                     metrics=ModelServerMetrics(new_registry(), config.id), registry=None, auth_token=None, openapi={})
        self.server.set_ready("v1")
        self.jobs, run, _ = table(self.clock)
        self.server.enable_jobs(self.jobs)
        self.job = self.jobs.submit(job_request("r-1"))
        self.clock.advance(0)  # the run starts on the next reactor turn
        run.start()
        run.finish()
        assert self.job.state == "done"


def expected_wait(query: str, known: bool, recv_timeout_ms: int | None = None) -> int:
    """The documented status of a wait with ``query`` (recv_timeout_ms: through a gateway with it)."""
    raw = first(query, b"timeout")
    valid = raw is None or NUMBER.fullmatch(raw) is not None
    budget = 30000 if raw is None else min(int(raw), WAIT_MAX_MS) if valid else None
    if recv_timeout_ms is not None and budget is not None and budget >= recv_timeout_ms:
        return 502  # the gateway's documented refusal, before forwarding
    if not known:
        return 404  # the model looks the job up first
    return 200 if valid else 422


def check_wait_reply(code: int, body: dict, expected: int, model_name: str) -> None:
    assert code == expected, body
    assert body["model"]["name"] == model_name
    if code == 200:
        assert body["state"] == "done"
    elif code == 404:
        assert body["status"] == 63 and "job not found" in body["error"]
    elif code == 422:
        assert body["status"] == 66 and [e["pointer"] for e in body["errors"]] == ["/timeout"]
        assert body["results"] == [] and body["error"].startswith("timeout must be a whole number")


@pytest.fixture
def model_server():
    """Built once per test: the wait never changes the done job."""
    return ModelServer()


@PROPERTY
@given(query=query_strings("timeout"), known=hs.booleans())
def test_any_wait_query_at_the_model_server_is_200_404_or_422(model_server, query, known):
    model = model_server
    client = StubTreq(model.server.resource())
    job_id = model.job.id if known else "job_nope"
    code, headers, body = settle(client, client.get(f"http://model/jobs/{job_id}/wait?{query}"))
    check_wait_reply(code, body, expected_wait(query, known), MODEL_ID)


def gateway_over_model(tmp_path: Path, recv_timeout_ms: int) -> tuple[ModelServer, Harness]:
    """The gateway's routes (test_gateway_app's harness) in front of the in-memory model server."""
    model = ModelServer()
    agent = RequestTraversalAgent(model.server.resource())
    gw = Harness(tmp_path, agent=agent, upstreams=[Upstream(MODEL_ID, 9001, "/testfaults/predict", True, None)],
                 recv_timeout_ms=recv_timeout_ms)
    return model, gw


def gateway_wait(model: ModelServer, gw: Harness, query: str, known: bool) -> tuple[str, int, dict, dict]:
    job_id = model.job.id if known else "job_nope"
    d = gw.client.get(f"http://gateway/v1/models/{MODEL_ID}/jobs/{job_id}/wait?{query}",
                      headers={"Authorization": f"Bearer {KEY}"})
    return (job_id, *settle(gw.client, d, gw.upstream_agent))


@pytest.fixture
def wide_gateway(tmp_path):
    """A receive timeout above every budget: the gateway forwards every wait (built once per test)."""
    return gateway_over_model(tmp_path, WAIT_MAX_MS + 1)


@pytest.fixture
def narrow_gateway(tmp_path):
    """The usual receive timeout, below 300000 ms (built once per test)."""
    return gateway_over_model(tmp_path, 20000)


@PROPERTY
@given(query=query_strings("timeout"), known=hs.booleans())
def test_any_wait_query_at_the_gateway_is_the_models_answer(wide_gateway, query, known):
    """The gateway forwards every wait and passes the model's answer: 200, 404 or 422, never a 5xx."""
    model, gw = wide_gateway
    job_id, code, headers, body = gateway_wait(model, gw, query, known)
    check_wait_reply(code, body, expected_wait(query, known), MODEL_ID)
    assert headers["x-service-key"] == "tenant-a"
    if code == 200:
        assert body["poll_url"] == f"/v1/models/{MODEL_ID}/jobs/{job_id}"


@PROPERTY
@given(query=query_strings("timeout"), known=hs.booleans())
def test_the_gateways_own_502_still_comes_first_for_long_budgets(narrow_gateway, query, known):
    """With the usual receive timeout (below 300000 ms), a valid budget at or above it is the gateway's 502."""
    model, gw = narrow_gateway
    job_id, code, headers, body = gateway_wait(model, gw, query, known)
    expected = expected_wait(query, known, recv_timeout_ms=20000)
    if expected == 502:
        assert code == 502 and body["status"] == 502 and body["model"]["name"] == "gateway", body
        assert "upstream_recv_timeout_ms" in body["error"]
    else:
        check_wait_reply(code, body, expected, MODEL_ID)


class Manager:
    """What the logs route needs of the child manager: children with a log sink."""

    def __init__(self, tmp_path: Path) -> None:
        sink = LogSink("M", str(tmp_path), clock=Clock(), max_bytes=1 << 20, backups=1, ring_lines=50)
        sink.feed("stdout", b"".join(b"line %d\n" % i for i in range(30)))
        self.children = {"M": SimpleNamespace(logs=sink)}

    def process(self, name: str, replica: int | None = None):
        return self.children[name]


@pytest.fixture
def supervisor(tmp_path):
    """The management API in memory, over one child with 30 log lines (built once per test)."""
    api = ManagementApi(manager=Manager(tmp_path), token=MGMT_TOKEN, registry=None, metrics=None,
                        ui_dir=str(REPO / "ui"))
    return StubTreq(api.resource())


@PROPERTY
@given(query=query_strings("offset", "limit"))
def test_any_logs_query_at_the_supervisor_is_200_or_400(supervisor, query):
    client = supervisor
    code, headers, body = settle(client, client.get(f"http://supervisor/api/v1/servers/M/logs?{query}",
                                                    headers={"Authorization": f"Bearer {MGMT_TOKEN}"}))
    offset, limit = first(query, b"offset"), first(query, b"limit")
    offset_ok = offset is None or NUMBER.fullmatch(offset) is not None
    limit_ok = limit is None or (NUMBER.fullmatch(limit) is not None and 1 <= int(limit) <= LOG_LIMIT_MAX)
    if offset_ok and limit_ok:
        assert code == 200 and body["ok"] is True and body["id"] == "M", body
        want = LOG_LIMIT_DEFAULT if limit is None else int(limit)
        assert len(body["lines"]) <= want
        if offset is not None and body["lines"]:
            assert body["lines"][0]["seq"] == max(int(offset), body["first_offset"])
    else:
        name = "offset" if not offset_ok else "limit"
        assert code == 400 and body["ok"] is False, body
        assert body["error"].startswith(f"{name} must be an integer"), body
