"""Start-up of the cpu profile: every model server from spawn to ``/ready``, empty state directory then restart.

Starts the profile's model servers together, as the supervisor does after
the gateway (``conf/profiles/cpu.toml``: their shipped configs with
``optimize = "auto"``, ``--device cpu --weights demo``), each in its own
process with one state directory (``SERVICE_STATE_DIR``), and times each
from spawn to ``/ready`` (build, optimisation, warm-up).  Then stops them
and starts them again with the same state directory: converted models,
compiled packages and ``auto``'s recorded choices are reused
(docs/optimize.md).  Prints per model the seconds to ready, the mode it runs
and how its mode was decided, for both starts, and the load average before
and after each (a benchmark, not a test: the machine should be idle).

    python -m bench.cold_start [--models MOBILENETV2 YOLOV8 ...] [--state DIR] [--timeout 600]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
import tomllib
from pathlib import Path

from tests.support.http import get
from tests.support.processes import LISTENING, REPO, Proc, spawn_model_server

PROFILE = REPO / "conf" / "profiles" / "cpu.toml"
READY_MODE = re.compile(r": ready \(version [^;]*; optimize (\S+); warm-up batch of \d+ took (\d+) ms")


def how(output: str, model: str) -> str:
    """How the optimisation decided, from the model's line: measured or recorded, and its seconds."""
    found = re.search(rf"{re.escape(model)}: optimize (.*)$", output, re.M)
    if not found:
        return "no optimisation line"
    line = found.group(1)
    seconds = re.search(r"[(;] ?(\d+\.\d) s[;)]", line)
    took = f" in {seconds.group(1)} s" if seconds else ""
    if "not measured again" in line:
        return f"recorded{took}"
    if " chose " in line:
        return f"measured{took}"
    return line[:60]


def start_all(models: list[str], state: Path, timeout: float) -> dict[str, tuple[float, float, Proc]]:
    """Spawn every model at once; (seconds to listening, to /ready, process) per model.  Raises if one is late."""
    started = time.perf_counter()
    procs = {m: spawn_model_server(REPO / "conf" / "server" / f"{m}.toml", env={"SERVICE_STATE_DIR": str(state)},
                                   extra_args=("--device", "cpu", "--weights", "demo")) for m in models}
    ready: dict[str, tuple[float, float, Proc]] = {}
    listening: dict[str, float] = {}
    try:
        while len(ready) < len(procs):
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"not ready after {timeout} s: {sorted(set(procs) - set(ready))}")
            for model, proc in procs.items():
                if model in ready:
                    continue
                if not proc.alive():
                    raise RuntimeError(f"{model} exited with {proc.popen.returncode}:\n{proc.output()[-3000:]}")
                if not proc.port:
                    found = LISTENING.search(proc.output())
                    proc.port = int(found.group(1)) if found else 0
                    if proc.port:
                        listening[model] = time.perf_counter() - started
                if proc.port and _ready(proc):
                    ready[model] = (listening[model], time.perf_counter() - started, proc)
            time.sleep(0.1)
    except BaseException:
        for proc in procs.values():
            proc.stop()
        raise
    return ready


def _ready(proc: Proc) -> bool:
    try:
        return get(proc.url + "/ready", timeout=5).status == 200
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = tomllib.loads(PROFILE.read_text())["models"]
    parser.add_argument("--models", nargs="+", default=models, choices=models)
    parser.add_argument("--state", type=Path, help="the state directory (default: a new empty one)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for every model")
    args = parser.parse_args()

    state = args.state or Path(tempfile.mkdtemp(prefix="bench-cold-start-")) / "state"
    empty = not state.exists() or not any(state.iterdir())
    rows: dict[str, list[str]] = {m: [] for m in args.models}
    loads = []
    for start in ("first start" + (" (empty state directory)" if empty else ""), "restart"):
        before = os.getloadavg()[0]
        ready = start_all(args.models, state, args.timeout)
        loads.append(f"{start}: load average {before:.1f} before, {os.getloadavg()[0]:.1f} when all were ready, "
                     f"all ready after {max(s for _, s, _ in ready.values()):.1f} s")
        for model, (up, seconds, proc) in ready.items():
            output = proc.output()
            found = READY_MODE.search(output)
            mode, warmup = (found.group(1), f"{int(found.group(2)) / 1000:.1f}") if found else ("?", "?")
            rows[model].append(f"{seconds:6.1f} {up:6.1f} {warmup:>6} {mode:<16} {how(output, model)}")
        for _, _, proc in ready.values():
            proc.stop()

    print(f"cpu profile, all models started together; state directory {state}")
    print("  ready: spawn to /ready; up: spawn to listening (imports); warm-up: the warm-up batch; decided: how "
          "auto chose and its seconds")
    for number, start in enumerate(("first start", "restart")):
        print(f"  {start}")
        print(f"    {'model':<14} {'ready':>6} {'up':>6} {'warm-up':>6} {'mode':<16} decided")
        for model, row in rows.items():
            print(f"    {model:<14} {row[number]}")
    for line in loads:
        print(f"  {line}")


if __name__ == "__main__":
    main()
