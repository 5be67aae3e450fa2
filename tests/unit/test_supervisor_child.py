"""The process manager on a fake reactor: every state transition and timer."""

from __future__ import annotations

import os
import signal

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure

from svc.supervisor.backoff import Timing
from svc.supervisor.child import (
    BACKOFF,
    FAILED,
    RUNNING,
    START_FAILED,
    STARTING,
    STOPPED,
    STOPPING,
    Child,
    ChildError,
    ChildSpec,
)
from svc.supervisor.logsink import LogSink
from svc.supervisor.spawn import GROUP_LEADER


class FakeTransport:
    def __init__(self, pid: int) -> None:
        self.pid = pid


class ProcessReactor(MemoryReactorClock):
    """MemoryReactorClock plus spawnProcess that records what would run."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[tuple] = []
        self.next_pid = 1000

    def spawnProcess(self, protocol, executable, args, env=None, path=None, **kw):
        self.next_pid += 1
        self.spawned.append((protocol, executable, args, env, path))
        protocol.makeConnection(FakeTransport(self.next_pid))
        return FakeTransport(self.next_pid)

    def exit(self, code: int | None = 0, sig: int | None = None, output: bytes = b"") -> None:
        protocol = self.spawned[-1][0]
        if output:
            protocol.errReceived(output)
        reason = ProcessDone(0) if code == 0 and sig is None else ProcessTerminated(code, sig)
        protocol.processEnded(Failure(reason))


class Probe:
    def __init__(self) -> None:
        self.ok = False
        self.calls = 0

    def __call__(self, port: int, path: str) -> Deferred:
        self.calls += 1
        return succeed(self.ok)


TIMING = Timing(stop_grace=10, start_timeout=60, backoff_initial=1, backoff_max=8, crash_loop_restarts=5,
                crash_loop_window=60, probe_starting=0.5, probe_running=2, port_wait=20)


class Port:
    """The fake port check: free unless a test says otherwise; counts the checks."""

    def __init__(self) -> None:
        self.free = True
        self.checks: list[int] = []

    def __call__(self, port: int) -> bool:
        self.checks.append(port)
        return self.free


def make(policy="on-failure", refused=None, timing=TIMING, port=None):
    reactor, probe, kills = ProcessReactor(), Probe(), []
    spec = ChildSpec("M", ["/usr/bin/python3", "-m", "twisted", "service-model"], {"A": "1"}, 9101, "/ready",
                     policy=policy, refused=refused)
    child = Child(spec, reactor=reactor, probe=probe, logs=LogSink("M", None, clock=reactor, max_bytes=1 << 20, backups=1, ring_lines=100),
                  timing=timing, killer=lambda pid, sig: kills.append((pid, sig)), port_free=port or Port())
    return child, reactor, probe, kills


def results(d: Deferred) -> list:
    out: list = []
    d.addBoth(out.append)
    return out


def running(child, reactor, probe):
    d = results(child.start())
    probe.ok = True
    reactor.advance(0.5)
    assert child.state == RUNNING and child.ready and d == [None]


def test_start_spawns_a_group_leader_and_becomes_running_when_ready():
    child, reactor, probe, _ = make()
    d = results(child.start())
    protocol, executable, args, env, _ = reactor.spawned[0]
    assert args[1:4] == ["-P", "-c", GROUP_LEADER] and args[4:] == child.spec.argv
    assert env == {"A": "1", "SERVICE_SUPERVISOR_PID": str(os.getpid())}  # this pid at the spawn (a daemon's own)
    assert (child.state, child.ready, child.pid) == (STARTING, False, 1001)
    reactor.advance(0.5)
    assert child.state == STARTING and d == []
    probe.ok = True
    reactor.advance(0.5)
    assert (child.state, child.ready, d) == (RUNNING, True, [None])
    assert child.snapshot()["uptime_s"] == 1.0


def test_ready_flag_follows_the_probe_while_running():
    child, reactor, probe, _ = make()
    running(child, reactor, probe)
    probe.ok = False
    reactor.advance(2)
    assert (child.state, child.ready) == (RUNNING, False)
    probe.ok = True
    reactor.advance(2)
    assert child.ready


def test_stop_sends_term_to_the_group_and_waits_for_the_exit():
    child, reactor, probe, kills = make()
    running(child, reactor, probe)
    d = results(child.stop())
    assert child.state == STOPPING and kills == [(1001, signal.SIGTERM)] and d == []
    # The state is said once ("stopping: stopping: SIGTERM ..." said it twice).
    assert [e["line"] for e in child.logs.page(None, 50)["lines"]][-1] == "stopping: SIGTERM to the process group"
    reactor.exit(0)
    assert child.state == STOPPED and d == [None] and child.pid is None


def test_kill_after_the_grace_period():
    child, reactor, probe, kills = make()
    running(child, reactor, probe)
    d = results(child.stop())
    reactor.advance(9.9)
    assert kills == [(1001, signal.SIGTERM)]
    reactor.advance(0.1)
    assert kills == [(1001, signal.SIGTERM), (1001, signal.SIGKILL)]
    reactor.exit(None, signal.SIGKILL)
    assert child.state == STOPPED and d == [None]


def test_crash_backs_off_exponentially_and_counts_restarts():
    child, reactor, probe, _ = make()
    running(child, reactor, probe)
    delays = []
    for _ in range(4):
        reactor.exit(None, signal.SIGKILL)
        assert child.state == BACKOFF
        spawned = len(reactor.spawned)
        waited = 0.0
        while len(reactor.spawned) == spawned:
            reactor.advance(0.25)
            waited += 0.25
        delays.append(waited)
        assert child.state == STARTING
    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert child.restarts == 4 and "killed by signal 9" in child.last_error


def test_backoff_is_capped():
    child, reactor, probe, _ = make(timing=Timing(backoff_initial=1, backoff_max=3, crash_loop_restarts=50,
                                                  crash_loop_window=600, probe_starting=0.5))
    running(child, reactor, probe)
    waits = []
    for _ in range(4):
        reactor.exit(None, signal.SIGKILL)
        spawned, waited = len(reactor.spawned), 0.0
        while len(reactor.spawned) == spawned:
            reactor.advance(0.5)
            waited += 0.5
        waits.append(waited)
    assert waits == [1.0, 2.0, 3.0, 3.0] and child.restarts == 4


def test_a_restart_loop_of_clean_stops_under_always_names_the_last_exit():
    """A regression probe: ``kill -TERM`` four times to a gateway under ``always`` (with ``crash_loop_restarts`` 3)
    ended it ``failed``, "crash loop: restarted 3 times in 60 s; not restarting", naming no exit at all."""
    child, reactor, probe, _ = make("always")
    running(child, reactor, probe)
    for _ in range(5):
        reactor.exit(None, signal.SIGTERM)
        reactor.advance(8)
        assert child.state == STARTING
    reactor.exit(None, signal.SIGTERM)
    assert child.state == FAILED and child.last_error.endswith("not restarting (last: killed by signal 15)")


def test_crash_loop_stops_restarting_and_says_so():
    child, reactor, probe, _ = make()
    running(child, reactor, probe)
    for _ in range(5):
        reactor.exit(2)
        reactor.advance(8)
        assert child.state == STARTING
    reactor.exit(2, output=b"boom\n")
    assert child.state == FAILED and "crash loop" in child.last_error and "boom" in child.last_error
    reactor.advance(100)
    assert len(reactor.spawned) == 6


def test_refusal_while_starting_is_start_failed_without_retry():
    child, reactor, probe, _ = make()
    d = results(child.start())
    reactor.exit(1, output=b"service-model: conf/server/M.toml: port: must be an integer\n")
    assert child.state == START_FAILED
    assert "must be an integer" in child.last_error
    assert isinstance(d[0], Failure) and d[0].check(ChildError) and "must be an integer" in str(d[0].value)
    reactor.advance(100)
    assert len(reactor.spawned) == 1
    results(child.start())  # an operator may try again
    assert child.state == STARTING


def test_a_refusal_after_start_up_notes_is_the_error_alone():
    """A UI probe: a model server that logged its start-up ("listening on ...; loading the model on cpu") and then
    refused its weights had both lines as its error, the note first: the table's cell showed the note and cut the
    reason off.  Its one-line refusal is the error alone; other last words keep their two lines."""
    child, reactor, probe, _ = make()
    results(child.start())
    reactor.exit(1, output=b"2026-11-29T08:40:01+0000 [svc.modelserver.service#info] M: listening on 127.0.0.1:9101; "
                           b"loading the model on cpu\n"
                           b"2026-11-29T08:40:02+0000 [svc.infra.process#critical] service-model: weights file w.pth: "
                           b"missing tensor 'features.0.0.weight'\n")
    assert (child.state, child.last_error) == (START_FAILED,
                                               "service-model: weights file w.pth: missing tensor 'features.0.0.weight'")
    child, reactor, probe, _ = make()
    running(child, reactor, probe)
    reactor.exit(2, output=b"Traceback (most recent call last):\nValueError: boom\n")
    assert child.last_error.endswith("Traceback (most recent call last): | ValueError: boom")


def test_a_crash_by_a_signal_after_notes_is_the_signal_not_the_notes():
    """A regression probe: a model server killed by SIGSEGV after it was ready had "killed by signal 11: ... |
    MOBILENETV2: ready (version ...)" as its error, its start-up notes as if they said why it died."""
    child, reactor, probe, _ = make()
    running(child, reactor, probe)
    reactor.exit(None, signal.SIGSEGV, output=b"2026-11-29T08:40:01+0000 [svc.modelserver.service#info] M: listening "
                                              b"on 127.0.0.1:9101\n2026-11-29T08:40:03+0000 "
                                              b"[svc.modelserver.service#info] M: ready (version random-init-seed0)\n")
    assert child.last_error == child.last_exit and "signal 11" in child.last_error
    running(child, reactor, probe)  # a warning before the death stays: it may say why
    reactor.exit(None, signal.SIGABRT, output=b"2026-11-29T08:41:01+0000 [svc.modelserver.service#warn] M: memory "
                                              b"is low\n2026-11-29T08:41:02+0000 [svc.modelserver.service#info] M: "
                                              b"batch done\n")
    assert child.last_error == f"{child.last_exit}: M: memory is low"


def test_crash_while_starting_fails_the_start_action_and_restarts():
    child, reactor, probe, _ = make()
    d = results(child.start())
    reactor.exit(None, signal.SIGSEGV)
    assert child.state == BACKOFF and isinstance(d[0], Failure)
    reactor.advance(1)
    assert child.state == STARTING


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_sent_while_it_starts_is_a_stop_not_a_crash(sig):
    """``kill -TERM`` to a model server 0.5 s after its spawn, while Python still imported, killed it by the signal
    (its handlers that exit 0 were not installed yet): the start answered 500 "killed by signal 15; restarting in
    1 s" and the on-failure policy respawned it, where a signal sent to a child is its clean stop (lifecycle probe)."""
    child, reactor, probe, _ = make("on-failure")
    d = results(child.start())
    reactor.exit(None, sig)
    assert child.state == STOPPED and child.last_error is None and child.last_exit == f"killed by signal {int(sig)}"
    assert str(d[0].value) == f"M could not start: killed by signal {int(sig)}"
    reactor.advance(60)
    assert child.state == STOPPED and len(reactor.spawned) == 1


@pytest.mark.parametrize("policy, code, sig, expected", [
    ("no", 3, None, FAILED),
    ("no", 0, None, STOPPED),
    ("on-failure", 0, None, STOPPED),
    ("always", 0, None, BACKOFF),
    ("on-failure", None, signal.SIGKILL, BACKOFF),
    ("on-failure", None, signal.SIGTERM, STOPPED),  # someone's stop that came before its handlers (see below)
    ("always", None, signal.SIGTERM, BACKOFF),
])
def test_restart_policies(policy, code, sig, expected):
    child, reactor, probe, _ = make(policy)
    running(child, reactor, probe)
    reactor.exit(code, sig)
    assert child.state == expected


def test_refused_child_fails_permanently_without_spawning():
    child, reactor, probe, _ = make(refused="SERVICE_METRICS_TOKEN is not set")
    d = results(child.start())
    assert child.state == FAILED and reactor.spawned == []
    assert child.last_error == "SERVICE_METRICS_TOKEN is not set" and isinstance(d[0], Failure)
    reactor.advance(1000)
    assert reactor.spawned == [] and child.state == FAILED


def test_stop_during_backoff_cancels_the_restart():
    child, reactor, probe, _ = make()
    running(child, reactor, probe)
    reactor.exit(1)
    assert child.state == BACKOFF
    assert results(child.stop()) == [None] and child.state == STOPPED
    reactor.advance(100)
    assert len(reactor.spawned) == 1


def test_restart_spawns_only_after_the_old_process_exited():
    child, reactor, probe, kills = make()
    running(child, reactor, probe)
    d = results(child.restart())
    assert child.state == STOPPING and len(reactor.spawned) == 1
    reactor.advance(5)
    assert len(reactor.spawned) == 1  # the port is still held
    reactor.exit(0)
    assert len(reactor.spawned) == 2 and child.state == STARTING and child.restarts == 1
    reactor.advance(0.5)
    assert d == [None] and child.state == RUNNING


def test_start_times_out_if_never_ready():
    child, reactor, probe, _ = make()
    d = results(child.start())
    reactor.advance(60)
    assert d[0].check(ChildError) and "did not become ready within 60 s" in str(d[0].value)
    assert child.state == STARTING


def test_stop_while_starting_fails_the_start():
    child, reactor, probe, _ = make()
    d = results(child.start())
    stop = results(child.stop())
    reactor.exit(None, signal.SIGTERM)
    assert child.state == STOPPED and stop == [None] and d[0].check(ChildError)


def test_logs_and_notes_reach_the_ring():
    child, reactor, probe, _ = make()
    results(child.start())
    reactor.spawned[0][0].outReceived(b"hello\npart")
    reactor.spawned[0][0].outReceived(b"ial line\n")
    lines = [(e["stream"], e["line"]) for e in child.logs.page(None, 50)["lines"]]
    assert ("stdout", "hello") in lines and ("stdout", "partial line") in lines
    assert any(stream == "supervisor" and text.startswith("starting:") for stream, text in lines)


# -- a busy port at start: waited for on the back-off schedule, up to port_wait ---------------------


def test_busy_port_is_retried_on_the_backoff_schedule_then_the_child_starts():
    port = Port()
    port.free = False
    child, reactor, probe, _ = make(port=port)
    d = results(child.start())
    assert (child.state, child.pid, reactor.spawned) == (STARTING, None, [])  # nothing spawned on a busy port
    assert "port 9101 is in use" in child.last_error and "trying again in 1 s" in child.last_error
    snap = child.snapshot()
    assert (snap["state"], snap["pid"], snap["uptime_s"]) == ("starting", None, None)
    reactor.advance(1)  # back-off 1, 2, 4 ...
    assert len(port.checks) == 2 and reactor.spawned == []
    reactor.advance(1.9)
    assert len(port.checks) == 2
    reactor.advance(0.1)
    assert len(port.checks) == 3 and "trying again in 4 s" in child.last_error
    port.free = True  # the orphan has exited
    reactor.advance(4)
    assert len(reactor.spawned) == 1 and child.state == STARTING and child.pid == 1001
    # The port is free: the wait's note is not shown beside the loading process (a UI probe: "port ... is in use;
    # trying again" stayed until the model was ready).
    assert child.last_error is None and child.snapshot()["last_error"] is None
    probe.ok = True
    reactor.advance(0.5)
    assert (child.state, child.ready, d, child.last_error) == (RUNNING, True, [None], None)


def test_a_crash_after_a_port_wait_is_its_error_through_the_respawn():
    """A regression probe: the port wait's note was cleared at every spawn until ready, so a crash of the process
    spawned on the freed port ("killed by signal 11") was wiped at its respawn; without a port wait it stays."""
    port = Port()
    port.free = False
    child, reactor, probe, _ = make(port=port)
    results(child.start())
    port.free = True
    reactor.advance(1)
    assert len(reactor.spawned) == 1 and child.last_error is None  # the note cleared once, at the spawn
    reactor.exit(None, signal.SIGSEGV)
    assert child.state == BACKOFF and "signal 11" in child.last_error
    reactor.advance(60)
    assert (child.state, len(reactor.spawned)) == (STARTING, 2) and "signal 11" in child.last_error
    probe.ok = True
    reactor.advance(0.5)
    assert child.state == RUNNING and "signal 11" in child.last_error  # "earlier:" in the UI, as without a wait


def test_port_still_busy_after_port_wait_is_start_failed_and_stays_so():
    port = Port()
    port.free = False
    child, reactor, probe, _ = make(port=port)
    d = results(child.start())
    for _ in range(15):  # checks at 0, 1, 3, 7, 11, 15 (a busy port's tries are at most 4 s apart)
        reactor.advance(1)
    assert child.state == STARTING and d == [] and len(port.checks) == 6
    assert "trying again in 4 s" in child.last_error
    reactor.advance(4)
    assert "trying again in 1 s" in child.last_error  # the last wait ends at port_wait (20 s)
    reactor.advance(1)
    assert child.state == START_FAILED and len(port.checks) == 8
    assert "port 9101 is in use" in child.last_error and "after waiting 20 s" in child.last_error
    assert isinstance(d[0], Failure) and d[0].check(ChildError) and "port 9101 is in use" in str(d[0].value)
    reactor.advance(100)
    assert len(port.checks) == 8 and reactor.spawned == []
    assert child.snapshot()["state"] == "start_failed"
    port.free = True
    running(child, reactor, probe)  # an operator may try again


def test_a_port_that_cannot_be_bound_for_another_reason_fails_the_start_at_once():
    """A port below 1024 for a user without the privilege was "in use" and retried for port_wait (60 s) while
    nothing listened there; it is no wait's business: start_failed at once, saying why."""
    def denied(port: int) -> bool:
        raise PermissionError(13, "Permission denied")

    child, reactor, probe, _ = make(port=denied)
    d = results(child.start())
    assert child.state == START_FAILED and reactor.spawned == []
    assert child.last_error == "cannot listen on port 9101: Permission denied"
    assert isinstance(d[0], Failure) and d[0].check(ChildError)
    reactor.advance(100)
    assert child.state == START_FAILED and reactor.spawned == []


def test_the_real_port_check_tells_a_busy_port_from_one_that_cannot_be_bound():
    import errno
    import socket

    from svc.supervisor.spawn import port_is_free

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert port_is_free(port) is False
    assert port_is_free(port) is True
    with pytest.raises(OSError) as raised:
        port_is_free(port, host="192.0.2.1")  # TEST-NET-1: an address no host of ours has
    assert raised.value.errno == errno.EADDRNOTAVAIL


def test_child_losing_the_race_for_its_port_waits_too():
    child, reactor, probe, _ = make()
    d = results(child.start())
    reactor.exit(1, output=b"service-model: cannot listen on 127.0.0.1:9101: [Errno 98] Address already in use\n")
    assert (child.state, child.pid, d) == (STARTING, None, [])
    assert "Address already in use" in child.last_error and "trying again in 1 s" in child.last_error
    reactor.advance(1)
    assert len(reactor.spawned) == 2
    probe.ok = True
    reactor.advance(0.5)
    assert (child.state, d) == (RUNNING, [None])


def test_stop_while_waiting_for_the_port_is_immediate():
    port = Port()
    port.free = False
    child, reactor, probe, kills = make(port=port)
    started = results(child.start())
    stopped = results(child.stop())
    assert (child.state, stopped, kills) == (STOPPED, [None], [])
    assert isinstance(started[0], Failure) and "stopped before it was ready" in str(started[0].value)
    reactor.advance(100)
    assert len(port.checks) == 1 and reactor.spawned == []


def test_a_crash_restart_onto_a_busy_port_waits_for_it_and_keeps_the_crash_as_the_error():
    """A regression probe: the port wait's note took the place of the crash's error, and clearing the note at the
    spawn on the freed port wiped both: whether a crash was shown depended on a race for the port."""
    port = Port()
    child, reactor, probe, _ = make(port=port)
    running(child, reactor, probe)
    reactor.exit(None, signal.SIGSEGV)
    assert child.state == BACKOFF and "signal 11" in child.last_error
    port.free = False
    reactor.advance(1)  # the back-off delay: the respawn finds the port busy
    assert child.state == STARTING and child.pid is None and len(reactor.spawned) == 1
    assert child.last_error.startswith("port ") and "trying again in 1 s" in child.last_error
    reactor.advance(1)
    assert "trying again in 2 s" in child.last_error  # the second try's note: still the crash before the wait
    port.free = True
    reactor.advance(2)
    assert len(reactor.spawned) == 2 and child.pid == 1002 and "signal 11" in child.last_error
    probe.ok = True
    reactor.advance(0.5)
    assert child.state == RUNNING and "signal 11" in child.last_error


def test_group_leader_gives_up_when_the_supervisor_is_already_gone():
    import os
    import subprocess
    import sys

    alive = subprocess.run([sys.executable, "-c", GROUP_LEADER, sys.executable, "-c", "print('ran')"],
                           env={**os.environ, "SERVICE_SUPERVISOR_PID": str(os.getpid())}, capture_output=True)
    assert (alive.returncode, alive.stdout) == (0, b"ran\n")
    gone = subprocess.run([sys.executable, "-c", GROUP_LEADER, sys.executable, "-c", "print('ran')"],
                          env={**os.environ, "SERVICE_SUPERVISOR_PID": "1"}, capture_output=True)
    assert (gone.returncode, gone.stdout) == (1, b"")


def test_a_starting_child_shows_the_phase_its_ready_route_reports():
    from svc.supervisor.probe import Probed

    child, reactor, probe, _ = make()
    d = results(child.start())
    assert child.snapshot()["phase"] is None
    probe.ok = Probed(False, "the model is loading: measuring mode 2 of 4 (compile)")
    reactor.advance(0.5)
    assert child.snapshot()["phase"] == "the model is loading: measuring mode 2 of 4 (compile)"
    probe.ok = Probed(True)
    reactor.advance(0.5)
    assert (child.state, child.ready, child.snapshot()["phase"], d) == (RUNNING, True, None, [None])


# -- actions that overtake each other, and the supervisor's shutdown --------------------------------


def test_a_stop_overtaking_a_restart_wins_and_the_restart_says_so():
    child, reactor, probe, kills = make()
    running(child, reactor, probe)
    restart = results(child.restart())
    stop = results(child.stop())  # while the old process still exits
    reactor.exit(0)
    assert (child.state, stop, len(reactor.spawned), child.restarts) == (STOPPED, [None], 1, 0)
    assert restart[0].check(ChildError) and str(restart[0].value) == "M: stopped before it started again"
    reactor.advance(100)
    assert len(reactor.spawned) == 1 and child.state == STOPPED


def test_a_stop_asked_after_a_start_that_waits_for_an_exit_wins():
    """Restarts, a start and then a stop at once: every stop answered ok, and then the start queued behind the
    first stop spawned the model again, which stayed up with no caller asking for it (a concurrency probe)."""
    child, reactor, probe, kills = make()
    running(child, reactor, probe)
    first_stop = results(child.stop())
    start = results(child.start())  # stopping: it starts once stopped...
    last_stop = results(child.stop())  # ...unless a stop asked after it wins
    reactor.exit(0)
    assert (child.state, first_stop, last_stop, len(reactor.spawned)) == (STOPPED, [None], [None], 1)
    assert start[0].check(ChildError) and str(start[0].value) == "M: stopped before it started again"
    reactor.advance(100)
    assert len(reactor.spawned) == 1 and child.state == STOPPED
    # a start asked after the last stop is the last word: it starts once stopped
    running(child, reactor, probe)
    child.stop()
    again = results(child.start())
    reactor.exit(0)
    probe.ok = True
    reactor.advance(0.5)
    assert (child.state, again, len(reactor.spawned)) == (RUNNING, [None], 3)


def test_two_restarts_at_once_are_one_restart():
    child, reactor, probe, kills = make()
    running(child, reactor, probe)
    first, second = results(child.restart()), results(child.restart())
    reactor.exit(0)
    probe.ok = True
    reactor.advance(0.5)
    assert (first, second, len(reactor.spawned), child.restarts, child.state) == ([None], [None], 2, 1, RUNNING)


def test_a_restart_of_a_child_still_starting_answers_the_start_it_overtook_when_it_is_ready():
    """A management probe: a restart of a model still warming up, then a second restart; the first was answered
    500 "could not start: stopped before it was ready" although the model came up. The start it was waiting for
    was overtaken, not failed: it answers when the new process is ready."""
    child, reactor, probe, kills = make()
    running(child, reactor, probe)
    first = results(child.restart())
    reactor.exit(0)
    assert child.state == STARTING and len(reactor.spawned) == 2 and first == []  # warming up
    second = results(child.restart())
    assert child.state == STOPPING and first == second == []
    reactor.exit(0)
    probe.ok = True
    reactor.advance(0.5)
    assert (first, second, len(reactor.spawned), child.restarts, child.state) == ([None], [None], 3, 2, RUNNING)
    third = results(child.restart())
    results(child.stop())  # a stop calls the restart off, and the start it overtook with it
    reactor.exit(0)
    assert third[0].check(ChildError) and "stopped before it started again" in str(third[0].value)


def test_nothing_is_spawned_once_the_shutdown_began():
    child, reactor, probe, kills = make()
    results(child.shutdown())  # a stopped child: the supervisor's shutdown came before its start
    started = results(child.start())
    assert started[0].check(ChildError) and str(started[0].value) == "M: the supervisor is shutting down"
    assert reactor.spawned == [] and child.state == STOPPED
    child, reactor, probe, kills = make()
    running(child, reactor, probe)
    restart = results(child.restart())
    shutdown = results(child.shutdown())  # SIGTERM to the supervisor while the restart waits for the exit
    reactor.exit(0)
    assert shutdown == [None] and restart[0].check(ChildError) and len(reactor.spawned) == 1
    port = Port()
    port.free = False
    child, reactor, probe, kills = make(port=port)
    results(child.start())  # waits for its port; a retry must not spawn after the shutdown
    results(child.shutdown())
    port.free = True
    reactor.advance(100)
    assert reactor.spawned == [] and child.state == STOPPED


def test_last_error_is_this_process_s_and_a_new_start_clears_it():
    child, reactor, probe, _ = make()
    results(child.start())
    reactor.spawned[-1][0].outReceived(b"POST /m/predict 200 30.8ms\nAddress already in use\n")
    probe.ok = True
    reactor.advance(0.5)
    child.stop()
    reactor.exit(0)
    d = results(child.start())
    reactor.exit(1, output=b"service-model: conf/server/M.toml: max_batch_size: must be an integer\n")
    assert child.state == START_FAILED  # not taken for a busy port by the old process's line
    assert child.last_error == "service-model: conf/server/M.toml: max_batch_size: must be an integer"
    assert d[0].check(ChildError)
    results(child.start())
    assert child.last_error is None


def test_a_full_log_disk_does_not_stop_a_crashed_child_from_restarting(tmp_path):
    (tmp_path / "M.log").symlink_to("/dev/full")
    child, reactor, probe, _ = make()
    child.logs = LogSink("M", str(tmp_path), clock=reactor, max_bytes=1 << 20, backups=1, ring_lines=100)
    running(child, reactor, probe)
    reactor.exit(None, signal.SIGKILL, output=b"last words\n")  # lines still waiting for the file
    assert child.state == BACKOFF and child.pid is None
    reactor.advance(1)
    assert child.state == STARTING and len(reactor.spawned) == 2


def test_start_and_stop_are_done_when_the_child_is_already_so_or_on_its_way():
    """Two scripts that both make sure a model runs (or is stopped), or an operator and a script: the second got
    500 "M is running: stop it first or restart it" or "M is stopped, not running" (a management probe). A start
    of a running child is done, of a starting one waits for that start, of a stopping one starts it once stopped;
    a stop of a stopped child is done."""
    child, reactor, probe, kills = make()
    first = results(child.start())
    second = results(child.start())  # while starting: the same start
    assert len(reactor.spawned) == 1 and first == second == []
    probe.ok = True
    reactor.advance(0.5)
    assert first == second == [None]
    assert results(child.start()) == [None] and len(reactor.spawned) == 1  # running: done
    stopped = results(child.stop())
    again = results(child.start())  # while stopping: it starts once the process has exited
    assert child.state == STOPPING and again == [] and len(reactor.spawned) == 1
    reactor.exit(0)
    assert stopped == [None] and child.state == STARTING and len(reactor.spawned) == 2
    reactor.advance(0.5)
    assert again == [None] and child.state == RUNNING
    assert results(child.stop()) == []
    reactor.exit(0)
    assert child.state == STOPPED and results(child.stop()) == [None]  # stopped: done


def test_a_failure_is_logged_at_error_a_crash_at_warn_and_the_rest_at_info():
    """Every state line was info, a crash loop and a refused gateway among them, while getting-started says only
    a real failure is a warning (logs probe); a model that stops answering /ready was noted in its file only."""
    from twisted.logger import LogLevel, capturedLogs

    child, reactor, probe, _ = make()
    with capturedLogs() as events:
        running(child, reactor, probe)
        probe.ok = False
        reactor.advance(2)
        probe.ok = True
        reactor.advance(2)
        for _ in range(5):
            reactor.exit(2)
            reactor.advance(8)
        reactor.exit(2)
    lines = [(e["log_level"], e["log_format"].format(**e)) for e in events if e.get("name") == "M"]
    assert lines[:5] == [
        (LogLevel.info, "M: starting: spawned pid 1001: service-model ..."),
        (LogLevel.info, "M: running: ready"),
        (LogLevel.warn, "M: not ready: /ready did not answer 200"),
        (LogLevel.info, "M: ready again"),
        (LogLevel.warn, "M: backoff: exited (exit code 2); restarting in 1 s"),
    ]
    assert lines[-1][0] == LogLevel.error and lines[-1][1].startswith("M: failed: crash loop")
    assert {level for level, text in lines if text.startswith("M: starting")} == {LogLevel.info}


def test_a_start_refused_at_once_is_logged_at_error():
    from twisted.logger import LogLevel, capturedLogs

    child, reactor, probe, _ = make(refused="M.toml: port: must be an integer")
    with capturedLogs() as events:
        results(child.start())
    assert [(e["log_level"], e["log_format"].format(**e)) for e in events if e.get("name") == "M"] == [
        (LogLevel.error, "M: failed: not started: M.toml: port: must be an integer")]


def test_last_error_is_what_the_child_said_without_its_log_prefix_or_the_reactors_goodbye():
    """last_error was the last two raw lines: times, namespaces, and "(TCP Port 18913 Closed)" (logs probe)."""
    child, reactor, probe, _ = make()
    results(child.start())
    reactor.exit(1, output=b"2026-11-28T05:20:38+0000 [-] Starting reactor...\n"
                          b"2026-11-28T05:20:38+0000 [-] JsonSite starting on 9101\n"
                          b"2026-11-28T05:20:39+0000 [svc.modelserver.engine#error] loading the weights\n"
                          b"2026-11-28T05:20:39+0000 [svc.infra.process#critical] service-model: M: model failed to "
                          b"load: RuntimeError: injected load failure\n"
                          b"2026-11-28T05:20:39+0000 [svc.access#info] GET /ready 503 0.4ms key=- rid=-\n"
                          b"2026-11-28T05:20:39+0000 [-] (TCP Port 9101 Closed)\n"
                          b"2026-11-28T05:20:39+0000 [-] Main loop terminated.\n")
    assert child.state == START_FAILED
    assert child.last_error == ("loading the weights | service-model: M: model failed to load: RuntimeError: "
                                "injected load failure")


def test_a_model_killed_by_signal_9_has_no_requests_for_its_last_error():
    """A kill -9 leaves no last words: last_error showed the last two access lines (UI probe)."""
    child, reactor, probe, _ = make()
    running(child, reactor, probe)
    reactor.exit(None, sig=9, output=b"2026-11-28T05:20:39+0000 [-] Starting reactor...\n"
                                     b"2026-11-28T05:20:39+0000 [svc.modelserver.service#info] M: ready (version x)\n"
                                     b"2026-11-28T05:20:39+0000 [svc.access#info] GET /openapi.json 200 3.1ms "
                                     b"key=- rid=-\n")
    assert child.last_error == "killed by signal 9"
