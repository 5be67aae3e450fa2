"""CUDA graphs called by several inference workers at once (``svc.optimize.cudagraphs``).

The suite has no GPU, so the graph is a stand-in that behaves as a replay on
a GPU does for this purpose: it reads the static inputs when it runs, later
than the call that asked for it (here after a pause that lets the other
threads run), and writes the static outputs.  Everything else is the real
``GraphedCallable.__call__`` on CPU tensors.
"""

from __future__ import annotations

import threading
import time

import torch

from svc.optimize.cudagraphs import GraphedCallable


class LateReplay:
    """Reads the static input only after a pause, as a GPU runs an enqueued replay after the call returned."""

    def __init__(self, static: tuple, out: torch.Tensor) -> None:
        self.static, self.out = static, out

    def replay(self) -> None:
        time.sleep(0.0005)  # the GIL is free: another worker's call runs meanwhile
        self.out.copy_(self.static[0] * 2)


def graphed(size: int) -> GraphedCallable:
    """A GraphedCallable for batches of ``size`` rows of 3, with a stand-in graph instead of a CUDA capture."""
    static, out = (torch.zeros(size, 3),), torch.zeros(size, 3)
    call = GraphedCallable.__new__(GraphedCallable)
    call.inner, call.sizes, call.batched = (lambda x: x * 2), (size,), True
    call.graphs = {size: (LateReplay(static, out), static, out)}
    call.lock = threading.Lock()
    return call


def test_workers_calling_one_graph_at_once_each_get_their_own_batch_back():
    call, wrong, rounds = graphed(4), [], 60

    def worker(k: int) -> None:
        for i in range(rounds):
            batch = torch.full((4, 3), float(k * 1000 + i))
            got = call(batch)
            if not torch.equal(got, batch * 2):
                wrong.append((k, i, got[0, 0].item()))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_a_smaller_batch_uses_the_bucket_and_gets_its_own_rows_and_another_shape_runs_the_callable():
    call = graphed(4)
    two = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.equal(call(two), two * 2)
    wider = torch.ones(2, 5)  # not the captured row shape: the callable itself
    assert torch.equal(call(wider), wider * 2)
