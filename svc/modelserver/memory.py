"""Giving the heap's free memory back to the system once the model server has been idle.

``backend.tune_malloc`` keeps glibc from mmapping and trimming large blocks
(svc.model.torchenv.tune_malloc): a forward pass's tensors then reuse the
heap instead of paying an mmap, a munmap and page faults each, which doubles
batch throughput on CPU.  The price is a heap that only grows: one arena, no
trim below 1 GiB, and replies of different sizes (16 images with 1,000
classes each: 661 kB) fragment it, so a server kept busy with them ended
about 300 MB above an untuned one and still rose slowly (a resource probe,
CHANGELOG).  ``malloc_trim(0)`` returns every free page of the heap, not only
its top, to the system (``madvise``): done when no batch has run for
``idle_s`` seconds since the last batch, it costs nothing while the server is
busy, and the next burst faults its pages in once.

The trim runs in a thread of the decode pool (it takes the heap's lock,
and walks the whole heap: tens of ms for a large one), never on the reactor
thread.  The timer's body catches everything: a LoopingCall stops at its
first exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from svc.infra.process import Runner

log = Logger()

#: Seconds without a batch after which the free heap is returned.
IDLE_S = 5.0


class IdleTrim(Service):
    """Every ``idle_s`` seconds: when batches ran before but none runs or waits now, trim the heap once."""

    def __init__(self, *, clock: IReactorTime, queue: Any, run: Runner, trim: Callable[[], bool],
                 idle_s: float = IDLE_S) -> None:
        self.clock = clock
        self.queue = queue  # svc.modelserver.batching.BatchQueue: batches_started, running_batches, waiting
        self.run = run  # where the trim runs: the decode pool
        self.trim = trim
        self.idle_s = idle_s
        self.trims = 0
        self._seen = 0  # batches started as of the last tick
        self._dirty = False  # batches ran since the last trim
        self._busy = False  # a trim in its thread
        self._loop: LoopingCall | None = None

    def startService(self) -> None:
        super().startService()
        self._loop = LoopingCall(self.tick)
        self._loop.clock = self.clock
        self._loop.start(self.idle_s, now=False)

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def tick(self) -> None:
        """Trim once after a whole interval in which no batch started, if batches ran since the last trim."""
        try:
            started = self.queue.batches_started
            if started != self._seen:  # something ran in this interval: wait for a quiet one
                self._seen = started
                self._dirty = True
                return
            if not self._dirty or self._busy or self.queue.running_batches or self.queue.waiting:
                return
            self._dirty = False
            self._busy = True
            d = self.run(self.trim)
            d.addCallbacks(self._trimmed, lambda f: log.failure("malloc_trim failed", f))
            d.addBoth(self._done)
        except Exception:  # noqa: BLE001 - the timer must survive anything
            log.failure("idle trim")

    def _trimmed(self, ok: bool) -> None:
        self.trims += 1 if ok else 0

    def _done(self, _: Any) -> None:
        self._busy = False
