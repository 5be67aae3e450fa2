"""Batch-shape buckets: the fixed batch sizes a graph is captured for, padding up to them and slicing back.

CUDA graphs replay fixed shapes, and a compiled graph on a CPU does not take
a batch of one: a batch of ``n`` runs in the smallest captured size
``>= n`` (the bucket), padded with copies of its first item, and the
outputs are cut back to ``n`` rows.  Pure functions of sizes and tensors, so
they are tested on a CPU.

The arguments of a target are positional; every tensor argument with at
least one dimension has the batch as dimension 0 (a 0-d tensor, such as a
diffusion timestep, is shared by the batch).
"""

from __future__ import annotations

from typing import Any


def capture_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes to capture for batches of 1..``max_batch``: powers of two, and ``max_batch`` itself.

    log2(max) + 1 graphs instead of max: padding wastes at most half a
    bucket, and memory holds a handful of graphs (1, 2, 4, 8 for 8).
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    sizes = []
    size = 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch)
    return tuple(sizes)


def bucket_for(n: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest of ``sizes`` that holds ``n`` items; None when ``n`` is larger than all of them."""
    if n < 1:
        raise ValueError(f"a batch has at least 1 item, got {n}")
    return next((size for size in sorted(sizes) if size >= n), None)


def _is_batched(value: Any) -> bool:
    return hasattr(value, "dim") and value.dim() >= 1


def batch_size_of(args: tuple) -> int | None:
    """The batch size of a target's arguments: dimension 0 of the first tensor that has one."""
    for value in args:
        if _is_batched(value):
            return int(value.shape[0])
    return None


def pad_batch(args: tuple, size: int) -> tuple:
    """Every batched tensor of ``args`` grown to ``size`` rows with copies of its first row."""
    import torch

    padded = []
    for value in args:
        if _is_batched(value) and value.shape[0] < size:
            filler = value[:1].expand(size - value.shape[0], *value.shape[1:])
            value = torch.cat([value, filler]).contiguous(memory_format=_memory_format(value))
        padded.append(value)
    return tuple(padded)


def _memory_format(value: Any) -> Any:
    import torch

    if value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last) and not value.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def slice_batch(outputs: Any, n: int) -> Any:
    """The first ``n`` rows of every tensor of ``outputs`` (a tensor, or lists/tuples/dicts of them)."""
    if hasattr(outputs, "dim"):
        return outputs[:n] if outputs.dim() >= 1 else outputs
    if isinstance(outputs, (list, tuple)):
        sliced = [slice_batch(v, n) for v in outputs]
        return sliced if isinstance(outputs, list) else tuple(sliced)
    if isinstance(outputs, dict):
        return {k: slice_batch(v, n) for k, v in outputs.items()}
    return outputs
