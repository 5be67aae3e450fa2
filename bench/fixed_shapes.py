"""OpenVINO's forms compiled for a fixed batch size against its dynamic batch dimension, in the served call.

    python -m bench.fixed_shapes [--models MOBILENETV2 YOLOV8 DDPM] [--precision f32|bf16] [--rounds 8]

For each model (its shipped config, demo weights), the batched optimisation
target is converted once and called through ``svc.optimize.runtime_calls``'s
``OpenVINOCall`` as a model server with two one-thread workers calls it,
twice: with the fixed forms (``FIXED``, what is served) and without (the
dynamic form only, as before).  The workers and threads are the shipped
config's on two cores.  Two shapes of load, interleaved round by
round in one process so that the machine's drift hits both alike:

- ``lone``: one caller, a batch of one, a 3 ms pause between calls (one
  client): the median ms of a call;
- ``busy``: two callers side by side, each with the warm-up batch
  (``max_batch_size``) while two batches run (a busy server): items/s.

Prints the medians of each and the median of the paired ratios (fixed over
dynamic: below 1 for ``lone`` ms and above 1 for ``busy`` items/s means the
fixed forms are faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MODELS = ("MOBILENETV2", "YOLOV8", "DDPM")


def target_of(name: str) -> tuple[Any, int, int]:
    """The model's batched optimisation target, its warm-up batch and its workers, from the shipped config."""
    from svc.config import load_model_server_config
    from svc.model.api import find_factory, model_config

    config = load_model_server_config(f"conf/server/{name}.toml")
    factory = find_factory(config.id)
    model = factory.build(model_config(factory, config.model, config.path), "cpu")
    target = next(t for t in model.optimization_targets() if t.batched)
    return target, config.max_batch_size, config.backend.workers


def lone(call: Any, args: tuple, reps: int = 30, gap: float = 0.003) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call(*args)
        times.append(time.perf_counter() - started)
        time.sleep(gap)
    return statistics.median(times) * 1000.0


def busy(call: Any, args: tuple, batch: int, seconds: float = 1.5) -> float:
    from svc.optimize.runtime_calls import BATCHES

    stop, done = time.perf_counter() + seconds, [0, 0]

    def loop(i: int) -> None:
        with BATCHES.running():
            while time.perf_counter() < stop:
                call(*args)
                done[i] += 1

    with BATCHES.running():  # a third batch decodes: neither call runs alone
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return sum(done) * batch / seconds


def measure(name: str, bf16: bool, rounds: int) -> None:
    import torch

    from svc.model import torchenv
    from svc.optimize import runtime_calls, runtimes

    target, batch, workers = target_of(name)
    torchenv.configure_threads(0, workers)
    runtimes.WORKERS = workers
    directory = Path(tempfile.mkdtemp(prefix="bench-fixed-"))
    calls = {}
    for fixed in (True, False):
        runtime_calls.FIXED = fixed
        with torch.inference_mode():
            calls[fixed] = runtimes.converted(target.module, target.example_inputs, batch, True, "openvino", bf16,
                                              name, directory)
    with torch.inference_mode():
        one, many = target.example_inputs(1), target.example_inputs(batch)
        for call in calls.values():  # warm: the first calls allocate
            lone(call, one, reps=3)
            busy(call, many, batch, seconds=0.3)
        times: dict[bool, list[float]] = {True: [], False: []}
        rates: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(rounds):
            for fixed in ((True, False) if round_ % 2 else (False, True)):
                times[fixed].append(lone(calls[fixed], one))
                rates[fixed].append(busy(calls[fixed], many, batch))
    lone_ratio = statistics.median(a / b for a, b in zip(times[True], times[False]))
    busy_ratio = statistics.median(a / b for a, b in zip(rates[True], rates[False]))
    print(f"  {name:12s} lone batch 1: fixed {statistics.median(times[True]):7.2f} ms, dynamic "
          f"{statistics.median(times[False]):7.2f} ms, paired {lone_ratio:.3f}   busy batch {batch}: fixed "
          f"{statistics.median(rates[True]):7.1f}/s, dynamic {statistics.median(rates[False]):7.1f}/s, paired "
          f"{busy_ratio:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                        help="bf16 where the CPU has it natively (svc.optimize.support)")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    from svc.model import torchenv

    torchenv.tune_malloc()
    print(f"OpenVINO {args.precision}, the shipped configs' workers; lone: ms per call (lower is better), busy: items/s "
          "(higher is better); paired: fixed over dynamic, median of the rounds", file=sys.stderr, flush=True)
    for name in args.models:
        measure(name, args.precision == "bf16", args.rounds)


if __name__ == "__main__":
    main()
