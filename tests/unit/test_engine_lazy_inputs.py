"""The engine with backend.decode_in_worker: inputs made in the worker, bad ones fail alone."""

from __future__ import annotations

from twisted.internet.task import Clock

from svc.contract import status as st
from svc.contract.envelope import ItemResult
from svc.contract.request import InferenceRequest
from svc.infra.process import inline_runner
from svc.modelserver.engine import Engine, LazyInput
from tests.unit.test_batching import inference


class Model:
    """Doubles each input; records what reached the forward pass."""

    def __init__(self) -> None:
        self.batches: list[list] = []

    def predict(self, inputs, params):
        self.batches.append(list(inputs))
        return [2 * x for x in inputs]

    def postprocess(self, output, params, options):
        return {"v": output}


class Factory:
    data_schema = {"type": "object"}


def engine(model: Model) -> Engine:
    e = Engine(Factory(), {}, "cpu", inline_runner)
    e.model = model
    return e


def broken(opened) -> int:
    raise RuntimeError("boom")


def lazy(made, tell=None) -> LazyInput:
    """A lazy input whose peek passes and whose making gives ``made`` (a callable: what it returns)."""
    return LazyInput(lambda: "opened", made if callable(made) else (lambda opened: made), tell)


def bad_at_peek(result, tell=None) -> LazyInput:
    """A lazy input whose peek finds it bad: never made."""
    def never(opened):
        raise AssertionError("a bad input is not made")
    return LazyInput(lambda: result, never, tell)


def test_lazy_inputs_are_made_in_the_worker_and_bad_ones_fail_alone():
    model = Model()
    bad = ItemResult(st.INVALID_IMAGE, None, "image cannot be decoded")
    inputs = [lazy(1), lazy(bad), lazy(broken), 4]
    results, problem = engine(model)._run_sync(inputs, {}, [({}, {})] * 4)
    assert model.batches == [[1, 4]]  # only the good inputs, in order
    assert [r.status for r in results] == [st.SUCCESS, st.INVALID_IMAGE, st.INTERNAL_ERROR, st.SUCCESS]
    assert [r.data for r in results] == [{"v": 2}, None, None, {"v": 8}]
    assert "RuntimeError: boom" in results[2].error
    assert problem is None


def test_a_batch_of_only_bad_inputs_never_reaches_the_model():
    model = Model()
    bad = ItemResult(st.IMAGE_EMPTY, None, "empty")
    results, _ = engine(model)._run_sync([bad_at_peek(bad), lazy(bad)], {}, [({}, {})] * 2)
    assert model.batches == [] and [r.status for r in results] == [st.IMAGE_EMPTY] * 2


def test_an_engine_failure_fails_the_good_items_and_keeps_the_bad_items_status():
    class Failing(Model):
        def predict(self, inputs, params):
            raise MemoryError("out of memory")

    bad = ItemResult(st.INVALID_IMAGE, None, "bad")
    results, problem = engine(Failing())._run_sync([lazy(1), bad_at_peek(bad)], {}, [({}, {})] * 2)
    assert [r.status for r in results] == [st.ENGINE_ERROR, st.INVALID_IMAGE]
    assert "predict failed for a batch of 1" in problem


def test_a_bad_input_is_told_before_any_input_of_its_batch_is_made():
    """A junk image beside one whose decoding outlasted the deadline was answered status 4 (probe): the worker
    peeks at every input first and tells the bad ones at once, so their own status reaches the request in time."""
    events = []
    bad = ItemResult(st.INVALID_IMAGE, None, "not a decodable image")
    empty = ItemResult(st.IMAGE_EMPTY, None, "input image is empty")
    inputs = [lazy(lambda opened: events.append("made 0") or 1), bad_at_peek(bad, lambda r: events.append(("told", r))),
              bad_at_peek(empty, lambda r: events.append(("told", r)))]
    results, _ = engine(Model())._run_sync(inputs, {}, [({}, {})] * 3)
    assert events == [("told", bad), ("told", empty), "made 0"]
    assert [r.status for r in results] == [st.SUCCESS, st.INVALID_IMAGE, st.IMAGE_EMPTY]


def no_pool(*args, **kwargs):
    raise AssertionError("the decode pool is not used with decode_in_worker")


def test_inference_queues_lazy_items_without_the_decode_pool():
    clock = Clock()
    inf, runner = inference(clock, decode_in_worker=True, max_batch_size=4)
    inf.run_decode = no_pool
    inf.run(InferenceRequest(images=["aGk=", "%%%"], req_id=None), deadline=None)
    (batch,) = runner.batches  # both items in one batch, still undecoded
    assert all(isinstance(item.input, LazyInput) for item in batch)
    good, bad = (item.input.make(item.input.open()) for item in batch)
    assert good == "input"
    assert bad.status == st.INVALID_IMAGE and "base64" in bad.error


def test_lazy_items_past_their_deadline_are_never_decoded():
    clock = Clock()
    inf, runner = inference(clock, decode_in_worker=True, max_batch_size=1)
    inf.run_decode = no_pool
    made = []
    inf.engine.model.preprocess = lambda image, params: made.append(1) or "input"
    answered = []
    inf.run(InferenceRequest(images=["aGk=", "aGk="], req_id=None), deadline=1.0).addCallback(answered.append)
    clock.advance(1.0)  # the first item is running (undecoded), the second expires in the queue
    runner.finish()
    assert [r.status for r in answered[0]] == [st.RUN_TIMEOUT, st.RUN_TIMEOUT]
    assert len(runner.batches) == 1  # the expired item never reached a worker
    assert made == []  # nothing was decoded outside a worker (the fake runner decodes nothing)


def test_a_batch_is_counted_while_it_decodes_and_runs_for_the_converted_models():
    from svc.optimize.runtime_calls import BATCHES

    seen: list[int] = []
    model = Model()
    predict = model.predict
    model.predict = lambda inputs, params: seen.append(BATCHES.count) or predict(inputs, params)
    e = engine(model)
    inputs = [lazy(lambda opened: seen.append(BATCHES.count) or 1), 2]
    e._run_sync(inputs, {}, [({}, {})] * 2)
    assert seen == [1, 1] and BATCHES.count == 0  # during the decode and the forward pass; not after
    with BATCHES.running():  # another worker's batch
        assert BATCHES.alone()  # that batch alone
        e._run_sync([3], {}, [({}, {})])
        assert seen[-1] == 2  # this one beside it: not alone
    assert BATCHES.count == 0 and BATCHES.alone()


def test_a_forward_pass_that_raises_or_is_abandoned_is_still_an_inference_sample():
    """Its time was spent: service_stage_duration_ms{stage="inference"} has one sample per pass that ran."""
    from prometheus_client import CollectorRegistry

    from svc.infra.metrics import ModelServerMetrics
    from svc.modelserver.progress import BatchAbandoned

    class Failing(Model):
        def predict(self, inputs, params):
            raise RuntimeError("boom")

    class Abandoned(Model):
        def predict(self, inputs, params):
            raise BatchAbandoned("every item was answered")

    registry = CollectorRegistry()
    metrics = ModelServerMetrics(registry, "M")
    statuses = []
    for model in (Model(), Failing(), Abandoned()):
        e = engine(model)
        e.metrics = metrics
        results, _ = e._run_sync([1], {}, [({}, {})])
        statuses.append(results[0].status)
    assert statuses == [st.SUCCESS, st.ENGINE_ERROR, st.RUN_TIMEOUT]
    assert registry.get_sample_value("service_stage_duration_ms_count", {"stage": "inference"}) == 3
    assert registry.get_sample_value("service_stage_duration_ms_count", {"stage": "postprocess"}) == 1


def test_a_failing_batch_is_logged_naming_its_requests_with_its_traceback_once_a_minute():
    """Each failed request logged its 8-line traceback (500 lines for 50 requests) and no line named a request
    (logs probe): the line names the batch's task ids, the same cause's traceback comes once a minute."""
    from types import SimpleNamespace

    from twisted.logger import LogLevel, capturedLogs

    class Failing(Model):
        def predict(self, inputs, params):
            raise ValueError("injected request failure")

    e = engine(Failing())

    def item(task_id):
        return SimpleNamespace(input=1, params={}, options={}, progress=None, deadline=None, task_id=task_id)

    with capturedLogs() as events:
        for batch in (["r-2", "r-1", "r-2"], ["r-3"], ["job_x"]):
            got = []
            e.run_batch([item(t) for t in batch]).addCallback(got.append)
            assert [r.status for r in got[0]] == [st.ENGINE_ERROR] * len(batch)
    lines = [(ev["log_level"], ev["log_format"].format(**ev)) for ev in events]
    assert [level for level, _ in lines] == [LogLevel.error] * 3
    first, second, third = (text for _, text in lines)
    assert first.startswith("predict failed for a batch of 3 (task r-1, r-2):\nTraceback (most recent call last):")
    assert first.endswith("ValueError: injected request failure")
    assert second == ("predict failed for a batch of 1 (task r-3): ValueError: injected request failure (its "
                      "traceback is in the log at most once a minute)")
    assert third.startswith("predict failed for a batch of 1 (task job_x): ValueError")
