"""The processes' reactor clock made monotonic (svc/infra/reactors.py), on a reactor of its own (never run)."""

from __future__ import annotations

import time

from twisted.internet.selectreactor import SelectReactor
from twisted.internet.task import Clock

from svc.infra.reactors import use_monotonic_clock, wall_time


def test_the_clock_becomes_monotonic_and_calls_already_scheduled_keep_their_delays_and_order():
    reactor = SelectReactor()
    fired = []
    late = reactor.callLater(30, fired.append, "late")
    soon = reactor.callLater(10, fired.append, "soon")
    gone = reactor.callLater(20, fired.append, "gone")
    reactor.runUntilCurrent()  # the new calls move into the heap
    gone.cancel()  # still in the reactor's heap until its time: shifted with the others
    use_monotonic_clock(reactor)
    use_monotonic_clock(reactor)  # once only: a second call shifts nothing
    assert reactor.seconds is time.monotonic
    assert abs(soon.getTime() - time.monotonic() - 10) < 1 and abs(late.getTime() - time.monotonic() - 30) < 1
    later = reactor.callLater(5, fired.append, "later")
    assert abs(later.getTime() - time.monotonic() - 5) < 1
    assert [c.getTime() for c in sorted(reactor._pendingTimedCalls + reactor._newTimedCalls)] == sorted(
        c.getTime() for c in (soon, late, later, gone))
    assert 0 < reactor.timeout() <= 5  # the next call is the one 5 s away, not one of the old wall clock
    soon.reset(0)
    reactor.runUntilCurrent()
    assert fired == ["soon"]
    for call in (late, later):
        call.cancel()


def test_wall_time_gives_dates_on_a_monotonic_clock_and_leaves_a_test_clock_alone():
    reactor = SelectReactor()
    use_monotonic_clock(reactor)
    assert abs(wall_time(reactor, reactor.seconds()) - time.time()) < 0.5
    assert abs(wall_time(reactor, reactor.seconds() - 60) - (time.time() - 60)) < 0.5
    clock = Clock()
    clock.advance(5)
    assert wall_time(clock, 3.0) == 3.0
