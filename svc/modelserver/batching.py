"""The batching queue: one item per image, batches of compatible items.

Policy (measured: waiting out a batch window at low load costs 2-3x
latency):

* A batch starts as soon as a worker is free and either ``max_batch_size``
  compatible items wait, or the window of the oldest waiting item
  (``max_batch_delay_ms`` from its arrival) has closed, or no admitted item
  is still being decoded (waiting could not grow the batch).  So an idle
  server runs a lone request at once, a multi-image request is batched
  together, and under load batches grow while the workers are busy.
* Items batch together only when their ``key`` is equal (params that change
  the forward pass keep items apart); FIFO order is kept otherwise.
* An item whose deadline has passed when a worker frees up is answered
  RUN_TIMEOUT without taking the worker.  A batch already started is never
  cancelled.
* ``max_queue_depth`` counts image items admitted and not yet running
  (decoding or queued).  A request that would push that count above the
  limit is refused at once with a ``Retry-After`` estimate.  Items of
  asynchronous jobs are admitted without it (jobs have their own bound,
  ``async_max_queue``) and do not count against it either: a job submitter
  could otherwise refuse every synchronous request for as long as its jobs
  wait.

Time comes only from the ``clock`` (``IReactorTime``) so unit tests drive it
with ``task.Clock``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from svc.contract import status as st
from svc.contract.envelope import TIMED_OUT, ItemResult

log = Logger()

QUEUED, RUNNING, DONE, DROPPED = "queued", "running", "done", "dropped"


class QueueFull(Exception):
    """The sync wait queue has no room; ``retry_after`` is in whole seconds."""

    def __init__(self, retry_after: int, waiting: int, limit: int) -> None:
        super().__init__(f"wait queue full: {waiting} items waiting, limit {limit}")
        self.retry_after = retry_after
        self.waiting = waiting
        self.limit = limit


class Item:
    """One image on its way through the queue."""

    __slots__ = ("input", "params", "options", "key", "deadline", "enqueued_at", "state", "on_done", "on_start",
                 "progress", "limited", "task_id")

    def __init__(
        self,
        input: Any,
        params: dict,
        options: dict,
        key: Hashable,
        deadline: float | None,
        on_done: Callable[[ItemResult], None],
        on_start: Callable[[], None] | None = None,
        progress: Any = None,
        task_id: str | None = None,
    ) -> None:
        self.input = input
        self.params = params
        self.options = options
        self.key = key
        self.deadline = deadline
        self.enqueued_at = 0.0
        self.state = QUEUED
        self.on_done = on_done
        self.on_start = on_start
        self.progress = progress  # the JobProgress of an asynchronous job's item, else None
        self.limited = True  # counts against max_queue_depth (a synchronous request's item)
        self.task_id = task_id  # its request's (or job's): a failed batch's log line names the requests in it

    def finish(self, result: ItemResult) -> None:
        if self.state in (DONE, DROPPED):
            return
        self.state = DONE
        self.on_done(result)


class Admission:
    """Room reserved for ``n`` items while their request is decoded."""

    def __init__(self, queue: "BatchQueue", n: int, limited: bool = True) -> None:
        self._queue = queue
        self.n = n
        self.limited = limited  # counted against max_queue_depth
        self.open = True

    def enqueue(self, items: list[Item]) -> None:
        """The decoded items enter the queue; the reservation ends."""
        if self.open:
            self.open = False
            for item in items:
                item.limited = self.limited
            self._queue.enqueue(self.n, items, self.limited)

    def release(self) -> None:
        """The request ended before its items were queued."""
        if self.open:
            self.open = False
            self._queue.enqueue(self.n, [], self.limited)


RunBatch = Callable[[list[Item]], "Deferred[list[ItemResult]]"]


class BatchQueue:
    """Collects items into batches and runs them on ``workers`` workers."""

    def __init__(
        self,
        clock: IReactorTime,
        run_batch: RunBatch,
        *,
        workers: int = 1,
        max_batch_size: int = 1,
        max_batch_delay_ms: int = 5,
        max_queue_depth: int = 0,
        metrics: Any = None,
    ) -> None:
        self.clock = clock
        self._run_batch = run_batch
        self.workers = workers
        self.max_batch_size = max_batch_size
        self.delay = max_batch_delay_ms / 1000.0
        self.max_queue_depth = max_queue_depth
        self.metrics = metrics
        self._queue: deque[Item] = deque()
        self._queued = 0  # live items in _queue
        self._expected = 0  # admitted items still being decoded
        self._unlimited = 0  # of those (queued or decoding), the items of jobs: not counted by max_queue_depth
        self._free = workers
        self._timer: Any = None
        self._seconds_per_item: float | None = None
        self.running_batches = 0
        self.batches_started = 0  # since the process started (svc.modelserver.memory watches it)
        self._running: list[list[Item]] = []  # the batches in the workers now
        self._idle_waiters: list[Deferred] = []
        self.closed = False
        self._closed_result: ItemResult | None = None

    # -- accounting ------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Image items admitted and not yet running (decoding or queued)."""
        return self._queued + self._expected

    def observe_throughput(self, seconds: float, items: int) -> None:
        """Feed the drain-time estimate (warm-up and every batch)."""
        if items <= 0:
            return
        sample = seconds / items
        if self._seconds_per_item is None:
            self._seconds_per_item = sample
        else:
            self._seconds_per_item = 0.8 * self._seconds_per_item + 0.2 * sample

    def retry_after(self) -> int:
        """Estimated seconds to drain the waiting items, clamped to 1..60."""
        per_item = self._seconds_per_item if self._seconds_per_item is not None else 1.0
        seconds = math.ceil(self.waiting * per_item / self.workers)
        return min(60, max(1, seconds))

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self.waiting)

    # -- admission ----------------------------------------------------------------

    def admit(self, n: int, *, enforce_limit: bool = True) -> Admission:
        """Reserve room for ``n`` items or raise :class:`QueueFull`.

        The check and the reservation are one step on the reactor thread.
        """
        limited = self.waiting - self._unlimited
        if enforce_limit and self.max_queue_depth and limited + n > self.max_queue_depth:
            if self.metrics is not None:
                self.metrics.queue_rejected.inc()
            raise QueueFull(self.retry_after(), limited, self.max_queue_depth)
        self._expected += n
        if not enforce_limit:
            self._unlimited += n
        self._gauge()
        return Admission(self, n, limited=enforce_limit)

    def _left(self, item: Item) -> None:
        """``item`` is no longer waiting (started, dropped or expired): one less in the counts."""
        self._queued -= 1
        if not item.limited:
            self._unlimited -= 1

    def enqueue(self, reserved: int, items: list[Item], limited: bool = True) -> None:
        """An admission's decoded ``items`` enter the queue and its reservation of ``reserved`` ends.

        Called through :meth:`Admission.enqueue`, which makes sure a
        reservation ends once.
        """
        self._expected -= reserved
        if not limited:
            self._unlimited -= reserved - len(items)  # its queued items stay counted until they leave
        if self._closed_result is not None:  # abandoned: late arrivals are answered at once
            if not limited:
                self._unlimited -= len(items)
            self._gauge()
            for item in items:
                item.finish(self._closed_result)
            self._check_idle()
            return
        now = self.clock.seconds()
        for item in items:
            item.enqueued_at = now
            item.state = QUEUED
            self._queue.append(item)
        self._queued += len(items)
        self._gauge()
        self._pump()
        self._check_idle()

    def drop(self, item: Item) -> None:
        """Take a queued item out (its request ended: deadline, disconnect)."""
        if item.state == QUEUED:
            item.state = DROPPED
            self._left(item)
            self._gauge()
            self._check_idle()

    # -- dispatch -------------------------------------------------------------------

    def _pump(self) -> None:
        if self.closed:
            return
        now = self.clock.seconds()
        while self._free > 0 and self._queued > 0:
            batch = self._collect(now)
            if not batch:
                break
            head = batch[0]
            if len(batch) >= self.max_batch_size or self._expected == 0 or now >= head.enqueued_at + self.delay:
                self._start(batch, now)
            else:
                self._arm(head.enqueued_at + self.delay, now)
                return
        if self._queued == 0 and self._timer is not None and self._timer.active():
            self._timer.cancel()
            self._timer = None

    def _collect(self, now: float) -> list[Item]:
        """The next batch (not yet removed); expired items are answered here."""
        batch: list[Item] = []
        key: Any = None
        keep: deque[Item] = deque()
        for item in self._queue:
            if item.state != QUEUED:
                continue
            if item.deadline is not None and item.deadline <= now:
                item.state = DROPPED  # leaves without taking a worker
                self._left(item)
                item.on_done(TIMED_OUT)
                continue
            keep.append(item)
            if len(batch) < self.max_batch_size and (not batch or item.key == key):
                if not batch:
                    key = item.key
                batch.append(item)
        self._queue = keep
        self._gauge()
        return batch

    def _arm(self, when: float, now: float) -> None:
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= when:
                return
            self._timer.cancel()
        self._timer = self.clock.callLater(max(0.0, when - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()
        self._check_idle()  # items past their deadline may have left

    def _start(self, batch: list[Item], now: float) -> None:
        chosen = set(map(id, batch))
        self._queue = deque(i for i in self._queue if id(i) not in chosen)
        for item in batch:
            self._left(item)
        self._free -= 1
        self.running_batches += 1
        self.batches_started += 1
        self._running.append(batch)
        self._gauge()
        for item in batch:
            item.state = RUNNING
            if item.on_start is not None:
                item.on_start()
        if self.metrics is not None:
            self.metrics.batch_size.observe(len(batch))
            self.metrics.batch_window_wait.observe((now - batch[0].enqueued_at) * 1000.0)
            queue_wait = self.metrics.stage.labels("queue_wait")
            for item in batch:
                queue_wait.observe((now - item.enqueued_at) * 1000.0)
        started = self.clock.seconds()
        d = maybeDeferred(self._run_batch, batch)
        d.addCallbacks(self._finished, self._failed, callbackArgs=(batch, started), errbackArgs=(batch,))

    def _finished(self, results: list[ItemResult], batch: list[Item], started: float) -> None:
        self.observe_throughput(self.clock.seconds() - started, len(batch))
        if len(results) != len(batch):
            broken = ItemResult(st.CONTRACT_FAILURE, None, f"batch runner gave {len(results)} results for {len(batch)} items")
            results = [broken] * len(batch)
        self._release_worker(batch)
        for item, result in zip(batch, results):
            item.finish(result)
        self._check_idle()

    def _failed(self, failure: Any, batch: list[Item]) -> None:
        log.failure("batch runner failed", failure)
        error = ItemResult(st.ENGINE_ERROR, None, f"batch failed: {failure.getErrorMessage()}")
        self._release_worker(batch)
        for item in batch:
            item.finish(error)
        self._check_idle()

    def _release_worker(self, batch: list[Item]) -> None:
        """The worker takes its next batch before the finished batch's replies are written.

        Writing the replies (their envelopes, the HTTP sends) is the
        reactor's work, about 3-4 ms for a batch of 8 small images: the
        worker decodes its next batch meanwhile instead of waiting for it.
        """
        self._free += 1
        self.running_batches -= 1
        self._running = [b for b in self._running if b is not batch]
        self._pump()

    def abandon(self, result: ItemResult) -> int:
        """Answer every item still held with ``result`` and start no more batches.

        For the end of a shutdown grace: queued items leave the queue, and
        items of a batch still running in a worker are answered now (a
        forward pass cannot be cancelled; its late results are ignored, as
        ``Item.finish`` answers an item once).  Returns the number of items
        answered.
        """
        self.closed = True
        self._closed_result = result
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        held = [i for i in self._queue if i.state == QUEUED] + [i for b in self._running for i in b]
        self._queue.clear()
        self._queued = self._unlimited = 0
        self._gauge()
        answered = 0
        for item in held:
            if item.state in (DONE, DROPPED):
                continue
            item.finish(result)
            answered += 1
        self._check_idle()
        return answered

    @property
    def idle(self) -> bool:
        """Nothing admitted (decoding or queued) and no batch in a worker."""
        return self.running_batches == 0 and self.waiting == 0

    def when_idle(self) -> Deferred:
        """A Deferred that fires once the queue is :attr:`idle` (at once if it is now).

        The graceful stop waits on it instead of polling the queue.
        """
        if self.idle:
            return succeed(None)
        d: Deferred = Deferred()
        self._idle_waiters.append(d)
        return d

    def _check_idle(self) -> None:
        """Fire the idle waiters; called at the end of every step that can leave the queue idle."""
        if self._idle_waiters and self.idle:
            waiters, self._idle_waiters = self._idle_waiters, []
            for d in waiters:
                d.callback(None)
