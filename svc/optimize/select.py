"""The optimisation step of a model load: apply the configured mode, gate it, or choose one (``auto``).

Runs in the worker thread after ``build`` and before the warm-up batch
(``svc.modelserver.engine``), so ``/ready`` still means built, optimised and
warmed up.  For a model that provides ``svc.model.api.IOptimizable``:

1. the eager reference: the model's ``gate_outputs()`` with every target eager,
   and (``auto`` only) one timed call of every target on its example inputs;
2. each candidate mode (``auto``: the model's ``optimize_candidates``, else
   :data:`DEFAULT_CANDIDATES`, without what this machine cannot run; an
   explicit mode: that one): applied to every target, gated against the
   reference with the gate of the model's category (:mod:`svc.optimize.gates`),
   and timed (``auto``: interleaved rounds, a mode clearly slower than the
   fastest after the first rounds left out of the rest); a mode whose runtime (``openvino``, ``onnxruntime``)
   does not import here is dropped without being tried, saying so;
3. the choice: the fastest candidate that passed and beats eager by
   :data:`MIN_GAIN`, else eager.  Any exception while applying or gating a
   candidate, or a failed gate, drops that candidate (an explicit mode falls
   back to eager): never a crash.

``auto``'s choice is recorded in the state directory under a key of
everything that decides it (:mod:`svc.optimize.choices`); a start with the
same key applies the recorded mode without steps 1 to 3 (its converted model
or package still comes from the cache), and falls back to measuring when the
recorded mode fails to apply or the record cannot be read.

The :class:`Report` carries one line with the figures of every candidate,
which the service logs.  A model without targets, or ``eager``, costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from svc.model.api import IOptimizable, OptimizationTarget
from svc.optimize.modes import EAGER_MODE, Mode, mode, parse_mode
from svc.optimize.report import Outcome, Report, cache_counters, cache_delta, describe_cache
from svc.optimize.timing import timed_ms

if TYPE_CHECKING:
    from svc.optimize.choices import Recorded

__all__ = ["DEFAULT_CANDIDATES", "MIN_GAIN", "Optimizer", "Outcome", "Report", "optimize_model", "timed_ms"]

#: What ``auto`` tries when a model names no candidates of its own, per torch device type.
DEFAULT_CANDIDATES: dict[str, tuple[str, ...]] = {
    "cpu": ("jit", "channels_last+jit", "onnxruntime", "openvino", "bf16+openvino"),
    "cuda": ("channels_last+fp16", "channels_last+fp16+cuda_graphs"),
}
#: ``auto`` keeps eager unless a candidate is at least this much faster (noise is not a speed-up).
MIN_GAIN = 0.05
#: Timing: ROUNDS interleaved rounds over eager and the candidates that passed; in each round every mode is
#: timed by :func:`svc.optimize.timing.timed_ms` (its best call).
ROUNDS = 3
#: After EARLY_ROUNDS rounds, a mode whose best is over SLOWER times the fastest mode's best is not timed again
#: (it cannot win, nor, when it is eager, change the choice); a mode left alone (eager when no candidate passed)
#: is timed in no further round: its figure is only reported.
EARLY_ROUNDS = 2
SLOWER = 1.5


def holds_weights(chosen: Mode) -> bool:
    """Whether ``chosen`` replays on the weights' addresses at capture (CUDA graphs): timing eager and the modes in
    turn moves the weights (:meth:`Optimizer.apply_layout`), and a graph captured before served NaN from freed
    memory; such a mode is applied again once the layout is the one it runs in."""
    return chosen.has("cuda_graphs")


def _problem(e: BaseException) -> str:
    """One line of ``e``: its type and first line; a known condition's text alone (``said_whole``: no gate)."""
    text = str(e).strip().splitlines()
    name = "" if getattr(e, "said_whole", False) else f"{type(e).__name__}: "
    return f"{name}{text[0][:160] if text else ''}".rstrip(": ")


class Optimizer:
    """The optimisation step for one built model (the worker thread calls :meth:`run` once)."""

    def __init__(self, model: Any, category: str, device: str, setting: str, batch: int, model_id: str = "",
                 apply: Callable[..., Any] | None = None, timer: Callable[..., float] = timed_ms,
                 workers: int = 1, phase: Callable[[str], None] | None = None, choices: Path | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        """``apply``/``timer``: the functions that apply a mode and time targets (tests inject failures).
        ``config``: the model's ``[model]`` table, part of every key of its artefacts and choice (a plugin may
        keep a value of it as an attribute its forward reads).

        ``workers``: the inference threads that will call the targets at once (a compiled package gets
        as many runners).  ``choices``: the folder of ``auto``'s records (:mod:`svc.optimize.choices`);
        None: ``auto`` measures every time and records nothing.
        """
        from svc.optimize.apply import apply_mode

        self.workers, self.model, self.category = workers, model, category
        self.device, self.setting = device, setting
        self.batch = max(1, batch)
        self.model_id = model_id
        self.config_digest = hashlib.sha256(json.dumps(config or {}, sort_keys=True, default=str).encode()).hexdigest()
        self.apply = apply or apply_mode
        self.timer = timer
        self.phase = phase or (lambda text: None)  # what the load is doing, for the model server's /ready
        self.choices = choices
        self.rounds: dict[str, int] = {}  # timing rounds of the modes timed in fewer than ROUNDS

    def run(self) -> Report:
        """The optimisation; whatever fails leaves the model eager with one line saying what.  The artefacts it
        makes are recorded as made for this model (svc.optimize.cache.MADE_FOR, for ``svcctl cache list``)."""
        from svc.optimize import cache

        started = time.perf_counter()
        cache.MADE_FOR, cache.KEY_CONTEXT = self.model_id, self.config_digest
        try:
            return self._run(started)
        except Exception as e:  # noqa: BLE001 - the reference run or the targets failed: serve eager
            report = Report(self.setting, fell_back=True, seconds=time.perf_counter() - started)
            try:
                targets = list(self.model.optimization_targets())
                self._install(targets, [t.module for t in targets])
                self.apply_layout(targets, EAGER_MODE)
            except Exception:  # noqa: BLE001 - nothing more to undo
                pass
            report.line = f"{self.model_id}: optimize {self.setting}: {_problem(e)}; running eager"
            report.outcomes.append(Outcome(EAGER_MODE, problem=_problem(e), detail=traceback.format_exc()))
            return report
        finally:
            cache.MADE_FOR = cache.KEY_CONTEXT = ""

    def _run(self, started: float) -> Report:
        report = Report(self.setting)
        explicit = parse_mode(self.setting, self.device)
        if explicit == EAGER_MODE or not IOptimizable.providedBy(self.model):
            report.line = (f"{self.model_id}: optimize {self.setting}: eager" if explicit == EAGER_MODE
                           else f"{self.model_id}: optimize {self.setting}: the model names no optimisation targets: eager")
            return report
        from svc.optimize.gates import gate_for

        gate = gate_for(getattr(self.model, "gate_category", None) or self.category)
        targets = list(self.model.optimization_targets())
        self._install(targets, [t.module for t in targets])  # the reference is eager, whatever ran before
        self.apply_layout(targets, EAGER_MODE)
        candidates = [explicit] if explicit is not None else self.candidates()
        key, first = None, None  # first: the record read before any wait (one that failed is not tried again)
        if explicit is None and self.choices is not None:
            key, first = self._recall(targets, candidates, report)
            if first is not None and self._apply_recorded(report, first, targets):
                return self._recorded(report, started)
        if key is None:
            return self._measure(report, explicit, candidates, targets, gate, None, started)
        from svc.optimize import measuring

        assert self.choices is not None
        with measuring.alone(self.choices, self.model_id, self.phase) as waited:
            if waited:  # another model measured meanwhile: a replica of this one may have recorded this key
                report.notes.append(f"waited {waited:.1f} s for another model's measurement")
                recorded = self._read(key, candidates)
                if recorded is not None and recorded != first and self._apply_recorded(report, recorded, targets):
                    return self._recorded(report, started)
            return self._measure(report, explicit, candidates, targets, gate, key, started)

    def _recorded(self, report: Report, started: float) -> Report:
        report.seconds = time.perf_counter() - started
        report.line = self._recorded_line(report)
        return report

    def _measure(self, report: Report, explicit: Mode | None, candidates: list[Mode],
                 targets: list[OptimizationTarget], gate: Any, key: str | None, started: float) -> Report:
        """Gate every candidate, time those that passed (``auto``) and keep the fastest: steps 1 to 3."""
        from svc.optimize.support import missing_runtime

        compiling = any(c.has("compile") for c in candidates)
        converting = any(c.runtime for c in candidates)
        cache_before = self._prepare(compiling, converting)
        reference = self.model.gate_outputs()
        passed: list[tuple[Outcome, list]] = []
        transient: list[str] = []  # candidates dropped for what may not happen again: no record
        for number, candidate in enumerate(candidates, 1):
            self.phase(f"measuring mode {number} of {len(candidates)} ({candidate.name})")
            outcome = Outcome(candidate)
            report.outcomes.append(outcome)
            missing = missing_runtime(candidate)
            if missing:  # a platform without the runtime's wheel: the torch modes compete without it
                outcome.problem = missing
                continue
            try:
                fns = [self.apply(t, candidate, self.device, self.batch) for t in targets]
                self._install(targets, fns)
                result = gate(reference, self.model.gate_outputs())
                outcome.gate = result.summary
                if result.passed:
                    passed.append((outcome, fns))
                else:
                    outcome.problem = f"gate failed: {result.summary}"
            except Exception as e:  # noqa: BLE001 - a mode that fails falls back, never stops the load
                outcome.problem = _problem(e)
                outcome.detail = traceback.format_exc()
                if isinstance(e, (OSError, MemoryError)):
                    transient.append(candidate.name)
            finally:
                self._install(targets, [t.module for t in targets])
        if explicit is None and passed:
            self.phase(f"timing eager and {len(passed)} mode(s) that passed the accuracy gate")
        eager_ms = self.time_all(targets, passed) if explicit is None else None
        best = min(passed, key=lambda p: p[0].ms or 0.0, default=None)
        chosen: Mode = EAGER_MODE
        if best is not None and (explicit is not None or (best[0].ms or 0.0) <= (eager_ms or 0.0) * (1 - MIN_GAIN)):
            chosen = best[0].mode
            self.apply_layout(targets, chosen)
            fns = self.recapture(targets, chosen) if explicit is None and holds_weights(chosen) else best[1]
            self._install(targets, fns)
        else:
            self.apply_layout(targets, EAGER_MODE)
        report.chosen = chosen
        report.fell_back = explicit is not None and chosen == EAGER_MODE
        report.cache = cache_delta(cache_before, compiling, converting)
        report.seconds = time.perf_counter() - started
        report.line = self._line(report, explicit, eager_ms)
        if key is not None:
            self._record(report, key, eager_ms, transient)
        return report

    def _prepare(self, compiling: bool, converting: bool) -> dict[str, int]:
        """Give compiled packages and converted models a runner per worker; the cache counters before the load."""
        if compiling:
            from svc.optimize import aot

            aot.RUNNERS = self.workers
        if converting:
            from svc.optimize import runtimes

            runtimes.WORKERS = self.workers
        return cache_counters(compiling, converting)

    def _recall(self, targets: list[OptimizationTarget], candidates: list[Mode],
                report: Report) -> tuple[str | None, Recorded | None]:
        """The key of this load's choice and its record, if one can be used (else a note says why not)."""
        from svc.optimize import choices

        assert self.choices is not None
        try:
            key = choices.choice_key(self.model, self.model_id, self.category, targets,
                                     [c.name for c in candidates], self.device, self.batch, self.workers)
        except Exception as e:  # noqa: BLE001 - without a key auto measures, as before records
            report.notes.append(f"choice not recorded: no key ({_problem(e)})")
            return None, None
        try:
            return key, choices.read(self.choices, self.model_id, key, [EAGER_MODE.name] + [c.name for c in candidates])
        except choices.RecordError as e:
            name = choices.record_path(self.choices, self.model_id, key).name
            report.notes.append(f"recorded choice {name} ignored: {e}")
            return key, None

    def _read(self, key: str, candidates: list[Mode]) -> Recorded | None:
        """The record of ``key`` if one can be used now (written by a replica while this load waited), else None."""
        from svc.optimize import choices

        assert self.choices is not None
        try:
            return choices.read(self.choices, self.model_id, key, [EAGER_MODE.name] + [c.name for c in candidates])
        except choices.RecordError:
            return None

    def _apply_recorded(self, report: Report, recorded: Recorded, targets: list[OptimizationTarget]) -> bool:
        """Run the recorded mode without measuring; False (the model eager again, a note) when it fails to apply.

        Not gated again: its cached conversion or package is read only when its files are the ones that passed
        the gate (their SHA-256, ``svc.optimize.cache``), else made again; the rest of the key is the same."""
        chosen = mode(recorded.mode, self.device)
        self.phase(f"applying {chosen}, the mode measured {recorded.when} (recorded: not measured again)")
        compiling, converting = chosen.has("compile"), chosen.runtime is not None
        before = self._prepare(compiling, converting)
        try:
            fns = [self.apply(t, chosen, self.device, self.batch) if chosen.steps else t.module for t in targets]
        except Exception as e:  # noqa: BLE001 - the record is of no use now: measure
            self._install(targets, [t.module for t in targets])
            self.apply_layout(targets, EAGER_MODE)
            report.notes.append(f"the recorded {chosen} failed to apply ({_problem(e)}): measured again")
            return False
        self.apply_layout(targets, chosen)
        self._install(targets, fns)
        report.chosen, report.recorded = chosen, recorded
        report.cache = cache_delta(before, compiling, converting)
        return True

    def _record(self, report: Report, key: str, eager_ms: float | None, transient: list[str]) -> None:
        """Write the choice for the next start with this key, unless a candidate failed for a passing reason."""
        from svc.optimize import choices

        assert self.choices is not None
        if transient:
            report.notes.append(f"choice not recorded: {', '.join(transient)} failed in a way that may pass")
        else:
            ms = next((o.ms for o in report.outcomes if o.mode == report.chosen), None)
            speedup = eager_ms / ms if eager_ms and ms else None
            try:
                choices.write(self.choices, self.model_id, key, report.chosen.name, speedup, report.line)
                return
            except OSError as e:
                report.notes.append(f"choice not recorded ({_problem(e)})")
        report.line = self._line(report, None, eager_ms)

    def time_all(self, targets: list[OptimizationTarget], passed: list[tuple[Outcome, list]]) -> float:
        """Time eager and every candidate that passed, in ``ROUNDS`` interleaved rounds; eager's figure.

        Interleaved, so that a neighbour's burst of load slows every mode a
        little rather than one mode a lot; each figure is its best round.
        """
        runs: list[tuple[Mode, list, Outcome | None]] = [(EAGER_MODE, [t.module for t in targets], None)]
        runs += [(outcome.mode, fns, outcome) for outcome, fns in passed]
        best = [float("inf")] * len(runs)
        rounds = [0] * len(runs)
        timing = list(range(len(runs)))
        for number in range(ROUNDS):
            if number >= EARLY_ROUNDS:
                timing = [i for i in timing if best[i] <= SLOWER * min(best)]
            if number >= 1 and len(timing) < 2:  # alone (nothing passed, or the rest left out): its figure is kept
                break
            for i in timing:
                self.apply_layout(targets, runs[i][0])
                if holds_weights(runs[i][0]):
                    runs[i] = (runs[i][0], self.recapture(targets, runs[i][0]), runs[i][2])
                best[i] = min(best[i], self.timer(list(zip(targets, runs[i][1])), self.batch))
                rounds[i] += 1
        for (_mode, _fns, outcome), ms in zip(runs, best):
            if outcome is not None:
                outcome.ms = ms
        self.rounds = {run[0].name: n for run, n in zip(runs, rounds) if n < ROUNDS}
        return best[0]

    def candidates(self) -> list[Mode]:
        """The modes ``auto`` tries on this device: the model's own list, else the default; what can run here."""
        from svc.optimize.support import unsupported

        own = getattr(self.model, "optimize_candidates", None)
        names = own(self.device) if callable(own) else DEFAULT_CANDIDATES.get(self.device, ())
        modes = [mode(name, self.device) for name in names]
        return [m for m in modes if m.steps and unsupported(m, self.device) is None]

    def recapture(self, targets: list[OptimizationTarget], chosen: Mode) -> list:
        """``chosen`` applied again, on the weights as they are now (:func:`holds_weights`)."""
        return [self.apply(t, chosen, self.device, self.batch) for t in targets]

    def apply_layout(self, targets: list[OptimizationTarget], chosen: Mode) -> None:
        """Leave every target's weights in the memory order the chosen mode runs them in."""
        from svc.optimize.tensors import set_layout

        for target in targets:
            set_layout(target.module, chosen.has("channels_last"))

    @staticmethod
    def _install(targets: list[OptimizationTarget], fns: list) -> None:
        for target, fn in zip(targets, fns):
            target.install(fn)

    def _line(self, report: Report, explicit: Mode | None, eager_ms: float | None) -> str:
        head = f"{self.model_id}: optimize {self.setting}"
        took = f"{report.seconds:.1f} s"
        cache = describe_cache(report.cache)
        if explicit is not None:
            outcome = report.outcomes[0]
            if report.fell_back:
                return f"{head}: {outcome.problem}; running eager ({took})"
            return f"{head}: gate passed [{outcome.gate}] ({took}{cache})"
        figures = "; ".join([f"eager {eager_ms:.1f} ms"] + [o.describe(eager_ms) for o in report.outcomes])
        chosen = report.chosen.name
        notes = "".join(f"; {note}" for note in report.notes)
        if self.rounds:
            short = ", ".join(f"{name} {n}" for name, n in self.rounds.items())
            notes += (f"; timed in fewer of {ROUNDS} rounds: {short} (over {SLOWER:g}x the fastest after "
                      f"{EARLY_ROUNDS}, or alone)")
        return (f"{head} chose {chosen}, batch {self.batch}: {figures} "
                f"(min gain {MIN_GAIN:.0%}{notes}; {took}{cache})")

    def _recorded_line(self, report: Report) -> str:
        recorded = report.recorded
        assert recorded is not None
        speed = f", {recorded.speedup:.2f}x eager" if recorded.speedup else ""
        notes = "".join(f"; {note}" for note in report.notes)
        return (f"{self.model_id}: optimize {self.setting} chose {report.chosen}, batch {self.batch}: as measured "
                f"{recorded.when}{speed} ({recorded.path.name}), not measured again "
                f"({report.seconds:.1f} s{notes}{describe_cache(report.cache)})")


def optimize_model(model: Any, category: str, device: str, setting: str, batch: int, model_id: str = "",
                   workers: int = 1, phase: Callable[[str], None] | None = None,
                   config: Mapping[str, Any] | None = None) -> Report:
    """Apply ``setting`` (``backend.optimize``) to a built model; the report of what runs now.

    ``workers``: the inference threads that will run batches at once; ``phase`` is told, in a line, which
    mode is being measured (the model server's /ready says it while the model loads).  ``auto`` records its
    choice in the state directory and applies a record of the same key (:mod:`svc.optimize.choices`).
    """
    from svc.optimize.choices import choices_dir

    return Optimizer(model, category, device, setting, batch, model_id, workers=workers, phase=phase,
                     choices=choices_dir(), config=config).run()
