"""How a converted model is called: torch tensors in, torch tensors out, on the streams the workers share.

:mod:`svc.optimize.runtimes` converts a target and keeps the file; this
module runs it:

- one OpenVINO stream per worker (``NUM_STREAMS``), or one ONNX Runtime
  session whose intra-op pool runs the workers' calls side by side;
- with several workers, one more stream or session with every worker's
  threads, for a call whose batch is the only one running (one client, a
  quiet moment: :data:`BATCHES`, :class:`Calls`, :data:`ALONE`);
- for OpenVINO, forms compiled with a fixed batch size
  (:func:`fixed_batches`): a batch of one on the stream a lone call takes,
  and the warm-up batch (``max_batch_size``, what a busy server forms) on
  the workers' streams.  OpenVINO's CPU plugin runs a fixed shape faster
  than the dynamic batch dimension the file has: 4 to 19 % less time per
  call, measured on MobileNetV2, YOLOv8's network and the DDPM UNet
  (bench/README.md, "fixed batch shapes").  Other sizes run the dynamic
  form.  Each fixed form costs its memory (its activations are allocated
  at compile time), which is why there are two and not one per size.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: With several workers, also compile one stream (OpenVINOCall) or open one session (OnnxRuntimeCall) with all their
#: threads for a call that runs alone.
ALONE = True
#: Compile OpenVINO forms with a fixed batch size for the batch sizes :func:`fixed_batches` names.
FIXED = True


class Batches:
    """The batches a model server's workers are running now: decoding, forward pass and postprocessing.

    The engine counts each of its batches (:meth:`running`); a converted
    model asks whether its caller's batch is the only one (:meth:`alone`)
    before it takes every worker's threads.  Outside a model server (a test,
    a benchmark) nothing is counted, and a call is alone when no other call
    runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self.count += 1
        try:
            yield
        finally:
            with self._lock:
                self.count -= 1

    def alone(self) -> bool:
        """No batch, or only the caller's, is running."""
        return self.count <= 1


#: The batches of this process's model server (``svc.modelserver.engine`` counts them).
BATCHES = Batches()




def _arrays(args: tuple) -> list:
    """Positional tensors as C-contiguous numpy arrays (views where they already are; a 0-d tensor stays 0-d)."""
    import numpy as np

    arrays = [a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a) for a in args]
    return [a if a.flags.c_contiguous else a.copy(order="C") for a in arrays]


def _outputs(arrays: list, returns: str) -> Any:
    import torch

    tensors = [torch.from_numpy(a) for a in arrays]
    if returns == "tensor":
        return tensors[0]
    return tensors if returns == "list" else tuple(tensors)


def input_positions(ports: Any) -> list[int]:
    """The argument each input of a converted model takes.

    A model converted from the ONNX export names its inputs ``inputN`` after
    the argument's position, and has none for an argument the graph does not
    use (the exporter leaves it out); a model converted from the module has
    one input per tensor argument, in order.
    """
    named = [next((int(n[5:]) for n in port.get_names() if re.fullmatch(r"input\d+", n)), None) for port in ports]
    return [i for i in named if i is not None] if None not in named else list(range(len(named)))


def fixed_batches(batch: int) -> tuple[int, ...]:
    """The batch sizes a batched target gets a fixed-shape form for: one (a lone request) and ``batch``, the
    warm-up batch (the largest the server forms, what a busy server runs)."""
    return tuple(sorted({1, max(1, batch)})) if FIXED else ()


def _fixed_batch(model: Any, n: int) -> Any | None:
    """A copy of ``model`` whose dynamic batch dimension is ``n``; None when it has no dynamic batch dimension,
    or dimensions other than the batch that are not fixed (a shape the copy cannot pin)."""
    shapes, pinned = {}, False
    for index, port in enumerate(model.inputs):
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic:
            return None
        dims = list(shape)
        if dims and dims[0].is_dynamic:
            dims, pinned = [n, *dims[1:]], True
        if any(not isinstance(d, int) and d.is_dynamic for d in dims):
            return None
        shapes[index] = [d if isinstance(d, int) else d.get_length() for d in dims]
    if not pinned:
        return None
    copy = model.clone()
    copy.reshape({copy.input(index): shape for index, shape in shapes.items()})
    return copy


def _batch_input(ports: Any) -> int | None:
    """The index of the first input whose first dimension is the dynamic batch; None if there is none."""
    for index, port in enumerate(ports):
        shape = port.get_partial_shape()
        if shape.rank.is_static and shape.rank.get_length() >= 1 and shape[0].is_dynamic:
            return index
    return None


class Calls:
    """The calls of one converted model in progress, all threads together.  A new one runs alone when the model
    has a form for it (``has_alone``: one stream or session with every worker's threads), no other call runs,
    and its batch is the model server's only one (:data:`BATCHES`): one client, a quiet moment."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0

    @contextmanager
    def one(self, has_alone: bool) -> Iterator[bool]:
        with self.lock:
            alone = has_alone and self.running == 0 and BATCHES.alone()
            self.running += 1
        try:
            yield alone
        finally:
            with self.lock:
                self.running -= 1


class OpenVINOCall:
    """A compiled OpenVINO model called like the target: torch tensors in, torch tensors out.

    One infer request per calling thread (a request is not shared); one
    stream per worker, so the workers' calls run side by side.  With more
    than one worker the model is compiled a second time as one stream with
    every worker's threads (:data:`ALONE`): a call made while its batch is
    the only one running (:data:`BATCHES`: one client, a quiet moment) and no
    other call runs uses that one and all the cores; a call beside another
    batch keeps its worker's stream and its share of the threads, so that
    the other worker's decoding and forward pass never wait for a core.
    A batch of one that runs alone, and a batch of the warm-up size beside
    another, run a form compiled for that size (:func:`fixed_batches`) on
    the stream they would take anyway.
    """

    def __init__(self, core: Any, model: Any, bf16: bool, returns: str, threads: int, workers: int,
                 batches: tuple[int, ...] = ()) -> None:
        workers = max(1, workers)
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32",
                  "INFERENCE_NUM_THREADS": threads * workers, "NUM_STREAMS": workers}
        alone_config = {**config, "NUM_STREAMS": 1}
        self.compiled = core.compile_model(model, "CPU", config)
        self.alone = core.compile_model(model, "CPU", alone_config) if ALONE and workers > 1 else None
        self.returns = returns
        self.types = [port.get_element_type().to_dtype() for port in self.compiled.inputs]
        self.positions = input_positions(self.compiled.inputs)
        self.batch_input = _batch_input(self.compiled.inputs)
        #: (alone, batch size) -> its fixed form: the smallest of ``batches`` (one) on the stream a lone call takes
        #: (the workers' streams when there is no lone stream), the largest (the warm-up batch) on the workers'.
        self.fixed: dict[tuple[bool, int], Any] = {}
        if batches:
            lone, busy = (self.alone is not None, min(batches)), (False, max(batches))
            for alone, n in {lone, busy}:
                try:
                    shaped = _fixed_batch(model, n)
                    if shaped is not None:
                        self.fixed[(alone, n)] = core.compile_model(shaped, "CPU", alone_config if alone else config)
                except Exception:  # noqa: BLE001 - a graph that refuses the pinned size keeps its dynamic form
                    continue
        self.local = threading.local()
        self.calls = Calls()

    def __call__(self, *args: Any) -> Any:
        given = _arrays(args)
        arrays = [given[i].astype(t, copy=False) for i, t in zip(self.positions, self.types)]
        n = arrays[self.batch_input].shape[0] if self.batch_input is not None else 0
        with self.calls.one(self.alone is not None) as alone:
            form = (alone, n) if (alone, n) in self.fixed else (alone, 0)  # 0: the dynamic form
            compiled = self.fixed[form] if form[1] else (
                self.alone if alone and self.alone is not None else self.compiled)
            infer_requests = getattr(self.local, "infer_requests", None)
            if infer_requests is None:
                infer_requests = self.local.infer_requests = {}
            request = infer_requests.get(form)
            if request is None:
                request = infer_requests[form] = compiled.create_infer_request()
            results = request.infer(arrays, share_inputs=True)  # outputs copied: the request reuses its buffers
            return _outputs([results[port] for port in compiled.outputs], self.returns)


class OnnxRuntimeCall:
    """An ONNX Runtime session called like the target: torch tensors in, torch tensors out.

    The exporter leaves out inputs the graph does not use; each argument goes
    to the session input of its position's name, if the session has it.  As
    :class:`OpenVINOCall`, with more than one worker a second session has
    every worker's threads (:data:`ALONE`), for a call that runs alone
    (:class:`Calls`); its threads do not spin between calls, so that they
    leave the cores to the workers' own sessions.
    """

    def __init__(self, path: Path, returns: str, threads: int, workers: int = 1) -> None:
        self.session = _ort_session(path, threads)
        self.alone = _ort_session(path, threads * workers, spin=False) if ALONE and workers > 1 else None
        self.returns = returns
        types = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(int32)": "int32",
                 "tensor(double)": "float64", "tensor(bool)": "bool"}
        self.inputs = {i.name: types.get(i.type) for i in self.session.get_inputs()}
        self.calls = Calls()

    def __call__(self, *args: Any) -> Any:
        feed = {}
        for i, array in enumerate(_arrays(args)):
            name = f"input{i}"
            if name in self.inputs:
                dtype = self.inputs[name]
                feed[name] = array.astype(dtype, copy=False) if dtype else array
        with self.calls.one(self.alone is not None) as alone:
            session = self.alone if alone and self.alone is not None else self.session
            return _outputs(session.run(None, feed), self.returns)


def _ort_session(path: Path, threads: int, spin: bool = True) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
