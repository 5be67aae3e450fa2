"""``openvino`` and ``onnxruntime``: targets converted at load, run by the runtime, cached (svc/optimize/runtimes.py).

Real conversions of small torch nets by the pinned OpenVINO and ONNX
Runtime; what cannot be caused otherwise is injected: a runtime that does
not import (``None`` in ``sys.modules``, as on a platform without its
wheel), a conversion of perturbed weights, timings.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from types import SimpleNamespace
from typing import Any

import onnxruntime
import pytest
import torch

from svc.model.api import OptimizationTarget
from svc.optimize import runtime_calls, runtimes, support
from svc.optimize.apply import apply_mode
from svc.optimize.modes import Mode, mode
from svc.optimize.select import Optimizer
from tests.unit.test_optimize_select import TinyClassifier

RUNTIMES = ("openvino", "onnxruntime")


def openvino_module() -> Any:
    """``openvino``, imported as the service imports it (without its telemetry)."""
    return runtimes._openvino()


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(runtimes, "WORKERS", 1)
    return tmp_path


class TwoHeads(torch.nn.Module):
    """A conv net returning a list of two tensors, one of them of integers (as YOLOv8's head returns a list)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: Any, scale: Any) -> list:
        y = self.conv(x) * scale
        return [y, y.flatten(1).argmax(1)]


def target_of(module: Any, *, batched: bool = True) -> tuple[OptimizationTarget, dict]:
    installed: dict = {}

    def example(batch: int) -> tuple:
        return torch.rand(batch, 3, 8, 8, generator=torch.Generator().manual_seed(batch)), torch.tensor(2.0)

    return OptimizationTarget("heads", module, example, installed.update, batched=batched), installed


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_converted_target_takes_every_batch_size_and_returns_what_the_module_returns(name, state_dir):
    module = TwoHeads().eval()
    target, _ = target_of(module)
    fn = apply_mode(target, mode(name), "cpu", 4)
    for n in (1, 3, 4, 9):  # a dynamic batch dimension: sizes other than the one converted
        x = torch.rand(n, 3, 8, 8)
        with torch.inference_mode():
            got, expected = fn(x, torch.tensor(0.5)), module(x, torch.tensor(0.5))
        assert type(got) is list and len(got) == 2
        assert got[0].dtype == torch.float32 and torch.allclose(got[0], expected[0], atol=1e-5)
        assert got[1].dtype == torch.int64 and torch.equal(got[1], expected[1])
    assert fn.conv is module.conv  # a stand-in: the original's attributes are read through it
    suffix = ".xml" if name == "openvino" else ".onnx"
    [artifact] = (state_dir / "compiled").glob(f"heads-{name}-*{suffix}")
    files = [artifact, artifact.with_suffix(".bin")] if name == "openvino" else [artifact]
    assert json.loads(artifact.with_suffix(".json").read_text()) == {
        "returns": "list", "sha256": {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}}


def test_the_runtime_threads_follow_torch_and_the_workers(monkeypatch):
    module = TwoHeads().eval()
    target, _ = target_of(module)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(runtimes, "WORKERS", 2)  # two one-thread workers: two streams of one thread
    fn = apply_mode(target, mode("openvino"), "cpu", 4)
    compiled = fn.optimised.compiled
    openvino = openvino_module()
    assert compiled.get_property("NUM_STREAMS") == 2 and compiled.get_property("INFERENCE_NUM_THREADS") == 2
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == openvino.Type.f32
    session = apply_mode(target, mode("onnxruntime"), "cpu", 4).optimised.session
    assert session.get_session_options().intra_op_num_threads == 1  # per call: each worker calls with its own
    x = torch.rand(5, 3, 8, 8)
    with torch.inference_mode():
        expected = module(x, torch.tensor(1.0))[0]
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(fn(x, torch.tensor(1.0))[0])) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(torch.allclose(r, expected, atol=1e-5) for r in results)  # a request per thread


@pytest.fixture
def two_workers(monkeypatch):
    """Two one-thread workers (the shipped cpu configs on two cores): a TwoHeads module and its target."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(runtimes, "WORKERS", 2)
    module = TwoHeads().eval()
    return module, target_of(module)[0]


def test_a_call_alone_runs_on_every_worker_thread_and_a_call_beside_another_on_its_stream(monkeypatch, two_workers):
    module, target = two_workers
    call = apply_mode(target, mode("openvino"), "cpu", 4).optimised
    assert call.alone.get_property("NUM_STREAMS") == 1 and call.alone.get_property("INFERENCE_NUM_THREADS") == 2
    assert call.alone.get_property("INFERENCE_PRECISION_HINT") == call.compiled.get_property("INFERENCE_PRECISION_HINT")
    x = torch.rand(3, 3, 8, 8)
    with torch.inference_mode():
        expected = module(x, torch.tensor(1.0))[0]
        alone = call(x, torch.tensor(1.0))[0]  # nothing else runs: the one-stream model
        assert set(call.local.infer_requests) == {(True, 0)} and call.calls.running == 0  # 3: the dynamic form
        call.calls.running = 1  # another worker's call in progress
        beside = call(x, torch.tensor(1.0))[0]
        assert set(call.local.infer_requests) == {(True, 0), (False, 0)} and call.calls.running == 1
        call.calls.running = 0
        del call.local.infer_requests
        with runtime_calls.BATCHES.running(), runtime_calls.BATCHES.running():  # the model server runs two batches
            call(x, torch.tensor(1.0))  # the other one decodes: this call keeps its stream
        assert set(call.local.infer_requests) == {(False, 0)}
        with runtime_calls.BATCHES.running():  # this call's own batch only
            call(x, torch.tensor(1.0))
        assert set(call.local.infer_requests) == {(False, 0), (True, 0)}
    assert torch.allclose(alone, expected, atol=1e-5) and torch.allclose(beside, expected, atol=1e-5)

    monkeypatch.setattr(runtimes, "WORKERS", 1)  # one worker: its stream already has every thread
    assert apply_mode(target, mode("openvino"), "cpu", 4).optimised.alone is None


def test_openvino_runs_a_batch_of_one_and_the_warm_up_batch_in_forms_compiled_for_their_size(monkeypatch,
                                                                                                two_workers):
    module, target = two_workers
    call = apply_mode(target, mode("openvino"), "cpu", 4).optimised
    assert set(call.fixed) == {(True, 1), (False, 4)}  # one on the lone stream, the warm-up batch on the workers'
    lone, busy = call.fixed[(True, 1)], call.fixed[(False, 4)]
    assert [str(p.get_partial_shape()) for p in lone.inputs] == ["[1,3,8,8]", "[]"]  # the 0-d scale stays 0-d
    assert [str(p.get_partial_shape()) for p in busy.inputs] == ["[4,3,8,8]", "[]"]
    assert str(call.compiled.inputs[0].get_partial_shape()) == "[?,3,8,8]"  # every other size: the dynamic form
    assert lone.get_property("NUM_STREAMS") == 1 and lone.get_property("INFERENCE_NUM_THREADS") == 2
    assert busy.get_property("NUM_STREAMS") == 2 and busy.get_property("INFERENCE_NUM_THREADS") == 2
    used = []

    def run(n: int, *, beside: bool = False) -> None:
        x = torch.rand(n, 3, 8, 8)
        call.calls.running = 1 if beside else 0
        before = set(getattr(call.local, "infer_requests", {}))
        got = call(x, torch.tensor(2.0))
        new = set(call.local.infer_requests) - before
        used.append(new.pop() if new else None)
        assert torch.allclose(got[0], module(x, torch.tensor(2.0))[0], atol=1e-5)
        assert torch.equal(got[1], module(x, torch.tensor(2.0))[1])

    with torch.inference_mode():
        run(1)  # alone: the lone stream's batch of one
        run(4, beside=True)  # beside another call: the workers' streams at the warm-up batch
        run(1, beside=True)  # one beside another: the workers' dynamic form
        run(4)  # the warm-up batch alone: the lone stream's dynamic form
        run(3, beside=True)
        run(1)  # the same form again: its request is reused
    assert used == [(True, 1), (False, 4), (False, 0), (True, 0), None, None]
    shapes = {key: str(request.get_compiled_model().inputs[0].get_partial_shape())
              for key, request in call.local.infer_requests.items()}
    assert shapes == {(True, 1): "[1,3,8,8]", (False, 4): "[4,3,8,8]", (False, 0): "[?,3,8,8]", (True, 0): "[?,3,8,8]"}

    one = apply_mode(target, mode("openvino"), "cpu", 1).optimised  # a warm-up batch of one (DDPM's)
    assert set(one.fixed) == {(True, 1), (False, 1)}  # alone, and two side by side on the workers' streams
    monkeypatch.setattr(runtime_calls, "FIXED", False)
    assert apply_mode(target, mode("openvino"), "cpu", 4).optimised.fixed == {}
    monkeypatch.setattr(runtimes, "WORKERS", 1)
    monkeypatch.setattr(runtime_calls, "FIXED", True)
    assert set(apply_mode(target, mode("openvino"), "cpu", 4).optimised.fixed) == {(False, 1), (False, 4)}
    fixed_shape, _ = target_of(module, batched=False)  # converted with a fixed shape already: nothing to pin
    assert apply_mode(fixed_shape, mode("openvino"), "cpu", 4).optimised.fixed == {}
    monkeypatch.setattr(runtime_calls, "_fixed_batch", lambda model, n: 1 / 0)  # a graph that refuses the size
    refused = apply_mode(target, mode("openvino"), "cpu", 4).optimised
    assert refused.fixed == {}  # the mode stays, on its dynamic form
    with torch.inference_mode():
        x = torch.rand(4, 3, 8, 8)
        assert torch.allclose(refused(x, torch.tensor(2.0))[0], module(x, torch.tensor(2.0))[0], atol=1e-5)


def test_a_loaded_openvino_model_keeps_what_it_read_when_its_cache_file_is_overwritten(state_dir):
    """An optimize probe: OpenVINO mapped the cached ``.bin`` into memory, so a running YOLOV8 whose file was cut
    short died of SIGBUS at its next request, and one whose file was overwritten in place answered 500 while it
    said ready, where docs/optimize.md says a running model server keeps what it loaded."""
    module = TwoHeads().eval()
    target, _ = target_of(module)
    apply_mode(target, mode("openvino"), "cpu", 4)  # converted and written
    fn = apply_mode(target, mode("openvino"), "cpu", 4)  # read from the cache, as at a restart
    [weights] = (state_dir / "compiled").glob("heads-openvino-*.bin")
    with open(weights, "r+b") as f:  # in place: the same file, the same size (a cp over it, a restored backup)
        f.write(bytes(weights.stat().st_size))
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        assert torch.allclose(fn(x, torch.tensor(0.5))[0], module(x, torch.tensor(0.5))[0], atol=1e-5)


def test_only_a_dynamic_batch_dimension_is_pinned():
    openvino = openvino_module()
    ops = openvino.opset13

    def model(*shapes: list) -> object:
        params = [ops.parameter(openvino.PartialShape(shape), openvino.Type.f32) for shape in shapes]
        return openvino.Model([ops.relu(p) for p in params], params)

    pinned = runtime_calls._fixed_batch(model([-1, 3], []), 5)
    assert [str(p.get_partial_shape()) for p in pinned.inputs] == ["[5,3]", "[]"]
    assert runtime_calls._fixed_batch(model([2, 3]), 5) is None  # fixed already
    assert runtime_calls._fixed_batch(model([-1, -1]), 5) is None  # another dimension is dynamic too
    assert runtime_calls._fixed_batch(model([]), 5) is None  # no batch dimension at all
    assert runtime_calls._batch_input(model([], [-1, 3]).inputs) == 1
    assert runtime_calls._batch_input(model([2, 3]).inputs) is None


def test_onnxruntime_has_a_session_of_every_worker_thread_for_a_call_alone(monkeypatch, two_workers):
    module, target = two_workers
    call = apply_mode(target, mode("onnxruntime"), "cpu", 4).optimised
    assert call.session.get_session_options().intra_op_num_threads == 1
    options = call.alone.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"  # idle, its threads sleep
    used = []
    for name in ("session", "alone"):
        session = getattr(call, name)
        monkeypatch.setattr(call, name, SimpleNamespace(run=lambda *a, s=session, n=name: used.append(n) or s.run(*a)))
    x = torch.rand(3, 3, 8, 8)
    with torch.inference_mode():
        expected = module(x, torch.tensor(1.0))[0]
        alone = call(x, torch.tensor(1.0))[0]
        call.calls.running = 1  # another worker's call in progress
        beside = call(x, torch.tensor(1.0))[0]
        call.calls.running = 0
        with runtime_calls.BATCHES.running(), runtime_calls.BATCHES.running():  # another batch decodes
            call(x, torch.tensor(1.0))
    assert used == ["alone", "session", "session"]
    assert torch.allclose(alone, expected, atol=1e-5) and torch.allclose(beside, expected, atol=1e-5)
    monkeypatch.setattr(runtimes, "WORKERS", 1)
    assert apply_mode(target, mode("onnxruntime"), "cpu", 4).optimised.alone is None


def test_openvino_converts_the_onnx_export_which_onnxruntime_then_reads(state_dir, monkeypatch):
    """One export serves both runtimes: OpenVINO converts the ONNX file (a fraction of a second, where tracing the
    module again took seconds), kept where the onnxruntime mode finds it."""
    module = TwoHeads().eval()
    target, _ = target_of(module)
    converted_from = []
    convert = openvino_module().convert_model
    monkeypatch.setattr(openvino_module(), "convert_model", lambda source, **kw: (converted_from.append(source),
                                                                                 convert(source, **kw))[1])
    fn = apply_mode(target, mode("openvino"), "cpu", 4)
    [onnx] = (state_dir / "compiled").glob("heads-onnxruntime-*.onnx")
    assert converted_from == [str(onnx)]
    assert json.loads(onnx.with_suffix(".json").read_text()) == {
        "returns": "list", "sha256": {onnx.name: hashlib.sha256(onnx.read_bytes()).hexdigest()}}

    def no_export(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("exported again")

    monkeypatch.setattr(torch.onnx, "export", no_export)
    before = dict(runtimes.STATS)
    ort = apply_mode(target, mode("onnxruntime"), "cpu", 4)
    assert runtimes.STATS["loaded"] == before.get("loaded", 0) + 1
    x = torch.rand(3, 3, 8, 8)
    with torch.inference_mode():
        expected = module(x, torch.tensor(0.5))
        for got in (fn(x, torch.tensor(0.5)), ort(x, torch.tensor(0.5))):
            assert torch.allclose(got[0], expected[0], atol=1e-5) and torch.equal(got[1], expected[1])


class IgnoresItsMask(torch.nn.Module):
    """A target with an argument its graph does not use: the ONNX export leaves that input out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, mask: Any, x: Any) -> Any:
        return self.conv(x)


def test_openvino_feeds_each_input_of_the_export_its_own_argument(state_dir):
    module = IgnoresItsMask().eval()

    def example(batch: int) -> tuple:
        return torch.ones(batch, 8, 8), torch.rand(batch, 3, 8, 8)

    fn = apply_mode(OptimizationTarget("masked", module, example, lambda fn: None), mode("openvino"), "cpu", 4)
    assert fn.optimised.positions == [1]  # input1 of the export: the mask (input0) was left out
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        assert torch.allclose(fn(torch.zeros(2, 8, 8), x), module(None, x), atol=1e-5)


def test_openvino_converts_the_module_when_the_onnx_export_fails(state_dir, monkeypatch):
    def failing_export(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the exporter cannot trace this")

    monkeypatch.setattr(torch.onnx, "export", failing_export)
    module = TwoHeads().eval()
    target, _ = target_of(module)
    fn = apply_mode(target, mode("openvino"), "cpu", 4)
    assert list((state_dir / "compiled").glob("*.onnx")) == []
    assert fn.optimised.positions == [0, 1]
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        assert torch.allclose(fn(x, torch.tensor(1.0))[0], module(x, torch.tensor(1.0))[0], atol=1e-5)


def test_bf16_openvino_runs_at_bf16_precision_from_the_same_converted_model(state_dir):
    target, _ = target_of(TwoHeads().eval())
    fp32 = apply_mode(target, mode("openvino"), "cpu", 4)
    before = dict(runtimes.STATS)
    bf16 = apply_mode(target, mode("bf16+openvino"), "cpu", 4)
    # bf16 where the CPU has it natively (the only CPUs `auto` offers the mode on: support.unsupported); on one
    # without, OpenVINO itself keeps the float32 it was asked to leave, and the mode's other promises hold.
    Type = openvino_module().Type
    expected = Type.bf16 if support.cpu_has_native_bf16() else Type.f32
    assert bf16.optimised.compiled.get_property("INFERENCE_PRECISION_HINT") == expected
    assert runtimes.STATS["loaded"] == before.get("loaded", 0) + 1  # the float32 IR, read again
    assert len(list((state_dir / "compiled").glob("*.xml"))) == 1
    x = torch.rand(2, 3, 8, 8)
    with torch.inference_mode():
        assert torch.allclose(bf16(x, torch.tensor(1.0))[0], fp32(x, torch.tensor(1.0))[0], atol=0.1, rtol=0.05)


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_second_load_reads_the_cache_and_new_weights_convert_afresh(name, state_dir, monkeypatch):
    model = TinyClassifier(candidates=(name,))
    report = Optimizer(model, "classification", "cpu", name, 4, "TINY").run()
    assert report.mode == name and not report.fell_back, report.line
    assert report.line.endswith("; converted models: 1 converted, 0 read from the cache)"), report.line
    files = sorted(p.name for p in (state_dir / "compiled").iterdir())
    # the owner's only, as the weights they hold: OpenVINO's .bin was 0644 (upgrade probe)
    assert {p.name: p.stat().st_mode & 0o777 for p in (state_dir / "compiled").iterdir()} == dict.fromkeys(files, 0o600)

    def no_conversion(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("converted again")

    monkeypatch.setattr(openvino_module(), "convert_model", no_conversion)
    monkeypatch.setattr(torch.onnx, "export", no_conversion)
    again = TinyClassifier(candidates=(name,))  # a restart: the same weights, the same key
    report = Optimizer(again, "classification", "cpu", name, 4, "TINY").run()
    assert report.mode == name and report.line.endswith("; converted models: 0 converted, 1 read from the cache)")
    assert sorted(p.name for p in (state_dir / "compiled").iterdir()) == files
    monkeypatch.undo()
    monkeypatch.setenv("SERVICE_STATE_DIR", str(state_dir))

    retrained = TinyClassifier(candidates=(name,))
    with torch.no_grad():
        retrained.net[0].weight.add_(0.01)  # other weights: another key
    report = Optimizer(retrained, "classification", "cpu", name, 4, "TINY").run()
    assert report.mode == name and report.line.endswith("; converted models: 1 converted, 0 read from the cache)")
    assert len(list((state_dir / "compiled").glob(f"net-{name}-*.json"))) == 2
    images = torch.rand(3, 3, 8, 8)
    assert torch.allclose(torch.stack(retrained.predict(list(images), {})), retrained.net(images), atol=1e-5)


def test_a_missing_runtime_leaves_the_torch_modes_with_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # what `import openvino` meets without its wheel
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    problem = "'openvino' is not installed here (ModuleNotFoundError: import of openvino halted; None in sys.modules)"
    assert support.missing_runtime(mode("bf16+openvino")) == problem
    assert support.missing_runtime(mode("jit")) is None
    support.check_setting("openvino", "cpu")  # not refused at startup: the load falls back
    assert support.without_runtimes(("compile",)) == ("compile",)  # a plugin's torch fallback is offered again

    model = TinyClassifier(candidates=("jit", "onnxruntime", "openvino"))
    report = Optimizer(model, "classification", "cpu", "auto", 4, "TINY").run()
    assert report.mode in ("jit", "eager") and "\n" not in report.line
    assert (f"; onnxruntime dropped ('onnxruntime' is not installed here (ModuleNotFoundError: import of onnxruntime halted; "
            f"None in sys.modules)); openvino dropped ({problem}) (min gain") in report.line
    assert report.line.startswith("TINY: optimize auto chose ") and "jit " in report.line

    model = TinyClassifier()
    report = Optimizer(model, "classification", "cpu", "openvino", 4, "TINY").run()
    assert report.fell_back and report.mode == "eager" and model.run is model.net
    assert report.line.startswith(f"TINY: optimize openvino: {problem}; running eager (")


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_cached_conversion_that_cannot_be_read_is_converted_again(name, state_dir):
    """A cut or overwritten file in the cache failed the mode on every start, and auto recorded the loss."""
    Optimizer(TinyClassifier(candidates=(name,)), "classification", "cpu", name, 4, "TINY").run()
    [artefact] = (state_dir / "compiled").glob(f"net-{name}-*.{'xml' if name == 'openvino' else 'onnx'}")
    artefact.write_bytes(artefact.read_bytes()[:100])  # cut short
    model = TinyClassifier(candidates=(name,))
    report = Optimizer(model, "classification", "cpu", name, 4, "TINY").run()
    assert report.mode == name and not report.fell_back, report.line
    assert report.line.endswith("; converted models: 1 converted, 0 read from the cache "
                                "(1 in the cache unusable: made again))"), report.line
    (state_dir / "compiled" / artefact.with_suffix(".json").name).write_text("")  # its record cut: the same
    assert Optimizer(TinyClassifier(candidates=(name,)), "classification", "cpu", name, 4, "TINY").run().line.endswith(
        "(1 in the cache unusable: made again))")
    report = Optimizer(TinyClassifier(candidates=(name,)), "classification", "cpu", name, 4, "TINY").run()
    assert report.line.endswith("; converted models: 0 converted, 1 read from the cache)"), report.line  # healed
    images = torch.rand(3, 3, 8, 8)
    assert torch.allclose(torch.stack(model.predict(list(images), {})), model.net(images), atol=1e-5)


def auto_loader(choices: Any) -> Any:
    """A load with ``auto`` recording in ``choices``, where the runtime wins on speed."""
    def timer(pairs: list, batch: int) -> float:
        return 10.0 if all(fn is target.module for target, fn in pairs) else 1.0

    return lambda model: Optimizer(model, "classification", "cpu", "auto", 4, "TINY", timer=timer,
                                   choices=choices).run()


def swap_in_other_weights(name: str, compiled: Any) -> tuple[Any, tuple[str, ...]]:
    """Convert other weights (their own key), then copy their files over the first conversion's under its name:
    the first artefact's path and the runtime's file suffixes."""
    wrong = TinyClassifier(candidates=(name,))
    with torch.no_grad():
        wrong.net[0].weight.mul_(-3.0)
    Optimizer(wrong, "classification", "cpu", name, 4, "TINY").run()
    suffixes = (".xml", ".bin") if name == "openvino" else (".onnx",)
    right, other = sorted(compiled.glob(f"net-{name}-*{suffixes[0]}"), key=lambda p: p.stat().st_mtime)
    for suffix in suffixes:
        right.with_suffix(suffix).write_bytes(other.with_suffix(suffix).read_bytes())
    return right, suffixes


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_cached_conversion_changed_since_it_passed_is_converted_again_also_for_a_recorded_choice(name, state_dir):
    """A recorded choice is applied without its gate: a cached file overwritten since (same size, other weights)
    served wrong classes as successes.  Each file's SHA-256 is kept beside it; one that differs is made again."""
    load = auto_loader(state_dir / "compiled" / "choices")
    assert load(TinyClassifier(candidates=(name,))).mode == name
    swap_in_other_weights(name, state_dir / "compiled")  # the other weights' conversion under this key's name
    model = TinyClassifier(candidates=(name,))
    report = load(model)  # the record's mode, not gated: the cached files are checked instead
    assert report.mode == name and report.recorded is not None and model.gate_calls == 0, report.line
    assert report.line.endswith("converted models: 1 converted, 0 read from the cache (1 in the cache unusable: "
                                "made again))"), report.line
    images = torch.rand(3, 3, 8, 8)
    assert torch.allclose(torch.stack(model.predict(list(images), {})), model.net(images), atol=1e-5)
    assert load(TinyClassifier(candidates=(name,))).line.endswith("0 converted, 1 read from the cache)")


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_conversion_swapped_in_a_folder_of_another_user_is_not_served(name, state_dir, tmp_path, monkeypatch):
    """As nobody, owner of a 0777 compiled/, a probe put another model's conversion under this key's name with
    its record's SHA-256s rewritten: the next auto start applied the recorded mode, ungated, and served the other
    model's results.  Nothing in such a folder is read or written: auto measures, and converts in a private
    folder of the process."""
    from svc.optimize import cache

    monkeypatch.setattr(cache, "_WARNED", set(), raising=False)
    (tmp_path / "scratch").mkdir(mode=0o700)
    monkeypatch.setattr(cache, "_scratch", tmp_path / "scratch", raising=False)
    compiled = state_dir / "compiled"
    load = auto_loader(compiled / "choices")
    assert load(TinyClassifier(candidates=(name,))).mode == name
    right, suffixes = swap_in_other_weights(name, compiled)  # its digests rewritten below
    record = json.loads(right.with_suffix(".json").read_text())
    record["sha256"] = cache.file_digests([right.with_suffix(suffix) for suffix in suffixes])
    right.with_suffix(".json").write_text(json.dumps(record))
    os.chown(compiled, 65534, 65534)
    os.chmod(compiled, 0o777)
    swapped = {p.name: p.read_bytes() for p in compiled.iterdir() if p.is_file()}
    model = TinyClassifier(candidates=(name,))
    report = load(model)
    assert report.mode == name and report.recorded is None and model.gate_calls > 0, report.line
    assert (f"; choice not recorded (UntrustedCache: {compiled} is owned by another user (uid 65534)); "
            in report.line), report.line
    assert report.line.endswith("; converted models: 1 converted, 0 read from the cache)"), report.line
    images = torch.rand(3, 3, 8, 8)
    assert torch.allclose(torch.stack(model.predict(list(images), {})), model.net(images), atol=1e-5)
    assert {p.name: p.read_bytes() for p in compiled.iterdir() if p.is_file()} == swapped
    assert any((tmp_path / "scratch" / "compiled").glob(f"net-{name}-*{suffixes[0]}"))


def test_openvino_failing_to_write_its_conversion_is_a_passing_failure_and_records_nothing(state_dir, monkeypatch):
    """A full disk reaches OpenVINO's save as a RuntimeError: auto recorded a lesser mode and never tried it again."""
    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("Exception from src/core/src/pass/serialize.cpp: basic_ios::clear: iostream error")

    monkeypatch.setattr(openvino_module(), "save_model", full_disk)
    choices = state_dir / "compiled" / "choices"
    model = TinyClassifier(candidates=("openvino",))
    report = Optimizer(model, "classification", "cpu", "auto", 4, "TINY", choices=choices).run()
    assert report.mode == "eager" and list(choices.glob("*.json")) == [], report.line  # the measuring lock only
    assert "openvino dropped (OSError: OpenVINO could not write net-openvino-" in report.line
    assert "; choice not recorded: openvino failed in a way that may pass" in report.line
    assert not list((state_dir / "compiled").glob(".converting-*"))  # nothing half-written left


class Perturbed(torch.nn.Module):
    """The module with its weights moved by 20 %: a conversion that computes something else."""

    def __init__(self, module: Any) -> None:
        super().__init__()
        import copy

        self.inner = copy.deepcopy(module)
        with torch.no_grad():
            for p in self.inner.parameters():
                p.mul_(torch.linspace(0.8, 1.2, p.numel()).view_as(p))

    def forward(self, *args: Any) -> Any:
        return self.inner(*args)


def perturbing_apply(target: OptimizationTarget, candidate: Mode, device: str, batch: int) -> Any:
    """The real apply; a runtime mode converts a perturbed copy of the target's module."""
    if candidate.runtime:
        target = OptimizationTarget(target.name, Perturbed(target.module), target.example_inputs, target.install,
                                    target.batched)
    fn = apply_mode(target, candidate, device, batch)
    fn.mode_name = candidate.name
    return fn


def test_a_perturbed_conversion_fails_the_gate_and_the_model_keeps_a_torch_mode():
    def timer(pairs: list, batch: int) -> float:  # the runtimes would win on speed
        fns = [fn for _, fn in pairs]
        if all(fn is target.module for target, fn in pairs):
            return 10.0
        return {"jit": 5.0}.get(fns[0].mode_name, 1.0)

    model = TinyClassifier(candidates=("jit", "onnxruntime", "openvino"))
    report = Optimizer(model, "classification", "cpu", "auto", 4, "TINY", apply=perturbing_apply, timer=timer).run()
    assert report.mode == "jit" and model.run.mode_name == "jit", report.line
    dropped = {o.mode.name: o.problem for o in report.outcomes if o.problem}
    assert sorted(dropped) == ["onnxruntime", "openvino"]
    assert all(problem.startswith("gate failed: top-1 ") for problem in dropped.values()), dropped
    assert "; openvino dropped (gate failed: top-1 " in report.line

    report = Optimizer(model, "classification", "cpu", "onnxruntime", 4, "TINY", apply=perturbing_apply).run()
    assert report.fell_back and report.mode == "eager" and model.run is model.net
    assert report.line.startswith("TINY: optimize onnxruntime: gate failed: top-1 ") and "running eager" in report.line


def test_a_target_that_returns_no_tensors_cannot_be_converted():
    class Words(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return {"logits": x}

    target = OptimizationTarget("words", Words(), lambda n: (torch.zeros(n, 2),), lambda fn: None)
    with pytest.raises(TypeError, match="the target returns dict, not a tensor or a flat list/tuple of tensors"):
        apply_mode(target, mode("onnxruntime"), "cpu", 2)
    assert onnxruntime.__version__ and openvino_module().__version__  # the pinned runtimes import here
    assert sys.modules["openvino_telemetry"] is None  # and OpenVINO sends no telemetry from a service
    assert support.without_runtimes(("compile",)) == ()  # a runtime imports: no costly torch fallback


# -- MOBILENETV2: its input normalisation converted into the runtime's graph ------------------------------------


@pytest.fixture(scope="module")
def mobilenet_factory() -> Any:
    from models.mobilenetv2 import mobilenetv2

    return mobilenetv2


def mobilenet(factory: Any) -> Any:
    return factory.build({"weights": "random", "seed": 0}, "cpu")


@pytest.mark.parametrize("name", RUNTIMES)
def test_mobilenetv2_converted_takes_uint8_nhwc_and_classifies_as_eager(name, mobilenet_factory):
    from models.gate_photos import PHOTOS
    from models.mobilenetv2 import GATE_IMAGES
    from svc.optimize.gates import classification
    from tests.support.photos import photo_like

    model = mobilenet(mobilenet_factory)
    reference = model.gate_outputs()
    photos = [photo_like(224, 224, seed) for seed in range(4)]
    eager = torch.stack(model.predict(photos, {}))
    report = Optimizer(model, "classification", "cpu", name, 4, "MOBILENETV2").run()
    assert report.mode == name and not report.fell_back, report.line
    gated = GATE_IMAGES + len(PHOTOS)  # the noise images and the photographs
    assert report.line.startswith(f"MOBILENETV2: optimize {name}: gate passed [top-1 {gated}/{gated}, "
                                  f"top-5 {gated}/{gated}, ")
    if name == "openvino":  # the uint8 batch as the worker stacks it is the compiled model's input
        [port] = model.run_net.optimised.compiled.inputs
        assert str(port.get_element_type()) == "<Type: 'uint8_t'>" and str(port.get_partial_shape()) == "[?,224,224,3]"
    else:
        [port] = model.run_net.optimised.session.get_inputs()
        assert port.type == "tensor(uint8)" and port.shape[1:] == [224, 224, 3]
    served = model.gate_outputs()
    assert torch.equal(served.topk(1).indices, reference.topk(1).indices)
    assert torch.equal(served.topk(5).indices.sort().values, reference.topk(5).indices.sort().values)
    assert torch.allclose(served, reference, atol=1e-4)  # float32: only the order of the arithmetic differs
    optimised = torch.stack(model.predict(photos, {}))  # the served path: HWC items, stacked, probabilities
    assert torch.equal(optimised.topk(5).indices, eager.topk(5).indices)
    assert torch.allclose(optimised, eager, rtol=1e-3, atol=1e-7)
    assert classification(eager.log(), optimised.log()).passed


class WrongNormalisation(torch.nn.Module):
    """MOBILENETV2's pixel module with the channels read in BGR order: a conversion whose preprocessing is wrong."""

    def __init__(self, pixels: Any) -> None:
        super().__init__()
        self.pixels = pixels

    def forward(self, x: Any) -> Any:
        return self.pixels(x.flip(-1))


@pytest.mark.parametrize("wrong", [Perturbed, WrongNormalisation])
def test_mobilenetv2_refuses_a_perturbed_conversion_and_keeps_eager(wrong, mobilenet_factory):
    model = mobilenet(mobilenet_factory)
    reference = model.gate_outputs()

    def perturbed(target: OptimizationTarget, candidate: Mode, device: str, batch: int) -> Any:
        # eval(): the exporter restores the training flag it found, down to the network's BatchNorm
        target = OptimizationTarget(target.name, wrong(target.module).eval(), target.example_inputs, target.install,
                                    target.batched)
        return apply_mode(target, candidate, device, batch)

    for name in ("openvino", "onnxruntime"):
        report = Optimizer(model, "classification", "cpu", name, 4, "MOBILENETV2", apply=perturbed).run()
        assert report.fell_back and report.mode == "eager" and model.run_net is model.pixels, report.line
        assert report.line.startswith(f"MOBILENETV2: optimize {name}: gate failed: top-1 "), report.line
        assert torch.equal(model.gate_outputs(), reference)
