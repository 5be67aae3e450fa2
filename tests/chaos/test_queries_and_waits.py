"""Hostile query strings and a model server killed under a parked wait, on real processes.

Each test's docstring is the promise it checks (docs/operations.md, "What survives what").
"""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest

from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.http import Reply, get, post
from tests.support.images import image_b64
from tests.support.processes import free_port, start_model_server, write_config
from tests.support.stack import build_stack, stop_stack

GATEWAY_AUTH = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}"}
UPSTREAM_TOKEN = "chaos-upstream-token"
#: ?timeout= values, as sent on the wire, that answered 500 at the model server, or 200 with a space taken away.
MODEL_BAD_TIMEOUTS = ["%B2", "%B9", "1" * 5000, "%201", "+5"]
#: The same through the gateway, where a decoded byte put back into the upstream URL also gave 502 "Invalid URI".
GATEWAY_BAD_TIMEOUTS = [*MODEL_BAD_TIMEOUTS, "%C2%B2", "%D9%A3"]


def start_pair(root) -> tuple:
    """TESTFAULTS with jobs on (one worker) and a gateway in front of it."""
    servers = root / "server"
    servers.mkdir()
    # Room for every job a module submits: on a loaded machine the nice'd worker may run none of them for a
    # while, and a full queue (429) is not what these tests are about.
    config = write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=free_port(), async_enabled=True,
                          max_batch_size=1, async_max_queue=32)
    port = int(re.search(r"^port = (\d+)", config.read_text(), re.M).group(1))
    model = start_model_server(config, token=UPSTREAM_TOKEN, port=port)
    try:
        gateway = start_gateway(root, servers, None, env={"SERVICE_UPSTREAM_TOKEN": UPSTREAM_TOKEN})
    except Exception:
        model.stop()
        raise
    return model, gateway


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    model, gateway = start_pair(tmp_path_factory.mktemp("queries"))
    yield model, gateway
    gateway.stop()
    model.stop()


def submit(gateway) -> str:
    reply = post(gateway.url + "/v1/models/TESTFAULTS/jobs", {"images": [image_b64()]}, headers=GATEWAY_AUTH)
    assert reply.status == 202, reply.body
    return reply.json["job_id"]


def assert_timeout_422(reply: Reply) -> None:
    assert reply.status == 422, reply.body
    assert reply.header("Content-Type") == "application/json; charset=utf-8"
    body = reply.json
    assert body["status"] == 66 and body["status_str"] and body["results"] == []
    assert body["model"]["name"] == "TESTFAULTS"
    assert [e["pointer"] for e in body["errors"]] == ["/timeout"]
    assert "timeout must be a whole number of milliseconds" in body["error"]


@pytest.mark.parametrize("value", MODEL_BAD_TIMEOUTS)
def test_a_bad_wait_timeout_is_422_at_the_model_server(pair, value):
    """A wait whose ?timeout= is not 1 to 18 ASCII digits (a Latin-1 superscript, 5000 digits, a sign, a
    space) answers 422 status 66 with pointer /timeout at the model server: never 500."""
    model, gateway = pair
    job_id = submit(gateway)
    assert_timeout_422(get(f"{model.url}/jobs/{job_id}/wait?timeout={value}", headers=model.auth))


@pytest.mark.parametrize("value", GATEWAY_BAD_TIMEOUTS)
def test_a_bad_wait_timeout_is_the_models_422_through_the_gateway(pair, value):
    """Through the gateway the same query gets the model server's own 422 (re-encoded upstream), never a
    500 or a 502 "Invalid URI" for the client's mistake; the gateway stays up."""
    model, gateway = pair
    job_id = submit(gateway)
    reply = get(f"{gateway.url}/v1/models/TESTFAULTS/jobs/{job_id}/wait?timeout={value}", headers=GATEWAY_AUTH)
    assert_timeout_422(reply)
    assert reply.header("X-Service-Key") == "static-token"
    assert get(f"{gateway.url}/v1/models/TESTFAULTS/jobs/{job_id}/wait?timeout=5000",
               headers=GATEWAY_AUTH).json["state"] == "done"


@pytest.mark.parametrize("value", ["%B2", "%C2%B2", "1" * 5000])
def test_an_unknown_job_is_404_before_its_bad_timeout(pair, value):
    """An unknown job id answers 404 status 63 "job not found" even with a bad ?timeout=, at the model server
    and through the gateway alike."""
    model, gateway = pair
    for url, headers in ((f"{model.url}/jobs/job_nope/wait", model.auth),
                         (f"{gateway.url}/v1/models/TESTFAULTS/jobs/job_nope/wait", GATEWAY_AUTH)):
        reply = get(f"{url}?timeout={value}", headers=headers)
        assert reply.status == 404 and reply.json["status"] == 63, reply.body
        assert "job not found" in reply.json["error"]


def test_good_waits_still_work_and_repeated_keys_take_the_first(pair):
    """Valid budgets are unchanged (0 answers at once, huge ones are clamped); of repeated keys the first
    counts, at the gateway and at the model server alike."""
    model, gateway = pair
    job_id = submit(gateway)
    base = f"{gateway.url}/v1/models/TESTFAULTS/jobs/{job_id}/wait"
    assert get(base + "?timeout=5000&timeout=%B2", headers=GATEWAY_AUTH).json["state"] == "done"
    assert_timeout_422(get(base + "?timeout=%B2&timeout=5000", headers=GATEWAY_AUTH))
    assert get(f"{model.url}/jobs/{job_id}/wait?timeout=999999999999999999", headers=model.auth).status == 200
    assert get(base + "?timeout=0", headers=GATEWAY_AUTH).json["state"] == "done"


def test_supervisor_logs_refuse_bad_numbers_with_400(tmp_path):
    """GET /api/v1/servers/{id}/logs with an offset or limit that is not 1 to 18 ASCII digits in range answers
    400 {ok: false, error} naming the argument: never 500."""
    stack = build_stack(tmp_path, {})
    try:
        stack.wait_for("__gateway", lambda c: c["state"] == "running")
        base = stack.url + "/api/v1/servers/__gateway/logs"
        for query, name in (("offset=%B2", "offset"), ("limit=%B9", "limit"), ("offset=" + "9" * 5000, "offset"),
                            ("limit=%C2%B2", "limit"), ("offset=%D9%A3", "offset")):
            reply = get(f"{base}?{query}", headers=stack.auth)
            assert reply.status == 400, (query, reply.body)
            assert reply.header("Content-Type") == "application/json; charset=utf-8"
            assert reply.json["ok"] is False and reply.json["error"].startswith(f"{name} must be an integer")
        page = get(base + "?offset=0&limit=2", headers=stack.auth)
        assert page.status == 200 and page.json["ok"] is True and len(page.json["lines"]) <= 2
    finally:
        code, survivors = stop_stack(stack)
    assert code == 0 and survivors == []


def test_a_wait_parked_at_the_gateway_gets_502_when_its_model_server_is_killed(tmp_path):
    """A client parked in /wait at the gateway whose model server dies (SIGKILL) gets 502 status 502 in the
    gateway's envelope at once (the connection was established, then lost), not 503 and not a hang; only a
    model server that refuses connections is 503.  What is lost: the job (jobs live in memory)."""
    model, gateway = start_pair(tmp_path)
    try:
        reply = post(gateway.url + "/v1/models/TESTFAULTS/jobs", {"images": [image_b64()], "params": {"sleep_ms": 30000}},
                     headers=GATEWAY_AUTH)
        assert reply.status == 202
        job_id = reply.json["job_id"]
        answered: dict[str, Reply] = {}
        waiter = threading.Thread(target=lambda: answered.setdefault("wait", get(
            f"{gateway.url}/v1/models/TESTFAULTS/jobs/{job_id}/wait?timeout=60000", headers={
                **GATEWAY_AUTH, "X-Request-ID": "parked-1"}, timeout=90)))
        waiter.start()
        deadline = time.monotonic() + 30
        while waiting(model) < 1:
            assert time.monotonic() < deadline, "the wait never reached the model server"
            time.sleep(0.05)
        killed_at = time.monotonic()
        model.stop(signal.SIGKILL)
        waiter.join(30)
        assert not waiter.is_alive(), "the parked wait was not answered"
        assert time.monotonic() - killed_at < 10
        parked = answered["wait"]
        assert parked.status == 502, parked.body
        assert parked.header("Content-Type") == "application/json; charset=utf-8"
        assert parked.header("X-Request-ID") == "parked-1" and parked.header("X-Service-Key") == "static-token"
        body = parked.json
        assert body["status"] == 502 and body["model"]["name"] == "gateway" and body["results"] == []
        assert body["task_id"] == "parked-1" and "model server TESTFAULTS" in body["error"]
        after = get(f"{gateway.url}/v1/models/TESTFAULTS/jobs/{job_id}", headers=GATEWAY_AUTH)
        assert after.status == 503 and after.json["status"] == 65 and "not running" in after.json["error"]
        metrics = get(gateway.url + "/metrics",
                      headers={"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_METRICS_TOKEN']}"}).body.decode()
        assert 'service_gateway_upstream_errors_total{kind="transport",model="TESTFAULTS",replica="0"} 1.0' in metrics
        assert 'service_gateway_upstream_errors_total{kind="unreachable",model="TESTFAULTS",replica="0"} 1.0' in metrics
    finally:
        gateway.stop()
        model.stop(signal.SIGKILL)


def waiting(model) -> float:
    """The model server's count of parked waits (its metrics)."""
    text = get(model.url + "/metrics", headers=model.auth).body.decode()
    found = re.search(r"^service_async_waiters (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0
