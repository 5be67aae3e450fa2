"""The model server's own work per request, without the model: CPU per request by thread.

    python -m bench.request_path [--seconds 8] [--rounds 3] [--clients 32] [--body raw|json]
                                 [--tree NAME=PATH ...] [--profile DIR]

Starts a model server of the test model TESTFAULTS (``tests/conf/TESTFAULTS.toml``,
batches of 8: its forward pass is a mean over an 8x8 image, so almost all
the CPU is the serving around it) and drives it with single-image requests
(a 64x48 JPEG; raw body by default) from ``--clients`` wrk connections.  The
reactor thread's CPU per request is the cost of HTTP, routing, parsing,
admission, the envelope, metrics and the access log; the worker's is the
cost of the batch's Python around the model (queue hand-over, decoding a
tiny image, postprocessing, the data schema check).  Per-thread CPU from
``/proc`` is what a shared machine's load disturbs least, so the figures of
two code versions compare even on a busy machine: ``--tree NAME=PATH`` adds
the same server run from another checkout, alternated round by round.
``--profile DIR`` writes a py-spy profile of each server's last round
(``py-spy`` on PATH or in ``/tmp/pyspy/bin``: ``pip install --target
/tmp/pyspy py-spy``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.served import measure_model_server
from tests.support.images import b64, image_bytes
from tests.support.processes import checkout, start_model_server, write_config


def pyspy() -> str | None:
    return shutil.which("py-spy") or (str(Path("/tmp/pyspy/bin/py-spy")) if Path("/tmp/pyspy/bin/py-spy").exists()
                                      else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--body", choices=("raw", "json"), default="raw")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--profile", type=Path, default=None, help="write py-spy profiles (raw format) here")
    parser.add_argument("--tool", choices=("auto", "wrk", "python"), default="auto")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-path-"))
    plans = {"this": (write_config(tmp, "TESTFAULTS", max_batch_size=8, max_queue_depth=0), {})}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        tree = Path(path).resolve()
        config = write_config(tmp, tree / "tests" / "conf" / "TESTFAULTS.toml", max_batch_size=8, max_queue_depth=0)
        plans[name] = (config, checkout(tree))
    raw = image_bytes(width=64, height=48, fmt="JPEG", seed=3)
    body, content_type = (raw, "image/jpeg") if args.body == "raw" else (
        json.dumps({"images": [b64(raw)]}).encode(), "application/json")
    print(f"TESTFAULTS served, {args.clients} clients, one 64x48 JPEG per request ({args.body} body), "
          f"{args.seconds:g} s per point; core-ms per request by thread (reactor, torch = the worker, other)")
    results: dict[str, list] = {name: [] for name in plans}
    for round_ in range(1, args.rounds + 1):
        for name, (config, launch) in plans.items():
            server = start_model_server(config, **launch, ready_timeout=300)
            spy = None
            try:
                if args.profile and round_ == args.rounds and pyspy():
                    args.profile.mkdir(parents=True, exist_ok=True)
                    spy = subprocess.Popen(
                        [pyspy(), "record", "-p", str(server.popen.pid), "-d", str(int(args.seconds) + 1), "-r", "500",
                         "-f", "raw", "-t", "--nonblocking", "-o", str(args.profile / f"{name}.txt")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                headers = {**server.auth, "Content-Type": content_type}
                point = measure_model_server(name, round_, server, server.url + "/testfaults/predict", body, headers,
                                             clients=args.clients, seconds=args.seconds, tool=args.tool)
                if spy is not None:
                    spy.wait()
            finally:
                server.stop()
            results[name].append(point)
            print(f"  round {round_} {name:<8} {point.load.rate:8.1f} req/s  errors {point.load.errors}  "
                  f"reactor {point.per_image('reactor'):.3f}  torch {point.per_image('torch'):.3f}  "
                  f"other {point.per_image('other'):.3f}  mean batch {point.stages['batch']:.2f}  "
                  f"load {point.load_avg[0]:.1f}/{point.load_avg[1]:.1f}", flush=True)
    print("\nmedian core-ms per request:")
    for name, points in results.items():
        med = statistics.median
        print(f"  {name:<8} reactor {med(p.per_image('reactor') for p in points):.3f}  "
              f"torch {med(p.per_image('torch') for p in points):.3f}  other {med(p.per_image('other') for p in points):.3f}"
              f"  total {med(p.total_per_image for p in points):.3f}  ({med(p.load.rate for p in points):.0f} req/s, "
              f"{os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
