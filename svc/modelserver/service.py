"""The model-server service tree: thread pools, engine, HTTP listener.

Start: the listener comes up at once (``/healthz`` answers, ``/ready`` is
503), then the model is built and warmed up in the worker pool; a model that
fails to load stops the process with one line and exit code 1.
Stop (SIGTERM/SIGINT): stop admitting (503 status 65, each connection closed
after its reply), let running requests finish or reach their deadline within
``shutdown_grace_ms``, then take the connections still in the listen backlog,
close the listener, give the requests already sent their reply, and exit 0.  The reactor keeps serving during the whole stop
(``/healthz`` answers until the port closes).  Work still held when the
grace ends is answered at once (503 status 65 per item; parked job waiters
get the current state), the port is closed, and a forward pass or a model
load still running in a worker is not waited for: the process hard-exits 0
(a torch call cannot be interrupted, and joining it would block the reactor).
Bound: exit within ``shutdown_grace_ms`` + 1 s, enforced by a wall-clock
watchdog.  When the supervisor that started us is gone (its SIGTERM is the
kernel's parent-death signal), the grace is cut to 0.5 s and the bound is
1.5 s, so that a new supervisor gets the port back at once.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from twisted.application.internet import TCPServer
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import deferLater
from twisted.logger import Logger

from svc.contract import status as st
from svc.contract.envelope import ItemResult
from svc.contract.jobid import JobOwner
from svc.contract.options import options_schema
from svc.contract.protocol import MODEL_PROGRAM as PROGRAM
from svc.contract.request import RequestValidator
from svc.contract.schema import ObjectSchema
from svc.infra.metrics import ModelServerMetrics, new_registry
from svc.infra.process import (
    ORPHAN_EXIT_S,
    ListeningMultiService,
    Runner,
    ThreadPoolService,
    exit_after_shutdown,
    freeze_heap,
    hard_exit,
    start_watchdog,
    supervisor_gone,
)
from svc.infra.reactors import IServiceReactor
from svc.model.api import IModelFactory
from svc.model.torchenv import trim_malloc
from svc.model.weights import MODEL_PLACEHOLDER, RANDOM, WeightsError, weights_kind, weights_named
from svc.modelserver.app import ModelServerApp
from svc.modelserver.batching import BatchQueue
from svc.modelserver.engine import Engine
from svc.modelserver.inference import Inference
from svc.modelserver.jobs import JobTable
from svc.modelserver.memory import IdleTrim
from svc.openapi.modelserver import model_server_document
from svc.optimize import measuring
from svc.web.httplimits import HttpLimits
from svc.web.site import JsonSite

log = Logger()


#: Orphaned (the supervisor is gone): the grace is cut to this, and the
#: watchdog ends the process ``ORPHAN_EXIT_S`` after the signal whatever happens.
ORPHAN_GRACE_S = 0.5
#: How long answers written at the end of a stop get to leave before the port closes.
FLUSH_S = 0.05
#: After the port closed, how long requests already sent on open connections get to be answered (idle
#: kept-alive connections hold it this long at most).
LAST_REPLIES_S = 0.2
#: The watchdog's margin over the grace (the promise is grace + 1 s).
WATCHDOG_MARGIN_S = 0.9
#: While the queue is idle but a request is still being parsed or answered
#: (no event marks its end), the drain looks again after this long.
RECHECK_S = 0.01

SHUT_DOWN = ItemResult(st.NOT_READY, None, "the server shut down before this item finished (shutdown_grace_ms)")


class ModelServerService(ListeningMultiService):
    """One model server: everything hangs off this service."""

    def __init__(self, *, reactor: IServiceReactor, config: Any, factory: IModelFactory, model_config: dict,
                 device: str, auth_token: str | None, run_worker: Runner | None = None, run_decode: Runner | None = None,
                 job_owner: JobOwner | None = None, job_secret: str | None = None) -> None:
        """``run_worker``/``run_decode``: None runs batches and decoding in the pools (tests pass their own).

        ``job_owner``/``job_secret``: the replica and host this process's job ids name, and the
        deployment's secret that signs them (svc.contract.jobid; the supervisor passes them in the environment).
        """
        super().__init__()
        self.reactor = reactor
        self.config = config
        self.registry = new_registry()
        self.metrics = ModelServerMetrics(self.registry, config.id)
        backend = config.backend

        self.decode = ThreadPoolService("decode", backend.decode_threads)
        self.workers = ThreadPoolService("inference", backend.workers)
        run_worker = run_worker or self.workers.runner(reactor)
        run_decode = run_decode or self.decode.runner(reactor)

        params = ObjectSchema(factory.params_schema(model_config), "parameter")
        options = ObjectSchema(options_schema(tuple(factory.options)), "option")
        self.engine = Engine(factory, model_config, device, run_worker, self.metrics,
                             default_params=params.with_defaults({}), default_options=options.with_defaults({}),
                             worker_nice=backend.worker_nice, clock=reactor, optimize=backend.optimize,
                             workers=backend.workers)
        self.queue = BatchQueue(
            reactor,
            self.engine.run_batch,
            workers=backend.workers,
            max_batch_size=config.max_batch_size,
            max_batch_delay_ms=config.max_batch_delay_ms,
            max_queue_depth=config.max_queue_depth,
            metrics=self.metrics,
        )
        self.inference = Inference(
            clock=reactor,
            engine=self.engine,
            validator=RequestValidator(params, options, config.max_request_items),
            queue=self.queue,
            run_decode=run_decode,
            max_image_pixels=config.max_image_pixels,
            metrics=self.metrics,
            # On a GPU, decoding in the pool overlaps the forward pass; on a CPU it competes with it.
            decode_in_worker=backend.decode_in_worker and device == "cpu",
        )
        self.app = ModelServerApp(
            clock=reactor,
            config=config,
            inference=self.inference,
            metrics=self.metrics,
            registry=self.registry,
            auth_token=auth_token,
            openapi=model_server_document(config, factory, model_config),
            weights=weights_kind(config.model.get("weights")),
        )
        self.site = JsonSite.for_app(
            self.app,
            self.app.resource(),
            max_body_bytes=config.max_body_bytes,
            limits=HttpLimits.from_config(config),
            timeout=config.peer_resp_timeout,
            reactor=reactor,
        )
        # The listener starts first: a busy port refuses before any thread
        # exists (the pools' threads would keep a refused process alive).
        self.jobs: JobTable | None = None
        if config.async_enabled:
            self.jobs = JobTable(
                reactor,
                self.inference.run_job,
                lambda: self.app.identity,
                max_queue=config.async_max_queue,
                timeout_ms=config.async_timeout,
                ttl_ms=config.async_job_ttl,
                max_completed=config.async_max_completed,
                workers=backend.workers,
                metrics=self.metrics,
                owner=job_owner,
                secret=job_secret,
            )
            self.app.enable_jobs(self.jobs)
            self.metrics.async_waiters.set_function(lambda: self.app.waiting)
        self.program = PROGRAM
        self.listen_address = f"127.0.0.1:{config.port}"
        self.listener = TCPServer(config.port, self.site, backlog=config.listen_backlog, interface="127.0.0.1")
        self.listener.setServiceParent(self)
        self.decode.setServiceParent(self)
        self.workers.setServiceParent(self)
        if backend.tune_malloc:  # the heap that tuning keeps is given back once idle (svc.modelserver.memory)
            IdleTrim(clock=reactor, queue=self.queue, run=run_decode, trim=trim_malloc).setServiceParent(self)
        self.replica = str(job_owner.replica if job_owner is not None else 0)
        self.metrics.info.labels(config.id, "loading", device, self.replica, "loading").set(1)
        self.device = device
        #: Ends the process if a stop overruns its bound (svc.infra.process.start_watchdog); replaceable in tests.
        self.watchdog = start_watchdog
        #: What chose the weights when not the config file (``--weights pretrained``), for a load's refusal.
        self.weights_from: str | None = None

    def startService(self) -> None:
        super().startService()
        port = self.listener._port
        assert port is not None  # listening: the TCPServer child started above
        log.info("{id}: listening on 127.0.0.1:{port}; loading the model on {device}; images decoded {where}",
                 id=self.config.id, port=port.getHost().port, device=self.device,  # the bound one
                 where="in the inference thread" if self.inference.decode_in_worker else "in the decode pool")
        self.engine.on_phase = self._phase
        d = self.engine.load(self.config.max_batch_size)
        d.addCallbacks(self._loaded, self._load_failed)

    def _phase(self, text: str) -> None:
        """What the load does now (from the worker thread): /ready's 503 says it, and so the supervisor's status.
        A wait for another model's measurement is logged too (svc.optimize.measuring): the model's log had a gap
        of a minute with nothing in it."""
        def show() -> None:
            if not self.app.ready:
                self.app.not_ready_reason = f"the model is loading: {text}"
            if text.startswith((measuring.WAITING, measuring.BESIDE)):
                log.info("{id}: {text}", id=self.config.id, text=text)

        call = getattr(self.reactor, "callFromThread", None)  # tests' clocks run the load in their own thread
        call(show) if call is not None else show()

    def _loaded(self, warmup: tuple[float, int]) -> None:
        seconds, items = warmup
        self.queue.observe_throughput(seconds, items)
        frozen = freeze_heap()  # the model and the warm-up are built: keep full collections off the reactor
        optimization = self.engine.optimization
        if optimization is not None:
            (log.warn if optimization.fell_back else log.info)("{line}", line=optimization.line)
        mode = optimization.mode if optimization is not None else "eager"
        self.app.set_ready(self.engine.version, mode)
        self.metrics.ready.set(1)
        self.metrics.info.clear()
        self.metrics.info.labels(self.config.id, self.engine.version, self.device, self.replica, mode).set(1)
        log.info("{id}: ready (version {version}; optimize {mode}; warm-up batch of {items} took {ms:.0f} ms; "
                 "{frozen} objects frozen out of garbage collection)",
                 id=self.config.id, version=self.engine.version, items=items, ms=seconds * 1000, frozen=frozen,
                 mode=mode)

    def _load_failed(self, failure: Any) -> None:
        if failure.check(WeightsError):  # named as a missing file is (svc.model.weights.check_path)
            said = str(failure.value).replace(MODEL_PLACEHOLDER, self.config.id)
            chosen = self.config.model.get("weights", RANDOM)
            message = f"{weights_named(chosen, self.weights_from or self.config.path)}: {said}"
        else:
            log.failure("model failed to load", failure)
            message = f"{self.config.id}: model failed to load: {failure.type.__name__}: {failure.getErrorMessage()}"
        self.app.not_ready_reason = "the model failed to load"
        exit_after_shutdown(self.reactor, PROGRAM, message)

    def stopService(self) -> Deferred:
        return ensureDeferred(self._drain_and_stop())

    async def _drain_and_stop(self) -> None:
        orphan = supervisor_gone()
        grace = self.config.shutdown_grace_ms / 1000.0
        if orphan:
            grace = min(grace, ORPHAN_GRACE_S)
            log.warn("{id}: the supervisor is gone: stopping within {bound:g} s", id=self.config.id, bound=ORPHAN_EXIT_S)
            self.watchdog(ORPHAN_EXIT_S, f"{PROGRAM} {self.config.id} (orphaned)")
        else:
            self.watchdog(grace + WATCHDOG_MARGIN_S, f"{PROGRAM} {self.config.id} (shutdown_grace_ms over)")
        try:
            await self._drain(grace)
        except Exception:  # noqa: BLE001 - MultiService would swallow it; the stop goes on
            log.failure("{id}: draining failed", id=self.config.id)
        port = self.listener._port
        if port is not None:
            # The kernel resets the connections still waiting in the listen backlog when the port closes: the
            # gateway's requests on them failed as transport failures (502). Taken now, they get their 503; shut
            # at once after (twisted closes the socket a reactor turn later), the port refuses the next ones.
            port.doRead()
            with contextlib.suppress(OSError):
                port.socket.shutdown(socket.SHUT_RD)
        await super().stopService()  # the port closes: a new connection is refused (the gateway's 503)
        await self._until_closed(self.reactor.seconds() + LAST_REPLIES_S)
        abandoned = [str(p.name) for p in (self.workers, self.decode) if p.abandoned]
        if abandoned:
            log.warn("{id}: {pools} still running: exiting without waiting for them",
                     id=self.config.id, pools=" and ".join(abandoned))
            self.reactor.addSystemEventTrigger("after", "shutdown", hard_exit, 0)

    async def _drain(self, grace: float) -> None:
        """Stop admitting; wait for held work up to ``grace``; answer what is left."""
        self.app.draining = True
        self.site.closing = True  # each connection closes after its reply: the gateway's next request goes on a
        # new one, answered 503 while the drain lasts, refused after it, instead of one the stop cuts (502)
        self.app.not_ready_reason = "the server is shutting down"
        self.metrics.ready.set(0)
        if self.jobs is not None:
            self.jobs.wake_all()  # parked waiters answer now with the current state
        if not await self._until_idle(self.reactor.seconds() + grace):
            answered = self.queue.abandon(SHUT_DOWN)
            if self.jobs is not None:
                self.jobs.wake_all()
            log.warn("{id}: shutdown grace of {grace:g} s over with work still held: {n} item(s) answered 503 "
                     "status 65; {batches} batch(es) still running are not waited for",
                     id=self.config.id, grace=grace, n=answered, batches=self.queue.running_batches)
        await deferLater(self.reactor, FLUSH_S, lambda: None)  # let the last replies leave

    async def _until_closed(self, deadline: float) -> None:
        """Let requests already sent on open connections get their reply (503 while stopping) before the
        reactor cuts every connection: each closes after it (``site.closing``).  Cut, such a request was a
        transport failure to the gateway (502) where the stop meant 503."""
        while self.site.open_connections > 0 and self.reactor.seconds() < deadline:
            await deferLater(self.reactor, RECHECK_S, lambda: None)

    async def _until_idle(self, deadline: float) -> bool:
        """Wait until nothing is held (True) or the deadline (False), never blocking the reactor.

        While the batching queue holds work, this waits on its idle event
        (``BatchQueue.when_idle``: nothing decoding, queued or running).
        Only what happens outside the queue (parsing a body before its
        admission, a job waiter writing its reply) has no event; that is
        looked at again every ``RECHECK_S``.
        """
        while self.busy():
            left = deadline - self.reactor.seconds()
            if left <= 0:
                return False
            if self.queue.idle:
                await deferLater(self.reactor, min(RECHECK_S, left), lambda: None)
            else:
                idle = self.queue.when_idle()
                idle.addTimeout(left, self.reactor, onTimeoutCancel=lambda result, timeout: None)
                await idle
        return True

    def busy(self) -> bool:
        """Requests or jobs still being answered, or batches still running."""
        running_jobs = self.jobs.depth if self.jobs is not None else 0
        return self.app.in_flight > 0 or self.app.waiting > 0 or self.queue.running_batches > 0 or running_jobs > 0
