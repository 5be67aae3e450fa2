"""How long one call of a model's optimisation targets takes: the figure ``auto`` compares its modes by.

The best call of a few (``MIN_CALLS`` to ``MAX_CALLS``, until ``TIMING_S``
seconds) is the figure: on a machine that others load too, the median moves
with their load, the best much less.  ``svc.optimize.select`` times eager and
every candidate that passed its gate in interleaved rounds of this.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from svc.model.api import OptimizationTarget

#: In each round a mode runs at least MIN_CALLS calls, then calls until TIMING_S seconds, at most MAX_CALLS.
MIN_CALLS = 1
TIMING_S = 0.15
MAX_CALLS = 10


def timed_ms(targets: list[tuple[OptimizationTarget, Any]], batch: int,
             clock: Callable[[], float] = time.perf_counter,
             synchronize: Callable[[], None] | None = None) -> float:
    """Best per-call time in ms of one call of every target on its example inputs.

    Calls until ``TIMING_S`` (at least ``MIN_CALLS``, at most ``MAX_CALLS``);
    the best call is the figure: on a machine that others load too, the
    median moves with their load, the best much less.  A target that takes a
    second per call is called once per round.

    On a GPU a call returns once its work is queued: ``synchronize`` (default: ``torch.cuda.synchronize``
    when an input is on a CUDA device) runs before the clock is read (a CUDA graph's replay timed 0.0 ms).
    """
    from svc.optimize.tensors import inference_context

    best = float("inf")
    calls = 0
    with inference_context():
        inputs = [(fn, target.example_inputs(batch)) for target, fn in targets]
        sync = synchronize or _cuda_synchronize(inputs)
        sync()
        started = clock()
        while calls < MIN_CALLS or (clock() - started < TIMING_S and calls < MAX_CALLS):
            begin = clock()
            for fn, args in inputs:
                fn(*args)
            sync()
            best = min(best, clock() - begin)
            calls += 1
    return best * 1000.0


def _cuda_synchronize(inputs: list[tuple[Any, tuple]]) -> Callable[[], None]:
    """``torch.cuda.synchronize`` when an input is on a CUDA device, else nothing to wait for."""
    if any(getattr(value, "is_cuda", False) is True for _, args in inputs for value in args):
        import torch

        return torch.cuda.synchronize
    return lambda: None
