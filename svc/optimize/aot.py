"""``compile``: a target exported and compiled ahead of time by inductor, kept as a package on disk.

``torch.export`` captures the target once (the batch dimension dynamic, 1 to
:func:`max_batch` of the warm-up batch: one program for every batch size the
server forms), AOTInductor compiles it
with freezing (weights as constants, conv and BatchNorm folded, oneDNN weight
packing on a CPU) into a ``.pt2`` package, and the package is loaded and run.
Packages live in ``<state dir>/compiled/`` (:mod:`svc.optimize.cache`) under
a key of everything that decides the compiled code: the mode, torch's
version, the device and CPU capability, the target's weights and buffers,
the source files of its module classes, the example inputs' shapes, types
and layout.  A restart with the same key loads the package (under a second)
instead of compiling again (tens of seconds); anything else that changed
makes a new package.

Why ahead of time rather than ``torch.compile`` at run time: a restart of a
``torch.compile`` model traces and lowers its graphs again (about 20 CPU
seconds for MobileNetV2 on the development machine), because graphs with
oneDNN-packed weights bypass torch's FX-graph cache; only the C++ build is
saved by the kernel cache.  A package is the compiled program itself.

:data:`STATS` counts packages built and loaded by this process, for the
optimisation line.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import os
import shutil
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from svc.optimize.buckets import batch_size_of
from svc.optimize.cache import (
    make_private_dirs,
    read_cached,
    sweep_dead_folders,
    temporary_file,
    usable_dir,
    write_record,
)

#: A package's dynamic batch dimension goes up to this many times the warm-up batch (``max_batch_size``, the
#: largest batch the server forms; twice it for a denoiser that doubles its batch for guidance).
BATCH_MARGIN = 2
#: The smallest example batch of a dynamic export (an example of 1 fixes the dimension to 1).
COMPILE_MIN_BATCH = 2
#: Packages built and loaded by this process (``built``, ``loaded``).
STATS: Counter = Counter()
#: Runners per loaded package: calls run at once up to this many (the server's inference workers; set by
#: ``svc.optimize.select``).  A package's runner serialises calls, and releases the GIL while it runs.
RUNNERS = 1


def _tensor_bytes(tensor: Any) -> memoryview:
    import torch

    flat = tensor.detach().contiguous().view(-1)
    return memoryview(flat.view(torch.uint8).cpu().numpy()) if flat.numel() else memoryview(b"")


def package_key(module: Any, example: tuple, device: str, mode_name: str) -> str:
    """The hex SHA-256 of what decides the compiled program of ``module`` on ``example``."""
    import torch

    from svc.optimize import cache

    h = hashlib.sha256()
    cpu = torch.backends.cpu.get_cpu_capability() if device == "cpu" else torch.cuda.get_device_name()
    h.update(f"{mode_name}|{torch.__version__}|{device}|{cpu}|{cache.KEY_CONTEXT}\n".encode())
    # Each class by its qualified name, not its file alone: two classes of one file with the same weights' shapes
    # (another model of the same plugin module) shared a key, and one served the other's converted code.
    h.update(" ".join(sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in module.modules()})).encode())
    for name, tensor in list(module.state_dict(keep_vars=False).items()):
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tuple(tensor.stride())}\n".encode())
        h.update(_tensor_bytes(tensor))
    # Each class's module by name and its file by content, never by path: the same code installed in another folder
    # (a new virtual environment per release, a checkout moved) has the same key, and its cache stays good.
    sources = sorted({(type(m).__module__, inspect.getsourcefile(type(m)) or "") for m in module.modules()})
    for name, source in sources:
        if source and os.path.isfile(source):
            h.update(f"{name}\n".encode())
            h.update(Path(source).read_bytes())
    for value in example:
        if isinstance(value, torch.Tensor):
            h.update(f"{tuple(value.shape[1:])}:{value.dim()}:{value.dtype}:{_layout(value)}\n".encode())
        else:
            h.update(f"{type(value).__name__}:{value!r}\n".encode())
    return h.hexdigest()


def _layout(value: Any) -> str:
    import torch

    if value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last) and not value.is_contiguous():
        return "channels_last"
    return "contiguous"


def _dynamic_shapes(module: Any, example: tuple, dim: Any) -> Any:
    """``torch.export``'s ``dynamic_shapes``: dimension 0 of every tensor with one is ``dim`` (None: static)."""
    import torch

    if dim is None:
        return None
    specs = tuple({0: dim} if isinstance(v, torch.Tensor) and v.dim() >= 1 else None for v in example)
    parameters = list(inspect.signature(module.forward).parameters.values())
    if parameters and parameters[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return (specs,)  # forward(*args): one entry holding them all
    return specs


class Package:
    """A loaded package, called like the target; a batch outside the sizes it was compiled for runs ``fallback``.

    Inputs are made contiguous in the layout the package was compiled for (a
    view, such as SAM's expanded prompt embeddings, gets real strides).
    """

    def __init__(self, runner: Any, layouts: list[str], batches: tuple[int, int] | None, fallback: Any,
                 path: Path) -> None:
        self.runner = runner
        self.layouts = layouts
        self.batches = batches  # (lowest, highest) batch size compiled; None: no batch dimension
        self.fallback = fallback
        self.path = path

    def __call__(self, *args: Any) -> Any:
        import torch

        if self.batches is not None:
            n = batch_size_of(args)
            if n is not None and not self.batches[0] <= n <= self.batches[1]:
                return self.fallback(*args)
        ready = []
        for value, layout in zip(args, self.layouts):
            if isinstance(value, torch.Tensor):
                value = value.contiguous(memory_format=torch.channels_last if layout == "channels_last"
                                         else torch.contiguous_format)
            ready.append(value)
        return self.runner(*ready)


def compiled(module: Any, make_example: Any, batch: int, device: str, batched: bool, mode_name: str, name: str,
             directory: Path) -> Package:
    """``module`` as a package from ``directory``: loaded when its key is there, else built and stored.

    ``make_example(n)`` makes the arguments of a batch of ``n`` (in the
    mode's layout).  A batched target is exported with a dynamic batch of 1
    to :func:`max_batch`; where the model's code does not allow that (diffusers'
    UNet: 2 to 63), with the range export finds, if it holds ``batch`` (the
    warm-up batch), else at ``batch`` alone.  The sizes compiled are kept
    beside the package (``.json``, written last).
    """
    import torch

    def example_of(n: int) -> tuple:
        return tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in make_example(n))  # not inference

    directory = usable_dir(directory)  # not a folder another user can change: a package is code
    example = example_of(max(batch, COMPILE_MIN_BATCH) if batched else batch)
    key = package_key(module, example, device, f"{mode_name}|batch {batch}" if batched else mode_name)
    path = directory / f"{name}-{mode_name}-{key[:32]}.pt2"
    meta = path.with_suffix(".json")
    layouts = [_layout(v) if isinstance(v, torch.Tensor) else "" for v in example]
    package = read_cached(meta, [path], lambda record: _load(path, record["batches"], layouts, module, device), STATS)
    if package is not None:
        return package
    batches, example = _build(module, example, example_of, batch, batched, path, device)
    write_record(meta, [path], {"batches": batches})
    STATS["built"] += 1
    layouts = [_layout(v) if isinstance(v, torch.Tensor) else "" for v in example]
    return _load(path, batches, layouts, module, device)


def _load(path: Path, batches: list[int] | None, layouts: list[str], module: Any, device: str) -> Package:
    if batches is not None and not (isinstance(batches, list) and len(batches) == 2
                                    and all(isinstance(b, int) for b in batches)):
        raise ValueError(f"its record says it holds batches {batches!r}")
    return Package(load_runner(path, device, RUNNERS), layouts,
                   (batches[0], batches[1]) if batches else None, module, path)


def _build(module: Any, example: tuple, example_of: Any, batch: int, batched: bool, path: Path,
           device: str) -> tuple:
    """Export and compile ``module`` into ``path``; (the batch range compiled or None, the example used).

    A dynamic program whose batch starts at 1 is checked at build time: a
    batch of one must give what the module gives it (export reasons about a
    batch of one as about any size, so code that treats it apart would be
    compiled wrong); if not, the range starts at 2.  When the range
    does not hold the warm-up batch, the program is exported for that batch alone.
    """
    import torch
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    if not batched:
        _compile(_export(module, example, None), path)
        return None, example
    try:
        program = _export(module, example, torch.export.Dim("batch", min=1, max=max_batch(batch)))
        batches: list[int] | None = [1, max_batch(batch)]
    except (ConstraintViolationError, torch._dynamo.exc.UserError):
        program = _export(module, example, torch.export.Dim.AUTO)  # export finds the range the code allows
        batches = _batch_range(program, max_batch(batch))
    if batches is not None and batches[0] <= batch <= batches[1]:
        _compile(program, path)
        if batches[0] == 1 and not _one_matches_eager(path, module, example_of, device):
            batches[0] = 2
        if batches[0] <= batch:
            return batches, example
    example = example_of(batch)
    _compile(_export(module, example, None), path)
    return [batch, batch], example


def _export(module: Any, example: tuple, dim: Any) -> Any:
    import torch

    with torch.no_grad():
        return torch.export.export(module, example, dynamic_shapes=_dynamic_shapes(module, example, dim))


def _compile(program: Any, path: Path) -> None:
    import torch

    make_private_dirs(path.parent)
    tmp = temporary_file(path, "building", ".pt2")
    try:
        with torch.no_grad():  # inductor freezes (constant weights, folded conv+BatchNorm) only without grad
            torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs={"freezing": True})
        os.replace(tmp, path)  # complete or absent: a cut build never looks cached
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


#: One package unpacked at a time: where it unpacks is chosen through ``TMPDIR``, which the process shares.
_UNPACKING = threading.Lock()
#: Folders of ours that packages unpacked into: ``svc-aot-<pid>-XXXXXXXX`` in the temporary folder.
UNPACK_PREFIX = "svc-aot-"


def load_runner(path: Path, device: str, runners: int = 1) -> Any:
    """The package at ``path`` loaded with ``runners`` runners, its unpacked files in a folder of ours.

    The loader unpacks a package into ``$TMPDIR/aotinductor_XXXXXX`` and
    removes that folder only when the runner is destroyed: a model server
    that ends without destroying it (killed, stopped by its watchdog, or
    ended with ``os._exit`` after a failed start) left the package's size
    (7 to 16 MB for MobileNetV2) in /tmp at every start.  On a CPU the
    compiled library is mapped into the process once loaded and its files
    are not read again, so the folder goes at once.  A CUDA package loads
    each kernel from its file at the kernel's first call: its folder stays
    while the process lives, goes at a clean exit, and otherwise goes at
    the next load on this machine once its process has ended
    (:func:`sweep_unpacked`).
    """
    from torch._inductor.package.package import load_package

    sweep_unpacked()
    with _UNPACKING:
        scratch = tempfile.mkdtemp(prefix=f"{UNPACK_PREFIX}{os.getpid()}-")
        previous = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = scratch
        try:
            runner = load_package(str(path), num_runners=max(1, runners))
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        finally:
            if previous is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = previous
    if device == "cpu":
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        atexit.register(shutil.rmtree, scratch, True)
    return runner


def sweep_unpacked() -> None:
    """Remove the unpacked folders (:func:`load_runner`) of processes that no longer run."""
    sweep_dead_folders(UNPACK_PREFIX)


#: Build-time check of a batch of one: the package's outputs within this fraction of eager's largest output.
ONE_RTOL = 0.05


def _one_matches_eager(path: Path, module: Any, example_of: Any, device: str) -> bool:
    """Whether the package gives a batch of one what the module itself gives it (within ``ONE_RTOL``).

    Loose enough for a compiled half-precision mode, tight enough for code
    that computes a batch of one differently.
    """
    import torch

    one = example_of(1)
    runner = load_runner(path, device)
    with torch.inference_mode():
        got, expected = runner(*[_dense(v) for v in one]), module(*one)
    gots = got if isinstance(got, (list, tuple)) else [got]
    expecteds = expected if isinstance(expected, (list, tuple)) else [expected]
    for a, b in zip(gots, expecteds):
        if a.shape != b.shape:
            return False
        if b.numel() and float((a.float() - b.float()).abs().max()) > ONE_RTOL * float(b.float().abs().max()) + 1e-6:
            return False
    return len(gots) == len(expecteds)


def _dense(value: Any) -> Any:
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    return value.contiguous(memory_format=torch.channels_last if _layout(value) == "channels_last"
                            else torch.contiguous_format)


def max_batch(batch: int) -> int:
    """The largest batch a package made at warm-up batch ``batch`` takes (what the server can form).

    A larger batch (none is formed) would run eager.  Measured: the bound does
    not change the compiled code's speed (YOLOv8: 1.40x eager with it, 1.43x
    with 4096).
    """
    return BATCH_MARGIN * max(batch, 2)


def _batch_range(program: Any, highest: int) -> list[int] | None:
    """The batch sizes an exported program takes: the range of its first input's dimension 0."""
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in program.graph_signature.user_inputs:
            continue
        value = node.meta.get("val")
        if value is None or not hasattr(value, "shape") or value.dim() < 1:
            continue
        size = value.shape[0]
        if isinstance(size, int):
            return [size, size]
        bounds = program.range_constraints.get(size.node.expr)
        if bounds is None:
            return None
        return [int(bounds.lower), int(min(bounds.upper, highest))]
    return None
