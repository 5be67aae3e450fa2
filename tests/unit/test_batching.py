"""The batching queue and the request deadline, driven by task.Clock."""

from __future__ import annotations

import json

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from svc.contract import status as st
from svc.contract.envelope import ItemResult, ModelIdentity, result_envelope
from svc.contract.request import InferenceRequest, RequestValidator
from svc.contract.schema import ObjectSchema, object_schema
from svc.infra.process import inline_runner
from svc.modelserver.batching import BatchQueue, Item, QueueFull
from svc.modelserver.engine import Engine
from svc.modelserver.inference import Inference


class Runner:
    """A batch runner whose batches finish when the test says so."""

    def __init__(self) -> None:
        self.batches: list[list[Item]] = []
        self.pending: list[Deferred] = []

    def __call__(self, batch: list[Item]) -> Deferred:
        self.batches.append(batch)
        d: Deferred = Deferred()
        self.pending.append(d)
        return d

    def finish(self, index: int = 0) -> None:
        batch = self.batches[len(self.batches) - len(self.pending) + index]
        self.pending.pop(index).callback([ItemResult(st.SUCCESS, {"v": item.input}) for item in batch])

    def names(self) -> list[list]:
        return [[item.input for item in batch] for batch in self.batches]


def make(clock: Clock, **kw) -> tuple[BatchQueue, Runner]:
    runner = Runner()
    kw.setdefault("max_batch_size", 4)
    kw.setdefault("max_batch_delay_ms", 10)
    return BatchQueue(clock, runner, **kw), runner


def item(name, results: dict, key=None, deadline=None) -> Item:
    return Item(name, {}, {}, key, deadline, lambda r: results.__setitem__(name, r))


def test_idle_worker_runs_a_lone_item_at_once():
    clock, results = Clock(), {}
    q, runner = make(clock)
    q.admit(1).enqueue([item("a", results)])
    assert runner.names() == [["a"]]


def test_batch_composition_at_the_window_edge():
    clock, results = Clock(), {}
    q, runner = make(clock)
    a, b, c = q.admit(1), q.admit(1), q.admit(1)  # three requests still decoding
    a.enqueue([item("A", results)])
    assert runner.names() == []  # waits: B and C are on their way
    clock.advance(0.0099)
    b.enqueue([item("B", results)])
    assert runner.names() == []
    clock.advance(0.0001)  # the window of A closes at exactly 10 ms
    assert runner.names() == [["A", "B"]]
    clock.advance(0.0001)
    c.enqueue([item("C", results)])  # worker busy: C waits
    assert runner.names() == [["A", "B"]]
    runner.finish()
    assert runner.names() == [["A", "B"], ["C"]]
    assert results["A"].status is st.SUCCESS and "C" not in results


def test_full_batch_starts_without_waiting_for_the_window():
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=2)
    first, _other = q.admit(2), q.admit(1)
    first.enqueue([item("a", results), item("b", results)])
    assert runner.names() == [["a", "b"]]


def test_batches_grow_while_the_worker_is_busy():
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=3)
    q.admit(1).enqueue([item(0, results)])
    for i in range(1, 6):
        q.admit(1).enqueue([item(i, results)])
    assert runner.names() == [[0]]
    runner.finish()
    assert runner.names() == [[0], [1, 2, 3]]
    runner.finish()
    assert runner.names() == [[0], [1, 2, 3], [4, 5]]


@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_the_worker_takes_its_next_batch_before_the_replies_are_written(outcome):
    """The reactor writes a finished batch's replies while the worker already decodes the next batch."""
    clock, seen = Clock(), []
    q, runner = make(clock, max_batch_size=1)

    def answered(name):
        return lambda result: seen.append((name, result.status, runner.names()))

    q.admit(1).enqueue([Item("a", {}, {}, None, None, answered("a"))])
    q.admit(1).enqueue([Item("b", {}, {}, None, None, answered("b"))])
    if outcome == "success":
        runner.finish()
    else:
        runner.pending.pop(0).errback(RuntimeError("boom"))
    status = st.SUCCESS if outcome == "success" else st.ENGINE_ERROR
    assert seen == [("a", status, [["a"], ["b"]])]  # b's batch had started when a was answered
    assert q.running_batches == 1


def test_different_keys_never_share_a_batch_and_order_is_kept():
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=4)
    q.admit(1).enqueue([item("busy", results)])
    q.admit(4).enqueue([item("x1", results, "x"), item("y1", results, "y"), item("x2", results, "x"), item("y2", results, "y")])
    runner.finish()
    assert runner.names()[1] == ["x1", "x2"]
    runner.finish()
    assert runner.names()[2] == ["y1", "y2"]


def test_expired_items_never_reach_the_model():
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=4)
    q.admit(1).enqueue([item("busy", results)])
    q.admit(2).enqueue([item("late", results, deadline=1.0), item("fine", results, deadline=10.0)])
    clock.advance(2.0)
    runner.finish()
    assert runner.names() == [["busy"], ["fine"]]
    assert results["late"].status is st.RUN_TIMEOUT
    assert q.waiting == 0


def test_a_started_batch_is_not_cancelled_by_its_deadline():
    clock, results = Clock(), {}
    q, runner = make(clock)
    q.admit(1).enqueue([item("a", results, deadline=1.0)])
    clock.advance(5.0)
    runner.finish()
    assert results["a"].status is st.SUCCESS


def test_engine_failure_fails_only_that_batch():
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=1)
    q.admit(1).enqueue([item("a", results)])
    q.admit(1).enqueue([item("b", results)])
    runner.pending.pop(0).errback(RuntimeError("boom"))
    runner.finish()
    assert results["a"].status is st.ENGINE_ERROR and results["b"].status is st.SUCCESS


def test_queue_depth_never_exceeds_the_limit_and_retry_after_is_clamped():
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=1, max_queue_depth=4)
    q.observe_throughput(2.0, 1)  # 2 s per item
    q.admit(1).enqueue([item("running", results)])
    admitted = []
    for n in (2, 3, 1, 2, 1, 1):
        try:
            admitted.append(q.admit(n))
        except QueueFull as e:
            assert 1 <= e.retry_after <= 60
            assert q.waiting + n > 4
        assert q.waiting <= 4
    assert [a.n for a in admitted] == [2, 1, 1]
    with pytest.raises(QueueFull) as e:
        q.admit(1)
    assert e.value.retry_after == 8  # 4 waiting items x 2 s, one worker


@pytest.mark.parametrize("per_item, waiting, expected", [(0.0001, 1, 1), (1000.0, 1, 60), (0.4, 5, 2)])
def test_retry_after_is_the_drain_time_clamped_to_1_60(per_item, waiting, expected):
    q, _ = make(Clock(), max_queue_depth=100)
    q.observe_throughput(per_item, 1)
    q.admit(waiting)
    assert q.retry_after() == expected


def test_released_admission_frees_its_room():
    q, _ = make(Clock(), max_queue_depth=2)
    a = q.admit(2)
    with pytest.raises(QueueFull):
        q.admit(1)
    a.release()
    q.admit(2)


def test_job_items_neither_meet_nor_fill_the_limit_of_synchronous_requests():
    """A job submitter's items (admitted without the limit: jobs have async_max_queue) pushed the count
    over max_queue_depth, and every synchronous request was then 429 while they waited."""
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=1, max_queue_depth=2)
    q.admit(1).enqueue([item("busy", results)])  # the worker is taken: everything after it waits
    jobs = q.admit(4, enforce_limit=False)  # four job items, decoding
    jobs_more = q.admit(3, enforce_limit=False)
    assert q.waiting == 7
    sync = q.admit(2)  # the limit is the synchronous requests' own: room for 2
    with pytest.raises(QueueFull) as e:
        q.admit(1)
    assert str(e.value) == "wait queue full: 2 items waiting, limit 2"
    jobs.enqueue([item(f"job{i}", results) for i in range(4)])
    jobs_more.enqueue([item("job4", results)])  # two of three failed to decode: their room ends too
    sync.enqueue([item("a", results), item("b", results)])
    assert q.waiting == 7
    with pytest.raises(QueueFull):
        q.admit(1)
    for _ in range(5):  # the busy item and the job items run, in order; the sync items are still waiting
        runner.finish()
    assert runner.names()[-1] == ["job4"] and q.waiting == 2
    with pytest.raises(QueueFull):
        q.admit(1)
    runner.finish()  # "a" starts
    q.admit(1)  # room again
    q.drop(next(i for i in q._queue if i.input == "b"))
    assert q.waiting == 1 and q._unlimited == 0


# -- a whole request through Inference: 68 versus 4 -----------------------------------


class Model:
    def preprocess(self, image, params):
        return "input"

    def batch_key(self, params):
        return None


class Factory:
    needs_image = False
    data_schema = {"type": "object"}


def inference(clock: Clock, decode_in_worker: bool = False, **kw) -> tuple[Inference, Runner]:
    """An Inference over a loaded engine whose batches go to the test's Runner (the engine runs none)."""
    q, runner = make(clock, **kw)
    engine = Engine(Factory(), {}, "cpu", inline_runner)
    engine.model = Model()
    validator = RequestValidator(ObjectSchema(object_schema({})), ObjectSchema(object_schema({})), 16)
    inf = Inference(clock=clock, engine=engine, validator=validator, queue=q, run_decode=inline_runner,
                    max_image_pixels=10**6, decode_in_worker=decode_in_worker)
    return inf, runner


def envelope(results) -> tuple[int, dict]:
    code, body = result_envelope(task_id="t", model=ModelIdentity("M", "v"), items=results, server_time_ms=0)
    return code, json.loads(body)


def test_deadline_with_some_items_done_is_200_status_68_partial():
    clock = Clock()
    inf, runner = inference(clock, max_batch_size=1)
    answered = []
    inf.run(InferenceRequest(images=["aGk=", "aGk="], req_id=None), deadline=1.0).addCallback(answered.append)
    runner.finish()  # first item done, second starts
    clock.advance(1.0)
    code, body = envelope(answered[0])
    assert (code, body["status"], body["partial"]) == (200, 68, True)
    assert [r["status"] for r in body["results"]] == [0, 4]
    assert body["results"][1]["data"] is None


def test_deadline_with_no_item_done_is_504_status_4():
    clock = Clock()
    inf, runner = inference(clock, max_batch_size=1)
    answered = []
    inf.run(InferenceRequest(images=["aGk=", "aGk="], req_id=None), deadline=1.0).addCallback(answered.append)
    clock.advance(1.0)
    code, body = envelope(answered[0])
    assert (code, body["status"], body["partial"]) == (504, 4, False)
    assert all(r["status"] == 4 and r["data"] is None for r in body["results"])
    runner.finish()  # the running batch finishes later: nothing changes
    assert inf.queue.waiting == 0 and len(runner.batches) == 1  # the second item never ran


def test_bad_base64_fails_only_its_item():
    clock = Clock()
    inf, runner = inference(clock)
    answered = []
    inf.run(InferenceRequest(images=["aGk=", "%%%"], req_id=None), deadline=None).addCallback(answered.append)
    runner.finish()
    assert [r.status for r in answered[0]] == [st.SUCCESS, st.INVALID_IMAGE]


def test_cancelled_request_leaves_the_queue_and_its_items_are_counted_as_abandoned():
    """A deadlines probe: the items of a client gone were in no metric (an operator could not see the work
    abandoned): ``service_items_abandoned_total``, and never ``service_items_total``."""
    from prometheus_client import CollectorRegistry

    from svc.infra.metrics import ModelServerMetrics

    clock, registry = Clock(), CollectorRegistry()
    inf, runner = inference(clock, max_batch_size=1)
    inf.metrics = ModelServerMetrics(registry, "M")
    inf.item_counter = inf.metrics.items.labels
    inf.run(InferenceRequest(images=["aGk="], req_id=None), deadline=None)
    d = inf.run(InferenceRequest(images=["aGk=", "aGk="], req_id=None), deadline=None)
    assert inf.queue.waiting == 2
    d.cancel()
    d.addErrback(lambda f: None)
    assert inf.queue.waiting == 0
    runner.finish()
    assert len(runner.batches) == 1
    assert registry.get_sample_value("service_items_abandoned_total") == 2
    assert [(s.labels, s.value) for f in registry.collect() for s in f.samples if s.name == "service_items_total"] == [
        ({"status": "SUCCESS"}, 1.0)]  # the first request's item alone


# -- the end of a shutdown grace ---------------------------------------------------------------


SHUT = ItemResult(st.NOT_READY, None, "shut down")


def test_abandon_answers_running_and_queued_items_and_starts_no_more_batches():
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=1)
    q.admit(1).enqueue([item("running", results)])
    q.admit(1).enqueue([item("queued", results)])
    late = q.admit(1)  # still being decoded
    assert runner.names() == [["running"]] and q.waiting == 2
    assert q.abandon(SHUT) == 2
    assert results == {"running": SHUT, "queued": SHUT} and q.waiting == 1
    late.enqueue([item("late", results)])  # arrives after: answered at once, never run
    assert results["late"] is SHUT and q.waiting == 0
    idle = []
    q.when_idle().addCallback(idle.append)
    runner.finish()  # the forward pass that could not be cancelled ends: its result is ignored
    assert results["running"] is SHUT and runner.names() == [["running"]] and idle == [None]
    clock.advance(1)
    assert runner.names() == [["running"]]


def test_when_idle_fires_once_the_last_batch_ends():
    clock, results = Clock(), {}
    q, runner = make(clock, max_batch_size=1)
    q.admit(1).enqueue([item("a", results)])
    q.admit(1).enqueue([item("b", results)])
    idle = []
    q.when_idle().addCallback(idle.append)
    runner.finish()
    assert idle == [] and runner.names() == [["a"], ["b"]]
    runner.finish()
    assert idle == [None] and set(results) == {"a", "b"}


def test_when_idle_waits_for_a_request_still_being_decoded():
    clock = Clock()
    q, runner = make(clock)
    decoding = q.admit(2)
    idle = []
    q.when_idle().addCallback(idle.append)
    assert idle == [] and not q.idle  # nothing queued or running, but two items are on their way
    decoding.release()
    assert idle == [None] and q.idle and runner.batches == []


def test_when_idle_fires_when_the_last_waiting_item_is_dropped():
    clock, results = Clock(), {}
    q, runner = make(clock)
    first, second = q.admit(1), q.admit(1)
    x = item("x", results)
    first.enqueue([x])  # waits for its window: the second request may join the batch
    idle = []
    q.when_idle().addCallback(idle.append)
    q.drop(x)  # its request ended (client gone)
    assert idle == [] and q.waiting == 1
    second.release()
    assert idle == [None] and runner.batches == [] and results == {}


def test_when_idle_is_already_fired_on_an_idle_queue():
    q, _ = make(Clock())
    idle = []
    q.when_idle().addCallback(idle.append)
    assert idle == [None]


def test_a_failure_of_our_own_decoding_in_the_decode_pool_fails_its_item_alone():
    """In the decode pool one item's unexpected exception failed every item of its request with 500. (A
    non-image model's preprocess that fails for one input: a fault of the server's own code, which no client
    input causes on the shipped models.) In the worker an item fails alone already: test_engine_lazy_inputs.py."""
    clock = Clock()
    inf, runner = inference(clock, decode_in_worker=False, max_batch_size=4)
    calls = []

    def preprocess(image, params):
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("the plugin's own bug")
        return "input"

    inf.engine.model.preprocess = preprocess
    answered = []
    with capturedLogs() as events:
        inf.run(InferenceRequest(images=["aGk=", "aGk=", "aGk="], req_id=None), deadline=None).addCallback(
            answered.append)
        runner.finish()
    code, body = envelope(answered[0])
    assert (code, body["status"]) == (200, 0)
    assert [r["status"] for r in body["results"]] == [0, 500, 0]
    assert body["results"][1]["error"] == "the model's preprocess failed: KeyError: \"the plugin's own bug\""
    assert [e["log_format"].format(**e) for e in events if e.get("log_failure")] == [
        "the model's preprocess failed for an item of task - (its traceback is in the log at most once a minute)"]


def test_a_bug_of_the_models_preprocess_is_its_500_and_a_broken_image_the_clients_status_5():
    """Any exception of an image model's preprocess was INVALID_IMAGE, "image cannot be decoded: <the plugin's
    AttributeError>", logged nowhere (logs probe).  What Pillow raises while the preprocess works on the image stays
    the client's status 5; the model's own exception is a 500, logged, its traceback once a minute per cause."""
    from tests.support.images import b64, image_bytes

    clock = Clock()
    inf, runner = inference(clock, max_batch_size=4)  # the decode pool; the worker calls the same open_item and prepare_item
    inf.engine.factory = type("ImageFactory", (Factory,), {"needs_image": True})()

    def preprocess(image, params):
        if image.size == (40, 30):
            image.resize((0, 0))  # Pillow refuses inside itself, as it does pixels it cannot read
        if image.size == (64, 48):
            raise AttributeError("injected preprocess bug")
        return "input"

    inf.engine.model.preprocess = preprocess
    images = [b64(image_bytes()), b64(image_bytes(width=40, height=30)), b64(image_bytes(width=8, height=8)),
              b64(image_bytes())]
    answered = []
    with capturedLogs() as events:
        inf.run(InferenceRequest(images=images, req_id="r-7"), deadline=None).addCallback(answered.append)
        runner.finish()
    code, body = envelope(answered[0])
    assert [r["status"] for r in body["results"]] == [500, 5, 0, 500]
    assert body["results"][0]["error"] == "the model's preprocess failed: AttributeError: injected preprocess bug"
    assert body["results"][1]["error"] == "image cannot be decoded: height and width must be > 0"
    assert [(bool(e.get("log_failure")), e["log_format"].format(**e)) for e in events
            if "preprocess" in e["log_format"]] == [
        (True, "the model's preprocess failed for an item of task r-7 (its traceback is in the log at most once a "
               "minute)"),
        (False, "the model's preprocess failed for an item of task r-7: AttributeError: injected preprocess bug")]
