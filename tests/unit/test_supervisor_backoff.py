"""The restart schedule on its own: doubling, the crash-loop window, the port wait."""

from __future__ import annotations

from svc.supervisor.backoff import Backoff, Timing

TIMING = Timing(backoff_initial=1, backoff_max=8, crash_loop_restarts=3, crash_loop_window=60, port_wait=10)


def test_crash_delays_double_up_to_the_max_and_start_over_after_a_long_run():
    b = Backoff(TIMING)
    assert [b.crash_delay(ran=1) for _ in range(6)] == [1, 2, 4, 8, 8, 8]
    assert b.crash_delay(ran=60) == 1  # ran a whole window: the doubling starts over
    assert b.crash_delay(ran=5) == 2
    b.reset()
    assert b.crash_delay(ran=5) == 1


def test_only_restarts_within_the_window_count():
    b = Backoff(TIMING)
    for t in (0, 30, 50):
        b.restarted(t)
    assert b.recent_restarts(59) == 3
    assert b.recent_restarts(60) == 2  # the one at 0 is a whole window old
    assert b.recent_restarts(200) == 0


def test_a_busy_port_is_tried_on_the_doubling_schedule_until_port_wait_is_used_up():
    b = Backoff(TIMING)
    assert b.next_port_try(100) == 1 and b.port_since == 100
    assert b.next_port_try(101) == 2
    assert b.next_port_try(103) == 4
    assert b.next_port_try(107) == 3  # capped by what is left of the 10 s
    assert b.next_port_try(110) is None and b.port_since is None
    assert b.next_port_try(111) == 1  # a new wait
    assert b.end_port_wait("note") is None and b.end_port_wait("note") == "note"  # no error before the wait
    slow = Backoff(Timing(backoff_initial=1, backoff_max=30, crash_loop_restarts=3, crash_loop_window=60,
                          port_wait=60))
    # a crash's back-off goes to 30 s; a busy port is tried at least every 4 s (a freed one noticed 30 s late)
    assert [slow.next_port_try(t) for t in (0, 1, 3, 7, 11)] == [1, 2, 4, 4, 4]
