"""Batch-shape buckets: the fixed batch sizes a CUDA graph is captured for, padding up to them and slicing back.

CUDA graphs replay fixed shapes: a batch of ``n`` runs in the smallest
captured size ``>= n`` (the bucket): its arguments are copied into the
first ``n`` rows of the graph's static buffers, and the outputs are cut
back to ``n`` rows.  Pure functions of sizes and tensors, so
they are tested on a CPU.

The arguments of a target are positional; every tensor argument with at
least one dimension has the batch as dimension 0 (a 0-d tensor, such as a
diffusion timestep, is shared by the batch).
"""

from __future__ import annotations

from typing import Any

from svc.optimize.tensors import map_tensors


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


def copy_into(static: tuple, args: tuple, exact: bool = False) -> int | None:
    """Copy a call's ``args`` into the static buffers of a captured graph; the batch size (None: no batch).

    A batched tensor fills the first rows of its buffer (the rows past the
    batch keep what an earlier call left: finite data that nothing reads
    back); a 0-d tensor, such as a timestep, replaces its buffer's value.
    The buffers must be of the bucket's size, the arguments' shapes
    otherwise the same (``exact``: the same shapes, for a target without a
    batch dimension); a ValueError says which differs, before anything is copied.
    """
    n = batch_size_of(args)
    if len(static) != len(args):
        raise ValueError(f"{len(args)} arguments for a graph captured with {len(static)}")
    for i, (buffer, value) in enumerate(zip(static, args)):
        if not hasattr(buffer, "copy_"):
            continue
        fits = tuple(buffer.shape) == tuple(value.shape)
        if not exact and _is_batched(buffer):
            fits = tuple(buffer.shape[1:]) == tuple(value.shape[1:]) and value.shape[0] <= buffer.shape[0]
        if not fits:
            raise ValueError(f"argument {i} of shape {tuple(value.shape)} does not fit the captured "
                             f"{tuple(buffer.shape)}")
    for buffer, value in zip(static, args):
        if hasattr(buffer, "copy_"):
            rows = buffer[: value.shape[0]] if _is_batched(buffer) else buffer
            rows.copy_(value, non_blocking=True)
    return n


def slice_batch(outputs: Any, n: int | None, *, copy: bool = False) -> Any:
    """The first ``n`` rows (all with None) of every tensor of ``outputs`` (a tensor, or lists/tuples/dicts of them).

    A 0-d tensor is shared by the batch and kept whole.  ``copy`` clones
    what it returns (a graph's static outputs are overwritten by its next
    replay), in the same walk.
    """
    def rows(tensor: Any) -> Any:
        part = tensor[:n] if n is not None and tensor.dim() >= 1 else tensor
        return part.clone() if copy else part

    return map_tensors(outputs, rows)
