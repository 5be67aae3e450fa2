"""Bare torch forward throughput of MobileNetV2, in a process of its own.

Same settings as the model server: torch threads = cores (``--threads N``
for another count: 1 is what each of two workers gets on 2 cores), float32,
224x224, ``torch.inference_mode()``, and the glibc allocator tuning the
server applies (``--no-tune-malloc`` shows the difference).  The network is
the served one: the MOBILENETV2 plugin's build (random init with seeded
BatchNorm statistics) with its input normalisation, fed a uint8 NHWC batch
as the worker stacks it (``models/mobilenetv2.py``: ``pixel_net``), and ``--optimize MODE`` (default ``eager``) applies
``backend.optimize`` as the model server does (``svc.optimize.select``,
accuracy gate included; ``auto`` measures and chooses at batch 8, the
shipped ``max_batch_size``, or the largest ``--batch`` on a GPU); its line
goes to stderr.  ``--device gpu`` runs on CUDA (bench/gpu_mobilenet.py).
Prints one JSON line per batch size: {"batch": B, "threads": T,
"images_per_s": X, "ms_per_batch": Y, "core_ms_per_image": Z, "optimize":
MODE} (Z: the process's CPU time over the timed loop, per image).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def _cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 = the CPU cores")
    parser.add_argument("--no-tune-malloc", action="store_true")
    parser.add_argument("--optimize", default="eager", help="backend.optimize to apply: auto, eager or a mode")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    args = parser.parse_args()

    from svc.model import torchenv
    from svc.optimize.support import check_setting

    if not args.no_tune_malloc:
        torchenv.tune_malloc()
    threads = torchenv.configure_threads(args.threads, 1)
    device = torchenv.select_device(args.device, 0)
    check_setting(args.optimize, device)
    torchenv.configure_compile_cache()
    import torch

    from models.mobilenetv2 import mobilenetv2
    from svc.optimize.select import optimize_model

    model = mobilenetv2.build({"weights": "random", "seed": 0}, device)
    batch_for_auto = 8 if device == "cpu" else max(args.batch)
    report = optimize_model(model, mobilenetv2.category, device, args.optimize, batch_for_auto, mobilenetv2.catalog_id)
    print(report.line, file=sys.stderr, flush=True)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for batch in args.batch:
        x = torch.randint(0, 256, (batch, 224, 224, 3), dtype=torch.uint8).to(device)
        with torch.inference_mode():
            for _ in range(3):
                model.run_net(x)
            sync()
            n = 0
            cpu = _cpu_ms()
            started = time.perf_counter()
            while time.perf_counter() - started < args.seconds:
                model.run_net(x)
                n += 1
            sync()
            elapsed = time.perf_counter() - started
            cpu = _cpu_ms() - cpu
        print(json.dumps({"batch": batch, "threads": threads, "images_per_s": n * batch / elapsed,
                          "ms_per_batch": elapsed / n * 1000, "core_ms_per_image": cpu / (n * batch),
                          "optimize": report.mode}), flush=True)


if __name__ == "__main__":
    main()
