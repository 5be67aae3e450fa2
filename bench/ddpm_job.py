"""How long a DDPM job takes, alone and beside a CPU-bound neighbour, per thread and nice setting.

    python -m bench.ddpm_job [--steps 1000] [--rounds 1] [--limit 240]
                             [--server NAME=JSON ...] [--neighbours 0 1] [--no-shipped]

For each server (the shipped ``conf/server/DDPM.toml``, and each
``--server NAME=JSON`` variant of it, e.g. ``'t2n5={"backend": {"threads": 2,
"worker_nice": 5}}'``) and each neighbour count, starts the model server,
starts that many CPU-bound neighbours (each a process spinning in a Python
loop at nice 0, like any other program of the machine's users), submits one
job of ``--steps`` steps (seed 7) and times it from the submit to its
terminal state (``/wait``).  A job still running after ``--limit`` seconds
is reported as ``>limit`` with the progress it reached (the server is then
stopped).  Prints one row per job: seconds, ms per step, the server's CPU
per step by thread role (``bench.threadcpu``) and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.shipped import shipped_config
from bench.threadcpu import ThreadCpu
from tests.support.http import get, post
from tests.support.processes import start_model_server

SPIN = "while True: pass"


def neighbours(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]


def run_job(server, steps: int, limit: float) -> tuple[float, str, float]:  # noqa: ANN001 - tests.support Proc
    """Seconds from submit to the terminal state (or to ``limit``), the state, and the progress reached."""
    body = {"images": ["AA=="], "params": {"timesteps": steps, "seed": 7}}
    started = time.perf_counter()
    job = post(server.url + "/jobs", body, headers=server.auth).json
    state: dict = {}
    while time.perf_counter() - started < limit:
        left = max(1, int((limit - (time.perf_counter() - started)) * 1000))
        state = get(f"{server.url}/jobs/{job['job_id']}/wait?timeout={min(left, 30000)}", headers=server.auth,
                    timeout=60).json
        if state["state"] not in ("pending", "running"):
            break
    elapsed = time.perf_counter() - started
    progress = state.get("progress") or {}
    done = progress.get("step", 0) / progress["steps"] if progress.get("steps") else float("nan")
    return elapsed, state.get("state", "?"), done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--limit", type=float, default=240.0, help="seconds before a job is given up")
    parser.add_argument("--server", action="append", default=[], metavar="NAME=JSON")
    parser.add_argument("--neighbours", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--no-shipped", dest="shipped", action="store_false", help="only the --server variants")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-ddpm-"))
    plans = {"shipped": shipped_config(tmp, "DDPM")} if args.shipped else {}
    for spec in args.server:
        name, _, overrides = spec.partition("=")
        plans[name] = shipped_config(tmp, "DDPM", **json.loads(overrides or "{}"))
    print(f"DDPM jobs of {args.steps} steps (seed 7), {os.cpu_count()} cores; neighbours: processes spinning at nice 0")
    print(f"  {'round':>5} {'server':<10} {'neighbours':>10} {'state':<8} {'seconds':>8} {'ms/step':>8} "
          f"{'server core-ms/step (reactor, torch, other)':<44} {'load':>9}")
    for round_ in range(1, args.rounds + 1):
        for name, config in plans.items():
            for n in args.neighbours:
                server = start_model_server(config, ready_timeout=300)
                spinners = neighbours(n)
                try:
                    cpu = ThreadCpu(server.popen.pid)
                    cpu.start()
                    load_before = os.getloadavg()[0]
                    seconds, state, done = run_job(server, args.steps, args.limit)
                    cpu.stop()
                finally:
                    for p in spinners:
                        p.kill()
                        p.wait()
                    server.stop()
                steps_done = args.steps if state == "done" else max(1.0, done * args.steps)
                roles = cpu.roles()
                shown = f"{seconds:8.1f}" if state == "done" else f">{seconds:7.0f}"
                per_step = "  ".join(f"{k} {v / steps_done:.2f}" for k, v in roles.items())
                extra = "" if state == "done" else f"  ({done:.0%} done)"
                print(f"  {round_:5d} {name:<10} {n:10d} {state:<8} {shown} {seconds * 1000 / steps_done:8.2f} "
                      f"{per_step:<44} {load_before:4.1f}/{os.getloadavg()[0]:<4.1f}{extra}", flush=True)


if __name__ == "__main__":
    main()
