"""MOBILENETV2 on a GPU through the gateway: requests per second with optimised execution.

The run to do on a GPU machine (bench/README.md says what it must show):

    python -m bench.gpu_mobilenet [--optimize auto] [--max-batch 64] [--concurrency 64 256 512] [--seconds 15]

1. Bare GPU forward of the served network (``bench/bare_forward.py --device
   gpu``), eager and in the mode ``--optimize`` chooses, at batch 1 and
   ``--max-batch``: the ceiling.
2. A real MOBILENETV2 model server on ``backend.device = "gpu"`` with
   ``backend.optimize`` and ``max_batch_size`` = ``--max-batch`` (images
   decoded in ``--decode-threads`` decode threads while the GPU runs, batches
   copied through pinned buffers), behind a real gateway; single-image
   requests (one 224x224 JPEG) at each concurrency through the gateway.
   Prints the model server's optimisation and ready lines, then req/s, p50,
   p99 and errors per concurrency.

Goal (issue): at least 2,000 requests/s through the gateway on one H100.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.loadgen import run_load
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.images import image_b64
from tests.support.processes import REPO, child_env, free_port, start_model_server, write_config

GOAL_RPS = 2000
LINES = re.compile(r"MOBILENETV2: (optimize .*|ready \(.*)")


def bare(optimize: str, batches: list[int], seconds: float) -> list[dict]:
    args = [sys.executable, "-m", "bench.bare_forward", "--device", "gpu", "--optimize", optimize,
            "--seconds", str(seconds), "--batch", *map(str, batches)]
    done = subprocess.run(args, env=child_env(), cwd=REPO, capture_output=True, check=True, text=True)
    print("  " + done.stderr.strip().splitlines()[-1])  # the optimisation line
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimize", default="auto", help="backend.optimize of the model server")
    parser.add_argument("--max-batch", type=int, default=64, help="max_batch_size of the model server")
    parser.add_argument("--decode-threads", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per point")
    parser.add_argument("--tool", choices=("auto", "wrk", "python"), default="auto")
    args = parser.parse_args()

    print("bare forward on the GPU (bench/bare_forward.py), images/s:")
    for optimize in ("eager", args.optimize):
        for row in bare(optimize, [1, args.max_batch], min(args.seconds, 8.0)):
            print(f"  {row['optimize']:<32} batch {row['batch']:4d}: {row['images_per_s']:9.0f} img/s")

    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    servers = tmp / "server"
    servers.mkdir()
    port = free_port()
    config = write_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=port, max_batch_size=args.max_batch,
                          max_queue_depth=0, max_batch_delay_ms=2, gpu_mem_limit_mb=0,
                          backend={"device": "gpu", "optimize": args.optimize, "decode_threads": args.decode_threads})
    model = start_model_server(config, token="bench-upstream", port=port, ready_timeout=600)
    gateway = start_gateway(tmp, servers, None, env={"SERVICE_UPSTREAM_TOKEN": "bench-upstream"})
    body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=3)]}).encode()
    headers = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}",
               "Content-Type": "application/json"}
    rows = []
    try:
        for line in LINES.findall(model.output()):
            print("  " + line)
        for c in args.concurrency:
            rows.append(run_load(gateway.url + "/v1/models/MOBILENETV2/infer", body, headers, concurrency=c,
                                 seconds=args.seconds, tool=args.tool))
    finally:
        gateway.stop()
        model.stop()

    print(f"\nMOBILENETV2 on the GPU through the gateway (max_batch_size {args.max_batch}, one 224x224 JPEG per "
          f"request, optimize {args.optimize}):")
    print(f"  {'clients':>7} {'tool':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for r in rows:
        print(f"  {r.concurrency:7d} {r.tool:>5} {r.rate:8.0f} {r.p50:8.2f} {r.p99:8.2f} {r.errors:6d}")
    best = max(r.rate for r in rows)
    print(f"\nbest {best:.0f} req/s: goal {GOAL_RPS} req/s {'met' if best >= GOAL_RPS else 'NOT met'}")


if __name__ == "__main__":
    main()
