"""The model zoo served versus the bare library call, in one run.

For each model of the zoo: start a real model server from its shipped
config (``conf/server/<ID>.toml``, random init, CPU), time requests from one
client, stop it, then time the bare library call in a process of its own
(``bench/bare_models.py``, same threads and allocator tuning).  Prints ms per
image (YOLOV8, SAM_AMG: synchronous requests of one 640x480 JPEG) or per
sampling step (diffusion: async jobs of ``--steps`` steps, from submit to the
terminal state of ``/wait``), and the ratio served / bare.

Each model runs twice: with ``backend.optimize = "eager"``, then with
``--optimize`` (default ``auto``).  The mode the server ran is read from its
``ready`` line, and the bare side applies the same mode
(``bench/bare_models.py --optimize``).  The table adds the start-up time
(spawn to ``/ready``: build, optimisation, warm-up) and the optimised bare
figure's speed-up over eager bare.  SAM_AMG's plugin runs its own mask
generator (the library's masks with less upsampling), so a last line holds
the served figures against segment-anything's own generator in eager, bare:
the call a user writes without the service.

``--weights MODEL=PATH`` serves and times that model on a weights file
instead of its demo weights (trained YOLOv8 weights from a package on the
registry: ``bench/yolov8_onnx.py``).  The image models' requests carry the
JPEG base64 in the JSON envelope, or with ``--body raw`` as the body itself
(``Content-Type: image/jpeg``), as ``bench.modelserver`` sends by default.

    python -m bench.models [--models YOLOV8 DDIM ...] [--seconds 10] [--steps 50] [--optimize auto]
                           [--weights YOLOV8=PATH] [--body json|raw]
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.http import get, post
from tests.support.images import image_bytes
from tests.support.processes import REPO, child_env, start_model_server, write_config

MODELS = ["YOLOV8", "SAM_AMG", "DDPM", "DDIM", "CLS_COND_DDIM", "LDM"]
GENERATIVE = {"DDPM", "DDIM", "CLS_COND_DDIM", "LDM"}


#: The model server's ready line names the mode it runs.
READY_MODE = re.compile(r": ready \(version [^;]*; optimize (\S+);")


def bare(model: str, seconds: float, steps: int, optimize: str = "eager", library: bool = False,
         weights: str | None = None) -> dict:
    args = [sys.executable, "-m", "bench.bare_models", "--model", model, "--seconds", str(seconds),
            "--steps", str(steps), "--optimize", optimize] + (["--library"] if library else []) + (
            ["--weights", weights] if weights else [])
    out = subprocess.run(args, env=child_env(), cwd=REPO, capture_output=True, check=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def served_sync(server, uri: str, body: dict | bytes, seconds: float) -> tuple[float, int]:
    """Mean ms per request of sequential requests (after one warm-up request); a bytes body is a raw JPEG."""
    headers = {**server.auth, "Content-Type": "image/jpeg"} if isinstance(body, bytes) else server.auth
    post(server.url + uri, body, headers=headers, timeout=300)
    runs, started = 0, time.perf_counter()
    while runs < 2 or time.perf_counter() - started < seconds:
        reply = post(server.url + uri, body, headers=headers, timeout=300)
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
    parser.add_argument("--optimize", default="auto", help="backend.optimize of the second run (auto or a mode)")
    parser.add_argument("--weights", action="append", default=[], metavar="MODEL=PATH",
                        help="run MODEL on this weights file (its [model] weights) instead of the demo weights")
    parser.add_argument("--body", choices=("json", "raw"), default="json",
                        help="image models: the JPEG base64 in the JSON envelope, or as the body itself")
    args = parser.parse_args()
    weights = dict(item.split("=", 1) for item in args.weights)

    tmp = Path(tempfile.mkdtemp(prefix="bench-zoo-"))
    jpeg = image_bytes(width=640, height=480, fmt="JPEG", seed=3)
    image_body = jpeg if args.body == "raw" else {"images": [base64.b64encode(jpeg).decode()]}
    rows, library = [], {}
    for model in args.models:
        eager_bare = None
        for setting in ("eager", args.optimize):
            config = write_config(tmp, model, max_queue_depth=0, backend={"optimize": setting},
                                  model={"weights": weights[model]} if model in weights else {})
            started = time.perf_counter()
            server = start_model_server(config, ready_timeout=600)
            startup = time.perf_counter() - started
            try:
                mode = READY_MODE.search(server.output()).group(1)
                if model in GENERATIVE:
                    params = {"timesteps": args.steps, "seed": 7}
                    ms, runs = served_jobs(server, {"images": ["AA=="], "params": params}, args.seconds)
                    served, unit = ms / args.steps, "step"
                else:
                    served, runs = served_sync(server, f"/{model.lower()}/predict", image_body, args.seconds)
                    unit = "image"
            finally:
                server.stop()
            reference = bare(model, args.seconds, args.steps, mode, weights=weights.get(model))
            assert reference["unit"] == unit and reference["optimize"] == mode, (reference, mode)
            eager_bare = eager_bare or reference["ms"]
            rows.append((model, setting, mode, startup, unit, served, runs, reference["ms"], reference["runs"],
                         eager_bare / reference["ms"]))
        if model == "SAM_AMG":
            library[model] = bare(model, args.seconds, args.steps, "eager", library=True)["ms"]

    on = "".join(f", {model} on {path}" for model, path in weights.items())
    print(f"model zoo, CPU, shipped configs (random init{on}), one client ({args.body} bodies); diffusion: jobs of "
          f"{args.steps} steps")
    print(f"  {'model':<14} {'optimize':<9} {'mode':<18} {'start s':>7} {'unit':<6} {'served ms':>10} {'runs':>5} "
          f"{'bare ms':>9} {'runs':>5} {'served/bare':>11} {'bare speed-up':>13}")
    for model, setting, mode, startup, unit, served, runs, bare_ms, bare_runs, speedup in rows:
        print(f"  {model:<14} {setting:<9} {mode:<18} {startup:7.1f} {unit:<6} {served:10.1f} {runs:5d} "
              f"{bare_ms:9.1f} {bare_runs:5d} {served / bare_ms:11.2f} {speedup:12.2f}x")
    for model, ms in library.items():
        speedups = ", ".join(f"{setting} ({mode}) {ms / served:.2f}x" for name, setting, mode, _, _, served, *_ in rows
                             if name == model)
        print(f"  {model}: segment-anything's own generator, eager, bare: {ms:.1f} ms; served against it: {speedups}")


if __name__ == "__main__":
    main()
