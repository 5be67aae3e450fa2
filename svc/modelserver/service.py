"""The model-server service tree: thread pools, engine, HTTP listener.

Start: the listener comes up at once (``/healthz`` answers, ``/ready`` is
503), then the model is built and warmed up in the worker pool; a model that
fails to load stops the process with one line and exit code 1.
Stop (SIGTERM/SIGINT): stop admitting (503 status 65), let running requests
finish or reach their deadline within ``shutdown_grace_ms``, then close the
listener and join the pools; twistd exits 0.
"""

from __future__ import annotations

from typing import Any

from twisted.application.internet import TCPServer
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import deferLater
from twisted.logger import Logger

from svc.http import HttpLimits, JsonSite
from svc.metrics import ModelServerMetrics, new_registry
from svc.modelapi import IModelFactory
from svc.modelserver.app import ModelServerApp
from svc.modelserver.batching import BatchQueue
from svc.modelserver.engine import Engine
from svc.modelserver.inference import Inference
from svc.modelserver.job_routes import JobRoutes
from svc.modelserver.jobs import JobTable
from svc.openapi import model_server_document
from svc.options import options_schema
from svc.process import ListeningMultiService, ThreadPoolService, exit_after_shutdown, freeze_heap
from svc.request import RequestValidator
from svc.schema import ObjectSchema
from svc.weights import WeightsError

log = Logger()

PROGRAM = "service-model"


class ModelServerService(ListeningMultiService):
    """One model server: everything hangs off this service."""

    def __init__(self, *, reactor: Any, config: Any, factory: IModelFactory, model_config: dict, device: str,
                 auth_token: str | None) -> None:
        super().__init__()
        self.reactor = reactor
        self.config = config
        self.registry = new_registry()
        self.metrics = ModelServerMetrics(self.registry, config.id)
        backend = config.backend

        self.decode = ThreadPoolService("decode", backend.decode_threads)
        self.workers = ThreadPoolService("inference", backend.workers)

        params = ObjectSchema(factory.params_schema(model_config), "parameter")
        options = ObjectSchema(options_schema(tuple(factory.options)), "option")
        self.engine = Engine(factory, model_config, device, self.workers.runner(reactor), self.metrics,
                             default_params=params.with_defaults({}), default_options=options.with_defaults({}),
                             worker_nice=backend.worker_nice)
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
            factory=factory,
            validator=RequestValidator(params, options, config.max_request_items),
            queue=self.queue,
            run_decode=self.decode.runner(reactor),
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
        )
        self.site = JsonSite(
            self.app.resource(),
            max_body_bytes=config.max_body_bytes,
            oversize_reply=self.app.oversize_reply,
            busy_reply=self.app.busy_reply,
            limits=HttpLimits.from_config(config),
            timeout=config.peer_resp_timeout,
            reactor=reactor,
            on_logged=self.app.count,
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
            )
            JobRoutes(self.app, self.jobs)
            self.metrics.async_waiters.set_function(lambda: self.app.waiting)
        self.program = PROGRAM
        self.listen_address = f"127.0.0.1:{config.port}"
        self.listener = TCPServer(config.port, self.site, backlog=config.listen_backlog, interface="127.0.0.1")
        self.listener.setServiceParent(self)
        self.decode.setServiceParent(self)
        self.workers.setServiceParent(self)
        self.metrics.info.labels(config.id, "loading", device).set(1)
        self.device = device

    def startService(self) -> None:
        super().startService()
        log.info("{id}: listening on 127.0.0.1:{port}; loading the model on {device}; images decoded {where}",
                 id=self.config.id, port=self.config.port, device=self.device,
                 where="in the inference thread" if self.inference.decode_in_worker else "in the decode pool")
        d = self.engine.load(self.config.max_batch_size)
        d.addCallbacks(self._loaded, self._load_failed)

    def _loaded(self, warmup: tuple[float, int]) -> None:
        seconds, items = warmup
        self.queue.observe_throughput(seconds, items)
        self.inference.model = self.engine.model
        frozen = freeze_heap()  # the model and the warm-up are built: keep full collections off the reactor
        self.app.set_ready(self.engine.version)
        self.metrics.ready.set(1)
        self.metrics.info.clear()
        self.metrics.info.labels(self.config.id, self.engine.version, self.device).set(1)
        log.info("{id}: ready (version {version}; warm-up batch of {items} took {ms:.0f} ms; {frozen} objects "
                 "frozen out of garbage collection)",
                 id=self.config.id, version=self.engine.version, items=items, ms=seconds * 1000, frozen=frozen)

    def _load_failed(self, failure: Any) -> None:
        if failure.check(WeightsError):
            message = str(failure.value)
        else:
            log.failure("model failed to load", failure)
            message = f"{self.config.id}: model failed to load: {failure.type.__name__}: {failure.getErrorMessage()}"
        self.app.not_ready_reason = "the model failed to load"
        exit_after_shutdown(self.reactor, PROGRAM, message)

    def stopService(self) -> Deferred:
        return ensureDeferred(self._drain_and_stop())

    async def _drain_and_stop(self) -> None:
        self.app.draining = True
        self.app.not_ready_reason = "the server is shutting down"
        self.metrics.ready.set(0)
        if self.jobs is not None:
            self.jobs.wake_all()  # parked waiters answer now with the current state
        deadline = self.reactor.seconds() + self.config.shutdown_grace_ms / 1000.0
        while self.busy() and self.reactor.seconds() < deadline:
            await deferLater(self.reactor, 0.05, lambda: None)
        if self.busy():
            log.warn("{id}: shutdown grace over with work still running", id=self.config.id)
        else:
            await deferLater(self.reactor, 0.05, lambda: None)  # let the last replies flush
        await super().stopService()

    def busy(self) -> bool:
        """Requests or jobs still being answered, or batches still running."""
        running_jobs = self.jobs.depth if self.jobs is not None else 0
        return self.app.in_flight > 0 or self.app.waiting > 0 or self.queue.running_batches > 0 or running_jobs > 0
