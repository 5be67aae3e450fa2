"""A whole model server in memory: the real service tree on a Clock, a gated worker, StubTreq in front.

Every in-memory test of the model server's routes builds it here
(:func:`build_model_server`), so that a change to how the service is put
together is adapted in one place.  What is real: ``ModelServerService`` and
everything it builds (``ModelServerApp``, ``JobRoutes``, ``Inference``,
``BatchQueue``, ``Engine``, ``JobTable``, the metrics and the ``JsonSite``
with its access-log accounting).  What is not:

* time is a ``twisted.internet.task.Clock``;
* the inference pool is :class:`GatedWorkers`: a batch runs (on the calling
  thread) only when the test releases it, so "the model is busy" is a state
  the test holds, not a sleep;
* the decode pool runs inline;
* the model is the TESTFAULTS plugin's contract (its params, batch keys,
  faults and data schema, tests/plugins/models/testfaults.py) computed
  without torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from unittest import mock

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from models.testfaults import FaultFactory, FaultModel
from svc.config import load_model_server_config
from svc.infra.metrics import render
from svc.infra.process import inline_runner
from svc.model.api import model_config
from svc.modelserver import service as service_module
from svc.modelserver.service import ModelServerService
from tests.support.processes import TEST_CONF

TOKEN = "in-memory-token"
URI = "/testfaults/predict"  # server_uri of tests/conf/TESTFAULTS.toml
OWN_TOKEN = object()  # send(): the server's own token


class GatedWorkers:
    """The inference pool's runner: work waits here until the test releases it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple, dict, Deferred]] = []

    def __call__(self, f: Any, *args: Any, **kwargs: Any) -> Deferred:
        d: Deferred = Deferred()
        self.calls.append((f, args, kwargs, d))
        return d

    @property
    def held(self) -> int:
        """Batches (or the warm-up) waiting to be released."""
        return len(self.calls)

    def release(self, n: int = 1) -> None:
        """Run the ``n`` oldest held calls now, in order, and fire their results."""
        for _ in range(n):
            f, args, kwargs, d = self.calls.pop(0)
            outcome = inline_runner(f, *args, **kwargs)
            outcome.chainDeferred(d)

    def release_all(self) -> None:
        """Release until nothing is held (batches started by a release included)."""
        while self.calls:
            self.release()


class InMemoryFaultModel(FaultModel):
    """TESTFAULTS without torch: an input is the image's mean colour; ``batches`` records each forward pass."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def preprocess(self, image: Any, params: dict) -> Any:
        return tuple(float(v) for v in image.convert("RGB").resize((1, 1)).getpixel((0, 0)))

    def predict(self, inputs: list, params: dict) -> list:
        self.batches.append(len(inputs))
        if params["fail"] == "engine":
            raise RuntimeError("injected engine failure")
        outputs = [(mean, len(inputs)) for mean in inputs]
        return outputs[:-1] if params["fail"] == "length" else outputs

    def warmup_input(self) -> Any:
        return (0.0, 0.0, 0.0)


class InMemoryFaultFactory(FaultFactory):
    """The TESTFAULTS factory building :class:`InMemoryFaultModel` (one instance, kept for the test)."""

    def __init__(self) -> None:
        self.model = InMemoryFaultModel()

    def build(self, config: dict, device: str) -> InMemoryFaultModel:
        return self.model


@dataclass
class Reply:
    code: int
    headers: dict[str, str]  # lower-case name -> first value
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class InMemoryModelServer:
    """The service tree and a client; ``call`` sends one request and returns its settled reply."""

    def __init__(self, clock: Clock, service: ModelServerService, workers: GatedWorkers,
                 model: InMemoryFaultModel, token: str | None) -> None:
        self.clock = clock
        self.service = service
        self.workers = workers
        self.model = model
        self.token = token
        self.client = StubTreq(service.site.resource)
        # Serve through the service's own JsonSite (limits, access-log accounting), not a plain Site.
        self.client._agent._serverFactory = service.site

    @property
    def jobs(self) -> Any:
        return self.service.jobs

    def send(self, method: str, path: str, *, token: Any = OWN_TOKEN, body: Any = None,
             headers: dict[str, str] | None = None) -> Deferred:
        """Start a request with the server's token (or ``token``; None sends none); ``body`` a dict is JSON."""
        headers = dict(headers or {})
        token = self.token if token is OWN_TOKEN else token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if isinstance(body, dict):
            body = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
        d = self.client.request(method, "http://127.0.0.1" + path, headers=headers, data=body)
        self.turn()
        return d

    def turn(self) -> None:
        """What the reactor does without time passing: move bytes, run what is due now."""
        for _ in range(4):
            self.client.flush()
            self.clock.advance(0)
        self.client.flush()

    def done(self, d: Deferred) -> bool:
        """Whether the reply of ``d`` has arrived (after a turn)."""
        self.turn()
        box: list = []
        d.addBoth(lambda r: (box.append(r), r)[1])
        return bool(box)

    def settle(self, d: Deferred) -> Reply:
        """The reply of ``d``, which must have arrived."""
        self.turn()
        box: list = []
        d.addBoth(box.append)
        assert box, "the request did not finish"
        if isinstance(box[0], Failure):
            box[0].raiseException()
        response = box[0]
        body: list = []
        self.client.content(response).addBoth(body.append)
        self.turn()
        headers = {k.decode().lower(): v[0].decode() for k, v in response.headers.getAllRawHeaders()}
        return Reply(response.code, headers, body[0])

    def call(self, method: str, path: str, **kw: Any) -> Reply:
        return self.settle(self.send(method, path, **kw))

    def infer(self, images: list[str], **params: Any) -> Deferred:
        """Start a synchronous inference on ``server_uri``."""
        return self.send("POST", URI, body={"images": images, **({"params": params} if params else {})})

    def submit(self, images: list[str], **params: Any) -> Reply:
        """Submit a job; its run starts on the next reactor turn."""
        return self.call("POST", "/jobs", body={"images": images, **({"params": params} if params else {})})

    def metric(self, name: str, labels: str = "") -> float | None:
        """The value of one sample of the registry's exposition, None when absent."""
        for line in render(self.service.registry).decode().splitlines():
            if line.startswith(name + labels + " "):
                return float(line.split(" ")[-1])
        return None


def _loaded(warmup: tuple[float, int], service: ModelServerService) -> None:
    # The real start freezes the heap out of garbage collection: not in a test process.
    with mock.patch.object(service_module, "freeze_heap", lambda: 0):
        service._loaded(warmup)


def build_model_server(clock: Clock | None = None, *, token: str | None = TOKEN, ready: bool = True,
                       decoders: GatedWorkers | None = None, **overrides: Any) -> InMemoryModelServer:
    """The TESTFAULTS server of tests/conf with top-level config keys overridden (``backend={...}`` merges).

    The load is started as ``startService`` starts it (its listener aside).
    ``ready``: the warm-up is released, as after a real start; otherwise it is
    still held in ``workers`` (release it to make the server ready).  ``decoders``: the decode pool's runner
    (default inline), gated to hold a request's validation and decoding.
    """
    clock = clock or Clock()
    config = load_model_server_config(str(TEST_CONF / "TESTFAULTS.toml"))
    # worker_nice 0: the warm-up and the batches run on the test's own thread, which must not be reniced.
    backend = {**config.backend.__dict__, "worker_nice": 0, **overrides.pop("backend", {})}
    config = config.replace(backend=config.backend.__class__(**backend), **overrides)
    factory = InMemoryFaultFactory()
    workers = GatedWorkers()
    service = ModelServerService(reactor=clock, config=config, factory=factory,
                                 model_config=model_config(factory, config.model, config.path), device="cpu",
                                 auth_token=token, run_worker=workers, run_decode=decoders or inline_runner)
    service.engine.load(config.max_batch_size).addCallback(_loaded, service)
    if ready:
        workers.release()
        factory.model.batches.clear()
    return InMemoryModelServer(clock, service, workers, factory.model, token)

