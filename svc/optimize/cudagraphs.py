"""CUDA graphs for fixed batch shapes (``cuda_graphs``): capture once per bucket, replay per batch.

At warm-up, for every size of :func:`svc.optimize.buckets.capture_sizes`
(1, 2, 4, 8 for a ``max_batch_size`` of 8) the target is run on static input
buffers and its kernels are captured into one ``torch.cuda.CUDAGraph``
(graphs share one memory pool).  A call copies its arguments into the
buffers of the smallest bucket that holds the batch (rows past the batch
keep earlier, finite data: nothing reads them), replays the graph and
returns copies of the first ``n`` rows of the static outputs.  A batch
larger than every bucket, or arguments of another shape than captured, run
the callable directly.  Replaying removes the
CPU cost of launching hundreds of small kernels, which is what limits a
small model such as MobileNetV2 on a fast GPU.

Several inference workers call one model at once (``backend.workers``), and
a graph has one set of static buffers: a call's copy in, replay and copy out
are one step under a lock (:meth:`GraphedCallable.__call__`).  Without it a
worker's replay could run on another's inputs, or its copy out follow
another's replay, and a client got another batch's answer.

Only usable where CUDA is; the bucket arithmetic it relies on is in
:mod:`svc.optimize.buckets` and tested on a CPU.
"""

from __future__ import annotations

import threading
from typing import Any

from svc.model.api import OptimizationTarget
from svc.optimize.buckets import batch_size_of, bucket_for, capture_sizes, copy_into, slice_batch
from svc.optimize.tensors import inference_context, to_channels_last

#: Runs before each capture, on a side stream (cuDNN autotuning and lazy initialisation happen outside the graph).
WARMUP_RUNS = 3


class GraphedCallable:
    """``inner`` replayed from CUDA graphs captured for ``capture_sizes(max_batch)``."""

    def __init__(self, inner: Any, target: OptimizationTarget, max_batch: int, channels_last: bool) -> None:
        import torch

        self.inner = inner
        self.sizes = capture_sizes(max_batch) if target.batched else (max_batch,)
        self.batched = target.batched
        self.graphs: dict[int, tuple[Any, tuple, Any]] = {}
        self.lock = threading.Lock()  # one call's copy in, replay and copy out at a time (the module's docstring)
        pool = None
        for size in sorted(self.sizes, reverse=True):  # the largest first: smaller graphs reuse its pool
            with inference_context():  # the buffers are made as the plugins' inputs are
                static = target.example_inputs(size)
                if channels_last:
                    static = to_channels_last(static)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), inference_context():
                for _ in range(WARMUP_RUNS):
                    inner(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with inference_context(), torch.cuda.graph(graph, pool=pool):
                out = inner(*static)
            pool = graph.pool()
            self.graphs[size] = (graph, static, out)

    def __call__(self, *args: Any) -> Any:
        n = batch_size_of(args) if self.batched else None
        size = bucket_for(n, self.sizes) if n is not None else self.sizes[0]
        if size is None:
            return self.inner(*args)  # larger than every graph
        graph, static, out = self.graphs[size]
        # Every worker enqueues on the device's default stream (none sets another), so the order the lock gives the
        # calls is the order the GPU runs them in: no call's copy in lands between another's copy in and its copy out.
        with self.lock:
            try:
                copy_into(static, args, exact=not self.batched)
            except ValueError:
                pass  # another shape than the one captured (a fixed-shape target called otherwise): run it below
            else:
                graph.replay()
                return slice_batch(out, n, copy=True)  # the next replay overwrites the static outputs
        return self.inner(*args)
