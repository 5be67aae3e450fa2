"""``openvino`` and ``onnxruntime``: a target converted at load and run by that runtime on the CPU.

The plugin's module stays a PyTorch module; at load it is converted from the
module and its example inputs:

- ``onnxruntime``: ``torch.onnx.export`` (the TorchScript exporter, the batch
  dimension dynamic) and an ``InferenceSession`` on the CPU provider;
- ``openvino``: ``openvino.convert_model`` of that same ONNX file (exported
  now, or the one the ``onnxruntime`` mode keeps), compiled for the CPU with
  the ``LATENCY`` hint at ``f32`` inference precision, or ``bf16`` for
  ``bf16+openvino`` (:mod:`svc.optimize.support` offers bf16 only where the
  CPU has it natively).  Converting the ONNX file costs a fraction of a
  second; converting the module (``convert_model(module, example_input=...)``,
  the batch dimension made dynamic), which traces it again, cost 13 to 18 s
  for YOLOV8's network and the DDPM UNet on 2 cores, and is what is left when
  the export fails or ONNX Runtime is not installed (its version keys the file).

The converted model is kept in ``<state dir>/compiled/`` (OpenVINO IR
``.xml`` + ``.bin`` saved in float32, the same file for both precisions;
``.onnx``) under the key :func:`svc.optimize.aot.package_key` computes for
``compile`` (the weights, the module's source files, torch's version, the
CPU, the input shapes) plus the runtime's version: a restart with the same
key reads the file instead of converting again; new weights or another
runtime version convert afresh.  A ``.json`` beside it, written last, says
what the target returns (a tensor, a list or a tuple of them).

Threads: the runtime's threads replace torch's.  Each call gets the intra-op
threads torch has (``backend.threads``, or the cores divided among the
workers: ``svc.model.torchenv.configure_threads``), and the workers call at once:
OpenVINO gets one stream per worker with that many threads each, ONNX
Runtime an intra-op pool of that size (a session runs concurrent calls).
With several workers OpenVINO also compiles one stream with all their
threads, for a call whose batch is the only one running (one client):
:class:`OpenVINOCall`, :data:`BATCHES`.
:data:`STATS` counts conversions and cache reads for the optimisation line.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: Models converted and read from the cache by this process (``converted``, ``loaded``).
STATS: Counter = Counter()
#: The inference threads that call a converted target at once (``backend.workers``; set by ``svc.optimize.select``).
WORKERS = 1
#: With several workers, also compile one stream (OpenVINOCall) or open one session (OnnxRuntimeCall) with all their
#: threads for a call that runs alone.
ALONE = True
#: The smallest example batch a batched target is converted with (tracing at one can fix broadcasts to one).
CONVERT_MIN_BATCH = 2
#: The ONNX opset of ``torch.onnx.export``.
ONNX_OPSET = 17
_core: Any = None
_core_lock = threading.Lock()


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


def runtime_version(runtime: str) -> str:
    """The runtime's package version (part of the cache key)."""
    if runtime == "openvino":
        return _openvino().__version__
    import onnxruntime

    return onnxruntime.__version__


def intra_op_threads() -> int:
    """The threads one call may use: torch's intra-op threads, as the model server configured them."""
    import torch

    return max(1, torch.get_num_threads())


def _openvino() -> Any:
    """The ``openvino`` module, imported without its telemetry (:func:`svc.optimize.support.block_openvino_telemetry`)."""
    from svc.optimize.support import block_openvino_telemetry

    block_openvino_telemetry()
    import openvino

    return openvino


def _ov_core() -> Any:
    global _core
    with _core_lock:
        if _core is None:
            _core = _openvino().Core()
        return _core


def artifact_path(module: Any, example: tuple, runtime: str, name: str, batched: bool, directory: Path) -> Path:
    """Where the converted ``module`` is kept: its name holds the key of everything that decides it."""
    import torch

    from svc.optimize.aot import package_key

    shapes = "batched" if batched else str([tuple(v.shape) for v in example if isinstance(v, torch.Tensor)])
    key = package_key(module, example, "cpu", f"{runtime} {runtime_version(runtime)}|{shapes}")
    return directory / f"{name}-{runtime}-{key[:32]}{'.xml' if runtime == 'openvino' else '.onnx'}"


def converted(module: Any, make_example: Any, batch: int, batched: bool, runtime: str, bf16: bool, name: str,
              directory: Path) -> Any:
    """``module`` converted for ``runtime`` (read from ``directory`` when its key is there), ready to call.

    ``make_example(n)`` makes the arguments of a batch of ``n``.  Raises
    what the conversion raises (the caller drops the mode).
    """
    import torch

    example = tuple(v.clone() if isinstance(v, torch.Tensor) else v
                    for v in make_example(max(batch, CONVERT_MIN_BATCH) if batched else batch))
    path = artifact_path(module, example, runtime, name, batched, directory)
    meta = path.with_suffix(".json")
    if meta.is_file() and path.is_file():
        returns = json.loads(meta.read_text())["returns"]
        STATS["loaded"] += 1
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        returns = _returns(module, example)
        if runtime == "openvino":
            _convert_openvino(module, example, batched, path, _onnx_file(module, example, batched, name, directory,
                                                                         returns))
        else:
            _export_onnx(module, example, batched, path)
        _write_atomically(meta, json.dumps({"returns": returns}))
        STATS["converted"] += 1
    if runtime == "openvino":
        return OpenVINOCall(_ov_core().read_model(str(path)), bf16, returns, intra_op_threads(), WORKERS)
    return OnnxRuntimeCall(path, returns, intra_op_threads(), WORKERS)


def _write_atomically(path: Path, text: str) -> None:
    """``path`` complete or absent: two servers converting the same key at once (DDPM and DDIM share a UNet)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".writing-", suffix=path.suffix)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _returns(module: Any, example: tuple) -> str:
    """What ``module`` returns: "tensor", "list" or "tuple" (of tensors); anything else cannot be converted."""
    import torch

    with torch.no_grad():
        out = module(*example)
    if isinstance(out, torch.Tensor):
        return "tensor"
    if isinstance(out, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in out):
        return type(out).__name__
    raise TypeError(f"the target returns {type(out).__name__}, not a tensor or a flat list/tuple of tensors")


def _tensors(example: tuple) -> list:
    import torch

    return [v for v in example if isinstance(v, torch.Tensor)]


def _onnx_file(module: Any, example: tuple, batched: bool, name: str, directory: Path, returns: str) -> Path | None:
    """``module`` exported to ONNX where the ``onnxruntime`` mode keeps it (exported now unless it is there),
    for OpenVINO to convert; None when ONNX Runtime is not installed or the export fails."""
    try:
        path = artifact_path(module, example, "onnxruntime", name, batched, directory)
        meta = path.with_suffix(".json")
        if not (meta.is_file() and path.is_file()):
            _export_onnx(module, example, batched, path)
            _write_atomically(meta, json.dumps({"returns": returns}))
        return path
    except Exception:  # noqa: BLE001 - OpenVINO converts the module itself instead
        return None


def _convert_openvino(module: Any, example: tuple, batched: bool, path: Path, onnx: Path | None = None) -> None:
    import torch

    openvino = _openvino()
    model = None
    if onnx is not None:
        try:
            model = openvino.convert_model(str(onnx))  # the batch dimension is dynamic in the file already
        except Exception:  # noqa: BLE001 - the module is converted instead
            model = None
    if model is None:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # convert_model traces with torch.jit.trace, which warns it is deprecated
            model = openvino.convert_model(module, example_input=example)
        if batched:
            shapes = {}
            for port, value in zip(model.inputs, _tensors(example)):
                if value.dim() >= 1:
                    shapes[port] = openvino.PartialShape([-1, *value.shape[1:]])
            model.reshape(shapes)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".converting-", suffix=".xml")
    os.close(fd)
    try:
        openvino.save_model(model, tmp, compress_to_fp16=False)  # float32 weights: the bf16 precision is a hint
        os.replace(tmp[:-4] + ".bin", path.with_suffix(".bin"))
        os.replace(tmp, path)  # the .xml last: a cut conversion never looks cached
    finally:
        for leftover in (tmp, tmp[:-4] + ".bin"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _export_onnx(module: Any, example: tuple, batched: bool, path: Path) -> None:
    import torch

    names = [f"input{i}" for i in range(len(example))]
    dynamic = {n: {0: "batch"} for n, v in zip(names, example)
               if batched and isinstance(v, torch.Tensor) and v.dim() >= 1}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".exporting-", suffix=".onnx")
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter warns that it is deprecated, and about traced values
            torch.onnx.export(module, example, tmp, input_names=names, dynamic_axes=dynamic or None,
                              opset_version=ONNX_OPSET, dynamo=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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
    """

    def __init__(self, model: Any, bf16: bool, returns: str, threads: int, workers: int) -> None:
        workers = max(1, workers)
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32",
                  "INFERENCE_NUM_THREADS": threads * workers, "NUM_STREAMS": workers}
        self.compiled = _ov_core().compile_model(model, "CPU", config)
        self.alone = (_ov_core().compile_model(model, "CPU", {**config, "NUM_STREAMS": 1})
                      if ALONE and workers > 1 else None)
        self.returns = returns
        self.types = [port.get_element_type().to_dtype() for port in self.compiled.inputs]
        self.positions = input_positions(self.compiled.inputs)
        self.local = threading.local()
        self.calls = Calls()

    def __call__(self, *args: Any) -> Any:
        with self.calls.one(self.alone is not None) as alone:
            compiled = self.alone if alone and self.alone is not None else self.compiled
            infer_requests = getattr(self.local, "infer_requests", None)
            if infer_requests is None:
                infer_requests = self.local.infer_requests = {}
            request = infer_requests.get(alone)
            if request is None:
                request = infer_requests[alone] = compiled.create_infer_request()
            given = _arrays(args)
            arrays = [given[i].astype(t, copy=False) for i, t in zip(self.positions, self.types)]
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
