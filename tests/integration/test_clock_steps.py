"""A wall clock stepped under a running model server: timers, deadlines and time to live hold.

The wall clock of a real process is stepped by tests/support/wallclock (its
``time.time`` reads an offset from a file; the monotonic clock is left
alone, as NTP and a resumed virtual machine leave it).  Twisted's reactor
read the wall clock: a step back parked a job wait for as long as the step,
and a step forward killed a running job as past its deadline and expired the
finished ones at once (svc/infra/reactors.py, ``use_monotonic_clock``; a
token bucket stepped back is tested on a Clock in tests/unit/test_ratelimit.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.processes import child_env, start_model_server, wait_until, write_config

RED = image_b64(color=(250, 10, 10))
WALLCLOCK = Path(__file__).resolve().parents[1] / "support" / "wallclock"


@pytest.fixture
def stepped(tmp_path):
    """(a model server whose wall clock follows ``set_offset``, set_offset(seconds))."""
    offset_file = tmp_path / "offset"
    offset_file.write_text("0\n")
    config = write_config(tmp_path, "TESTFAULTS", async_enabled=True, max_batch_size=1)
    server = start_model_server(config, env={
        "PYTHONPATH": f"{WALLCLOCK}:{child_env()['PYTHONPATH']}", "SVC_TEST_WALL_OFFSET_FILE": str(offset_file)})

    def set_offset(seconds: int) -> None:
        offset_file.write_text(f"{seconds}\n")
        time.sleep(0.3)  # the server has read it

    try:
        yield server, set_offset
    finally:
        server.stop()


def submit(server, **params):
    reply = post(server.url + "/jobs", {"images": [RED], "params": params}, headers=server.auth)
    assert reply.status == 202, reply.body
    return reply.json["job_id"]


def job(server, job_id, suffix="", timeout=30):
    return get(f"{server.url}/jobs/{job_id}{suffix}", headers=server.auth, timeout=timeout)


def test_a_clock_stepped_back_an_hour_delays_no_wait(stepped):
    server, set_offset = stepped
    job_id = submit(server, sleep_ms=6000)
    wait_until(lambda: job(server, job_id).json["state"] == "running", "the job runs")
    replies = {}
    started = time.monotonic()
    waiter = threading.Thread(target=lambda: replies.setdefault("wait", job(server, job_id, "/wait?timeout=2000")))
    waiter.start()
    time.sleep(0.5)  # parked: its budget must not wait for the hour back
    set_offset(-3600)
    waiter.join(30)
    reply = replies["wait"]
    assert (reply.status, reply.json["state"]) == (200, "running")
    assert time.monotonic() - started < 4
    assert reply.json["elapsed_ms"] > 0  # it was -3,574,825 ms
    done = job(server, job_id, "/wait?timeout=20000")
    assert (done.status, done.json["state"]) == (200, "done")


def test_a_clock_stepped_forward_an_hour_kills_no_job_and_expires_no_result(stepped):
    server, set_offset = stepped
    finished = submit(server)
    assert job(server, finished, "/wait?timeout=20000").json["state"] == "done"
    running = submit(server, sleep_ms=5000)
    wait_until(lambda: job(server, running).json["state"] == "running", "the job runs")
    replies = {}
    waiter = threading.Thread(target=lambda: replies.setdefault("wait", job(server, running, "/wait?timeout=30000",
                                                                              timeout=60)))
    waiter.start()
    time.sleep(0.5)  # parked
    set_offset(3600)  # past async_timeout (600 s) and async_job_ttl (300 s) by the wall clock
    waiter.join(60)
    assert (replies["wait"].status, replies["wait"].json["state"]) == (200, "done"), replies["wait"].body
    assert replies["wait"].json["elapsed_ms"] < 60_000
    result = job(server, finished, "/result")
    assert result.status == 200 and result.json["results"][0]["data"]["mean"] == [250.0, 10.0, 10.0]
