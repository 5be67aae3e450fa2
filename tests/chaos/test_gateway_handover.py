"""Restarting the gateway refuses no connection (the supervisor hands its
listening socket from the old gateway process to the new one).

Promises checked, under 32 concurrent clients on the gateway's ``/healthz``
(24 with a fresh connection per request, 8 with a kept-alive one; each waits
``PAUSE_S`` after an answer, so that over a thousand requests a second, not
every cycle of both cores, arrive while a socket changes hands):

* ten ``POST /api/v1/servers/__gateway/restart`` in a row: zero connection
  errors, zero 5xx, each restart 200, a new pid each time, ``restarts`` + 1,
  one ``__gateway`` entry, every old process gone, and a key added to the key
  file before each restart authenticates after it;
* a new gateway that refuses to start (a bad ``[gateway]`` table): the restart
  answers 500 ``{ok: false, error}`` naming the refusal, the old process keeps
  serving the clients without an error;
* kill -9 of the gateway: the supervisor respawns it on the same socket and
  the connections made meanwhile wait in the backlog instead of being refused;
* requests in flight at a restart (a slow model) finish on the old process,
  which exits after them.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.support.clients import ClientLoops
from tests.support.http import post, request
from tests.support.images import image_b64
from tests.support.processes import wait_until
from tests.support.stack import build_stack, key_entry, stop_stack

RESTARTS = 10
PAUSE_S = 0.02


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """One stack for the module (each test leaves its gateway running and checks against what it found)."""
    s = build_stack(tmp_path_factory.mktemp("handover"), {"TESTFAULTS": {}})
    for name in ("__gateway", "TESTFAULTS"):
        s.wait_for(name, lambda c: c["state"] == "running" and c["ready"], timeout=120)
    yield s
    code, survivors = stop_stack(s)
    assert code == 0, s.supervisor.output()[-3000:]
    assert survivors == [], f"children left behind: {survivors}"


def restart(stack):
    return request("POST", stack.url + "/api/v1/servers/__gateway/restart", headers=stack.auth, timeout=120)


def authenticates(stack, key: str) -> bool:
    """A POST to an unknown model: 404 once authenticated, 401 before routing otherwise."""
    status = post(stack.gateway + "/v1/models/NO_SUCH_MODEL/infer", {},
                  headers={"Authorization": f"Bearer {key}"}).status
    assert status in (401, 404), status
    return status == 404


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def loaded(stack, seconds=1.0):
    """32 clients on /healthz, after they have completed some requests."""
    clients = ClientLoops(stack.gateway_port, "/healthz", fresh=24, kept=8, max_requests=20_000,
                          pause_s=PAUSE_S).start()
    deadline = time.monotonic() + 30
    while clients.snapshot()[0] < 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(seconds)
    return clients


def report(outcomes) -> str:
    return (f"{outcomes.requests} requests, statuses {outcomes.statuses}, {len(outcomes.errors)} errors "
            f"(first: {outcomes.errors[:5]}), {outcomes.stale_retries} stale keep-alive retries")


def test_ten_restarts_under_load_refuse_no_connection_and_reload_the_keys(stack):
    first = stack.child("__gateway")
    pids = [first["pid"]]
    clients = loaded(stack)
    try:
        for i in range(RESTARTS):
            key = os.urandom(32).hex()
            stack.keys_file.write_text(stack.keys_file.read_text() + "\n" + key_entry(f"tenant-r{i}", key))
            assert not authenticates(stack, key)  # no hot reload
            reply = restart(stack)
            assert (reply.status, reply.json) == (200, {"ok": True}), reply.body
            gateway = stack.child("__gateway")
            assert gateway["state"] == "running" and gateway["pid"] not in pids
            assert gateway["restarts"] == first["restarts"] + i + 1
            assert authenticates(stack, key)
            pids.append(gateway["pid"])
            time.sleep(0.3)
    finally:
        outcomes = clients.stop()
    assert outcomes.errors == [] and outcomes.server_errors == 0, report(outcomes)
    assert set(outcomes.statuses) == {200}, report(outcomes)
    assert outcomes.requests >= 100, report(outcomes)
    assert [server["id"] for server in stack.status()["servers"]] == ["TESTFAULTS"]  # the gateway is not one
    assert stack.child("__gateway")["pid"] == pids[-1]
    assert wait_gone(pids[:-1]) == [], "previous gateway processes still running"
    log_text = "".join(p.read_text(errors="replace") for p in (stack.root / "logs").glob("__gateway.log*"))
    notes = [line for line in log_text.splitlines() if "[supervisor] handover: pid" in line]
    assert len(notes) == RESTARTS and all("accepts; SIGTERM to the previous pid" in n for n in notes), notes
    print(report(outcomes))


def test_a_new_gateway_that_refuses_to_start_leaves_the_old_one_serving(stack):
    before = stack.child("__gateway")
    config = stack.root / "service.toml"
    good = config.read_text()
    config.write_text(good.replace("[gateway]\n", "[gateway]\nno_such_key = 1\n", 1))
    clients = loaded(stack, seconds=0.5)
    try:
        reply = restart(stack)
        assert reply.status == 500 and reply.json["ok"] is False, reply.body
        assert "exited before it was ready" in reply.json["error"] and "no_such_key" in reply.json["error"]
        assert "still serves" in reply.json["error"]
        time.sleep(0.5)
    finally:
        outcomes = clients.stop()
    assert outcomes.errors == [] and outcomes.server_errors == 0, report(outcomes)
    after = stack.child("__gateway")
    assert (after["state"], after["pid"], after["restarts"]) == ("running", before["pid"], before["restarts"])
    assert "no_such_key" in after["last_error"]
    config.write_text(good)
    assert restart(stack).status == 200
    assert stack.child("__gateway")["pid"] != before["pid"]


def test_sigkilled_gateway_is_respawned_on_the_same_socket_and_connections_wait(stack):
    before = stack.child("__gateway")
    clients = loaded(stack, seconds=0.5)
    try:
        os.kill(before["pid"], signal.SIGKILL)
        after = stack.wait_for("__gateway", lambda c: c["state"] == "running" and c["ready"]
                               and c["pid"] not in (None, before["pid"]), timeout=60)
        time.sleep(0.5)
    finally:
        outcomes = clients.stop()
    assert after["restarts"] == before["restarts"] + 1 and after["last_exit"] == "killed by signal 9"
    # The requests the killed process held die with it (a reset); no new connection is refused.
    refused = [e for e in outcomes.errors if "ConnectionRefused" in e]
    assert refused == [], report(outcomes)
    assert len(outcomes.errors) <= 32, report(outcomes)
    assert outcomes.server_errors == 0, report(outcomes)


def test_requests_in_flight_at_a_restart_finish_on_the_old_gateway(stack):
    old = stack.child("__gateway")["pid"]
    statuses: list = []

    def slow() -> None:
        try:
            statuses.append(post(stack.gateway + "/v1/models/TESTFAULTS/infer",
                                 {"images": [image_b64()], "params": {"sleep_ms": 3000}},
                                 headers={"Authorization": f"Bearer {stack.key}"}, timeout=60).status)
        except OSError as e:
            statuses.append(repr(e))

    parsed = stack.model_metric("TESTFAULTS", 'service_stage_duration_ms_count{stage="parse"}')
    threads = [threading.Thread(target=slow) for _ in range(4)]
    for t in threads:
        t.start()
    # The four requests are held by the old gateway: it forwarded each, and the model server parsed it.
    wait_until(lambda: stack.model_metric("TESTFAULTS", 'service_stage_duration_ms_count{stage="parse"}')
               >= parsed + 4, "the four requests reached the model server", timeout=30)
    assert restart(stack).status == 200
    assert alive(old)  # still finishing its requests
    for t in threads:
        t.join(60)
    assert statuses == [200] * 4
    assert wait_gone([old]) == []
