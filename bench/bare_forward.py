"""Bare torch forward throughput of MobileNetV2, in a process of its own.

Same settings as the model server: torch threads = cores (``--threads N``
for another count: 1 is what each of two workers gets on 2 cores), float32,
224x224, ``torch.inference_mode()``, and the glibc allocator tuning the
server applies (``--no-tune-malloc`` shows the difference).  Prints one JSON
line per batch size: {"batch": B, "threads": T, "images_per_s": X,
"ms_per_batch": Y, "core_ms_per_image": Z} (Z: the process's CPU time over
the timed loop, per image).
"""

from __future__ import annotations

import argparse
import json
import resource
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
    args = parser.parse_args()

    from svc import torchenv

    if not args.no_tune_malloc:
        torchenv.tune_malloc()
    threads = torchenv.configure_threads(args.threads, 1)
    import torch
    from torchvision.models import mobilenet_v2

    torch.manual_seed(0)
    net = mobilenet_v2(weights=None).eval()
    for batch in args.batch:
        x = torch.randn(batch, 3, 224, 224)
        with torch.inference_mode():
            for _ in range(3):
                net(x)
            n = 0
            cpu = _cpu_ms()
            started = time.perf_counter()
            while time.perf_counter() - started < args.seconds:
                net(x)
                n += 1
            elapsed = time.perf_counter() - started
            cpu = _cpu_ms() - cpu
        print(json.dumps({"batch": batch, "threads": threads, "images_per_s": n * batch / elapsed,
                          "ms_per_batch": elapsed / n * 1000, "core_ms_per_image": cpu / (n * batch)}), flush=True)


if __name__ == "__main__":
    main()
