"""The optimisation step of a load: gate, time, choose, one line, fall back (svc/optimize/select.py).

A small real torch model stands behind ``IOptimizable``; what cannot be
caused otherwise is injected: a mode whose application raises, timings
(``timer``), outputs that break the gate.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from zope.interface import implementer

from svc.model.api import IModel, IOptimizable, OptimizationTarget
from svc.optimize import select, timing
from svc.optimize.apply import apply_mode
from svc.optimize.modes import Mode, mode
from svc.optimize.select import Optimizer, optimize_model


@implementer(IModel, IOptimizable)
class TinyClassifier:
    """A conv net classifying 8x8 images into 5 classes; ``run`` is what its predict would call."""

    version = "tiny"

    def __init__(self, candidates: tuple = ("channels_last", "jit")) -> None:
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                       torch.nn.Linear(4 * 6 * 6, 5)).eval().requires_grad_(False)
        self.run = self.net
        self.candidates = candidates
        self.gate_calls = 0

    def preprocess(self, image: Any, params: dict) -> Any:
        return image

    def batch_key(self, params: dict) -> Any:
        return None

    def predict(self, inputs: list, params: dict) -> list:
        with torch.inference_mode():
            return list(self.run(torch.stack(inputs)))

    def postprocess(self, output: Any, params: dict, options: dict) -> Any:
        return int(output.argmax())

    def warmup_input(self) -> Any:
        return torch.zeros(3, 8, 8)

    def optimization_targets(self) -> list:
        def install(fn: Any) -> None:
            self.run = fn

        return [OptimizationTarget("net", self.net, lambda batch: (torch.ones(batch, 3, 8, 8),), install)]

    def gate_outputs(self) -> Any:
        self.gate_calls += 1
        images = torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(3))
        return torch.stack(self.predict(list(images), {}))

    def optimize_candidates(self, device: str) -> tuple:
        return self.candidates


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """``optimize_model`` records ``auto``'s choices in the state directory: the test's own."""
    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path))
    return tmp_path


def timings(**ms: float):
    """A timer that says each mode (by name, eager included) takes ``ms``."""

    def timer(pairs: list, batch: int) -> float:
        fns = [fn for _, fn in pairs]
        if all(fn is target.module for target, fn in pairs):
            return ms["eager"]
        return ms[fns[0].mode_name]

    return timer


def named_apply(failing: dict[str, Exception] | None = None, corrupt: tuple = ()):
    """The real apply, with the mode's name on the result; some modes raise, some give wrong outputs."""

    def apply(target: OptimizationTarget, mode: Mode, device: str, batch: int) -> Any:
        if failing and mode.name in failing:
            raise failing[mode.name]
        fn = apply_mode(target, mode, device, batch)
        if mode.name in corrupt:
            inner = fn

            class Corrupted(torch.nn.Module):
                def forward(self, x):
                    return inner(x).flip(-1)  # another top-1

            fn = Corrupted()
        fn.mode_name = mode.name
        return fn

    return apply


def run(model: Any, setting: str, **kwargs: Any) -> select.Report:
    return Optimizer(model, "classification", "cpu", setting, 4, "TINY", **kwargs).run()


def test_auto_chooses_the_fastest_mode_that_passes_and_logs_every_figure():
    model = TinyClassifier()
    report = run(model, "auto", apply=named_apply(), timer=timings(eager=10.0, channels_last=9.0, jit=4.0))
    assert report.mode == "jit" and not report.fell_back
    assert [(o.mode.name, o.ms, o.problem) for o in report.outcomes] == [("channels_last", 9.0, None), ("jit", 4.0, None)]
    assert report.line.startswith("TINY: optimize auto chose jit, batch 4: eager 10.0 ms; channels_last 9.0 ms 1.11x "
                                  "[top-1 6/6, top-5 6/6, logit error ")
    assert "; jit 4.0 ms 2.50x [top-1 6/6" in report.line and "(min gain 5%; " in report.line
    assert model.run is not model.net and model.run.mode_name == "jit"  # installed: predict runs the chosen mode
    assert model.gate_calls == 3  # the eager reference and one per candidate
    assert [model.postprocess(o, {}, {}) for o in model.predict([torch.zeros(3, 8, 8)], {})] == [
        int(model.net(torch.zeros(1, 3, 8, 8)).argmax())]


def test_auto_keeps_eager_unless_a_mode_beats_it_by_the_minimum_gain():
    model = TinyClassifier()
    report = run(model, "auto", apply=named_apply(), timer=timings(eager=10.0, channels_last=9.6, jit=9.8))
    assert report.mode == "eager" and model.run is model.net
    assert report.line.startswith("TINY: optimize auto chose eager, batch 4: eager 10.0 ms; channels_last 9.6 ms 1.04x")
    assert model.net[0].weight.is_contiguous()  # eager's layout again after channels_last was tried


def test_auto_drops_a_mode_that_fails_and_one_that_fails_its_gate():
    model = TinyClassifier(candidates=("channels_last", "jit", "channels_last+jit"))
    apply = named_apply(failing={"jit": RuntimeError("injected: tracing failed\nsecond line")},
                        corrupt=("channels_last+jit",))
    report = run(model, "auto", apply=apply, timer=timings(eager=10.0, channels_last=8.0))
    assert report.mode == "channels_last"
    dropped = {o.mode.name: o.problem for o in report.outcomes if o.problem}
    assert dropped["jit"] == "RuntimeError: injected: tracing failed"
    assert dropped["channels_last+jit"].startswith("gate failed: top-1 ")
    assert "jit dropped (RuntimeError: injected: tracing failed)" in report.line
    assert "channels_last+jit dropped (gate failed: top-1 " in report.line
    assert "Traceback" in next(o.detail for o in report.outcomes if o.mode.name == "jit")
    assert model.run.mode_name == "channels_last"
    assert model.net[0].weight.is_contiguous(memory_format=torch.channels_last)  # the chosen layout


def test_auto_with_every_mode_failing_serves_eager():
    model = TinyClassifier()
    report = run(model, "auto", apply=named_apply(failing={"channels_last": OSError("no"), "jit": ValueError("no")}),
                 timer=timings(eager=10.0))
    assert report.mode == "eager" and model.run is model.net and not report.fell_back
    assert model.net[0].weight.is_contiguous()


def test_a_second_optimisation_compares_with_eager_not_with_what_ran_before():
    model = TinyClassifier()
    run(model, "jit", apply=named_apply())
    assert model.run.mode_name == "jit"
    references = []
    gate_outputs = model.gate_outputs

    def recorded() -> Any:
        out = gate_outputs()
        references.append(model.run is model.net)
        return out

    model.gate_outputs = recorded
    report = run(model, "channels_last", apply=named_apply(corrupt=("channels_last",)))
    assert references[0] is True and report.fell_back and model.run is model.net


def test_an_explicit_mode_is_gated_and_falls_back_to_eager_with_one_line():
    model = TinyClassifier()
    report = run(model, "jit", apply=named_apply(corrupt=("jit",)))
    assert report.mode == "eager" and report.fell_back and model.run is model.net
    assert report.line.startswith("TINY: optimize jit: gate failed: top-1 ") and report.line.endswith(
        "; running eager (" + report.line.rsplit("(", 1)[1])
    assert "\n" not in report.line
    report = run(model, "jit", apply=named_apply(failing={"jit": RuntimeError("compile error")}))
    assert report.fell_back and report.line.startswith("TINY: optimize jit: RuntimeError: compile error; running eager")
    report = run(model, "channels_last+jit", apply=named_apply())
    assert report.mode == "channels_last+jit" and not report.fell_back
    assert report.line.startswith("TINY: optimize channels_last+jit: gate passed [top-1 6/6, top-5 6/6, logit error ")


def test_a_failing_reference_run_serves_eager_never_a_crash():
    model = TinyClassifier()

    def broken() -> Any:
        raise RuntimeError("the gate inputs could not be made")

    model.gate_outputs = broken
    report = optimize_model(model, "classification", "cpu", "auto", 4, "TINY")
    assert report.fell_back and report.mode == "eager" and model.run is model.net
    assert report.line == "TINY: optimize auto: RuntimeError: the gate inputs could not be made; running eager"


def test_models_without_targets_and_eager_cost_nothing():
    @implementer(IModel)
    class Plain:
        version = "plain"

    report = optimize_model(Plain(), "classification", "cpu", "auto", 4, "PLAIN")
    assert report.mode == "eager" and not report.outcomes
    assert report.line == "PLAIN: optimize auto: the model names no optimisation targets: eager"
    model = TinyClassifier()
    report = optimize_model(model, "classification", "cpu", "eager", 4, "TINY")
    assert report.line == "TINY: optimize eager: eager" and model.gate_calls == 0


def test_an_unknown_category_has_no_gate_said_in_its_words_alone():
    """A plugin author's probe: the documented line read ``ValueError: no accuracy gate ...``, like a crash."""
    report = Optimizer(TinyClassifier(), "poetry", "cpu", "jit", 4, "TINY").run()
    assert report.fell_back and report.line == ("TINY: optimize jit: no accuracy gate for category 'poetry'; known: "
                                                "classification, detection, generation, segmentation; running eager")


def test_candidates_leave_out_what_the_machine_cannot_run(monkeypatch):
    from svc.optimize import support

    model = TinyClassifier(candidates=("channels_last+bf16", "jit", "eager"))
    monkeypatch.setattr(support, "cpu_has_native_bf16", lambda flags=None: False)
    assert [m.name for m in Optimizer(model, "classification", "cpu", "auto", 4).candidates()] == ["jit"]
    monkeypatch.setattr(support, "cpu_has_native_bf16", lambda flags=None: True)
    assert [m.name for m in Optimizer(model, "classification", "cpu", "auto", 4).candidates()] == [
        "channels_last+bf16", "jit"]


def test_the_real_timer_takes_the_best_call(monkeypatch):
    # started; then per call begin, end and the loop's look at the clock: calls of 0.5, 0.2 and 0.9 s
    ticks = iter([0.0, 0.0, 0.5, 0.5, 0.5, 0.7, 0.7, 0.7, 1.6, 1.6])
    monkeypatch.setattr(timing, "TIMING_S", 1.0)
    model = TinyClassifier()
    [target] = model.optimization_targets()
    assert timing.timed_ms([(target, target.module)], 2, clock=lambda: next(ticks)) == pytest.approx(200.0)


def test_the_timer_waits_for_queued_gpu_work_before_it_reads_the_clock(monkeypatch):
    """A GPU call returns once its work is queued (a CUDA graph's replay is one launch, timed 0.0 ms before):
    with an example input on a CUDA device, every call is timed to the end of its work."""
    events: list[str] = []

    class OnCuda:
        is_cuda = True

    def call(*args: Any) -> None:
        events.append("call")

    target = SimpleNamespace(example_inputs=lambda batch: (OnCuda(),))
    ticks = iter(range(100))
    monkeypatch.setattr(timing, "MIN_CALLS", 2)
    monkeypatch.setattr(timing, "TIMING_S", 0.0)
    timing.timed_ms([(target, call)], 2, clock=lambda: events.append("clock") or next(ticks),
                    synchronize=lambda: events.append("sync"))
    # before the clock starts, then each call timed from its start to the end of its work; the last look ends it
    assert events == ["sync", "clock", *["clock", "call", "sync", "clock"] * 2, "clock"]
    assert timing._cuda_synchronize([(call, (OnCuda(),))]).__name__ == "synchronize"  # torch.cuda's
    assert timing._cuda_synchronize([(call, (torch.zeros(1),))])() is None  # on the CPU: nothing to wait for


def test_a_mode_that_replays_on_captured_weights_is_applied_again_once_their_layout_changed():
    """A CUDA graph replays its kernels on the weights' addresses at capture. Timing eager and the modes in turn
    moves the weights (their memory order changed in place, a new allocation each time), so a graph captured
    before read freed memory and served NaN. Here the "graph" checks the address it captured on every call."""
    model = TinyClassifier()
    applied: list[str] = []

    def graph_like_apply(target: OptimizationTarget, chosen: Mode, device: str, batch: int) -> Any:
        weight = target.module[0].weight
        captured = weight.data_ptr()
        applied.append(chosen.name)

        def replay(*args: Any) -> Any:
            assert target.module[0].weight.data_ptr() == captured, "replayed on weights that moved"
            return target.module(*args)

        return replay

    def timer(pairs: list, batch: int) -> float:
        for target, fn in pairs:
            fn(*target.example_inputs(batch))
        return 10.0 if all(fn is target.module for target, fn in pairs) else 2.0

    graphs = mode("channels_last+fp16+cuda_graphs", "cuda")
    optimizer = Optimizer(model, "classification", "cuda", "auto", 4, "TINY", apply=graph_like_apply, timer=timer)
    optimizer.candidates = lambda: [graphs]  # type: ignore[method-assign]  # no GPU here: the mode is named
    report = optimizer.run()
    assert report.mode == graphs.name, report.line
    timed = optimizer.rounds.get(graphs.name, select.ROUNDS)
    assert applied == [graphs.name] * (1 + timed + 1)  # gated, timed after each of eager's layouts, served
    assert not model.net[0].weight.is_contiguous()  # channels-last: the layout the graph was captured on
    model.predict([torch.zeros(3, 8, 8)], {})  # served on the weights it captured
