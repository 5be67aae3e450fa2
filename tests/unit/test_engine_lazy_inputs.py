"""The engine with backend.decode_in_worker: inputs made in the worker, bad ones fail alone."""

from __future__ import annotations

from twisted.internet.task import Clock

from svc import status as st
from svc.envelope import ItemResult
from svc.modelserver.batching import LazyInput
from svc.modelserver.engine import Engine
from svc.modelserver.inference import Inference
from svc.process import inline_runner
from svc.request import InferenceRequest
from tests.unit.test_batching import make


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


def broken() -> int:
    raise RuntimeError("boom")


def test_lazy_inputs_are_made_in_the_worker_and_bad_ones_fail_alone():
    model = Model()
    bad = ItemResult(st.INVALID_IMAGE, None, "image cannot be decoded")
    inputs = [LazyInput(lambda: 1), LazyInput(lambda: bad), LazyInput(broken), 4]
    results, problem = engine(model)._run_sync(inputs, {}, [({}, {})] * 4)
    assert model.batches == [[1, 4]]  # only the good inputs, in order
    assert [r.status for r in results] == [st.SUCCESS, st.INVALID_IMAGE, st.INTERNAL_ERROR, st.SUCCESS]
    assert [r.data for r in results] == [{"v": 2}, None, None, {"v": 8}]
    assert "RuntimeError: boom" in results[2].error
    assert problem is None


def test_a_batch_of_only_bad_inputs_never_reaches_the_model():
    model = Model()
    bad = ItemResult(st.IMAGE_EMPTY, None, "empty")
    results, _ = engine(model)._run_sync([LazyInput(lambda: bad)] * 2, {}, [({}, {})] * 2)
    assert model.batches == [] and [r.status for r in results] == [st.IMAGE_EMPTY] * 2


def test_an_engine_failure_fails_the_good_items_and_keeps_the_bad_items_status():
    class Failing(Model):
        def predict(self, inputs, params):
            raise MemoryError("out of memory")

    bad = ItemResult(st.INVALID_IMAGE, None, "bad")
    results, problem = engine(Failing())._run_sync([LazyInput(lambda: 1), LazyInput(lambda: bad)], {}, [({}, {})] * 2)
    assert [r.status for r in results] == [st.ENGINE_ERROR, st.INVALID_IMAGE]
    assert "predict failed for a batch of 1" in problem


class DecodingModel:
    def preprocess(self, image, params):
        return "decoded"

    def batch_key(self, params):
        return None


class NoImageFactory:
    needs_image = False


def test_inference_queues_lazy_items_without_the_decode_pool():
    clock = Clock()
    q, runner = make(clock, max_batch_size=4)

    def no_pool(*args, **kwargs):
        raise AssertionError("the decode pool is not used with decode_in_worker")

    inf = Inference(clock=clock, factory=NoImageFactory(), validator=None, queue=q, run_decode=no_pool,
                    max_image_pixels=10**6, decode_in_worker=True)
    inf.model = DecodingModel()
    inf.run(InferenceRequest(images=["aGk=", "%%%"], req_id=None), deadline=None)
    (batch,) = runner.batches  # both items in one batch, still undecoded
    assert all(isinstance(item.input, LazyInput) for item in batch)
    good, bad = (item.input.make() for item in batch)
    assert good == "decoded"
    assert bad.status == st.INVALID_IMAGE and "base64" in bad.error
