"""The model server's /jobs routes in memory (tests/support/inmemory.py).

The real JobTable, Inference, BatchQueue and Engine on a Clock, behind the
real routes; the worker is gated, so a job stays pending or running exactly
as long as the test wants, and every wait budget is observed on the Clock.
"""

from __future__ import annotations

import re
from unittest import mock

import pytest
from werkzeug.routing import Map

from tests.support.images import image_b64
from tests.support.inmemory import build_model_server

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport:DeprecationWarning")

RED = image_b64(color=(250, 10, 10))
JSON = "application/json; charset=utf-8"


@pytest.fixture
def server():
    """TESTFAULTS with jobs: one worker, batches of one, a 3 s job budget."""
    return build_model_server(async_enabled=True, async_max_queue=8, async_timeout=3000, max_batch_size=1)


def patient():
    """Jobs without a budget (async_timeout 0): only the wait's own budget ends a wait."""
    return build_model_server(async_enabled=True, async_timeout=0)


def poll(server, job_id, suffix=""):
    return server.call("GET", f"/jobs/{job_id}{suffix}")


def state(server, job_id):
    return poll(server, job_id).json["state"]


def assert_job_error(reply, http, status, job_id=None, state=None):
    assert reply.code == http, reply.body
    assert reply.headers["content-type"] == JSON
    body = reply.json
    assert (body["status"], body["results"], body["partial"]) == (status, [], False)
    assert reply.headers["x-request-id"] == body["task_id"]
    assert reply.headers["cache-control"] == "no-store"  # as on every reply about a job
    if http in (409, 429):  # about a job, or the job queue: the weights too
        assert reply.headers["x-service-weights"] == "demo"
    assert body.get("job_id") == job_id and body.get("state") == state
    return body


# -- submission --------------------------------------------------------------------------------------------


def test_submit_answers_202_at_once_while_the_model_is_busy(server):
    busy = server.submit([RED], sleep_ms=1500)
    assert busy.code == 202 and server.workers.held == 1 and state(server, busy.json["job_id"]) == "running"
    reply = server.submit([RED])
    assert reply.code == 202 and server.workers.held == 1
    body = reply.json
    job_id = body["job_id"]
    assert re.fullmatch(r"job_[0-9a-f]{42}", job_id)  # svc.contract.jobid: random, replica, tag
    assert body == {"job_id": job_id, "state": "pending", "poll_url": f"/jobs/{job_id}",
                    "result_url": f"/jobs/{job_id}/result", "task_id": job_id,
                    "model": {"name": "TESTFAULTS", "version": "test-faults"}}
    assert reply.headers["location"] == body["poll_url"]
    assert reply.headers["content-type"] == JSON and reply.headers["cache-control"] == "no-store"
    assert reply.headers["x-request-id"] == job_id
    now = poll(server, job_id)
    assert now.code == 200 and now.json["state"] == "pending" and "error" not in now.json
    early = poll(server, job_id, "/result")
    body = assert_job_error(early, 409, 409, job_id, "pending")
    assert body["error"] == "job is pending: no result"
    server.workers.release()
    assert state(server, busy.json["job_id"]) == "done" and state(server, job_id) == "running"
    assert poll(server, job_id, "/result").json["error"] == "job is running: no result"
    server.workers.release()
    assert state(server, job_id) == "done"


def test_poll_until_done_then_the_result_twice(server):
    job_id = server.submit([RED], sleep_ms=300).json["job_id"]
    server.clock.advance(0.25)
    running = poll(server, job_id).json
    assert (running["state"], running["elapsed_ms"], running["progress"]) == ("running", 250.0, None)
    server.clock.advance(0.25)
    server.workers.release()
    server.clock.advance(1.0)  # elapsed_ms stops at the terminal transition
    status = poll(server, job_id)
    assert status.code == 200 and status.headers["cache-control"] == "no-store"
    assert status.json == {"job_id": job_id, "state": "done", "elapsed_ms": 500.0, "task_id": job_id,
                           "model": {"name": "TESTFAULTS", "version": "test-faults"}, "poll_url": f"/jobs/{job_id}",
                           "result_url": f"/jobs/{job_id}/result", "progress": None}
    first, second = poll(server, job_id, "/result"), poll(server, job_id, "/result")
    assert first.code == second.code == 200 and first.body == second.body
    body = first.json
    assert list(body) == ["status", "status_str", "task_id", "model", "results", "server_time_ms", "partial"]
    assert body["status"] == 0 and body["task_id"] == job_id and body["server_time_ms"] == 500.0
    assert body["results"] == [{"status": 0, "data": {"mean": [250.0, 10.0, 10.0], "batch_size": 1}}]
    assert first.headers["x-request-id"] == job_id


def test_req_id_becomes_the_task_id_of_the_result(server):
    reply = server.call("POST", "/jobs", body={"images": [RED], "req_id": "client-7"})
    assert reply.json["task_id"] == "client-7" and reply.headers["x-request-id"] == "client-7"
    server.workers.release()
    result = poll(server, reply.json["job_id"], "/result")
    assert result.json["task_id"] == "client-7" and result.headers["x-request-id"] == "client-7"


@pytest.mark.parametrize("path", ["/jobs", "/testfaults/predict"])
def test_a_422_keeps_the_req_id_the_body_named(path, server):
    """docs/api.md: a req_id is echoed as task_id and X-Request-ID, a correlation never lost without a word. A 422
    of the same body made a new id (a docs probe: svcctl infer --req-id with a bad option lost it); a req_id that
    is itself invalid is not one to keep."""
    reply = server.call("POST", path, body={"images": [RED], "req_id": "client-8", "params": {"nope": 1}})
    assert reply.code == 422 and reply.json["status"] == 66
    assert reply.json["task_id"] == "client-8" and reply.headers["x-request-id"] == "client-8"
    bad = server.call("POST", path, body={"images": [RED], "req_id": "two words", "params": {"nope": 1}})
    assert bad.code == 422 and bad.json["task_id"] != "two words" and bad.json["task_id"]


def test_a_job_of_several_images_is_done_when_all_are(server):
    job_id = server.submit([RED, RED, RED]).json["job_id"]
    for left in (3, 2, 1):
        assert server.workers.held == 1 and state(server, job_id) == "running", left
        server.workers.release()
    assert state(server, job_id) == "done" and server.model.batches == [1, 1, 1]
    assert [r["status"] for r in poll(server, job_id, "/result").json["results"]] == [0, 0, 0]


# -- waiting -------------------------------------------------------------------------------------------------


def test_wait_with_a_short_budget_returns_a_non_terminal_state(server):
    job_id = server.submit([RED], sleep_ms=1500).json["job_id"]
    d = server.send("GET", f"/jobs/{job_id}/wait?timeout=300")
    server.clock.advance(0.25)
    assert not server.done(d) and server.metric("service_async_waiters") == 1.0
    server.clock.advance(0.05)
    reply = server.settle(d)
    assert reply.code == 200 and reply.json["state"] == "running" and reply.json["elapsed_ms"] == 300.0
    assert server.metric("service_async_waiters") == 0.0
    d = server.send("GET", f"/jobs/{job_id}/wait?timeout=20000")
    server.workers.release()
    assert server.settle(d).json["state"] == "done"
    assert poll(server, job_id, "/wait?timeout=20000").json["state"] == "done"  # terminal: at once


def test_wait_answers_when_the_job_ends():
    server = patient()
    job_id = server.submit([RED]).json["job_id"]
    d = server.send("GET", f"/jobs/{job_id}/wait")  # the default budget: 30000 ms
    server.clock.advance(29.0)
    assert not server.done(d)
    server.workers.release()
    reply = server.settle(d)
    assert reply.json["state"] == "done" and reply.json["elapsed_ms"] == 29000.0


def test_wait_of_zero_answers_at_once(server):
    job_id = server.submit([RED]).json["job_id"]
    reply = poll(server, job_id, "/wait?timeout=0")
    assert reply.code == 200 and reply.json["state"] == "running" and reply.json["elapsed_ms"] == 0.0


@pytest.mark.parametrize("query, budget_ms", [("", 30000), ("?timeout=300", 300), ("?timeout=300000", 300000),
                                              ("?timeout=300001", 300000), ("?timeout=99999999", 300000),
                                              ("?timeout=999999999999999999", 300000)])
def test_wait_budget_default_given_and_clamped_to_300000(query, budget_ms):
    server = patient()
    job_id = server.submit([RED]).json["job_id"]
    d = server.send("GET", f"/jobs/{job_id}/wait{query}")
    server.clock.advance(budget_ms / 1000.0 - 0.125)
    assert not server.done(d)
    server.clock.advance(0.125)
    reply = server.settle(d)
    assert reply.code == 200 and reply.json["state"] == "running" and reply.json["elapsed_ms"] == budget_ms


def test_concurrent_waiters_all_get_the_same_terminal_state(server):
    job_id = server.submit([RED], sleep_ms=600).json["job_id"]
    waits = [server.send("GET", f"/jobs/{job_id}/wait?timeout=20000") for _ in range(4)]
    assert server.metric("service_async_waiters") == 4.0
    server.clock.advance(0.5)
    server.workers.release()
    replies = [server.settle(d) for d in waits]
    assert [r.code for r in replies] == [200] * 4 and {r.json["state"] for r in replies} == {"done"}
    assert server.metric("service_async_waiters") == 0.0


def test_a_disconnected_waiter_leaves_nothing_behind(server):
    job_id = server.submit([RED], sleep_ms=1000).json["job_id"]
    d = server.send("GET", f"/jobs/{job_id}/wait?timeout=20000")
    assert server.metric("service_async_waiters") == 1.0 and len(server.jobs.jobs[job_id].waiters) == 1
    d.addErrback(lambda f: None)
    d.cancel()  # the client goes away
    server.turn()
    assert server.metric("service_async_waiters") == 0.0 and server.jobs.jobs[job_id].waiters == []
    server.workers.release()
    assert state(server, job_id) == "done"


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "", "+5", "1e3", "\u0661", "1234567890123456789"])
def test_bad_wait_timeout_is_422_pointing_at_timeout(server, value):
    job_id = server.submit([RED]).json["job_id"]
    reply = poll(server, job_id, f"/wait?timeout={value}")
    assert reply.code == 422 and reply.json["status"] == 66 and reply.json["results"] == []
    assert [e["pointer"] for e in reply.json["errors"]] == ["/timeout"]
    assert reply.json["error"] == ("timeout must be a whole number of milliseconds (0 answers at once; above 300000 "
                                   "it is 300000)")
    assert server.metric("service_async_waiters") == 0.0


# -- failure, timeout, unknown jobs -------------------------------------------------------------------------


def test_failed_job(server):
    job_id = server.submit([RED], fail="engine").json["job_id"]
    server.workers.release()
    status = poll(server, job_id).json
    assert status["state"] == "failed"
    assert status["error"] == "every item failed: ENGINE_ERROR: model error: RuntimeError: injected engine failure"
    body = assert_job_error(poll(server, job_id, "/result"), 409, 409, job_id, "failed")
    assert body["error"] == f"job is failed: no result ({status['error']})"


def test_a_job_past_async_timeout_times_out_running_or_queued(server):
    running = server.submit([RED], sleep_ms=4000).json["job_id"]  # longer than async_timeout (3000 ms)
    server.clock.advance(1.0)
    queued = server.submit([RED]).json["job_id"]  # behind it: its budget ends at 4 s
    server.clock.advance(1.999)
    assert (state(server, running), state(server, queued)) == ("running", "pending")
    server.clock.advance(0.001)
    status = poll(server, running).json
    assert status["state"] == "timeout" and status["elapsed_ms"] == 3000.0
    assert status["error"] == "async_timeout of 3000 ms elapsed before the job finished"
    assert_job_error(poll(server, running, "/result"), 409, 409, running, "timeout")
    server.workers.release()  # the started batch finishes late; the queued job still waits for the worker
    assert state(server, running) == "timeout" and state(server, queued) == "running"
    server.clock.advance(1.0)
    assert poll(server, queued).json["state"] == "timeout" and server.metric("service_async_queue_depth") == 0.0
    server.workers.release()
    assert server.model.batches == [1, 1]


def test_unknown_job_is_404_on_all_three_routes(server):
    for suffix in ("", "/wait?timeout=10", "/result"):
        reply = poll(server, "job_doesnotexist", suffix)
        body = assert_job_error(reply, 404, 63)
        assert body["error"] == "job not found: job_doesnotexist"


def test_finished_jobs_expire_after_async_job_ttl():
    server = build_model_server(async_enabled=True, async_job_ttl=1000)
    job_id = server.submit([RED]).json["job_id"]
    server.clock.advance(5.0)
    server.workers.release()
    server.clock.advance(0.999)
    assert poll(server, job_id, "/result").code == 200
    server.clock.advance(0.001)
    for suffix in ("", "/wait?timeout=0", "/result"):
        assert poll(server, job_id, suffix).code == 404


# -- routing, auth, admission --------------------------------------------------------------------------------


def test_wrong_methods_are_405_with_allow(server):
    job_id = server.submit([RED]).json["job_id"]
    for method, path, allowed in (("POST", f"/jobs/{job_id}", "GET, HEAD"), ("GET", "/jobs", "POST"),
                                  ("DELETE", f"/jobs/{job_id}/result", "GET, HEAD"),
                                  ("PUT", f"/jobs/{job_id}/wait", "GET, HEAD")):
        reply = server.call(method, path, body=b"{}" if method in ("POST", "PUT") else None)
        assert reply.code == 405 and reply.json["status"] == 62 and reply.headers["allow"] == allowed, (method, path)


def test_a_submit_path_is_matched_once_then_remembered_and_other_answers_stay(server):
    """svc.web.configured.ConfiguredRoutes.dispatch remembers POST /jobs after its first match."""
    binds: list[Map] = []
    real_bind = Map.bind

    def counting_bind(self, *args, **kwargs):
        binds.append(self)
        return real_bind(self, *args, **kwargs)

    with mock.patch.object(Map, "bind", counting_bind):
        first = server.submit([RED])
        first_binds, binds[:] = len(binds), []
        second = server.submit([RED])
        assert (first.code, second.code) == (202, 202) and first.json["job_id"] != second.json["job_id"]
        assert first_binds == 3 and len(binds) == 1  # Klein's own match of the catch-all only, the second time
        reply = server.call("GET", "/jobs")  # the same path with another method is matched, and refused, as before
        assert reply.code == 405 and reply.headers["allow"] == "POST"
        assert server.call("POST", "/jobs/").code == 404
        assert server.call("GET", f"/jobs/{second.json['job_id']}").json["state"] in ("pending", "running")


def test_invalid_bodies_get_no_job_and_no_slot(server):
    for body in ({"img_data": "x"}, {"images": []}, {"images": [RED], "params": {"sleep_ms": -1}}):
        reply = server.call("POST", "/jobs", body=body)
        assert reply.code == 422 and reply.json["status"] == 66 and "job_id" not in reply.json
    reply = server.call("POST", "/jobs", body=b"{nope", headers={"Content-Type": "application/json"})
    assert reply.code == 400 and reply.json["status"] == 50
    assert server.metric("service_async_jobs_total", '{state="submitted"}') == 0.0
    assert server.metric("service_async_queue_depth") == 0.0 and server.jobs.jobs == {}
    assert server.workers.held == 0


@pytest.mark.parametrize("token", [None, "wrong"])
def test_auth_is_needed_on_every_job_route(server, token):
    job_id = server.submit([RED]).json["job_id"]
    replies = [server.call("POST", "/jobs", token=token, body={"images": [RED]})]
    replies += [server.call("GET", f"/jobs/{job_id}{suffix}", token=token) for suffix in ("", "/wait", "/result")]
    replies += [server.call("GET", "/jobs/job_unknown", token=token)]  # 401 before 404
    for reply in replies:
        assert_job_error(reply, 401, 401)
        assert reply.headers["www-authenticate"] == 'Bearer realm="model-server"'
    assert list(server.jobs.jobs) == [job_id]


def test_a_loading_server_refuses_jobs_with_503():
    server = build_model_server(ready=False, async_enabled=True)
    body = assert_job_error(server.call("POST", "/jobs", body={"images": [RED]}), 503, 65)
    assert body["error"] == "the model is loading" and server.jobs.jobs == {}


def test_twelve_rapid_submits_admit_exactly_eight(server):
    replies = [server.submit([RED], sleep_ms=250) for _ in range(12)]
    assert [r.code for r in replies] == [202] * 8 + [429] * 4
    for full in replies[8:]:
        body = assert_job_error(full, 429, 429)
        assert body["error"] == "async queue full: 8 jobs pending or running (async_max_queue 8)"
        assert full.headers["retry-after"] == "1"  # no job finished yet: 1 s per job over one worker
    assert server.metric("service_async_queue_depth") == 8.0
    # A submit's valid req_id names its 429, as its 422 and 413 are (a probe: a new id named it)
    named = server.call("POST", "/jobs", body={"images": [RED], "req_id": "rid-429", "params": {"sleep_ms": 250}})
    assert assert_job_error(named, 429, 429)["task_id"] == "rid-429" and named.headers["x-request-id"] == "rid-429"
    server.workers.release_all()
    assert [state(server, r.json["job_id"]) for r in replies[:8]] == ["done"] * 8
    assert server.metric("service_async_queue_depth") == 0.0
    assert server.submit([RED]).code == 202


def test_retry_after_follows_the_mean_job_duration():
    server = build_model_server(async_enabled=True, async_max_queue=1)
    first = server.submit([RED]).json["job_id"]
    server.clock.advance(5.0)
    server.workers.release()
    assert state(server, first) == "done"
    server.submit([RED])
    full = server.submit([RED])
    assert full.code == 429 and full.headers["retry-after"] == "5"


def test_jobs_routes_are_404_when_async_is_disabled():
    server = build_model_server()  # async_enabled defaults to false
    assert_job_error(server.call("POST", "/jobs", body={"images": [RED]}), 404, 63)
    for suffix in ("/job_x", "/job_x/wait", "/job_x/result"):
        assert_job_error(server.call("GET", "/jobs" + suffix), 404, 63)
    assert server.workers.held == 0


# -- metrics -------------------------------------------------------------------------------------------------------


def test_job_metrics(server):
    job_id = server.submit([RED]).json["job_id"]
    d = server.send("GET", f"/jobs/{job_id}/wait?timeout=1000")
    server.clock.advance(0.5)
    server.workers.release()
    assert server.settle(d).json["state"] == "done"
    states = ("submitted", "running", "done", "failed", "timeout")
    counts = {s: server.metric("service_async_jobs_total", f'{{state="{s}"}}') for s in states}
    # every state the contract names is a sample, 0 until it happens (a query for failed had no data)
    assert counts == {"submitted": 1.0, "running": 1.0, "done": 1.0, "failed": 0.0, "timeout": 0.0}
    assert server.metric("service_async_job_duration_ms_count") == 1.0
    assert server.metric("service_async_job_duration_ms_sum") == 500.0
    text = server.call("GET", "/metrics").body.decode()
    assert 'service_http_requests_total{code="202",method="POST",route="jobs_submit"} 1.0' in text
    assert 'service_http_requests_total{code="200",method="GET",route="jobs_wait"} 1.0' in text
    assert 'service_http_request_duration_ms_count{route="jobs' not in text


def test_every_job_reply_is_counted_by_code(server):
    """The contract: service_http_requests_total counts every reply, the jobs' 404, 405, 409 and 429 too."""
    pending = server.submit([RED]).json["job_id"]
    assert server.call("GET", f"/jobs/{pending[:-1]}x").code == 404
    assert server.call("POST", f"/jobs/{pending}").code == 405
    assert server.call("GET", f"/jobs/{pending}/result").code == 409
    replies = [server.submit([RED]) for _ in range(8)]
    assert [r.code for r in replies] == [202] * 7 + [429]
    text = server.call("GET", "/metrics").body.decode()
    for code, method, route, count in (("202", "POST", "jobs_submit", 8), ("404", "GET", "jobs_status", 1),
                                       ("405", "POST", "unmatched", 1), ("409", "GET", "jobs_result", 1),
                                       ("429", "POST", "jobs_submit", 1)):
        line = f'service_http_requests_total{{code="{code}",method="{method}",route="{route}"}} {count:.1f}'
        assert line in text, (line, [t for t in text.splitlines() if t.startswith("service_http_requests_total")])
    server.workers.release_all()
