"""kill -9 and SIGSTOP of a model server under load, through a real stack.

The stack is a real supervisor with its gateway and the test-only TESTFAULTS
model (real torch, a slow forward pass on request) and MOBILENETV2.  Client
threads keep sending requests through the gateway while a fault is done to a
model server; every reply the clients see is recorded and checked against the
promise of docs/operations.md, "What survives what".
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.clients import RequestLoad
from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.processes import wait_until
from tests.support.stack import build_stack, stop_stack

MODELS = {"TESTFAULTS": {"max_batch_size": 4}, "MOBILENETV2": {}}
RECV_TIMEOUT_MS = 2000


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = build_stack(tmp_path_factory.mktemp("chaos-kills"), MODELS,
                    gateway_extra=f"upstream_recv_timeout_ms = {RECV_TIMEOUT_MS}\n")
    for name in ("__gateway", *MODELS):
        s.wait_for(name, lambda c: c["state"] == "running" and c["ready"])
    yield s
    code, survivors = stop_stack(s)
    assert code == 0, s.supervisor.output()[-3000:]
    assert survivors == [], f"children left behind: {survivors}"


def infer(stack, model: str, params: dict | None = None, timeout: float = 30.0):
    body = {"images": [image_b64(width=16, height=16)], "params": params or {}}
    return post(f"{stack.gateway}/v1/models/{model}/infer", body,
                headers={"Authorization": f"Bearer {stack.key}"}, timeout=timeout)


def test_kill9_of_a_model_server_under_load(stack):
    """Promise: kill -9 of a model server under load costs only the requests it held (502 status 502) and the
    requests sent while it is down (503 status 65); the gateway keeps answering, the supervisor restarts the
    model, and new requests succeed again; no client ever sees a 500 or a hung request."""
    before = stack.child("TESTFAULTS")
    load = RequestLoad(lambda: infer(stack, "TESTFAULTS", {"sleep_ms": 100}), clients=6, limit_s=60.0, join_s=40.0)
    try:
        wait_until(lambda: load.codes()[(200, 0)] >= 12, "requests answered before the kill", timeout=60)
        os.kill(before["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        after = stack.wait_for("TESTFAULTS", lambda c: c["state"] == "running" and c["ready"]
                               and c["pid"] != before["pid"], timeout=60)
        recovered_at = time.monotonic()
        wait_until(lambda: load.codes(answered_after=recovered_at + 0.5)[(200, 0)] >= 12,
                   "requests answered after the restart", timeout=60)
        assert get(stack.gateway + "/healthz").status == 200
    finally:
        load.stop()
    codes = load.codes()
    assert set(codes) <= {(200, 0), (502, 502), (503, 65)}, codes
    assert load.errors == [], load.errors[:5]
    assert codes[(502, 502)] + codes[(503, 65)] > 0, codes  # the kill was seen
    late = load.codes(answered_after=recovered_at + 0.5)
    assert late[(200, 0)] > 0
    assert set(late) == {(200, 0)}, late
    assert after["restarts"] == before["restarts"] + 1
    assert after["last_exit"] == "killed by signal 9"
    assert recovered_at - killed_at < 30


def test_sigstop_of_a_model_server_past_the_receive_timeout(stack):
    """Promise: a model server that stops answering (SIGSTOP) costs its own requests a 502 status 502 after the
    gateway's upstream_recv_timeout_ms, never a hang; the gateway and the other models keep serving; once it
    runs again (SIGCONT) it serves again, with no restart."""
    before = stack.child("TESTFAULTS")
    os.kill(before["pid"], signal.SIGSTOP)
    try:
        started = time.monotonic()
        reply = infer(stack, "TESTFAULTS")
        took = time.monotonic() - started
        assert reply.status == 502, reply.body
        assert reply.json["status"] == 502 and reply.json["model"]["name"] == "gateway"
        assert "model server TESTFAULTS" in reply.json["error"]
        assert RECV_TIMEOUT_MS / 1000 - 0.1 <= took < RECV_TIMEOUT_MS / 1000 + 5
        other = infer(stack, "MOBILENETV2")
        assert other.status == 200 and other.json["status"] == 0
        assert get(stack.gateway + "/healthz").status == 200
        stack.wait_for("TESTFAULTS", lambda c: c["ready"] is False, timeout=30)
    finally:
        os.kill(before["pid"], signal.SIGCONT)
    after = stack.wait_for("TESTFAULTS", lambda c: c["ready"] is True, timeout=30)
    assert after["pid"] == before["pid"] and after["restarts"] == before["restarts"]
    reply = infer(stack, "TESTFAULTS")
    assert reply.status == 200 and reply.json["status"] == 0
