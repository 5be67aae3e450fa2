"""Asynchronous jobs on real model-server processes.

Only what needs a real process is here: a job run end to end by a real
(torch) model, jobs living in memory only (a restart loses them), the reactor
answering job routes while a real forward pass runs, and SIGTERM waking
parked waiters.  The rules of the job routes (states, waits and their
budgets, admission, retention, errors, auth, metrics) are driven on a Clock
in memory in tests/unit/test_job_routes.py.
"""

from __future__ import annotations

import threading
import time

from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.processes import metric, start_model_server, wait_until, write_config

RED = image_b64(color=(250, 10, 10))


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


def test_a_restart_loses_every_job(tmp_path):
    # TESTFAULTS (real torch, no torchvision: both starts take half of MOBILENETV2's CPU); the zoo tests
    # run jobs end to end on the catalog models (tests/integration/test_zoo_*.py).
    config = write_config(tmp_path, "TESTFAULTS", async_enabled=True)
    server = start_model_server(config)
    try:
        job_id = post(server.url + "/jobs", {"images": [RED]}, headers=server.auth).json["job_id"]
        done = wait_terminal(server, job_id)
        assert done.json["state"] == "done"
        result = poll(server, job_id, "/result").json
        assert result["model"]["name"] == "TESTFAULTS" and result["results"][0]["data"]["mean"] == [250.0, 10.0, 10.0]
    finally:
        server.stop()
    again = start_model_server(config, port=server.port)
    try:
        for suffix in ("", "/wait?timeout=0", "/result"):
            assert poll(again, job_id, suffix).status == 404
    finally:
        again.stop()


def test_sigterm_answers_parked_waiters_and_exits_0(tmp_path):
    config = write_config(tmp_path, "TESTFAULTS", async_enabled=True, max_batch_size=1)
    server = start_model_server(config)
    job_id = submit(server, sleep_ms=3000).json["job_id"]  # long enough for every step below
    wait_until(lambda: poll(server, job_id).json["state"] == "running", "the job reaches the worker")
    # The forward pass runs in a worker thread: the reactor still admits and answers.
    other = submit(server)
    assert other.status == 202 and poll(server, job_id).json["state"] == "running"
    replies = {}
    thread = threading.Thread(target=lambda: replies.setdefault("wait", poll(server, job_id, "/wait?timeout=60000")))
    thread.start()
    wait_until(lambda: metric(server, "service_async_waiters") == 1.0, "the wait is parked")
    started = time.monotonic()
    server.popen.terminate()
    thread.join(30)
    assert time.monotonic() - started < 5
    assert replies["wait"].status == 200 and replies["wait"].json["state"] == "running"
    assert server.popen.wait(30) == 0


def test_a_wait_its_client_abandons_is_logged_with_its_jobs_task_id(tmp_path):
    """docs/api.md: one id (``rid=``) follows a job from its submission to its result in the access lines. A
    wait whose client went away (499: no reply, so no ``X-Request-ID`` to log) was ``rid=-``."""
    import socket

    config = write_config(tmp_path, "TESTFAULTS", async_enabled=True, max_batch_size=1)
    server = start_model_server(config)
    try:
        job = submit(server, sleep_ms=3000).json
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(f"GET /jobs/{job['job_id']}/wait?timeout=30000 HTTP/1.1\r\nHost: x\r\n"
                         f"Authorization: {server.auth['Authorization']}\r\n\r\n".encode())
            wait_until(lambda: metric(server, "service_async_waiters") == 1.0, "the wait is parked")
        line = f"GET /jobs/{job['job_id']}/wait?timeout=30000 499 "
        wait_until(lambda: line in server.output(), "the abandoned wait's access line")
        logged = next(text for text in server.output().splitlines() if line in text)
        assert logged.endswith(f"key=- rid={job['task_id']}"), logged
    finally:
        server.stop()
