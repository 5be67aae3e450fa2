"""Tensor helpers of the optimisation modes: mapping over nested outputs, precision, memory layout.

A leaf of :mod:`svc.optimize`: :mod:`~svc.optimize.apply` (the orchestrator),
:mod:`~svc.optimize.aot`, :mod:`~svc.optimize.buckets`, :mod:`~svc.optimize.cudagraphs` and
:mod:`~svc.optimize.standin` import it, and it imports none of them.  torch is imported inside
the functions: the engine imports this package before torch is configured.
"""

from __future__ import annotations

from typing import Any


def torch_module() -> Any:
    import torch

    return torch


def map_tensors(value: Any, fn: Any) -> Any:
    """``value`` with ``fn`` applied to every tensor in it (tensors, lists, tuples, dicts)."""
    torch = torch_module()
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
    torch = torch_module()
    return map_tensors(value, lambda t: t.float() if t.dtype in (torch.bfloat16, torch.float16) else t)


def to_channels_last(value: Any) -> Any:
    """4-D floating-point tensors in ``value`` in channels-last memory order."""
    torch = torch_module()
    return map_tensors(value, lambda t: t.contiguous(memory_format=torch.channels_last)
                       if t.dim() == 4 and t.is_floating_point() else t)


def set_layout(module: Any, channels_last: bool) -> None:
    """Convert ``module``'s 4-D weights to channels-last or back to contiguous, in place."""
    torch = torch_module()
    module.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def inference_context() -> Any:
    """What every traced, compiled or timed call runs under: the plugins' ``torch.inference_mode()``."""
    return torch_module().inference_mode()
