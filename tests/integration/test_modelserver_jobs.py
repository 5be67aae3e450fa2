"""Asynchronous jobs on real model-server processes."""

from __future__ import annotations

import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.http import get, post, request
from tests.support.images import image_b64
from tests.support.processes import start_model_server, write_config

RED = image_b64(color=(250, 10, 10))


@pytest.fixture(scope="module")
def jobs_server(tmp_path_factory):
    """TESTFAULTS with jobs: one worker, batches of one, a 3 s job budget."""
    config = write_config(tmp_path_factory.mktemp("jobs"), "TESTFAULTS", async_enabled=True, async_max_queue=8,
                          async_timeout=3000, max_batch_size=1, name="TESTFAULTS.toml")
    server = start_model_server(config)
    server.extra["config"] = config
    yield server
    server.stop()


def submit(server, images=None, **params):
    body = {"images": images or [RED]}
    if params:
        body["params"] = params
    return post(server.url + "/jobs", body, headers=server.auth)


def poll(server, job_id, suffix=""):
    return get(f"{server.url}/jobs/{job_id}{suffix}", headers=server.auth, timeout=120)


def wait_terminal(server, job_id):
    reply = poll(server, job_id, "/wait?timeout=20000")
    assert reply.json["state"] in ("done", "failed", "timeout"), reply.json
    return reply


def metric(server, name, labels=""):
    text = get(server.url + "/metrics", headers=server.auth).body.decode()
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_submit_answers_202_at_once_while_the_model_is_busy(jobs_server):
    busy = submit(jobs_server, sleep_ms=1500)
    started = time.monotonic()
    reply = submit(jobs_server)
    elapsed = time.monotonic() - started
    assert busy.status == 202 and reply.status == 202
    assert elapsed < 0.5, elapsed  # admission, not computation (bench/ measures the p99)
    body = reply.json
    assert body["job_id"].startswith("job_") and body["state"] == "pending"
    assert body["poll_url"] == f"/jobs/{body['job_id']}" and body["result_url"] == f"/jobs/{body['job_id']}/result"
    assert reply.header("Location") == body["poll_url"]
    assert reply.header("Content-Type") == "application/json; charset=utf-8"
    now = poll(jobs_server, body["job_id"])
    assert now.status == 200 and now.json["state"] in ("pending", "running")
    early = poll(jobs_server, body["job_id"], "/result")
    assert early.status == 409 and early.json["status"] == 409
    assert early.json["state"] in ("pending", "running") and early.json["state"] in early.json["error"]
    wait_terminal(jobs_server, busy.json["job_id"])
    wait_terminal(jobs_server, body["job_id"])


def test_poll_until_done_then_the_result_twice(jobs_server):
    job_id = submit(jobs_server, sleep_ms=300).json["job_id"]
    seen = []
    for _ in range(100):
        state = poll(jobs_server, job_id).json
        seen.append(state["elapsed_ms"])
        if state["state"] == "done":
            break
        time.sleep(0.05)
    assert state["state"] == "done" and "error" not in state
    assert seen == sorted(seen) and seen[-1] >= 300
    first, second = poll(jobs_server, job_id, "/result"), poll(jobs_server, job_id, "/result")
    assert first.status == second.status == 200 and first.body == second.body
    body = first.json
    assert list(body) == ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial"]
    assert body["status"] == 0 and body["task_id"] == job_id and body["results"][0]["status"] == 0
    assert first.header("X-Request-ID") == job_id


def test_req_id_becomes_the_task_id_of_the_result(jobs_server):
    reply = post(jobs_server.url + "/jobs", {"images": [RED], "req_id": "client-7"}, headers=jobs_server.auth)
    assert reply.json["task_id"] == "client-7" and reply.header("X-Request-ID") == "client-7"
    wait_terminal(jobs_server, reply.json["job_id"])
    assert poll(jobs_server, reply.json["job_id"], "/result").json["task_id"] == "client-7"


def test_wait_with_a_short_budget_returns_a_non_terminal_state(jobs_server):
    job_id = submit(jobs_server, sleep_ms=1500).json["job_id"]
    started = time.monotonic()
    reply = poll(jobs_server, job_id, "/wait?timeout=300")
    elapsed = time.monotonic() - started
    assert reply.status == 200 and reply.json["state"] in ("pending", "running")
    assert 0.25 <= elapsed < 1.2, elapsed
    assert wait_terminal(jobs_server, job_id).json["state"] == "done"
    started = time.monotonic()
    assert poll(jobs_server, job_id, "/wait?timeout=20000").json["state"] == "done"
    assert time.monotonic() - started < 0.5  # terminal: at once


def test_concurrent_waiters_all_get_the_same_terminal_state(jobs_server):
    job_id = submit(jobs_server, sleep_ms=600).json["job_id"]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: poll(jobs_server, job_id, "/wait?timeout=20000"), range(4)))
    assert [r.status for r in replies] == [200] * 4
    assert {r.json["state"] for r in replies} == {"done"}


def test_a_disconnected_waiter_leaves_nothing_behind(jobs_server):
    job_id = submit(jobs_server, sleep_ms=1000).json["job_id"]
    with socket.create_connection(("127.0.0.1", jobs_server.port)) as s:
        s.sendall(f"GET /jobs/{job_id}/wait?timeout=20000 HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {jobs_server.token}\r\n\r\n".encode())
        time.sleep(0.3)
        assert metric(jobs_server, "service_async_waiters") == 1.0
    deadline = time.monotonic() + 5
    while metric(jobs_server, "service_async_waiters") != 0.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(jobs_server, "service_async_waiters") == 0.0
    wait_terminal(jobs_server, job_id)


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", ""])
def test_bad_wait_timeout_is_422(jobs_server, value):
    job_id = submit(jobs_server).json["job_id"]
    reply = poll(jobs_server, job_id, f"/wait?timeout={value}")
    assert reply.status == 422 and reply.json["status"] == 66
    assert [e["pointer"] for e in reply.json["errors"]] == ["/timeout"]
    wait_terminal(jobs_server, job_id)


def test_huge_wait_timeout_is_clamped_not_refused(jobs_server):
    job_id = submit(jobs_server).json["job_id"]
    assert poll(jobs_server, job_id, "/wait?timeout=99999999").json["state"] == "done"


def test_failed_and_timed_out_jobs(jobs_server):
    failed = submit(jobs_server, fail="engine").json["job_id"]
    slow = submit(jobs_server, sleep_ms=4000).json["job_id"]  # longer than async_timeout (3000 ms)
    state = wait_terminal(jobs_server, failed).json
    assert state["state"] == "failed" and "injected engine failure" in state["error"]
    result = poll(jobs_server, failed, "/result")
    assert result.status == 409 and "failed" in result.json["error"] and result.json["state"] == "failed"
    state = wait_terminal(jobs_server, slow).json
    assert state["state"] == "timeout" and "async_timeout" in state["error"]
    assert 2900 <= state["elapsed_ms"] < 3900
    assert poll(jobs_server, slow, "/result").status == 409
    time.sleep(1.2)  # the started batch finishes before the next test


def test_unknown_job_is_404_on_all_three_routes(jobs_server):
    for suffix in ("", "/wait?timeout=10", "/result"):
        reply = poll(jobs_server, "job_doesnotexist", suffix)
        assert reply.status == 404 and reply.json["status"] == 63 and "job not found" in reply.json["error"]


def test_wrong_methods_are_405(jobs_server):
    job_id = submit(jobs_server).json["job_id"]
    reply = request("POST", f"{jobs_server.url}/jobs/{job_id}", {"images": [RED]}, headers=jobs_server.auth)
    assert reply.status == 405 and reply.json["status"] == 62 and reply.header("Allow") == "GET"
    assert request("GET", jobs_server.url + "/jobs", headers=jobs_server.auth).header("Allow") == "POST"
    assert request("DELETE", f"{jobs_server.url}/jobs/{job_id}/result", headers=jobs_server.auth).status == 405
    wait_terminal(jobs_server, job_id)


def test_invalid_bodies_get_no_job_and_no_slot(jobs_server):
    submitted = metric(jobs_server, "service_async_jobs_total", '{state="submitted"}')
    for body in ({"img_data": "x"}, {"images": []}, {"images": [RED], "params": {"sleep_ms": -1}}):
        started = time.monotonic()
        reply = post(jobs_server.url + "/jobs", body, headers=jobs_server.auth)
        assert reply.status == 422 and reply.json["status"] == 66 and "job_id" not in reply.json
        assert time.monotonic() - started < 0.5
    assert request("POST", jobs_server.url + "/jobs", b"{nope", headers={**jobs_server.auth, "Content-Type": "application/json"}).status == 400
    assert metric(jobs_server, "service_async_jobs_total", '{state="submitted"}') == submitted
    assert metric(jobs_server, "service_async_queue_depth") == 0.0


def test_auth_is_needed_on_every_job_route(jobs_server):
    job_id = submit(jobs_server).json["job_id"]
    assert post(jobs_server.url + "/jobs", {"images": [RED]}).status == 401
    for suffix in ("", "/wait", "/result"):
        assert get(f"{jobs_server.url}/jobs/{job_id}{suffix}").status == 401
    wait_terminal(jobs_server, job_id)


def test_twelve_rapid_submits_never_admit_more_than_eight(jobs_server):
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: submit(jobs_server, sleep_ms=250), range(12)))
    codes = [r.status for r in replies]
    assert codes.count(202) <= 8 and codes.count(429) >= 1 and set(codes) <= {202, 429}
    full = next(r for r in replies if r.status == 429)
    assert "async queue full" in full.json["error"] and full.json["status"] == 429
    assert 1 <= int(full.header("Retry-After")) <= 60
    for r in replies:
        if r.status == 202:
            wait_terminal(jobs_server, r.json["job_id"])
    assert metric(jobs_server, "service_async_queue_depth") == 0.0


def test_job_metrics(jobs_server):
    before = {s: metric(jobs_server, "service_async_jobs_total", f'{{state="{s}"}}') for s in ("submitted", "running", "done")}
    job_id = submit(jobs_server).json["job_id"]
    wait_terminal(jobs_server, job_id)
    after = {s: metric(jobs_server, "service_async_jobs_total", f'{{state="{s}"}}') for s in ("submitted", "running", "done")}
    assert {s: after[s] - before[s] for s in after} == {"submitted": 1, "running": 1, "done": 1}
    assert metric(jobs_server, "service_async_job_duration_ms_count") >= 1
    text = get(jobs_server.url + "/metrics", headers=jobs_server.auth).body.decode()
    assert 'service_http_requests_total{code="202",method="POST",route="jobs_submit"}' in text
    assert 'route="jobs_wait"' in text
    assert 'service_http_request_duration_ms_count{route="jobs' not in text


def test_a_restart_loses_every_job(tmp_path):
    config = write_config(tmp_path, "MOBILENETV2", async_enabled=True)
    server = start_model_server(config)
    try:
        job_id = post(server.url + "/jobs", {"images": [RED]}, headers=server.auth).json["job_id"]
        done = wait_terminal(server, job_id)
        assert done.json["state"] == "done"
        result = poll(server, job_id, "/result").json
        assert result["model"]["name"] == "MOBILENETV2" and result["results"][0]["data"]["category"]
    finally:
        server.stop()
    again = start_model_server(config, port=server.port)
    try:
        for suffix in ("", "/wait?timeout=0", "/result"):
            assert poll(again, job_id, suffix).status == 404
    finally:
        again.stop()


def test_jobs_routes_are_404_when_async_is_disabled(mobilenet):
    assert post(mobilenet.url + "/jobs", {"images": [RED]}, headers=mobilenet.auth).json["status"] == 63
    for suffix in ("/job_x", "/job_x/wait", "/job_x/result"):
        reply = get(mobilenet.url + "/jobs" + suffix, headers=mobilenet.auth)
        assert reply.status == 404 and reply.json["status"] == 63


def test_sigterm_answers_parked_waiters_and_exits_0(tmp_path):
    config = write_config(tmp_path, "TESTFAULTS", async_enabled=True, max_batch_size=1)
    server = start_model_server(config)
    job_id = submit(server, sleep_ms=800).json["job_id"]
    replies = {}
    thread = threading.Thread(target=lambda: replies.setdefault("wait", poll(server, job_id, "/wait?timeout=60000")))
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    server.popen.terminate()
    thread.join(30)
    assert time.monotonic() - started < 5
    assert replies["wait"].status == 200 and replies["wait"].json["state"] in ("pending", "running")
    assert server.popen.wait(30) == 0
