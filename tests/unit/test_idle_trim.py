"""The model server gives its heap's free pages back once idle (svc.modelserver.memory), on task.Clock."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

from twisted.internet.task import Clock

from svc.infra.process import inline_runner
from svc.model.torchenv import trim_malloc
from svc.modelserver.memory import IdleTrim


class Queue:
    """What the trimmer reads of the batch queue."""

    def __init__(self) -> None:
        self.batches_started = 0
        self.running_batches = 0
        self.waiting = 0


def make() -> tuple[IdleTrim, Clock, Queue, list[int]]:
    clock, queue, calls = Clock(), Queue(), []

    def trim() -> bool:
        calls.append(queue.batches_started)
        return True

    trimmer = IdleTrim(clock=clock, queue=queue, run=inline_runner, trim=trim, idle_s=5.0)
    trimmer.startService()
    return trimmer, clock, queue, calls


def test_an_idle_server_that_never_ran_a_batch_is_not_trimmed():
    trimmer, clock, _, calls = make()
    clock.advance(60)
    assert calls == []


def test_one_trim_after_a_whole_quiet_interval_following_batches():
    trimmer, clock, queue, calls = make()
    queue.batches_started = 3
    clock.advance(5)  # batches ran in this interval: not yet
    assert calls == []
    clock.advance(5)  # a whole interval without a new batch
    assert calls == [3] and trimmer.trims == 1
    clock.advance(60)  # still quiet: once per quiet spell
    assert calls == [3]
    queue.batches_started = 4
    clock.advance(5)
    clock.advance(5)
    assert calls == [3, 4]


def test_no_trim_while_a_batch_runs_or_items_wait():
    trimmer, clock, queue, calls = make()
    queue.batches_started = 1
    clock.advance(5)
    queue.running_batches = 1  # a long batch (a diffusion job): it started long ago and still runs
    clock.advance(20)
    assert calls == []
    queue.running_batches, queue.waiting = 0, 2
    clock.advance(5)
    assert calls == []
    queue.waiting = 0
    clock.advance(5)
    assert calls == [1]


def test_a_failing_trim_does_not_stop_the_timer():
    clock, queue = Clock(), Queue()
    attempts = []

    def broken() -> bool:
        attempts.append(1)
        raise OSError("no")

    trimmer = IdleTrim(clock=clock, queue=queue, run=inline_runner, trim=broken, idle_s=5.0)
    trimmer.startService()
    for started in (1, 2):
        queue.batches_started = started
        clock.advance(5)
        clock.advance(5)
    assert len(attempts) == 2 and trimmer.trims == 0
    trimmer.stopService()
    assert clock.getDelayedCalls() == []


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_the_real_trim_returns_free_pages_inside_the_heap():
    """What the tuned heap keeps: freed blocks below its top, which glibc never returns by itself."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 * 1024) for _ in range(3200)]  # 200 MB of heap, below the mmap threshold
    for block in blocks:
        ctypes.memset(block, 1, 64 * 1024)  # touched: resident
    for block in blocks[:-1]:
        libc.free(block)  # the last one stays: the heap's top is not free, so nothing is trimmed on free
    before = rss_mb()
    assert trim_malloc() is True
    assert before - rss_mb() > 150
    libc.free(blocks[-1])
