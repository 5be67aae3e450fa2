"""Process helpers: telling an orphan from a stop, and pools that never block a stop."""

from __future__ import annotations

import gc
import os
import threading
import weakref

from svc.infra.process import SUPERVISOR_PID_ENV, ThreadPoolService, freeze_heap, supervisor_gone


def test_supervisor_gone_compares_the_parent_with_the_supervisor_pid():
    assert supervisor_gone({SUPERVISOR_PID_ENV: str(os.getppid())}) is False
    assert supervisor_gone({SUPERVISOR_PID_ENV: "1" if os.getppid() != 1 else "2"}) is True
    assert supervisor_gone({}) is False  # started by hand: never an orphan
    assert supervisor_gone({SUPERVISOR_PID_ENV: "not a pid"}) is False


def test_stopping_a_busy_pool_does_not_join_it():
    service = ThreadPoolService("work", 1)
    service.startService()
    release, started = threading.Event(), threading.Event()
    service.pool.callInThread(lambda: (started.set(), release.wait(10)))
    assert started.wait(5)
    service.stopService()  # returns at once instead of waiting for the work
    assert service.abandoned and service.busy == 1
    release.set()
    service.pool.stop()


def test_stopping_an_idle_pool_joins_it():
    service = ThreadPoolService("idle", 2)
    service.startService()
    service.stopService()
    assert not service.abandoned and service.pool.joined


class Node:
    """An object in a reference cycle, weakly referenceable."""


def test_freeze_heap_frees_the_young_garbage_and_freezes_what_is_alive():
    kept = Node()
    dead = Node()
    dead.self = dead  # a cycle only the cyclic collector frees
    gone = weakref.ref(dead)
    del dead
    try:
        frozen = freeze_heap()
        assert gone() is None  # collected before the freeze, not frozen with the rest
        after = gc.get_freeze_count()  # this process's modules, pytest's, and ``kept``
        # A frozen object that dies leaves the count (an xdist worker's I/O thread frees its messages meanwhile:
        # 748,368 frozen, 748,366 a line later in one CI run); nothing joins it after the freeze.
        assert after > 10_000 and 0 <= frozen - after <= 100
        assert not any(o is kept for o in gc.get_objects())  # frozen objects are out of the collector's lists
    finally:
        gc.unfreeze()


def test_stop_signals_are_ignored_once_the_reactor_has_stopped(monkeypatch):
    """Python puts its own handlers back to the default as it finalizes: a second Ctrl-C in the last moments of a
    clean stop killed the process (exit -2, seen in the suite). Once the reactor has stopped, they are ignored."""
    import signal

    from twisted.internet.testing import MemoryReactor

    from svc.infra.process import exit_zero_on_signals

    installed: dict[int, object] = {}
    monkeypatch.setattr(signal, "signal", lambda signum, handler: installed.__setitem__(signum, handler))
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_DFL)
    reactor = MemoryReactor()
    exit_zero_on_signals(reactor)
    for call, args, kwargs in reactor.whenRunningHooks:
        call(*args, **kwargs)
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    assert set(installed) == {*stops, signal.SIGUSR1} and all(callable(installed[s]) for s in stops)
    assert installed[signal.SIGUSR1] == signal.SIG_IGN  # logrotate's usual signal ended the process
    [(after, args, kwargs)] = reactor.triggers["after"]["shutdown"]
    after(*args, **kwargs)
    assert installed == dict.fromkeys((*stops, signal.SIGUSR1), signal.SIG_IGN)
