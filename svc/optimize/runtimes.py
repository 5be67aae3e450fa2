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
How the converted model is called (streams, a stream for a call that runs
alone, batch sizes compiled with fixed shapes): :mod:`svc.optimize.runtime_calls`.
:data:`STATS` counts conversions and cache reads for the optimisation line.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from svc.optimize.cache import make_private_dirs, read_cached, temporary_file, usable_dir, write_record
from svc.optimize.runtime_calls import OnnxRuntimeCall, OpenVINOCall, fixed_batches

#: Models converted and read from the cache by this process (``converted``, ``loaded``).
STATS: Counter = Counter()
#: The inference threads that call a converted target at once (``backend.workers``; set by ``svc.optimize.select``).
WORKERS = 1
#: The smallest example batch a batched target is converted with (tracing at one can fix broadcasts to one).
CONVERT_MIN_BATCH = 2
#: The ONNX opset of ``torch.onnx.export``.
ONNX_OPSET = 17
_core: Any = None
_core_lock = threading.Lock()


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

    directory = usable_dir(directory)  # not a folder another user can change (svc.optimize.cache.trust_problem)
    example = tuple(v.clone() if isinstance(v, torch.Tensor) else v
                    for v in make_example(max(batch, CONVERT_MIN_BATCH) if batched else batch))
    path = artifact_path(module, example, runtime, name, batched, directory)
    meta = path.with_suffix(".json")
    call = read_cached(meta, _files(path), lambda record: _load(path, record["returns"], runtime, bf16, batch,
                                                               batched), STATS)
    if call is not None:
        return call
    make_private_dirs(path.parent)
    returns = _returns(module, example)
    if runtime == "openvino":
        _convert_openvino(module, example, batched, path, _onnx_file(module, example, batched, name, directory,
                                                                     returns))
    else:
        _export_onnx(module, example, batched, path)
    write_record(meta, _files(path), {"returns": returns})
    STATS["converted"] += 1
    return _load(path, returns, runtime, bf16, batch, batched)


def _files(path: Path) -> list[Path]:
    """The files of a converted model: OpenVINO's ``.xml`` and ``.bin``, or the ``.onnx``."""
    return [path, path.with_suffix(".bin")] if path.suffix == ".xml" else [path]


def _load(path: Path, returns: str, runtime: str, bf16: bool, batch: int, batched: bool) -> Any:
    if returns not in ("tensor", "list", "tuple"):
        raise ValueError(f"its record says it returns {returns!r}")
    if runtime == "openvino":
        # Read, not mapped: OpenVINO's default maps the .bin, and a file cut short or overwritten in place (a cp
        # over it, a restored backup) then killed the running server (SIGBUS) or changed its weights under it.
        model = _ov_core().read_model(str(path), config={"ENABLE_MMAP": False})
        return OpenVINOCall(_ov_core(), model, bf16, returns, intra_op_threads(), WORKERS,
                            fixed_batches(batch) if batched else ())
    return OnnxRuntimeCall(path, returns, intra_op_threads(), WORKERS)


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
        if read_cached(meta, [path], lambda record: path) is None:
            _export_onnx(module, example, batched, path)
            write_record(meta, [path], {"returns": returns})
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
    tmp = temporary_file(path, "converting", ".xml")
    try:
        try:
            openvino.save_model(model, tmp, compress_to_fp16=False)  # float32 weights: the bf16 precision is a hint
        except RuntimeError as e:  # how OpenVINO reports a full disk ("basic_ios::clear: iostream error")
            raise OSError(f"OpenVINO could not write {path.name}: {str(e)[:200]}") from e
        # OpenVINO makes the .bin (the weights) under the umask, 0644 as a rule: the owner's only, as the
        # weights file and every other file of the cache (made by mkstemp) are.
        os.chmod(tmp[:-4] + ".bin", 0o600)
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
    tmp = temporary_file(path, "exporting", ".onnx")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter warns that it is deprecated, and about traced values
            torch.onnx.export(module, example, tmp, input_names=names, dynamic_axes=dynamic or None,
                              opset_version=ONNX_OPSET, dynamo=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
