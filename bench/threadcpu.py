"""Per-thread CPU time of a running process, from ``/proc/<pid>/task/*/stat``.

CPU time per unit of work (core-ms per image) is what the load of a shared
machine disturbs least: throughput and latency swing with the neighbours,
the work a request costs does not.  A :class:`ThreadCpu` snapshot before and
after a measured run gives each thread's user + system time over the run;
:func:`roles` names the threads of a model server:

- ``reactor``: the main thread (tid == pid): HTTP, JSON, envelope, metrics,
  access log;
- ``torch``: the inference worker and the OpenMP threads it starts, which
  are the niced threads (``backend.worker_nice`` > 0); with
  ``decode_in_worker`` the worker also decodes;
- ``other``: everything else (the decode pool, twisted's own pool).

The same works for any process (TorchServe's Java frontend and its Python
worker: :func:`process_tree_cpu` sums whole processes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ThreadStat:
    tid: int
    nice: int
    cpu_ms: float  # user + system since the thread started


def _stat_fields(path: str) -> list[str] | None:
    try:
        with open(path) as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may hold spaces or parentheses: the fields start after the last ')'
    return text[text.rindex(")") + 2:].split()


def threads(pid: int) -> dict[int, ThreadStat]:
    """Every thread of ``pid`` now."""
    out: dict[int, ThreadStat] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for name in tids:
        fields = _stat_fields(f"/proc/{pid}/task/{name}/stat")
        if fields is None:
            continue
        # fields[0] is field 3 (state): utime is field 14, stime 15, nice 19
        out[int(name)] = ThreadStat(int(name), int(fields[16]), (int(fields[11]) + int(fields[12])) * TICK_MS)
    return out


def process_cpu_ms(pid: int) -> float:
    """User + system time of the whole process (all its threads, living and ended)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) * TICK_MS


def children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(f"/proc/{name}/stat")
        if fields is not None and int(fields[1]) == pid:
            found.append(int(name))
    return found


def process_tree_cpu(pid: int) -> dict[int, float]:
    """CPU ms of ``pid`` and of every descendant, by pid."""
    out = {pid: process_cpu_ms(pid)}
    for child in children(pid):
        out.update(process_tree_cpu(child))
    return out


def sched_ns(pid: int, tid: int) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for a CPU) of one thread so far, from its ``schedstat``.

    Nanoseconds, where ``stat``'s times are clock ticks (10 ms); the wait is
    the run-queue delay (a thread asleep on the GIL is not runnable and does
    not count).  (0, 0) where the kernel keeps no schedstat.
    """
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            on_cpu, waiting = f.read().split()[:2]
    except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
        return 0, 0
    return int(on_cpu), int(waiting)


class ThreadCpu:
    """Per-thread CPU of one process between :meth:`start` and :meth:`stop`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before: dict[int, ThreadStat] = {}
        self.after: dict[int, ThreadStat] = {}
        self.main_before = self.main_after = (0, 0)

    def start(self) -> None:
        self.before = threads(self.pid)
        self.main_before = sched_ns(self.pid, self.pid)

    def stop(self) -> None:
        self.after = threads(self.pid)
        self.main_after = sched_ns(self.pid, self.pid)

    def main_thread_ms(self) -> tuple[float, float]:
        """The main (reactor) thread's (CPU ms, ms waiting for a CPU) over the run, from schedstat."""
        return ((self.main_after[0] - self.main_before[0]) / 1e6, (self.main_after[1] - self.main_before[1]) / 1e6)

    def used_ms(self) -> dict[int, float]:
        """CPU ms of each thread over the run (threads born during the run count from 0)."""
        return {tid: s.cpu_ms - (self.before[tid].cpu_ms if tid in self.before else 0.0)
                for tid, s in self.after.items()}

    def roles(self) -> dict[str, float]:
        """CPU ms over the run by role: ``reactor``, ``torch``, ``other`` (see the module docstring)."""
        used = self.used_ms()
        out = {"reactor": 0.0, "torch": 0.0, "other": 0.0}
        for tid, ms in used.items():
            nice = self.after[tid].nice
            role = "reactor" if tid == self.pid else "torch" if nice > 0 else "other"
            out[role] += ms
        return out


@dataclass(frozen=True)
class MachineCpu:
    """The whole machine's idle CPU time from the first line of ``/proc/stat`` (ms summed over every core)."""

    idle_ms: float  # idle and iowait

    @staticmethod
    def now() -> MachineCpu:
        with open("/proc/stat") as f:
            idle, iowait = (int(v) for v in f.readline().split()[4:6])
        return MachineCpu((idle + iowait) * TICK_MS)

    def since(self, before: MachineCpu) -> MachineCpu:
        return MachineCpu(self.idle_ms - before.idle_ms)
