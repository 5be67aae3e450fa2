"""The data plane of a model server, independent of HTTP.

validate (decode pool) -> admit (reactor) -> decode items (decode pool) ->
batching queue -> worker pool -> per-item results, under one deadline.
With ``decode_in_worker`` the items enter the queue undecoded
(:class:`~svc.modelserver.engine.LazyInput`) and the worker decodes a
batch's images right before its forward pass.  Either way every item is
peeked at (base64, image header) before any is decoded, and a bad one is
settled at once: a deadline passing while the others decode keeps its status.
Synchronous requests and asynchronous jobs both run through
:meth:`Inference.run`; only their deadline and admission differ.
"""

from __future__ import annotations

import functools
import os
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import PIL
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from svc.contract import status as st
from svc.contract.envelope import TIMED_OUT, ItemResult
from svc.contract.request import InferenceRequest, RequestValidator
from svc.infra.repeats import TracebackBudget
from svc.model.images import ItemInputError, decode_base64, finish_image, peek_image
from svc.modelserver.batching import DROPPED, QUEUED, RUNNING, Admission, BatchQueue, Item
from svc.modelserver.engine import Engine, LazyInput
from svc.modelserver.progress import JobProgress

log = Logger()
#: Where Pillow's modules are: an error raised there, while a model's preprocess reads the image, is the image's.
_PILLOW = os.path.dirname(PIL.__file__) + os.sep


def raised_in_pillow(error: BaseException) -> bool:
    """Whether ``error`` was raised inside Pillow (a broken or hostile image; any type, as its plugins raise),
    rather than by the model's own preprocess (an AttributeError of a plugin's read as the client's bad image)."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_PILLOW)

#: Bodies up to this size are validated on the reactor thread (JSON parsing
#: costs about 3 ms per MB; 64 KiB stays well under a millisecond).
INLINE_PARSE_BYTES = 64 * 1024


class Inference:
    """Validates, admits, decodes and batches the items of one request.

    The model is reached through ``engine`` only (its preprocess and batch
    key), so requests see the model the engine loaded and nothing else.
    """

    def __init__(
        self,
        *,
        clock: IReactorTime,
        engine: Engine,
        validator: RequestValidator,
        queue: BatchQueue,
        run_decode: Any,
        max_image_pixels: int,
        metrics: Any = None,
        decode_in_worker: bool = False,
    ) -> None:
        self.clock = clock
        self.decode_in_worker = decode_in_worker
        self.engine = engine
        self.validator = validator
        self.queue = queue
        self.run_decode = run_decode  # svc.infra.process.Runner of the decode pool
        self.max_image_pixels = max_image_pixels
        self.traced = TracebackBudget()  # an item whose decoding failed by our fault: once a minute per cause
        self.metrics = metrics
        # The labelled children, looked up once (a labels() lookup costs about 5 us, on the reactor).
        self.stage = functools.cache(metrics.stage.labels) if metrics is not None else None
        self.item_counter = functools.cache(metrics.items.labels) if metrics is not None else None

    # -- step 1: the request ---------------------------------------------------------

    def parse(self, body: bytes, media_type: str, type_params: Mapping[str, str], headers: Mapping[str, str | None]) -> Deferred:
        """Validate the body; fires an InferenceRequest or fails with ApiError.

        Bodies up to ``INLINE_PARSE_BYTES`` are parsed on the reactor thread
        (well under a millisecond), so that admission never queues behind
        image decoding in the decode pool; larger bodies are parsed there.
        """
        return self.parse_with(lambda data: self.validator.parse(data, media_type, type_params, headers), body)

    def parse_with(self, parser: Callable[[bytes], Any], body: bytes) -> Deferred:
        """``parser(body)`` where :meth:`parse` runs its own (the reactor or the decode pool, by the body's size),
        timed as the ``parse`` stage: the Open Inference Protocol's route parses its tensors this way."""
        if len(body) <= INLINE_PARSE_BYTES:
            return maybeDeferred(self._timed_parse, parser, body)
        return self.run_decode(self._timed_parse, parser, body)

    def _timed_parse(self, parser: Callable[[bytes], Any], body: bytes) -> Any:
        started = time.perf_counter()
        try:
            return parser(body)
        finally:
            if self.stage is not None:
                self.stage("parse").observe((time.perf_counter() - started) * 1000.0)

    # -- step 2..n: the items ---------------------------------------------------------

    def run(
        self,
        request: InferenceRequest,
        *,
        deadline: float | None,
        enforce_queue_limit: bool = True,
        on_start: Callable[[], None] | None = None,
        progress: JobProgress | None = None,
    ) -> Deferred:
        """Admit and run every item; fires the per-item results in order.

        Raises :class:`~svc.modelserver.batching.QueueFull` synchronously when
        the wait queue has no room.  ``on_start`` is called when an item of
        the request reaches a worker; ``progress`` (a job's) receives the
        progress that the model reports for the batches of its items.
        Cancelling the returned Deferred (client gone) takes the request's
        queued items out of the queue.
        """
        admission = self.queue.admit(len(request.images), enforce_limit=enforce_queue_limit)
        return _Run(self, request, deadline, admission, on_start, progress).start()

    def run_job(self, request: InferenceRequest, deadline: float | None, on_start: Callable[[], None],
                progress: JobProgress | None = None) -> Deferred:
        """A job's run: jobs have their own admission, so no wait-queue limit."""
        return self.run(request, deadline=deadline, enforce_queue_limit=False, on_start=on_start, progress=progress)

    def decode_items(self, request: InferenceRequest, tell: Callable[[int, ItemResult], None] | None = None,
                     live: Callable[[], bool] | None = None) -> list[Any]:
        """Per item: the model input, or an ItemResult for a bad input (decode pool).

        Every item is peeked at (:meth:`open_item`) before any is decoded, and ``tell(index, result)`` gets each
        bad one's result on the reactor at once: decoding the others may outlast the deadline.  Nothing is
        decoded once ``live()`` is false (the request was answered: its deadline passed while it waited for the
        pool), so that a busy pool does not spend itself on requests already answered 504 while the next ones
        wait: their own bad items came back 504 as well."""
        if live is not None and not live():
            return []
        started = time.perf_counter()
        opened = [self.open_item(raw, request.req_id) for raw in request.images]
        if tell is not None:
            for index, entry in enumerate(opened):
                if isinstance(entry, ItemResult):
                    self.on_reactor(tell, index, entry)
        out = [self.prepare_item(entry, request.params, request.req_id) if live is None or live() else entry
               for entry in opened]
        if self.stage is not None:
            self.stage("decode").observe((time.perf_counter() - started) * 1000.0)
        return out

    def open_item(self, raw: str | bytes, task_id: str | None = None) -> Any:
        """The item's image opened from its header (its bytes for a model that reads no pixels), or the
        ItemResult of an input that is not base64, empty, not an image or too large: cheap, no pixel decoded
        (any thread but the reactor; ``task_id``, its request's, names it in a failure's log line)."""
        def peek() -> Any:
            data = decode_base64(raw) if isinstance(raw, str) else raw
            return peek_image(data, self.max_image_pixels) if self.engine.needs_image else data

        return self._item(peek, task_id)

    def prepare_item(self, opened: Any, params: dict, task_id: str | None = None) -> Any:
        """The model input of an item that :meth:`open_item` opened (its pixels decoded and preprocessed), or
        its ItemResult (``opened`` itself when that is one)."""
        if isinstance(opened, ItemResult):
            return opened

        def prepare() -> Any:
            if not self.engine.needs_image:
                return self.engine.preprocess(None, params)
            image = finish_image(opened)
            try:
                return self.engine.preprocess(image, params)
            except ItemInputError:
                raise
            except Exception as e:  # noqa: BLE001 - a bad image fails its own item
                if not raised_in_pillow(e):  # the model's own code: its bug, not the client's image
                    raise
                raise ItemInputError(st.INVALID_IMAGE, f"image cannot be decoded: {e}") from None

        return self._item(prepare, task_id)

    def _item(self, step: Callable[[], Any], task_id: str | None) -> Any:
        """``step()``, or the ItemResult of its failure: the client's input (its own status), else ours (500,
        logged with its traceback once a minute per cause); one item fails alone either way."""
        try:
            return step()
        except ItemInputError as e:
            return ItemResult(e.status, None, e.message)
        except Exception as e:  # noqa: BLE001 - ours, not the client's: the item fails alone, in the decode pool too
            cause = f"{type(e).__name__}: {e}"
            if self.traced.allows(cause):  # (where it failed every item of its request)
                log.failure("the model's preprocess failed for an item of task {task} (its traceback is in the log "
                            "at most once a minute)", task=task_id or "-")
            else:
                log.error("the model's preprocess failed for an item of task {task}: {cause}", task=task_id or "-",
                          cause=cause)
            return ItemResult(st.INTERNAL_ERROR, None, f"the model's preprocess failed: {cause}")

    def lazy_items(self, request: InferenceRequest, tell: Callable[[int, ItemResult], None] | None = None,
                   ) -> list[LazyInput]:
        """The items as inputs that the worker decodes (``decode_in_worker``); ``tell(index, result)`` gets a
        bad one's result on the reactor as soon as the worker has peeked at it (:meth:`decode_items`)."""
        params, task_id = request.params, request.req_id

        def lazy(index: int, raw: str | bytes) -> LazyInput:
            told = (lambda result: self.on_reactor(tell, index, result)) if tell is not None else None
            return LazyInput(lambda: self.open_item(raw, task_id),
                             lambda opened: self.prepare_item(opened, params, task_id), told)

        return [lazy(index, raw) for index, raw in enumerate(request.images)]

    def on_reactor(self, f: Callable[..., Any], *args: Any) -> None:
        """``f(*args)`` on the reactor thread, from a decode or inference thread (a test's Clock, whose runners run
        on the test's own thread: at once)."""
        call = getattr(self.clock, "callFromThread", None)
        if call is None:
            f(*args)
        else:
            call(f, *args)


class _Run:
    """One admitted request: its items, its deadline, its answer."""

    def __init__(
        self,
        inference: Inference,
        request: InferenceRequest,
        deadline: float | None,
        admission: Admission,
        on_start: Callable[[], None] | None = None,
        progress: JobProgress | None = None,
    ) -> None:
        self.inference = inference
        self.on_start = on_start
        self.progress = progress
        self.request = request
        self.admission = admission
        self.deadline = deadline
        n = len(request.images)
        self.results: list[ItemResult | None] = [None] * n
        self.items: list[Item] = []
        self.lazy: dict[int, Item] = {}  # by index: the items queued undecoded (decode_in_worker)
        self.remaining = n
        self.finished = False
        self.done: Deferred = Deferred(canceller=self._cancelled)
        self.timer: Any = None

    def start(self) -> Deferred:
        clock = self.inference.clock
        if self.deadline is not None:
            self.timer = clock.callLater(max(0.0, self.deadline - clock.seconds()), self._deadline_passed)
        if self.inference.decode_in_worker:
            self._decoded(self.inference.lazy_items(self.request, self._settle))
            return self.done
        d = self.inference.run_decode(self.inference.decode_items, self.request, self._settle,
                                      lambda: not self.finished)
        d.addCallbacks(self._decoded, self._decode_failed)
        return self.done

    def _decoded(self, decoded: list[Any]) -> None:
        if self.finished:
            self.admission.release()
            return
        params, options = self.request.params, self.request.options
        key = self.inference.engine.batch_key(params)
        for index, entry in enumerate(decoded):
            if isinstance(entry, ItemResult):
                self._settle(index, entry)
            else:
                item = Item(entry, params, options, key, self.deadline, self._settler(index), self.on_start,
                            self.progress, self.request.req_id)
                self.items.append(item)
                if isinstance(entry, LazyInput):
                    self.lazy[index] = item
        self.admission.enqueue(self.items)

    def _decode_failed(self, failure: Any) -> None:
        self.admission.release()
        error = ItemResult(st.INTERNAL_ERROR, None, f"decoding failed: {failure.getErrorMessage()}")
        for index in range(len(self.results)):
            self._settle(index, error)

    def _settler(self, index: int) -> Any:
        return lambda result: self._settle(index, self._expired(index) if result is TIMED_OUT else result)

    def _settle(self, index: int, result: ItemResult) -> None:
        if self.finished or self.results[index] is not None:
            return
        self.results[index] = result
        if self.inference.item_counter is not None:
            self.inference.item_counter(result.status.text).inc()
        self.remaining -= 1
        if self.remaining == 0:
            self._finish()

    def _deadline_passed(self) -> None:
        self.timer = None
        for index, result in enumerate(self.results):
            if result is None:
                self._settle(index, self._expired(index))

    def _expired(self, index: int) -> ItemResult:
        """What an item gets when the deadline passed before it ran: TIMED_OUT, or, for one still queued
        undecoded (``decode_in_worker``), its own status when its base64 or image header is bad.

        The worker peeks at an item only when its batch starts, so a bad image queued behind a busy worker (or
        in a request's later batch) was answered 504 status 4 after the whole deadline, and a request of bad
        images alone 504 instead of 400 (a batching probe).  The peek (the base64 and the header, no pixel)
        runs on the reactor, for expired items alone."""
        item = self.lazy.get(index)
        if item is None or item.state not in (QUEUED, DROPPED):
            return TIMED_OUT
        opened = self.inference.open_item(self.request.images[index], self.request.req_id)
        return opened if isinstance(opened, ItemResult) else TIMED_OUT

    def _finish(self) -> None:
        self.finished = True
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        for item in self.items:
            self.inference.queue.drop(item)
        self.done.callback(list(self.results))

    def _cancelled(self, _: Deferred) -> None:
        """The client went away (its request's Deferred cancelled): its queued items leave the queue, and the
        deadline of those running is now, so that their batch stops at its next report once nobody else waits
        for it (svc.modelserver.progress.BatchProgress): a diffusion run of a client gone kept its worker to its
        deadline."""
        self.finished = True
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        if self.inference.metrics is not None:  # in no service_items_total: nobody was answered
            self.inference.metrics.items_abandoned.inc(sum(result is None for result in self.results))
        now = self.inference.clock.seconds()
        for item in self.items:
            self.inference.queue.drop(item)
            if item.state == RUNNING:
                item.deadline = now
