"""Model-server throughput and latency against bare torch, in one run.

Starts a real MOBILENETV2 model server (max_batch_size 1, then 8) and drives
it with single-image requests (a 224x224 JPEG) at concurrency 1, 8 and 32;
measures bare torch forward throughput at batch 1 and 8 in a separate process
with the same settings, before and after each server (the mean is the
reference: this machine's speed drifts); prints images/s, p50/p99 latency,
the ratio served / bare, and the server's own per-batch forward time.

    python -m bench.modelserver [--seconds 15] [--tool wrk|python]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.loadgen import run_load
from tests.support.http import get
from tests.support.images import image_b64
from tests.support.processes import REPO, child_env, start_model_server, write_config


def bare(batches: list[int], seconds: float, tune: bool = True) -> dict[int, float]:
    args = [sys.executable, "-m", "bench.bare_forward", "--seconds", str(seconds), "--batch", *map(str, batches)]
    if not tune:
        args.append("--no-tune-malloc")
    out = subprocess.run(args, env=child_env(), cwd=REPO, capture_output=True, check=True, text=True).stdout
    return {row["batch"]: row["images_per_s"] for row in map(json.loads, out.splitlines())}


def forward_ms(server) -> tuple[float, float]:
    """Mean forward time per batch and mean batch size, from the server's metrics."""
    text = get(server.url + "/metrics", headers=server.auth).body.decode()

    def value(pattern: str) -> float:
        return float(re.search(pattern, text, re.M).group(1))

    inference = value(r'^service_stage_duration_ms_sum\{stage="inference"\} (\S+)') / value(
        r'^service_stage_duration_ms_count\{stage="inference"\} (\S+)')
    batch = value(r"^service_batch_size_sum (\S+)") / value(r"^service_batch_size_count (\S+)")
    return inference, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tool", choices=("auto", "wrk", "python"), default="auto")
    args = parser.parse_args()

    untuned = bare(args.batch_sizes, 4, tune=False)
    body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=3)]}).encode()
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))
    rows = []
    for batch in args.batch_sizes:
        before = bare([batch], 4)[batch]
        config = write_config(tmp, "MOBILENETV2", max_batch_size=batch, max_queue_depth=0)
        server = start_model_server(config)
        points = []
        try:
            headers = {**server.auth, "Content-Type": "application/json"}
            for c in args.concurrency:
                result = run_load(server.url + "/mobilenetv2/predict", body, headers, concurrency=c,
                                  seconds=args.seconds, tool=args.tool)
                points.append((c, result))
            fwd, mean_batch = forward_ms(server)
        finally:
            server.stop()
        after = bare([batch], 4)[batch]
        reference = statistics.mean([before, after])
        for c, result in points:
            rows.append((batch, c, result, reference, result.rate / reference))
        rows.append((batch, None, (fwd, mean_batch), reference, None))

    print("bare torch MobileNetV2 (CPU, float32, 224x224, 2 intra-op threads):")
    for b in args.batch_sizes:
        refs = {r[3] for r in rows if r[0] == b}
        print(f"  batch {b:2d}: {statistics.mean(refs):7.1f} img/s   (glibc malloc defaults: {untuned[b]:6.1f} img/s)")
    print("\nserved (single-image requests, closed loop):")
    print(f"  {'max_batch':>9} {'clients':>7} {'tool':>6} {'img/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'served/bare':>11}")
    for batch, c, r, _ref, ratio in rows:
        if c is None:
            fwd, mean_batch = r
            print(f"  {batch:9d}   server forward pass: {fwd:.1f} ms per batch, mean batch {mean_batch:.2f}")
            continue
        print(f"  {batch:9d} {c:7d} {r.tool:>6} {r.rate:8.1f} {r.p50:8.1f} {r.p99:8.1f} {r.errors:6d} {ratio:11.2f}")
    print("\n(served/bare: served images/s over bare torch at the same batch size, measured around that server)")


if __name__ == "__main__":
    main()
