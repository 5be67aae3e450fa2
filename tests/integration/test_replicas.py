"""A model at two replicas behind one gateway, all started by a real supervisor.

Real processes and real torch: the supervisor spawns the gateway and two
model servers of the test model TESTFAULTS (tests/plugins/models/testfaults.py,
jobs on), each on its own port with its own token, log file and CPU; clients
send real requests through the gateway while a replica is killed or the model
is restarted.  The load's requests ask the model to take ``LOAD_SLEEP_MS`` in
its forward pass, so that requests are in flight at every kill and restart
without the clients spending the suite's CPU (what is checked is the replica
machinery, the same for every model).
Promises checked (docs/scaling.md, "Replicas on one host"): both replicas serve; a
kill -9 of one under load costs only the requests it held, and the survivor
takes every new request; jobs come back to their replica; a rolling restart
loses no synchronous request.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter

import pytest

from svc.contract import jobid
from tests.support.clients import RequestLoad
from tests.support.http import get, post, request
from tests.support.images import image_b64
from tests.support.processes import wait_until
from tests.support.stack import build_stack, stop_stack

MODEL = "TESTFAULTS"
LOAD_SLEEP_MS = 20
PROBE_INTERVAL_S = 0.5
CLIENTS = 4
JOBS = 16


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    cpus = sorted(os.sched_getaffinity(0))
    pinning = f"cpus = [[{cpus[0]}], [{cpus[-1]}]]\n"  # one CPU each (the same one on a 1-CPU machine)
    # Room for every job of test_jobs_come_back_to_their_replica on either replica: jobs are spread at
    # random (nothing outstanding at each submission), so one replica may get more than the shipped 8.
    models = {MODEL: {"async_enabled": True, "async_max_queue": JOBS}}
    s = build_stack(tmp_path_factory.mktemp("replicas"), models, replicas={MODEL: 2},
                    server_extra={MODEL: pinning},
                    gateway_extra=f"replica_probe_interval_ms = {int(PROBE_INTERVAL_S * 1000)}\n")
    wait_ready(s)
    wait_until(lambda: gateway_sees_both_ready(s), "the gateway's own probe saw both replicas ready", timeout=30)
    yield s
    code, survivors = stop_stack(s)
    assert code == 0, s.supervisor.output()[-3000:]
    assert survivors == [], f"children left behind: {survivors}"


def gateway_sees_both_ready(stack) -> bool:
    """The gateway's probe (svc.gateway.readiness) logs each change: no replica's last word is "not ready"."""
    text = "".join(p.read_text(errors="replace") for p in sorted((stack.root / "logs").glob("__gateway.log*")))
    for index in range(2):
        said = [line for line in text.splitlines() if f"{MODEL} replica {index} (port" in line]
        if said and "not ready" in said[-1]:
            return False
    return True


def replicas(stack) -> list[dict]:
    return stack.child(MODEL)["replicas"]


def wait_ready(stack, timeout: float = 240.0) -> list[dict]:
    stack.wait_for("__gateway", lambda c: c["state"] == "running" and c["ready"], timeout=timeout)
    stack.wait_for(MODEL, lambda c: all(r["state"] == "running" and r["ready"] for r in c["replicas"]),
                   timeout=timeout)
    return replicas(stack)


def infer(stack, timeout: float = 60.0, sleep_ms: int = 0):
    return post(f"{stack.gateway}/v1/models/{MODEL}/infer",
                {"images": [image_b64(width=32, height=32)], "params": {"sleep_ms": sleep_ms}},
                headers={"Authorization": f"Bearer {stack.key}"}, timeout=timeout)


def slow_infer(stack):
    """One request of the load: the model holds it ``LOAD_SLEEP_MS``."""
    return infer(stack, sleep_ms=LOAD_SLEEP_MS)


def gateway_metrics(stack) -> str:
    return get(stack.gateway + "/metrics", headers={"Authorization": f"Bearer {stack.env['SERVICE_METRICS_TOKEN']}"}
               ).body.decode()


def per_replica(text: str, route: str = "infer") -> dict[str, float]:
    """Requests the gateway had answered by each replica (its upstream duration count)."""
    pattern = rf'^service_gateway_upstream_duration_ms_count\{{model="{MODEL}",replica="(\d+)",route="{route}"\}} (\S+)$'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.M)}


def test_both_replicas_serve_on_their_ports_with_their_own_logs_and_cpus(stack):
    found = wait_ready(stack)
    assert [(r["index"], r["name"], r["port"]) for r in found] == [
        (0, f"{MODEL}.0", stack.model_ports[MODEL]), (1, f"{MODEL}.1", stack.extra["replica_ports"][MODEL][1])]
    model = stack.child(MODEL)
    assert (model["state"], model["ready"], model["pid"], model["port"]) == ("running", True, None,
                                                                             stack.model_ports[MODEL])
    cpus = sorted(os.sched_getaffinity(0))
    for replica, cpu in zip(found, (cpus[0], cpus[-1])):
        assert replica["cpus"] == [cpu]
        with open(f"/proc/{replica['pid']}/status") as f:  # the pinning reached the model server itself
            allowed = re.search(r"^Cpus_allowed_list:\s*(\S+)$", f.read(), re.M).group(1)
        assert allowed == str(cpu)
    before = per_replica(gateway_metrics(stack))
    replies = [infer(stack) for _ in range(24)]
    assert [(r.status, r.json["status"]) for r in replies] == [(200, 0)] * 24
    after = per_replica(gateway_metrics(stack))
    served = {i: after.get(i, 0.0) - before.get(i, 0.0) for i in ("0", "1")}
    assert served["0"] > 0 and served["1"] > 0 and served["0"] + served["1"] == 24, served
    logs = stack.root / "logs"
    assert (logs / f"{MODEL}.0.log").exists() and (logs / f"{MODEL}.1.log").exists()
    assert not (logs / f"{MODEL}.log").exists()
    page = get(f"{stack.url}/api/v1/servers/{MODEL}/replicas/1/logs?limit=2000", headers=stack.auth).json
    assert page["replica"] == 1 and any(f":{found[1]['port']};" in line["line"] for line in page["lines"])


def test_jobs_come_back_to_their_replica(stack):
    wait_ready(stack)
    auth = {"Authorization": f"Bearer {stack.key}"}
    owners = Counter()
    jobs = []
    for _ in range(JOBS):
        submitted = post(f"{stack.gateway}/v1/models/{MODEL}/jobs", {"images": [image_b64(width=32, height=32)]},
                         headers=auth)
        assert submitted.status == 202, submitted.body
        owner = jobid.parse_unverified(submitted.json["job_id"])
        owners[owner.replica] += 1
        jobs.append(submitted.json)
    assert set(owners) == {0, 1}, owners  # both replicas took jobs (least outstanding, random ties)
    for job in jobs:
        waited = get(f"{stack.gateway}{job['poll_url']}/wait?timeout=30000", headers=auth, timeout=60)
        assert (waited.status, waited.json["job_id"], waited.json["state"]) == (200, job["job_id"], "done")
        result = get(stack.gateway + job["result_url"], headers=auth)
        assert (result.status, result.json["status"], len(result.json["results"])) == (200, 0, 1)
    # An id whose replica byte is edited no longer verifies: unknown, not another replica's job.
    raw = jobs[0]["job_id"][4:]
    replica_byte = 2 * jobid.RANDOM_BYTES
    other = f"{int(raw[replica_byte:replica_byte + 2], 16) ^ 1:02x}"
    forged = "job_" + raw[:replica_byte] + other + raw[replica_byte + 2:]
    for suffix in ("", "/result"):
        reply = get(f"{stack.gateway}/v1/models/{MODEL}/jobs/{forged}{suffix}", headers=auth)
        assert (reply.status, reply.json["status"]) == (404, 63) and "job not found" in reply.json["error"]


def test_kill_of_one_replica_under_load_costs_only_its_requests_in_flight(stack):
    before = wait_ready(stack)
    victim = before[1]
    load = RequestLoad(lambda: slow_infer(stack), clients=CLIENTS, limit_s=240.0, join_s=90.0)
    try:
        wait_until(lambda: load.codes()[(200, 0)] >= 8, "requests answered before the kill", timeout=60)
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        time.sleep(PROBE_INTERVAL_S * 4)
        after = wait_ready(stack)  # the supervisor respawned it, and it serves again
        time.sleep(PROBE_INTERVAL_S * 4)
    finally:
        load.stop()
    codes = load.codes()
    assert load.errors == [], load.errors[:5]
    assert set(codes) <= {(200, 0), (502, 502)}, codes  # never 503: the survivor was there
    assert codes[(502, 502)] <= CLIENTS, codes  # at most one request in flight per client on the dead replica
    late = load.codes(sent_after=killed_at + PROBE_INTERVAL_S)
    assert set(late) == {(200, 0)} and late[(200, 0)] > 0, late
    assert after[1]["pid"] != victim["pid"] and after[1]["restarts"] == victim["restarts"] + 1
    assert after[1]["last_exit"] == "killed by signal 9" and after[0]["pid"] == before[0]["pid"]


def test_a_rolling_restart_loses_no_synchronous_request(stack):
    before = wait_ready(stack)
    load = RequestLoad(lambda: slow_infer(stack), clients=CLIENTS, limit_s=240.0, join_s=90.0)
    try:
        wait_until(lambda: load.codes()[(200, 0)] >= 8, "requests answered before the restart", timeout=60)
        reply = request("POST", f"{stack.url}/api/v1/servers/{MODEL}/restart", headers=stack.auth, timeout=400)
        assert (reply.status, reply.json) == (200, {"ok": True}), reply.body
        restarted_at = time.monotonic()
        wait_until(lambda: load.codes(sent_after=restarted_at)[(200, 0)] >= 8, "requests after the restart")
    finally:
        load.stop()
    codes = load.codes()
    assert load.errors == [], load.errors[:5]
    assert set(codes) == {(200, 0)}, codes
    after = replicas(stack)
    assert all(a["pid"] != b["pid"] for a, b in zip(after, before))
    assert [a["restarts"] for a in after] == [b["restarts"] + 1 for b in before]
    assert all(a["state"] == "running" and a["ready"] for a in after)
