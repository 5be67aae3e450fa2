"""Job progress on task.Clock: the throttled reporter, the engine's hook, the status field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent

from svc.contract.envelope import ModelIdentity
from svc.contract.jobs import DONE, RUNNING, TIMEOUT
from svc.contract.request import InferenceRequest, RequestValidator
from svc.contract.schema import ObjectSchema, object_schema
from svc.infra.process import inline_runner
from svc.model.api import report_progress, reporting_progress
from svc.modelserver.batching import BatchQueue
from svc.modelserver.engine import Engine
from svc.modelserver.inference import Inference
from svc.modelserver.job_routes import JobRoutes
from svc.modelserver.jobs import JobTable
from svc.modelserver.progress import BatchAbandoned, BatchProgress, JobProgress

# -- the reporter -----------------------------------------------------------------------------


def test_reports_closer_than_100_ms_are_dropped_but_the_last_step_is_always_written():
    clock = Clock()
    a, b = JobProgress(items=2), JobProgress()
    reporter = BatchProgress(clock, [a, b, a])  # both items of job a, the one of job b
    shown = []
    for step in range(1, 7):
        reporter(step, 6)
        shown.append(a.value)
        clock.advance(0.03)
    # written at 0 ms (first), 120 ms (>= 100 ms after 0), 150 ms (the last step); dropped in between
    assert shown == [(1, 6), (1, 6), (1, 6), (1, 6), (5, 6), (6, 6)]
    assert b.value == (6, 6) and len(reporter.targets) == 2


def test_a_job_whose_items_run_one_batch_after_another_shows_its_share_done():
    """3 images sampled one at a time (max_batch_size 1): the first image's last step showed 150 of 150
    while two images still waited, and the job stayed `running` for seconds at "done"."""
    clock = Clock()
    job = JobProgress(items=3)
    first = BatchProgress(clock, [job])
    first(150, 150)
    assert job.to_json() == {"step": 50, "steps": 150}
    second = BatchProgress(clock, [job])
    second(75, 150)
    assert job.to_json() == {"step": 75, "steps": 150}
    second(150, 150)
    third = BatchProgress(clock, [job])
    third(149, 150)
    assert job.to_json() == {"step": 149, "steps": 150}
    third(150, 150)
    assert job.to_json() == {"step": 150, "steps": 150}


def test_a_batch_that_reuses_a_finished_batchs_address_is_still_another_batch():
    clock = Clock()
    job = JobProgress(items=3)
    for _ in range(3):  # each reporter is dropped before the next is made: CPython may reuse its memory
        reporter = BatchProgress(clock, [job])
        reporter(150, 150)
        del reporter
    assert job.to_json() == {"step": 150, "steps": 150}


def test_two_batches_of_one_job_at_once_add_up_and_never_go_back():
    clock = Clock()
    job = JobProgress(items=4)
    left, right = BatchProgress(clock, [job, job]), BatchProgress(clock, [job, job])  # two workers
    left(10, 20)
    assert job.value == (5, 20)
    right(4, 20)
    assert job.value == (7, 20)  # (2 x 10 + 2 x 4) / 4 items of 20 steps
    right(20, 20)
    left(20, 20)
    assert job.value == (20, 20)


def test_a_report_exactly_100_ms_after_the_last_write_is_written():
    clock = Clock()
    target = JobProgress()
    reporter = BatchProgress(clock, [target])
    reporter(1, 10)
    clock.advance(0.1)
    reporter(2, 10)
    assert target.value == (2, 10)


def test_reports_that_are_not_progress_are_ignored_and_a_step_past_the_end_is_the_end():
    clock = Clock()
    target = JobProgress()
    reporter = BatchProgress(clock, [target])
    for step, steps in ((1, 0), (-1, 5), ("x", 5), (True, 5), (None, 5)):
        reporter(step, steps)
    assert target.value is None and target.to_json() is None
    reporter(9, 4)
    assert target.to_json() == {"step": 4, "steps": 4}


def test_report_progress_is_a_no_op_without_a_reporter_and_the_reporter_is_scoped():
    seen = []
    report_progress(1, 2)  # outside a batch: nothing happens
    with reporting_progress(lambda step, steps: seen.append(("outer", step, steps))):
        with reporting_progress(lambda step, steps: seen.append(("inner", step, steps))):
            report_progress(1, 3)
        report_progress(2, 3)
    report_progress(3, 3)
    assert seen == [("inner", 1, 3), ("outer", 2, 3)]


# -- through the job table, the batching queue and the engine ----------------------------------------


class HeldRunner:
    """The worker pool: a call runs when the test says (in the test's thread, standing in for a worker)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, f, *args):
        d: Deferred = Deferred()
        self.calls.append((f, args, d))
        return d

    def run_next(self) -> None:
        f, args, d = self.calls.pop(0)
        d.callback(f(*args))


class SteppingModel:
    """Reports ``plan`` (step, steps) during ``predict``, the clock advancing 40 ms before each report."""

    def __init__(self, clock: Clock, jobs: list) -> None:
        self.clock = clock
        self.jobs = jobs
        self.plan: list[tuple[int, int]] = []
        self.seen: list[list] = []  # what a poll would show for each job after each report

    def preprocess(self, image, params):
        return "input"

    def batch_key(self, params):
        return None

    def predict(self, inputs, params):
        for step, steps in self.plan:
            self.clock.advance(0.04)
            report_progress(step, steps)
            self.seen.append([job.progress.to_json() for job in self.jobs])
        return ["out"] * len(inputs)

    def postprocess(self, output, params, options):
        report_progress(99, 99)  # outside predict: no reporter, ignored
        return {"v": output}


class Factory:
    needs_image = False
    data_schema = {"type": "object"}


def setup(clock: Clock, timeout_ms: int = 0):
    runner = HeldRunner()
    engine = Engine(Factory(), {}, "cpu", runner, clock=clock)
    queue = BatchQueue(clock, engine.run_batch, workers=1, max_batch_size=2, max_batch_delay_ms=10)
    validator = RequestValidator(ObjectSchema(object_schema({})), ObjectSchema(object_schema({})), 16)
    inference = Inference(clock=clock, engine=engine, validator=validator, queue=queue, run_decode=inline_runner,
                          max_image_pixels=10**6)
    jobs = JobTable(clock, inference.run_job, lambda: ModelIdentity("M", "v"), max_queue=8, timeout_ms=timeout_ms,
                    ttl_ms=60_000, max_completed=10)
    model = SteppingModel(clock, [])
    engine.model = model
    routes = JobRoutes(jobs, clock=clock, identity=lambda: ModelIdentity("M", "v"), task_id=None, authenticate=None,
                       check_admitting=None, draining=None, parse=inference.parse)
    return jobs, runner, model, routes.status_body, inference


def test_every_job_of_a_batch_sees_the_batch_progress_throttled_and_the_final_poll_shows_the_last_step():
    clock = Clock()
    jobs, runner, model, status, _ = setup(clock)
    first = jobs.submit(InferenceRequest(images=["aGk="], req_id=None))
    a = jobs.submit(InferenceRequest(images=["aGk="], req_id=None))
    b = jobs.submit(InferenceRequest(images=["aGk="], req_id=None))
    model.jobs = [first, a, b]
    clock.advance(0)
    assert first.state == RUNNING and len(runner.calls) == 1  # a and b wait for the worker
    assert status(a)["progress"] is None and status(first)["progress"] is None

    runner.run_next()  # the first job's batch reports nothing: its progress stays null
    assert first.state == DONE and status(first)["progress"] is None
    assert a.state == RUNNING and b.state == RUNNING and len(runner.calls) == 1  # a and b share the next batch

    model.plan = [(step, 5) for step in range(1, 6)]
    runner.run_next()
    one, four, five = {"step": 1, "steps": 5}, {"step": 4, "steps": 5}, {"step": 5, "steps": 5}
    # 40 ms between reports: written at 40 ms and 160 ms, and the last step at 200 ms
    assert model.seen == [[None, one, one], [None, one, one], [None, one, one], [None, four, four],
                          [None, five, five]]
    assert a.state == DONE and b.state == DONE
    assert status(a)["progress"] == five and status(b)["progress"] == five
    assert status(first)["progress"] is None


def test_a_synchronous_requests_reports_write_no_progress():
    """A synchronous request's batch has a reporter (its client may go away: below) that writes no job's progress."""
    clock = Clock()
    _, runner, model, _, inference = setup(clock)
    model.plan = [(1, 2), (2, 2)]
    answered = []
    inference.run(InferenceRequest(images=["aGk="], req_id=None), deadline=None).addCallback(answered.append)
    _, args, _ = runner.calls[0]
    assert isinstance(args[-1], BatchProgress) and args[-1].targets == ()
    runner.run_next()
    assert answered[0][0].data == {"v": "out"} and len(model.seen) == 2


class LeavingModel(SteppingModel):
    """Its clients go away (their requests' Deferreds cancelled, as Klein does on a lost connection) during
    the step named in ``leave``."""

    def __init__(self, clock: Clock, leave: dict) -> None:
        super().__init__(clock, [])
        self.leave = leave  # step -> the requests' Deferreds to cancel then

    def predict(self, inputs, params):
        for step, steps in self.plan:
            self.clock.advance(0.04)
            for d in self.leave.get(step, ()):
                d.cancel()
            report_progress(step, steps)
            self.seen.append(step)
        return ["out"] * len(inputs)


@pytest.mark.parametrize("deadline", [None, 60.0])
def test_a_synchronous_request_whose_client_went_away_stops_its_batch_at_the_next_report(deadline):
    """A soak probe: a diffusion run whose client left (logged 499) kept its worker to its deadline, or to its
    last step without one, while other requests waited (docs/api.md, "Work that nobody waits for stops")."""
    clock = Clock()
    _, runner, _, _, inference = setup(clock)
    model = inference.engine.model = LeavingModel(clock, {})
    model.plan = [(step, 10) for step in range(1, 11)]
    d = inference.run(InferenceRequest(images=["aGk="], req_id=None),
                      deadline=None if deadline is None else clock.seconds() + deadline)
    gone = []
    d.addErrback(lambda f: gone.append(f.trap(CancelledError)))
    model.leave = {3: [d]}
    clock.advance(0.01)
    with capturedLogs() as events:
        runner.run_next()
    assert gone and model.seen == [1, 2]  # the report of step 3, after the client left, stopped predict
    assert [formatEvent(e) for e in events] == [
        "a batch of 1 stopped: every item of the batch is past its deadline or its client went away (reported step "
        "3 of 10)"]


def test_a_batch_goes_on_while_one_of_its_requests_still_waits():
    """Two requests in one batch: the first's client leaves, the second's still waits, so every step runs and the
    second gets its result."""
    clock = Clock()
    _, runner, _, _, inference = setup(clock)
    model = inference.engine.model = LeavingModel(clock, {})
    inference.run(InferenceRequest(images=["aGk="], req_id=None), deadline=None)  # the worker busy meanwhile
    first = inference.run(InferenceRequest(images=["aGk="], req_id=None), deadline=None)
    first.addErrback(lambda f: f.trap(CancelledError))
    answered = []
    inference.run(InferenceRequest(images=["aGk="], req_id=None), deadline=None).addCallback(answered.append)
    runner.run_next()  # the first batch ends: the two waiting requests make the next one
    _, args, _ = runner.calls[0]
    assert len(args[0]) == 2
    model.plan = [(step, 5) for step in range(1, 6)]
    model.leave = {2: [first]}
    runner.run_next()
    assert model.seen == [1, 2, 3, 4, 5] and answered[0][0].data == {"v": "out"}


def test_a_jobs_progress_never_goes_back_and_stays_once_the_job_is_terminal():
    """Two workers may run batches of one job, each writing its own step (428, 425, 616 of 1000 were seen on a
    job that had timed out already)."""
    progress = JobProgress()
    for value in ((428, 1000), (425, 1000), (3, 5), (616, 1000)):
        progress.write(value)
    assert progress.to_json() == {"step": 616, "steps": 1000}  # (425, 1000) was behind; 3 of 5 is ahead
    progress.close()
    progress.write((999, 1000))
    assert progress.to_json() == {"step": 616, "steps": 1000}


def test_a_report_after_every_items_deadline_stops_the_batch():
    clock = Clock()
    reporter = BatchProgress(clock, [], items=[SimpleNamespace(deadline=0.5), SimpleNamespace(deadline=1.0)])
    reporter(1, 5)
    clock.advance(0.6)
    reporter(2, 5)  # the second item's deadline has not passed: someone still waits
    clock.advance(0.4)
    try:
        reporter(3, 5)
    except BatchAbandoned as e:
        assert str(e) == "every item of the batch is past its deadline or its client went away (reported step 3 of 5)"
    else:
        raise AssertionError("the reporter let a batch past its deadline go on")


def test_a_job_past_its_timeout_stops_at_its_next_step_and_its_progress_stays():
    """A timed-out job's batch held the worker to its last step (a SAM_AMG image: minutes), reporting all along."""
    clock = Clock()
    jobs, runner, model, status, _ = setup(clock, timeout_ms=100)
    job = jobs.submit(InferenceRequest(images=["aGk="], req_id=None))
    model.jobs = [job]
    clock.advance(0)
    model.plan = [(step, 10) for step in range(1, 11)]  # 40 ms a step: the 100 ms budget ends in step 3
    runner.run_next()
    assert job.state == TIMEOUT
    assert len(model.seen) == 2  # steps 1 and 2 ran; the report of step 3, past the deadline, stopped predict
    assert status(job)["progress"] == {"step": 1, "steps": 10}  # written at 40 ms; 80 ms was throttled; then still
    assert runner.calls == []


def test_a_synchronous_request_past_its_deadline_stops_the_work_it_no_longer_waits_for():
    clock = Clock()
    _, runner, model, _, inference = setup(clock)
    model.plan = [(step, 10) for step in range(1, 11)]
    answered = []
    inference.run(InferenceRequest(images=["aGk="], req_id=None), deadline=clock.seconds() + 0.1).addCallback(
        answered.append)
    clock.advance(0.01)  # the batch window
    with capturedLogs() as events:
        runner.run_next()
    assert len(model.seen) == 2  # stopped at the report of step 3, at 120 ms
    assert [result.status.code for result in answered[0]] == [4]  # answered at its deadline, RUN_TIMEOUT
    assert [formatEvent(e) for e in events] == [  # logged once, on the reactor's side of the batch
        "a batch of 1 stopped: every item of the batch is past its deadline or its client went away (reported step 3 of 10)"]


def test_postprocessing_past_every_deadline_stops_too():
    """SAM_AMG's postprocess encodes every mask of an image (12,288 at points_per_side 64): minutes of work for
    requests answered already."""
    clock = Clock()
    _, runner, model, _, inference = setup(clock)
    encoded = []
    model.postprocess = lambda output, params, options: (encoded.append(output), clock.advance(0.2), {"v": output})[2]
    answered = []
    inference.run(InferenceRequest(images=["aGk=", "aGk=", "aGk="], req_id=None),
                  deadline=clock.seconds() + 0.1).addCallback(answered.append)
    clock.advance(0.01)
    runner.run_next()
    assert len(encoded) == 1  # the first item's took it past the deadline: the other two were not encoded
    assert [result.status.code for result in answered[0]] == [4, 4, 4]


def test_a_done_job_whose_items_did_not_all_run_shows_its_last_step():
    """An item that failed before it ran (not base64) never reports its share: a done job showed 2 of 4."""
    progress = JobProgress(items=2)
    progress.write((4, 4), count=1)
    assert progress.to_json() == {"step": 2, "steps": 4}
    progress.close(done=True)
    assert progress.to_json() == {"step": 4, "steps": 4}
    quiet = JobProgress(items=2)  # a model that reports nothing stays null
    quiet.close(done=True)
    assert quiet.to_json() is None
    failed = JobProgress(items=2)  # failed or timed out: what was shown stays
    failed.write((4, 4), count=1)
    failed.close()
    assert failed.to_json() == {"step": 2, "steps": 4}


def test_a_done_job_with_an_item_that_failed_before_it_ran_ends_at_its_last_step():
    clock = Clock()
    jobs, runner, model, status, _ = setup(clock)
    job = jobs.submit(InferenceRequest(images=["aGk=", "!!!"], req_id=None))
    model.jobs = [job]
    model.plan = [(1, 2), (2, 2)]
    clock.advance(0)
    runner.run_next()
    assert job.state == DONE and status(job)["progress"] == {"step": 2, "steps": 2}
