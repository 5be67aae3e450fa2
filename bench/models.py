"""The model zoo served versus the bare library call, in one run.

For each model of the zoo: start a real model server from its shipped
config (``conf/server/<ID>.toml``, random init, CPU), time requests from one
client, stop it, then time the bare library call in a process of its own
(``bench/bare_models.py``, same threads and allocator tuning).  Prints ms per
image (YOLOV8, SAM_AMG: synchronous requests of one 640x480 JPEG) or per
sampling step (diffusion: async jobs of ``--steps`` steps, from submit to the
terminal state of ``/wait``), and the ratio served / bare.

    python -m bench.models [--models YOLOV8 DDIM ...] [--seconds 10] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.processes import REPO, child_env, start_model_server, write_config

MODELS = ["YOLOV8", "SAM_AMG", "DDPM", "DDIM", "CLS_COND_DDIM", "LDM"]
GENERATIVE = {"DDPM", "DDIM", "CLS_COND_DDIM", "LDM"}


def bare(model: str, seconds: float, steps: int) -> dict:
    args = [sys.executable, "-m", "bench.bare_models", "--model", model, "--seconds", str(seconds),
            "--steps", str(steps)]
    out = subprocess.run(args, env=child_env(), cwd=REPO, capture_output=True, check=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def served_sync(server, uri: str, body: dict, seconds: float) -> tuple[float, int]:
    """Mean ms per request of sequential requests (after one warm-up request)."""
    post(server.url + uri, body, headers=server.auth, timeout=300)
    runs, started = 0, time.perf_counter()
    while runs < 2 or time.perf_counter() - started < seconds:
        reply = post(server.url + uri, body, headers=server.auth, timeout=300)
        assert reply.status == 200 and reply.json["status"] == 0, reply.body[:300]
        runs += 1
    return (time.perf_counter() - started) * 1000 / runs, runs


def served_jobs(server, body: dict, seconds: float) -> tuple[float, int]:
    """Mean ms per job (submit to done, waiting with /wait), sequential."""

    def one() -> None:
        job = post(server.url + "/jobs", body, headers=server.auth).json
        while True:
            state = get(f"{server.url}/jobs/{job['job_id']}/wait?timeout=30000", headers=server.auth, timeout=60).json
            if state["state"] != "pending" and state["state"] != "running":
                assert state["state"] == "done", state
                return

    one()
    runs, started = 0, time.perf_counter()
    while runs < 2 or time.perf_counter() - started < seconds:
        one()
        runs += 1
    return (time.perf_counter() - started) * 1000 / runs, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per figure")
    parser.add_argument("--steps", type=int, default=50, help="sampling steps per diffusion job")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-zoo-"))
    image = image_b64(width=640, height=480, fmt="JPEG", seed=3)
    rows = []
    for model in args.models:
        server = start_model_server(write_config(tmp, model, max_queue_depth=0), ready_timeout=300)
        try:
            if model in GENERATIVE:
                params = {"timesteps": args.steps, "seed": 7}
                ms, runs = served_jobs(server, {"images": ["AA=="], "params": params}, args.seconds)
                served, unit = ms / args.steps, "step"
            else:
                served, runs = served_sync(server, f"/{model.lower()}/predict", {"images": [image]}, args.seconds)
                unit = "image"
        finally:
            server.stop()
        reference = bare(model, args.seconds, args.steps)
        assert reference["unit"] == unit
        rows.append((model, unit, served, runs, reference["ms"], reference["runs"]))

    print(f"model zoo, CPU, shipped configs (random init), one client; diffusion: jobs of {args.steps} steps")
    print(f"  {'model':<14} {'unit':<6} {'served ms':>10} {'runs':>5} {'bare ms':>9} {'runs':>5} {'served/bare':>11}")
    for model, unit, served, runs, bare_ms, bare_runs in rows:
        print(f"  {model:<14} {unit:<6} {served:10.1f} {runs:5d} {bare_ms:9.1f} {bare_runs:5d} {served / bare_ms:11.2f}")


if __name__ == "__main__":
    main()
