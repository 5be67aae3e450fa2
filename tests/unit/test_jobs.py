"""The job table on task.Clock: every transition, admission, waiters, retention."""

from __future__ import annotations

import json

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from svc.contract import status as st
from svc.contract.envelope import TIMED_OUT, ItemResult, ModelIdentity
from svc.contract.jobs import DONE, FAILED, PENDING, RUNNING, TIMEOUT
from svc.contract.request import InferenceRequest
from svc.modelserver.jobs import AsyncQueueFull, JobTable


class FakeRun:
    """Stands in for Inference.run_job: the test decides when items start and end."""

    def __init__(self) -> None:
        self.calls: list[tuple[InferenceRequest, float | None, object, Deferred]] = []

    def __call__(self, request, deadline, on_start, progress=None):
        d: Deferred = Deferred()
        self.calls.append((request, deadline, on_start, d, progress))
        return d

    def start(self, i=-1):
        self.calls[i][2]()

    def finish(self, i=-1, results=None):
        self.calls[i][3].callback(results or [ItemResult(st.SUCCESS, {"ok": 1})])


class Metrics:
    def __init__(self):
        self.counts: dict[str, int] = {}
        self.depth = []
        self.durations = []
        self.running = []
        outer = self

        class Counter:
            def labels(self, state):
                class C:
                    def inc(self_inner):
                        outer.counts[state] = outer.counts.get(state, 0) + 1
                return C()

        class Gauge:
            def set(self, v):
                outer.depth.append(v)

        class Hist:
            def observe(self, v):
                outer.durations.append(v)

        class Running:
            def set(self, v):
                outer.running.append(v)

        self.async_jobs, self.async_depth, self.async_duration = Counter(), Gauge(), Hist()
        self.async_running = Running()


def table(clock, **kw):
    run = FakeRun()
    kw.setdefault("max_queue", 8)
    kw.setdefault("timeout_ms", 10_000)
    kw.setdefault("ttl_ms", 60_000)
    kw.setdefault("max_completed", 100)
    metrics = Metrics()
    return JobTable(clock, run, lambda: ModelIdentity("M", "v"), metrics=metrics, **kw), run, metrics


def request(req_id=None):
    return InferenceRequest(images=["aGk="], req_id=req_id)


def test_successful_job_goes_pending_running_done_and_counts_each_once():
    clock = Clock()
    jobs, run, metrics = table(clock)
    job = jobs.submit(request("r1"))
    assert job.id.startswith("job_") and job.state == PENDING and jobs.depth == 1
    assert run.calls == []  # the run starts after the 202, two reactor turns later
    clock.advance(0)
    assert run.calls[0][1] == 10.0  # deadline: created + async_timeout
    run.start()
    run.start()  # a second item starting changes nothing
    assert job.state == RUNNING
    clock.advance(2)
    run.finish()
    assert job.state == DONE and jobs.depth == 0
    code, body = job.result[0], json.loads(job.result[1])
    assert code == 200 and body["task_id"] == "r1" and body["results"] == [{"status": 0, "data": {"ok": 1}}]
    assert metrics.counts == {"submitted": 1, "running": 1, "done": 1}
    assert metrics.durations == [2000.0]
    assert metrics.running[-2:] == [1, 0]  # service_async_running_jobs: up when it ran, down when it ended
    assert job.elapsed_ms(clock.seconds() + 50) == 2000.0  # frozen once terminal


class ReactorTurns(Clock):
    """A Clock that runs calls as the reactor does: per turn, the calls due when it begins.

    twisted's reactor runs its due calls, then its I/O pass (which writes
    what routes answered); a call made while the due calls run waits for the
    next turn.  task.Clock.advance runs such a call at once, so it cannot
    tell a reply written before a run from one written after.
    """

    def turn(self) -> None:
        due = [call for call in self.calls if call.getTime() <= self.seconds()]
        for call in due:
            self.calls.remove(call)
            call.called = 1
            call.func(*call.args, **call.kw)


def test_a_burst_of_submits_is_answered_before_any_of_its_runs_starts():
    clock = ReactorTurns()
    jobs, run, _ = table(clock, max_queue=100)
    burst = [jobs.submit(request()) for _ in range(100)]  # read in one I/O pass, their 202s buffered
    clock.turn()  # the turn whose I/O pass writes those 202s
    assert run.calls == [] and {job.state for job in burst} == {PENDING}
    clock.turn()
    assert len(run.calls) == 100 and [c[0] for c in run.calls] == [job.request for job in burst]


def test_only_pending_enters_running():
    clock = Clock()
    jobs, run, _ = table(clock)
    job = jobs.submit(request())
    clock.advance(0)
    jobs.finish(job, FAILED, error="x")
    run.start()
    assert job.state == FAILED


def test_terminal_transition_happens_once_and_depth_drops_once():
    clock = Clock()
    jobs, run, metrics = table(clock)
    job = jobs.submit(request())
    other = jobs.submit(request())
    assert jobs.finish(job, FAILED, error="first") is True
    assert jobs.finish(job, DONE, result=(200, {})) is False
    assert jobs.finish(job, TIMEOUT, error="late") is False
    assert (job.state, job.error, jobs.depth) == (FAILED, "first", 1)
    assert metrics.counts.get("failed") == 1 and "timeout" not in metrics.counts
    assert other.state == PENDING
    with pytest.raises(ValueError):
        jobs.finish(other, RUNNING)


def test_pending_and_running_may_fail_or_time_out():
    clock = Clock()
    jobs, run, _ = table(clock)
    pending, running = jobs.submit(request()), jobs.submit(request())
    clock.advance(0)
    run.start(1)
    run.finish(0, [TIMED_OUT])
    run.finish(1, [ItemResult(st.ENGINE_ERROR, None, "boom")])
    assert pending.state == TIMEOUT and "async_timeout" in pending.error
    assert running.state == FAILED and "ENGINE_ERROR: boom" in running.error
    assert jobs.depth == 0


def test_partly_failed_items_still_make_a_done_job():
    clock = Clock()
    jobs, run, _ = table(clock)
    job = jobs.submit(InferenceRequest(images=["a", "b"], req_id=None))
    clock.advance(0)
    run.finish(results=[ItemResult(st.SUCCESS, {}), ItemResult(st.INVALID_IMAGE, None, "bad")])
    assert job.state == DONE and json.loads(job.result[1])["status"] == 0 and job.task_id == job.id


def test_admission_is_atomic_under_interleaved_submits():
    clock = Clock()
    jobs, run, _ = table(clock, max_queue=3)
    admitted, refused = [], []
    for i in range(12):
        try:
            admitted.append(jobs.submit(request()))
        except AsyncQueueFull as e:
            refused.append(e)
            assert "async queue full" in str(e) and 1 <= e.retry_after <= 60
        assert jobs.depth <= 3
        if i == 5:  # one job ends in the middle of the burst
            clock.advance(0)
            run.finish(0)
    assert len(admitted) == 4 and len(refused) == 8


def test_queue_full_retry_after_is_the_mean_job_duration_over_the_workers_clamped_to_1_60():
    """docs/api.md: Retry-After = mean job duration / workers, clamped to 1..60 s (the mean weighs new jobs 0.2)."""
    clock = Clock()
    jobs, run, _ = table(clock, max_queue=1, workers=2)

    def retry_after_of_a_full_queue() -> int:
        with pytest.raises(AsyncQueueFull) as e:
            jobs.submit(request())
        return e.value.retry_after

    seen = []
    for seconds in (10.0, 20.0, 13.0, 1000.0):
        job = jobs.submit(request())
        clock.advance(0)
        run.start()
        seen.append(retry_after_of_a_full_queue())  # the mean of the jobs finished before this one
        clock.advance(seconds)
        run.finish()
        assert job.state == DONE
    jobs.submit(request())
    seen.append(retry_after_of_a_full_queue())
    # no job yet: 1 s / 2 -> 1; 10 s / 2 = 5; (0.8*10 + 0.2*20) / 2 = 6; (0.8*12 + 0.2*13) / 2 = 6.1 -> 7;
    # (0.8*12.2 + 0.2*1000) / 2 = 104.88 -> 60
    assert seen == [1, 5, 6, 7, 60]


def test_queue_full_retry_after_is_at_least_one_second():
    clock = Clock()
    jobs, run, _ = table(clock, max_queue=1)
    jobs.submit(request())
    clock.advance(0.25)
    run.finish()
    jobs.submit(request())
    with pytest.raises(AsyncQueueFull) as e:
        jobs.submit(request())
    assert (e.value.retry_after, str(e.value).count("async queue full")) == (1, 1)


def test_waiters_wake_on_the_terminal_state_all_with_the_same_state():
    clock = Clock()
    jobs, run, _ = table(clock)
    job = jobs.submit(request())
    clock.advance(0)
    got = []
    for _ in range(5):
        jobs.wait(job, 30).addCallback(lambda j: got.append(j.state))
    clock.advance(3)
    assert got == []
    run.finish()
    assert got == [DONE] * 5 and job.waiters == []


def test_wait_returns_at_the_end_of_its_budget_with_a_non_terminal_state():
    clock = Clock()
    jobs, run, _ = table(clock)
    job = jobs.submit(request())
    clock.advance(0)
    run.start()
    got = []
    jobs.wait(job, 1.5).addCallback(lambda j: got.append((j.state, clock.seconds())))
    clock.advance(1.4)
    assert got == []
    clock.advance(0.1)
    assert got == [(RUNNING, 1.5)] and job.waiters == []


def test_wait_on_a_terminal_job_or_with_zero_budget_returns_at_once():
    clock = Clock()
    jobs, run, _ = table(clock)
    job = jobs.submit(request())
    got = []
    jobs.wait(job, 0).addCallback(lambda j: got.append(j.state))
    jobs.finish(job, FAILED, error="x")
    jobs.wait(job, 30).addCallback(lambda j: got.append(j.state))
    assert got == [PENDING, FAILED]


def test_a_cancelled_waiter_leaves_nothing_behind():
    clock = Clock()
    jobs, run, _ = table(clock)
    job = jobs.submit(request())
    before = list(clock.getDelayedCalls())
    d = jobs.wait(job, 30)
    timers = [c for c in clock.getDelayedCalls() if c not in before]
    assert [c.getTime() for c in timers] == [30.0] and job.waiters == [d]
    d.addErrback(lambda f: None)
    d.cancel()
    assert job.waiters == [] and not timers[0].active()
    assert clock.getDelayedCalls() == before  # the wait's timer is gone; the job's own start call stays


def test_finished_jobs_expire_after_the_ttl():
    clock = Clock()
    jobs, run, _ = table(clock, ttl_ms=5000)
    job = jobs.submit(request())
    jobs.finish(job, DONE, result=(200, {}))
    clock.advance(4.9)
    assert jobs.get(job.id) is job
    clock.advance(0.1)
    assert jobs.get(job.id) is None


def test_lru_cap_evicts_the_least_recently_read_finished_job():
    clock = Clock()
    jobs, run, _ = table(clock, max_completed=2)
    a, b, c = (jobs.submit(request()) for _ in range(3))
    jobs.finish(a, DONE, result=(200, {}))
    jobs.finish(b, DONE, result=(200, {}))
    jobs.get(a.id)  # a is now more recently used than b
    jobs.finish(c, DONE, result=(200, {}))
    assert jobs.get(b.id) is None and jobs.get(a.id) is a and jobs.get(c.id) is c


def test_pending_and_running_jobs_are_never_evicted():
    clock = Clock()
    jobs, run, _ = table(clock, max_completed=1, ttl_ms=1)
    pending = jobs.submit(request())
    for _ in range(3):
        jobs.finish(jobs.submit(request()), DONE, result=(200, {}))
    clock.advance(10)
    assert jobs.get(pending.id) is pending


def test_async_timeout_zero_means_no_deadline():
    clock = Clock()
    jobs, run, _ = table(clock, timeout_ms=0)
    jobs.submit(request())
    clock.advance(0)
    assert run.calls[0][1] is None


def test_a_run_that_raises_fails_the_job_not_the_table():
    clock = Clock()

    def broken(request, deadline, on_start, progress):
        raise RuntimeError("no room")

    jobs = JobTable(clock, broken, lambda: ModelIdentity("M", "v"), max_queue=2, timeout_ms=0, ttl_ms=1000,
                    max_completed=5)
    job = jobs.submit(request())
    clock.advance(0)
    assert job.state == FAILED and "no room" in job.error and jobs.depth == 0


# -- with the real batching queue -----------------------------------------------------------


def real_table(clock, **kw):
    from tests.unit.test_batching import inference

    inf, runner = inference(clock, max_batch_size=1)
    jobs = JobTable(clock, inf.run_job, lambda: ModelIdentity("M", "v"), max_queue=8, ttl_ms=60_000,
                    max_completed=10, **kw)
    return jobs, inf, runner


def test_timeout_while_pending_takes_the_items_out_of_the_queue():
    clock = Clock()
    jobs, inf, runner = real_table(clock, timeout_ms=1000)
    first = jobs.submit(request())
    second = jobs.submit(request())
    clock.advance(0)
    assert first.state == RUNNING and second.state == PENDING and inf.queue.waiting == 1
    clock.advance(1.0)
    assert first.state == TIMEOUT and second.state == TIMEOUT
    assert inf.queue.waiting == 0
    runner.finish()  # the started batch ends; the second job's item never ran
    assert len(runner.batches) == 1 and first.state == TIMEOUT


def test_job_runs_through_the_shared_queue_to_done():
    clock = Clock()
    jobs, inf, runner = real_table(clock, timeout_ms=0)
    job = jobs.submit(InferenceRequest(images=["aGk=", "aGk="], req_id="x"))
    clock.advance(0)
    assert job.state == RUNNING
    runner.finish()
    assert job.state == RUNNING
    runner.finish()
    assert job.state == DONE and [r["status"] for r in json.loads(job.result[1])["results"]] == [0, 0]
