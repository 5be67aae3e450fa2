"""Applying a mode to one optimisation target: an ``nn.Module`` and its example inputs.

``apply_mode`` returns a callable ``nn.Module`` with the target's call
signature (positional tensors in, a tensor or a list/tuple of tensors out,
float32 whatever the autocast), standing in for the original: attributes it
does not have are read from the original, so it can replace a submodule that
other code reads attributes of (SAM's ``image_encoder.img_size``).

Steps, in the order they wrap each other:

- ``channels_last``: the module's 4-D weights are converted in place (a
  layout change: the values and the eager results are the same) and 4-D
  inputs are converted on each call;
- ``bf16``/``fp16``: ``torch.autocast`` around the call, outputs cast back
  to float32;
- ``jit``: ``torch.jit.trace`` on the example inputs, ``torch.jit.freeze``
  (weights become constants, conv+batchnorm folded), and on a CPU
  ``torch.jit.optimize_for_inference`` (oneDNN weight layouts);
- ``compile``: ``torch.compile`` (inductor; on a CPU with freezing), run
  here so that the warm-up pays the compilation, never a request.  With a
  batch dimension, that dimension is compiled dynamic (one graph for every
  batch size from two) and a batch of one is compiled too (torch specialises
  size 1: its own graph, rather than padding it to two and paying twice the
  work for the most common batch of a quiet server);
- ``cuda_graphs``: see :mod:`svc.optimize.cudagraphs`.

torch is imported inside the functions: this module is imported by the
engine, which is imported before torch is configured.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

from svc.modelapi import OptimizationTarget
from svc.optimize.modes import Mode

#: The smallest batch of a compiled target's dynamic graph (torch specialises size 1: a graph of its own).
COMPILE_MIN_BATCH = 2


def _torch() -> Any:
    import torch

    return torch


def map_tensors(value: Any, fn: Any) -> Any:
    """``value`` with ``fn`` applied to every tensor in it (tensors, lists, tuples, dicts)."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        mapped = [map_tensors(v, fn) for v in value]
        return mapped if isinstance(value, list) else tuple(mapped)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def to_float(value: Any) -> Any:
    """Half-precision tensors in ``value`` as float32 (what the eager model returns)."""
    torch = _torch()
    return map_tensors(value, lambda t: t.float() if t.dtype in (torch.bfloat16, torch.float16) else t)


def to_channels_last(value: Any) -> Any:
    """4-D floating-point tensors in ``value`` in channels-last memory order."""
    torch = _torch()
    return map_tensors(value, lambda t: t.contiguous(memory_format=torch.channels_last)
                       if t.dim() == 4 and t.is_floating_point() else t)


def set_layout(module: Any, channels_last: bool) -> None:
    """Convert ``module``'s 4-D weights to channels-last or back to contiguous, in place."""
    torch = _torch()
    module.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def inference_context() -> Any:
    """What every traced, compiled or timed call runs under: the plugins' ``torch.inference_mode()``."""
    return _torch().inference_mode()


def adapter(module: Any, call: Any) -> Any:
    """An ``nn.Module`` whose positional call is ``call(module, *args)`` (:class:`svc.optimize.standin.Adapter`)."""
    from svc.optimize.standin import Adapter

    return Adapter(module, call)


def apply_mode(target: OptimizationTarget, mode: Mode, device: str, batch_size: int) -> Any:
    """The callable module that runs ``target.module`` in ``mode`` on ``device`` ("cpu" or "cuda").

    ``batch_size`` is the batch the example inputs are made for (the
    warm-up batch).  Raises whatever tracing or compiling raises; the caller
    falls back to eager.  Eager (an empty mode) is the module itself.
    """
    module = target.module
    set_layout(module, mode.has("channels_last"))
    if not mode.steps:
        return module
    torch = _torch()
    from svc.optimize.standin import CallModule, StandIn

    inner: Any = module
    if mode.autocast:
        inner = CallModule(inner, autocast=(torch.device(device).type, getattr(torch, mode.autocast)))
    with inference_context():  # what the plugins' calls pass: compiled graphs guard on it
        example = target.example_inputs(batch_size if not (mode.has("compile") and target.batched)
                                        else max(batch_size, COMPILE_MIN_BATCH))
    if mode.has("channels_last"):
        example = to_channels_last(example)
    if mode.has("jit"):
        inner = _traced(inner, example, device)
    elif mode.has("compile"):
        examples = [example]
        if target.batched:
            with inference_context():
                single = target.example_inputs(1)
            examples.append(to_channels_last(single) if mode.has("channels_last") else single)
        inner = _compiled(inner, examples, device, target.batched)
    if mode.has("cuda_graphs"):
        from svc.optimize.cudagraphs import GraphedCallable

        inner = GraphedCallable(inner, target, batch_size, mode.has("channels_last"))
    return StandIn(module, inner, channels_last=mode.has("channels_last"))


def _traced(inner: Any, example: tuple, device: str) -> Any:
    torch = _torch()
    with warnings.catch_warnings(), torch.no_grad():
        # TorchScript warns that it is in maintenance mode and about traced Python values: expected here.
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(inner.eval(), example, check_trace=False, strict=False)
        frozen = torch.jit.freeze(traced.eval())
        if torch.device(device).type == "cpu":
            frozen = torch.jit.optimize_for_inference(frozen)  # oneDNN weight layouts (README figures)
        with inference_context():
            for _ in range(2):  # the profiling executor specialises on the first calls
                frozen(*example)
    return frozen


def _compiled(inner: Any, examples: list[tuple], device: str, batched: bool) -> Any:
    """``inner`` compiled by calling it on each example (a dynamic batch, then a batch of one)."""
    torch = _torch()
    import torch._inductor.config as inductor_config

    on_cpu = torch.device(device).type == "cpu"
    if batched:
        for value in examples[0]:
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                torch._dynamo.mark_dynamic(value, 0)
    compiled = torch.compile(inner, dynamic=False if not batched else None, fullgraph=False)
    # Freezing (weights as constants, conv+batchnorm folded, oneDNN weight packing) is read when a call
    # compiles; inference only, which is all a model server does.
    patch = inductor_config.patch(freezing=True) if on_cpu else contextlib.nullcontext()
    with patch, inference_context():
        for example in examples:
            compiled(*example)
    return compiled
