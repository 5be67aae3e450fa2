"""The engine: the built model and the worker threads that run its batches.

The reactor thread never runs model code: building the model, the warm-up
batch and every forward pass go through ``deferToThreadPool`` on the
dedicated worker pool (never the reactor's shared one).  Failures are contained per run: an
exception in ``predict`` fails every item of that batch (ENGINE_ERROR), a
result list of the wrong length fails them with CONTRACT_FAILURE, and an
item whose postprocess raises or whose data breaks the model's ``data``
schema fails alone with CONTRACT_FAILURE.  While ``predict`` runs, the
model's ``report_progress`` calls go to a throttled reporter that writes
the progress of every job with an item in the batch
(:mod:`svc.modelserver.progress`).  Inputs still to be decoded
(``decode_in_worker``) are made first, in the worker: a bad one fails its
item alone and the rest of the batch runs without it.  Between the build and
the warm-up batch the load runs the optimisation step of ``backend.optimize``
(:mod:`svc.optimize.select`), so the warm-up already runs what will serve.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Hashable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface.verify import verifyObject

from svc.contract import status as st
from svc.contract.envelope import ItemResult
from svc.contract.schema import compile_schema
from svc.infra.repeats import TracebackBudget
from svc.model.api import IModel, IModelFactory, ProgressReporter, reporting_progress
from svc.modelserver.progress import ABANDONED, BatchAbandoned, BatchProgress
from svc.optimize.runtime_calls import BATCHES
from svc.web.replies import dumps

log = Logger()


class LazyInput:
    """A model input that the worker running its batch makes, right before the forward pass.

    ``open()`` peeks at the item (cheap: its base64 and its image's header) and returns what ``make(opened)``
    turns into the input, or the :class:`ItemResult` of an item that cannot be used (a bad image): that item
    fails alone, and ``tell`` (when given) gets its result at once, before the worker decodes the batch's other
    images.  Used with ``backend.decode_in_worker``; the batching queue carries it like any input.
    """

    __slots__ = ("make", "open", "tell")

    def __init__(self, open: Callable[[], Any], make: Callable[[Any], Any],
                 tell: Callable[[ItemResult], None] | None = None) -> None:
        self.open = open
        self.make = make
        self.tell = tell


class Engine:
    """The one holder of the model; ``run_batch`` is the batching queue's runner.

    Everything else reaches the model through it (``preprocess``,
    ``batch_key``), so there is no second reference that could be read
    before the load has finished.
    """

    def __init__(
        self,
        factory: IModelFactory,
        model_config: dict,
        device: str,
        run_worker: Any,
        metrics: Any = None,
        default_params: dict | None = None,
        default_options: dict | None = None,
        worker_nice: int = 0,
        clock: IReactorTime | None = None,
        optimize: str = "eager",
        workers: int = 1,
    ) -> None:
        self.factory = factory
        self.clock = clock  # the reactor: times the progress reports of batches with job items
        self._traced = TracebackBudget()  # a failed batch's traceback: once a minute per cause
        self.model_config = model_config
        self.device = device
        self.run_worker = run_worker  # svc.infra.process.Runner of the worker pool
        self.metrics = metrics
        self.default_params = default_params or {}
        self.default_options = default_options or {}
        self.worker_nice = worker_nice
        self._thread = threading.local()
        self.model: Any = None
        self._data = compile_schema(factory.data_schema)
        self.optimize = optimize  # backend.optimize, checked at startup
        self.workers = workers  # backend.workers: the threads that call the optimised model at once
        self.optimization: Any = None  # the svc.optimize.select.Report of the load (None: eager, not run)
        #: Told (from the worker thread) what the load is doing: building, measuring mode N of M, warming up.
        self.on_phase: Callable[[str], None] = lambda text: None

    @property
    def version(self) -> str:
        return self.model.version if self.model is not None else "loading"

    @property
    def needs_image(self) -> bool:
        """Whether items are images to open before ``preprocess`` (false for generative models)."""
        return bool(self.factory.needs_image)

    def preprocess(self, image: Any, params: dict) -> Any:
        """One item's model input (decode pool or worker thread, never the reactor)."""
        return self.model.preprocess(image, params)

    def batch_key(self, params: dict) -> Hashable:
        """The model's batch key of these params (cheap: runs on the reactor)."""
        return self.model.batch_key(params)

    # -- loading ---------------------------------------------------------------

    def load(self, warmup_batch: int) -> Any:
        """Build the model and run one warm-up batch; fires (seconds, items)."""
        return self.run_worker(self._load_sync, warmup_batch)

    def _load_sync(self, warmup_batch: int) -> tuple[float, int]:
        self._lower_priority()
        self.on_phase("building the model and loading its weights")
        model = self.factory.build(self.model_config, self.device)
        verifyObject(IModel, model)
        if self.optimize != "eager":
            from svc.optimize.select import optimize_model

            self.on_phase(f"choosing the execution mode (backend.optimize {self.optimize})")
            self.optimization = optimize_model(model, self.factory.category, self.device, self.optimize,
                                               warmup_batch, self.factory.catalog_id, self.workers,
                                               phase=self.on_phase, config=self.model_config)
        self.on_phase(f"warming up (a batch of {warmup_batch})")
        if self.factory.needs_image:
            # Exercise the decode path too, so the first request pays no lazy imports.
            from PIL import Image

            model.preprocess(Image.new("RGB", (320, 240), (128, 128, 128)), dict(self.default_params))
        inputs = [model.warmup_input() for _ in range(warmup_batch)]
        started = time.perf_counter()
        outputs = model.predict(inputs, dict(self.default_params))
        for output in outputs:
            model.postprocess(output, dict(self.default_params), dict(self.default_options))
        elapsed = time.perf_counter() - started
        self.model = model
        return elapsed, len(inputs)

    # -- running ---------------------------------------------------------------

    def run_batch(self, items: list) -> Any:
        """Run the items' forward pass in a worker thread; fires their results."""
        inputs = [item.input for item in items]
        per_item = [(item.params, item.options) for item in items]
        targets = [item.progress for item in items if getattr(item, "progress", None) is not None]
        reporter = None
        if self.clock is not None:  # nobody waits once every item is past its deadline, or its client went away
            reporter = BatchProgress(self.clock, targets, items=items)
        d = self.run_worker(self._run_sync, inputs, items[0].params, per_item, reporter)
        d.addCallback(self._log_problems, sorted({item.task_id for item in items if getattr(item, "task_id", None)}))
        return d

    def _log_problems(self, outcome: tuple[list[ItemResult], str | None], tasks: list[str]) -> list[ItemResult]:
        """Log what went wrong in the worker, here on the reactor thread (as every log line of the process):
        naming the batch's requests (their task ids, as the access lines' ``rid=``), and a traceback once a
        minute per failure (one per request flooded the log: 500 lines for 50 requests)."""
        results, problem = outcome
        if problem:
            head, _, trace = problem.partition("\n")
            named = head.rstrip(":") + (f" (task {', '.join(tasks[:8])}{' ...' if len(tasks) > 8 else ''})"
                                        if tasks else "")
            cause = trace.strip().splitlines()[-1] if trace.strip() else ""
            if trace and not self._traced.allows(cause):
                log.error("{named}: {cause} (its traceback is in the log at most once a minute)", named=named,
                          cause=cause)
            else:
                log.error("{named}{trace}", named=named, trace=f":\n{trace.rstrip()}" if trace else "")
        stopped = [r.error for r in results if r.error and r.error.startswith(ABANDONED)]
        if stopped:
            log.info("a batch of {n} stopped: {why}", n=len(results), why=stopped[0])
        return results

    def _lower_priority(self) -> None:
        """Once per worker thread, before its first torch op (OpenMP threads inherit it)."""
        if self.worker_nice and not getattr(self._thread, "niced", False):
            from svc.model.torchenv import lower_thread_priority

            lower_thread_priority(self.worker_nice)
            self._thread.niced = True

    def _make_inputs(self, inputs: list) -> list:
        """The batch's inputs with every :class:`LazyInput` made: an input or a bad item's ItemResult.

        Every lazy input is opened before any is made, and a bad one is told at once: decoding the others
        may outlast the deadline, which must not hide an item's own error (a 504 for a junk image)."""
        if not any(isinstance(x, LazyInput) for x in inputs):
            return inputs
        started = time.perf_counter()
        opened = [self._lazily(x.open) if isinstance(x, LazyInput) else x for x in inputs]
        for x, entry in zip(inputs, opened):
            if isinstance(x, LazyInput) and isinstance(entry, ItemResult) and x.tell is not None:
                x.tell(entry)
        made = [self._lazily(x.make, entry) if isinstance(x, LazyInput) and not isinstance(entry, ItemResult)
                else entry for x, entry in zip(inputs, opened)]
        if self.metrics is not None:
            self.metrics.stage.labels("decode").observe((time.perf_counter() - started) * 1000.0)
        return made

    @staticmethod
    def _lazily(step: Callable[..., Any], *args: Any) -> Any:
        """One step of a lazy input; an exception fails its item only."""
        try:
            return step(*args)
        except Exception as e:  # noqa: BLE001 - an input that cannot be made fails its item only
            return ItemResult(st.INTERNAL_ERROR, None, f"decoding failed: {type(e).__name__}: {e}")

    def _run_sync(self, inputs: list, params: dict, per_item: list[tuple[dict, dict]],
                  reporter: ProgressReporter | None = None) -> tuple[list[ItemResult], str | None]:
        self._lower_priority()
        with BATCHES.running():  # a converted model may use every worker's threads while this batch runs alone
            made = self._make_inputs(inputs)
            good = [i for i, x in enumerate(made) if not isinstance(x, ItemResult)]
            results: list[ItemResult] = list(made)
            problem = None
            if good:
                ran, problem = self._run_inputs([made[i] for i in good], params, [per_item[i] for i in good],
                                                reporter)
                for i, result in zip(good, ran):
                    results[i] = result
        return results, problem

    def _run_inputs(self, inputs: list, params: dict, per_item: list[tuple[dict, dict]],
                    reporter: ProgressReporter | None = None) -> tuple[list[ItemResult], str | None]:
        """Forward pass and per-item postprocessing of inputs that are all ready.

        ``reporter`` receives the model's ``report_progress`` calls during ``predict`` only.
        """
        n = len(inputs)
        started = time.perf_counter()
        try:
            with reporting_progress(reporter):
                outputs = self.model.predict(inputs, params)
        except BatchAbandoned as e:  # every item was answered already (504, a job's timeout): stop the work
            return [ItemResult(st.RUN_TIMEOUT, None, str(e))] * n, None
        except Exception as e:  # noqa: BLE001 - an engine failure fails this run only
            error = ItemResult(st.ENGINE_ERROR, None, f"model error: {type(e).__name__}: {e}")
            return [error] * n, f"predict failed for a batch of {n}:\n{traceback.format_exc()}"
        finally:  # a pass stopped at its deadline, or one that raised, took its time too
            if self.metrics is not None:
                self.metrics.stage.labels("inference").observe((time.perf_counter() - started) * 1000.0)
        inferred = time.perf_counter()
        if not isinstance(outputs, (list, tuple)) or len(outputs) != n:
            got = len(outputs) if isinstance(outputs, (list, tuple)) else type(outputs).__name__
            error = ItemResult(st.CONTRACT_FAILURE, None, f"model returned {got} outputs for {n} inputs")
            return [error] * n, f"contract failure: {error.error}"
        results: list[ItemResult] = []
        problem = None
        for output, (item_params, item_options) in zip(outputs, per_item):
            if isinstance(reporter, BatchProgress) and reporter.abandoned():  # encoding 12,288 SAM masks: minutes
                results += [ItemResult(st.RUN_TIMEOUT, None, f"{ABANDONED} (postprocessing)")] * (n - len(results))
                break
            try:
                data = self.model.postprocess(output, item_params, item_options)
                encoded = dumps(data)  # JSON, never NaN; the reply splices these bytes in (svc.contract.envelope)
                broken = next(iter(self._data.iter_errors(data)), None)
                if broken is not None:
                    raise ValueError(f"data breaks its schema at {list(broken.absolute_path)}: {broken.message}")
                results.append(ItemResult(st.SUCCESS, data, encoded=encoded))
            except Exception as e:  # noqa: BLE001 - fails this item only
                results.append(ItemResult(st.CONTRACT_FAILURE, None, f"model output contract failure: {e}"))
                problem = f"postprocess failed: {type(e).__name__}: {e}"
        if self.metrics is not None:
            self.metrics.stage.labels("postprocess").observe((time.perf_counter() - inferred) * 1000.0)
        return results, problem
