"""One measured point of a served MOBILENETV2: load, latency, and the CPU each image cost, by thread.

Used by ``bench.modelserver`` for our model server and for TorchServe.
The CPU figures are per image and per thread role (``bench.threadcpu``):
what the neighbours of a shared machine disturb least.  Every point also
records the 1-minute load average before and after it, so a figure taken
while other work loaded the machine says so.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

from bench import loadgen
from bench.loadgen import LoadResult
from bench.threadcpu import MachineCpu, ThreadCpu, process_tree_cpu
from tests.support.http import get


@dataclass
class Point:
    """One server at one concurrency."""

    server: str
    round: int
    clients: int
    load: LoadResult
    cpu_ms: dict[str, float]  # CPU ms over the run by role
    wall_s: float
    load_avg: tuple[float, float]  # 1-minute load average before and after
    stages: dict[str, float] = field(default_factory=dict)  # the model server's own metrics over the run
    machine: MachineCpu | None = None  # the whole machine's CPU over the run (every process, every core)

    @property
    def images(self) -> int:
        return max(1, self.load.requests)

    def per_image(self, role: str) -> float:
        return self.cpu_ms.get(role, 0.0) / self.images

    @property
    def total_per_image(self) -> float:
        return sum(self.cpu_ms.values()) / self.images

    @property
    def cores_busy(self) -> float:
        return sum(self.cpu_ms.values()) / 1000.0 / self.wall_s

    @property
    def client_cores(self) -> float:
        """Cores the load tool kept busy (wrk; NaN for the Python clients)."""
        return self.load.client_cpu_ms / 1000.0 / self.wall_s

    @property
    def idle_cores(self) -> float:
        """Cores nobody used over the run: what the server, the load tool and the neighbours left."""
        return self.machine.idle_ms / 1000.0 / self.wall_s if self.machine else float("nan")


def _metric_sums(text: str) -> dict[str, float]:
    """The sums and counts of the model server's batch and stage histograms, by name."""
    out: dict[str, float] = {}
    for name, value in re.findall(r'^(service_(?:stage_duration_ms|batch_size)_(?:sum|count)(?:\{stage="\w+"\})?) (\S+)$',
                                  text, re.M):
        out[name] = float(value)
    return out


def _stages(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean batch size and mean ms per batch of the forward pass and the decoding, over the run."""

    def mean(prefix: str) -> float:
        n = after.get(prefix + "_count", 0.0) - before.get(prefix + "_count", 0.0)
        total = after.get(prefix + "_sum", 0.0) - before.get(prefix + "_sum", 0.0)
        return total / n if n else float("nan")

    out = {"batch": mean("service_batch_size")}
    for stage in ("inference", "decode", "postprocess"):
        sums = {k.replace(f'{{stage="{stage}"}}', ""): v for k, v in after.items() if f'"{stage}"' in k}
        base = {k.replace(f'{{stage="{stage}"}}', ""): v for k, v in before.items() if f'"{stage}"' in k}
        n = sums.get("service_stage_duration_ms_count", 0.0) - base.get("service_stage_duration_ms_count", 0.0)
        total = sums.get("service_stage_duration_ms_sum", 0.0) - base.get("service_stage_duration_ms_sum", 0.0)
        out[stage] = total / n if n else float("nan")
    return out


def measure_model_server(name: str, round_: int, server: Any, url: str, body: bytes, headers: dict[str, str], *,
                         clients: int, seconds: float, tool: str) -> Point:
    """Drive our model server; CPU by thread role (reactor, torch, other) and its stage metrics."""
    metrics_url = server.url + "/metrics"
    before_metrics = _metric_sums(get(metrics_url, headers=server.auth).body.decode())
    cpu = ThreadCpu(server.popen.pid)
    load_before = os.getloadavg()[0]

    def started() -> None:
        cpu.start()

    result, wall, machine = _timed_load(url, body, headers, clients, seconds, tool, started)
    cpu.stop()
    after_metrics = _metric_sums(get(metrics_url, headers=server.auth).body.decode())
    return Point(name, round_, clients, result, cpu.roles(), wall, (load_before, os.getloadavg()[0]),
                 _stages(before_metrics, after_metrics), machine)


def measure_torchserve(round_: int, peer: Any, body: bytes, headers: dict[str, str], *, clients: int,
                       seconds: float, tool: str) -> Point:
    """Drive TorchServe; CPU by process: ``frontend`` (Java) and ``worker`` (the Python handler and launcher)."""
    snapshot: dict[str, dict[int, float]] = {}
    load_before = os.getloadavg()[0]

    def started() -> None:
        snapshot["before"] = process_tree_cpu(peer.pid)

    result, wall, machine = _timed_load(peer.url, body, headers, clients, seconds, tool, started)
    after = process_tree_cpu(peer.pid)
    roles = {"frontend": 0.0, "worker": 0.0}
    for pid, ms in after.items():
        used = ms - snapshot["before"].get(pid, 0.0)
        roles["frontend" if _comm(pid) == "java" else "worker"] += used
    return Point("torchserve", round_, clients, result, roles, wall, (load_before, os.getloadavg()[0]),
                 machine=machine)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _timed_load(url: str, body: bytes, headers: dict[str, str], clients: int, seconds: float, tool: str,
                started: Any) -> tuple[LoadResult, float, MachineCpu]:
    """A second of warm-up, then ``started()`` and the measured load; returns its result, its wall time and
    the machine's CPU over it.

    The CPU snapshot (``started``) is taken after the warm-up, so the
    measured CPU and the measured requests cover the same seconds (to within
    the start of the load tool).
    """
    loadgen.run_python(url, body, headers, concurrency=clients, seconds=1.0)  # warm-up
    started()
    machine = MachineCpu.now()
    t0 = time.perf_counter()
    if tool == "wrk" or (tool == "auto" and shutil.which("wrk")):
        result = loadgen.run_wrk(url, body, headers, concurrency=clients, seconds=seconds)
    else:
        result = loadgen.run_python(url, body, headers, concurrency=clients, seconds=seconds)
    return result, time.perf_counter() - t0, MachineCpu.now().since(machine)
