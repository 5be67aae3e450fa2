"""The model server's graceful stop waits on the queue's idle event, driven by task.Clock."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock

from svc.modelserver.service import RECHECK_S, ModelServerService
from tests.unit.test_batching import item, make


def drainer(clock: Clock, outside: list[int]) -> SimpleNamespace:
    """What ``_until_idle`` reads of the service: the reactor, the queue, and ``busy``.

    ``outside[0]`` stands for work the queue does not see (a body being parsed).
    """
    q, runner = make(clock, max_batch_size=1)
    server = SimpleNamespace(reactor=clock, queue=q, runner=runner)
    server.busy = lambda: outside[0] > 0 or not q.idle
    return server


def until_idle(server: SimpleNamespace, deadline: float) -> list:
    out: list = []
    ensureDeferred(ModelServerService._until_idle(server, deadline)).addCallback(out.append)
    return out


def test_the_drain_ends_when_the_last_batch_ends_without_polling():
    clock, results, outside = Clock(), {}, [0]
    server = drainer(clock, outside)
    server.queue.admit(1).enqueue([item("a", results)])
    decoding = server.queue.admit(1)
    done = until_idle(server, deadline=10.0)
    assert done == [] and clock.getDelayedCalls()[0].getTime() == 10.0  # only the grace's timer waits
    server.runner.finish()
    assert done == []  # a request is still being decoded
    decoding.release()
    assert done == [True] and clock.getDelayedCalls() == [] and results["a"].status.code == 0


def test_work_outside_the_queue_is_looked_at_again_until_the_grace_ends():
    clock, outside = Clock(), [1]
    server = drainer(clock, outside)
    done = until_idle(server, deadline=1.0)
    clock.advance(RECHECK_S)
    assert done == []
    outside[0] = 0
    clock.advance(RECHECK_S)
    assert done == [True]
    outside[0] = 1
    late = until_idle(server, deadline=clock.seconds() + 0.05)
    clock.pump([RECHECK_S] * 10)
    assert late == [False]


def test_the_drain_gives_up_at_the_deadline_while_a_batch_still_runs():
    clock, results, outside = Clock(), {}, [0]
    server = drainer(clock, outside)
    server.queue.admit(1).enqueue([item("a", results)])
    done = until_idle(server, deadline=2.0)
    clock.advance(2.0)
    assert done == [False] and results == {}
    server.runner.finish()  # the late end of the batch changes nothing
    assert done == [False]


def test_after_the_port_closed_the_stop_waits_for_the_open_connections_but_not_past_its_bound():
    """``_until_closed``: requests already sent get their last reply (each connection then closes: site.closing)
    before the reactor cuts the connections; an idle kept-alive one holds the stop LAST_REPLIES_S at most."""
    from svc.modelserver.service import LAST_REPLIES_S

    clock = Clock()
    server = SimpleNamespace(reactor=clock, site=SimpleNamespace(open_connections=2))
    done: list = []
    ensureDeferred(ModelServerService._until_closed(server, LAST_REPLIES_S)).addCallback(done.append)
    clock.advance(RECHECK_S)
    assert done == []
    server.site.open_connections = 0  # both answered and closed
    clock.advance(RECHECK_S)
    assert done == [None]
    server.site.open_connections = 1  # one idle connection never closes
    held: list = []
    ensureDeferred(ModelServerService._until_closed(server, clock.seconds() + LAST_REPLIES_S)).addCallback(held.append)
    clock.pump([RECHECK_S] * round(LAST_REPLIES_S / RECHECK_S - 1))
    assert held == []
    clock.pump([RECHECK_S] * 2)
    assert held == [None]
