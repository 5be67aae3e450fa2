"""Progress of asynchronous jobs: written by a worker thread, read by the reactor.

A model reports progress from inside ``predict`` with
``svc.model.api.report_progress(step, steps)``.  The engine installs a
:class:`BatchProgress` for the batch it runs; that reporter writes the value
into the :class:`JobProgress` of every job with an item in the batch (a
batch may hold items of several jobs: each sees the batch's progress), at
most once per :data:`MIN_INTERVAL_S` and always for the last step.  The
reactor only reads the value when it answers a poll or a wait, so a model
that reports on every sampler step costs the reactor nothing and never
waits for it: the worker thread replaces one tuple reference, which is
atomic in CPython, and takes no lock.

A job's items may run in several batches, one after another or on two
workers at once: the job shows the share of its items' work done, as a step
of the current batch's ``steps`` (3 images sampled one at a time: the first
image's last step is step 50 of 150, not 150 of 150 while two images wait).
It never goes back and stops moving once the job is terminal
(:meth:`JobProgress.close`: a timed-out job's step kept changing).

The reporter is also where a batch learns that nobody waits for it any
more: once every item's deadline has passed (each request was answered 504,
each job ``timeout``), a report raises :class:`BatchAbandoned`, so a model
that reports progress (a sampler step, a batch of SAM's prompts) stops at
its next step instead of holding the worker for minutes of wasted work.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

from twisted.internet.interfaces import IReactorTime

#: Keys of the batches a job's progress sums (unique for the life of the process).
_BATCH_KEYS = itertools.count(1)

#: Writes closer together than this are dropped (the last step is always written).
MIN_INTERVAL_S = 0.1


#: The error of the items of a batch stopped because nobody waits for it (the engine logs such a batch at info).
ABANDONED = "every item of the batch is past its deadline or its client went away"


class BatchAbandoned(Exception):
    """Raised by a report once every item of the running batch is past its deadline or its client went away (its
    answer is gone)."""


class JobProgress:
    """The last progress written for one job of ``items`` images: ``(step, steps)`` or None before the first report."""

    __slots__ = ("_batches", "_lock", "closed", "items", "value")

    def __init__(self, items: int = 1) -> None:
        self.value: tuple[int, int] | None = None
        self.closed = False
        self.items = max(1, items)
        self._batches: dict[int, Fraction] = {}  # per batch: the items of this job in it x the share done
        self._lock = threading.Lock()  # two workers may write (the reactor reads ``value`` alone)

    def write(self, value: tuple[int, int], batch: int = 0, count: int | None = None) -> None:
        """Batch ``batch``, holding ``count`` of the job's items (default: all), is at ``value`` (worker thread).

        Shows the job's share done as a step of ``value``'s steps, unless the job is terminal or that is
        behind what is shown.
        """
        step, steps = value
        with self._lock:
            self._batches[batch] = Fraction((self.items if count is None else count) * step, steps)
            done = min(Fraction(1), sum(self._batches.values(), Fraction(0)) / self.items)
            shown = self.value
            new = (int(done * steps), steps)
            if self.closed or (shown is not None and new[0] * shown[1] < shown[0] * new[1]):
                return
            self.value = new

    def close(self, done: bool = False) -> None:
        """The job is terminal: what is shown stays (reactor thread); a job that is ``done`` shows its last step.

        Its items that failed before running (an image that is not base64)
        never reported their share, and a done job stopped at 2 of 4.
        """
        with self._lock:
            self.closed = True
            if done and self.value is not None:
                self.value = (self.value[1], self.value[1])

    def to_json(self) -> dict[str, int] | None:
        """The ``progress`` field of the job status body (null when nothing was reported)."""
        value = self.value  # one read: the worker may replace it meanwhile
        if value is None:
            return None
        return {"step": value[0], "steps": value[1]}


class BatchProgress:
    """The reporter of one running batch: throttled writes into the progress of its jobs.

    Called in the worker thread.  Time comes from ``clock`` (the reactor's
    ``seconds``, safe to read from any thread; ``task.Clock`` in tests).
    A report that is not two whole numbers with ``0 <= step`` and
    ``1 <= steps`` is ignored rather than failing the forward pass; a step
    past ``steps`` is shown as ``steps``.
    """

    def __init__(self, clock: IReactorTime, targets: Iterable[JobProgress],
                 min_interval: float = MIN_INTERVAL_S, items: Sequence[Any] = ()) -> None:
        """``items``: the batch's queue items, whose ``deadline`` (None: none) the reactor moves to now when their
        client goes away (svc.modelserver.inference); once each is past its own, a report raises
        :class:`BatchAbandoned` (never for a batch given no items)."""
        self.clock = clock
        self.items = tuple(items)
        self.key = next(_BATCH_KEYS)  # not id(self): a finished batch's address is reused by the next one
        counted = Counter(id(t) for t in targets)  # a job's items in this batch
        self.targets = tuple((t, counted[id(t)]) for t in {id(t): t for t in targets}.values())
        self.min_interval = min_interval
        self.last: float | None = None
        self.written: tuple[int, int] | None = None

    def abandoned(self) -> bool:
        """Whether every item of the batch is past its deadline, or its client went away: nobody waits for what it
        would give.  Read in the worker thread; the reactor only ever moves a deadline earlier."""
        now = self.clock.seconds()
        return bool(self.items) and all(item.deadline is not None and now >= item.deadline for item in self.items)

    def __call__(self, step: int, steps: int) -> None:
        if self.abandoned():
            raise BatchAbandoned(f"{ABANDONED} (reported step {step} of {steps})")
        if isinstance(step, bool) or isinstance(steps, bool):
            return
        try:
            step, steps = int(step), int(steps)
        except (TypeError, ValueError, OverflowError):
            return
        if steps < 1 or step < 0:
            return
        step = min(step, steps)
        now = self.clock.seconds()
        if step < steps and self.last is not None and now - self.last < self.min_interval:
            return
        self.last = now
        value = (step, steps)
        self.written = value
        for target, count in self.targets:
            target.write(value, self.key, count)
