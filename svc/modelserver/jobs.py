"""The job table of asynchronous inference: admission, state, waiters, retention.

A job runs the same items through the same batching queue and worker pool as
a synchronous request (``Inference.run``); this module adds only what
docs/contract.md, Jobs, describes:

* admission: pending + running below ``async_max_queue``, checked and counted
  in one synchronous step on the reactor thread;
* states ``pending -> running -> done | failed | timeout``: only ``pending``
  enters ``running`` (when the first of its items reaches a worker); the
  terminal transition happens once, and it alone lowers the queue depth;
* the budget ``async_timeout`` covers waiting for a worker and inference: it
  is the deadline of the run, so items not yet started leave the queue;
* waiters that wake on the terminal state or at the end of their budget;
* retention: terminal jobs stay readable ``async_job_ttl`` ms, at most
  ``async_max_completed`` of them (least recently used first out);
* progress: each job owns a :class:`~svc.modelserver.progress.JobProgress`
  that the run hands to the batches of its items; worker threads write it
  (throttled), the status body reads it.

Time comes only from ``clock``, so every rule is unit-tested with task.Clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from svc.contract import jobid
from svc.contract import status as st
from svc.contract.envelope import ItemResult, ModelIdentity, outcome, result_envelope
from svc.contract.jobs import DONE, FAILED, PENDING, RUNNING, TERMINAL, TIMEOUT
from svc.contract.request import InferenceRequest
from svc.infra.reactors import cancelling
from svc.modelserver.progress import JobProgress

log = Logger()



class AsyncQueueFull(Exception):
    """Pending + running jobs are at ``async_max_queue``."""

    def __init__(self, depth: int, limit: int, retry_after: int) -> None:
        super().__init__(f"async queue full: {depth} jobs pending or running (async_max_queue {limit})")
        self.depth, self.limit, self.retry_after = depth, limit, retry_after


class Job:
    """One asynchronous job and its waiters."""

    def __init__(self, job_id: str, request: InferenceRequest, created: float) -> None:
        self.id = job_id
        self.request = request
        self.task_id = request.req_id = request.req_id or job_id  # its items carry it (a failed batch's line)
        self.state = PENDING
        self.created = created
        self.started: float | None = None
        self.finished: float | None = None
        self.error: str | None = None
        self.result: tuple[int, bytes] | None = None  # (HTTP code, encoded envelope) of a done job
        self.waiters: list[Deferred] = []
        self.run: Deferred | None = None
        self.expiry: Any = None
        self.progress = JobProgress(len(request.images))  # written by worker threads, read on polls

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def elapsed_ms(self, now: float) -> float:
        end = self.finished if self.finished is not None else now
        return round((end - self.created) * 1000.0, 3)


#: ``run(request, deadline, on_start, progress)``: Inference.run_job.
RunJob = Callable[[InferenceRequest, float | None, Callable[[], None], JobProgress], Deferred]


class JobTable:
    """Jobs of one model server, by id."""

    def __init__(
        self,
        clock: IReactorTime,
        run: RunJob,
        model: Callable[[], ModelIdentity],
        *,
        max_queue: int,
        timeout_ms: int,
        ttl_ms: int,
        max_completed: int,
        workers: int = 1,
        metrics: Any = None,
        owner: jobid.JobOwner | None = None,
        secret: str | None = None,
    ) -> None:
        """``owner``/``secret``: what new job ids name and are signed with (svc.contract.jobid)."""
        self.clock = clock
        self.owner = owner or jobid.JobOwner()
        self.secret = secret or jobid.new_secret()
        self._run = run
        self._model = model
        self.max_queue = max_queue
        self.timeout = timeout_ms / 1000.0 if timeout_ms else None
        self.ttl = ttl_ms / 1000.0
        self.max_completed = max_completed
        self.workers = workers
        self.metrics = metrics
        self.jobs: dict[str, Job] = {}
        self._completed: OrderedDict[str, None] = OrderedDict()
        self.depth = 0  # pending + running
        self.running = 0  # of which running (the supervisor's charts split the depth by it)
        self._mean_duration: float | None = None

    # -- admission -------------------------------------------------------------------

    def submit(self, request: InferenceRequest) -> Job:
        """Admit a validated request as a pending job, or raise AsyncQueueFull.

        The check and the increment are one step; the run starts two reactor
        turns later (:meth:`_after_reply`), after the 202 has been written.
        """
        if self.depth >= self.max_queue:
            raise AsyncQueueFull(self.depth, self.max_queue, self.retry_after())
        self.depth += 1
        job = Job(jobid.mint(self.owner, self.secret), request, self.clock.seconds())
        self.jobs[job.id] = job
        self._count("submitted")
        self._gauge()
        self.clock.callLater(0, self._after_reply, job)
        return job

    def _after_reply(self, job: Job) -> None:
        """One reactor turn after the submit: start the run on the next one.

        The reactor runs its due calls before each I/O pass, and a call made
        during that run waits for the next turn.  So the 202 (buffered by the
        route, written by the I/O pass) leaves before the run starts, and a
        burst of submits read in one pass is answered before any of its jobs
        starts a forward pass that competes with the reactor for the cores
        and the GIL (bench/README.md, jobs_burst).
        """
        self.clock.callLater(0, self._start_run, job)

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the mean job duration over the workers."""
        mean = self._mean_duration if self._mean_duration is not None else 1.0
        return min(60, max(1, math.ceil(mean / self.workers)))

    # -- running ------------------------------------------------------------------------

    def _start_run(self, job: Job) -> None:
        if job.terminal:
            return
        deadline = job.created + self.timeout if self.timeout is not None else None
        try:
            job.run = self._run(job.request, deadline, lambda: self.mark_running(job), job.progress)
        except Exception as e:  # noqa: BLE001 - the job fails, the server does not
            self.finish(job, FAILED, error=f"job could not start: {e}")
            return
        job.run.addCallbacks(lambda results: self._ran(job, results), lambda f: self._crashed(job, f))

    def mark_running(self, job: Job) -> None:
        """A worker took the first item of the job: pending -> running (only)."""
        if job.state != PENDING:
            return
        job.state = RUNNING
        job.started = self.clock.seconds()
        self.running += 1
        self._count("running")
        self._gauge()

    def _ran(self, job: Job, results: list[ItemResult]) -> None:
        if any(r.status is st.RUN_TIMEOUT for r in results):
            assert self.timeout is not None  # only a job with a deadline (async_timeout) runs out of time
            self.finish(job, TIMEOUT, error=f"async_timeout of {self.timeout * 1000:.0f} ms elapsed before the job finished")
            return
        top, _ = outcome(results)
        if top is not st.SUCCESS:
            first = next(r for r in results if r.status is not st.SUCCESS)
            self.finish(job, FAILED, error=f"every item failed: {first.status.text}: {first.error}")
            return
        now = self.clock.seconds()
        code, body = result_envelope(task_id=job.task_id, model=self._model(), items=results,
                                     server_time_ms=(now - job.created) * 1000.0)
        self.finish(job, DONE, result=(code, body))

    def _crashed(self, job: Job, failure: Any) -> None:
        if failure.check(CancelledError):
            return
        log.failure("job {job} crashed", failure, job=job.id)
        self.finish(job, FAILED, error=f"internal error: {failure.getErrorMessage()}")

    def finish(self, job: Job, state: str, *, error: str | None = None, result: tuple[int, bytes] | None = None) -> bool:
        """The one terminal transition: False (and no effect) when already terminal."""
        if job.terminal:
            return False
        if state not in TERMINAL:
            raise ValueError(f"{state!r} is not a terminal state")
        now = self.clock.seconds()
        if job.state == RUNNING:
            self.running -= 1
        job.state = state
        job.progress.close(done=state == DONE)  # a timed-out job's batch may still report: what is shown stays
        job.finished = now
        job.error = error
        job.result = result
        self.depth -= 1
        self._gauge()
        self._count(state)
        duration = now - job.created
        self._mean_duration = duration if self._mean_duration is None else 0.8 * self._mean_duration + 0.2 * duration
        if self.metrics is not None:
            self.metrics.async_duration.observe(duration * 1000.0)
        self._retain(job)
        waiters, job.waiters = job.waiters, []
        for d in waiters:
            d.callback(job)
        return True

    # -- reading -------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        """The job, if it exists and is retained (reading counts as use for the LRU)."""
        job = self.jobs.get(job_id)
        if job is not None and job.id in self._completed:
            self._completed.move_to_end(job.id)
        return job

    def wait(self, job: Job, budget: float) -> Deferred:
        """Fires with the job when it is terminal or after ``budget`` seconds."""
        d: Deferred = Deferred(lambda d: self._forget_waiter(job, d))
        if job.terminal or budget <= 0:
            d.callback(job)
            return d
        timer = self.clock.callLater(budget, self._wake, job, d)
        d.addBoth(cancelling(timer))
        job.waiters.append(d)
        return d

    def _wake(self, job: Job, d: Deferred) -> None:
        if d in job.waiters:
            job.waiters.remove(d)
        if not d.called:
            d.callback(job)

    @staticmethod
    def _forget_waiter(job: Job, d: Deferred) -> None:
        if d in job.waiters:
            job.waiters.remove(d)

    # -- retention ------------------------------------------------------------------------

    def _retain(self, job: Job) -> None:
        self._completed[job.id] = None
        job.expiry = self.clock.callLater(self.ttl, self._evict, job.id)
        while len(self._completed) > self.max_completed:
            oldest, _ = self._completed.popitem(last=False)
            self._evict(oldest)

    def _evict(self, job_id: str) -> None:
        self._completed.pop(job_id, None)
        job = self.jobs.pop(job_id, None)
        if job is not None and job.expiry is not None and job.expiry.active():
            job.expiry.cancel()

    # -- shutdown -------------------------------------------------------------------------------

    def wake_all(self) -> None:
        """Answer every parked waiter now (the server is stopping)."""
        for job in list(self.jobs.values()):
            waiters, job.waiters = job.waiters, []
            for d in waiters:
                if not d.called:
                    d.callback(job)

    # -- metrics ------------------------------------------------------------------------------

    def _count(self, state: str) -> None:
        if self.metrics is not None:
            self.metrics.async_jobs.labels(state).inc()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.async_depth.set(self.depth)
            self.metrics.async_running.set(self.running)
