"""The process manager on a fake reactor: every state transition and timer."""

from __future__ import annotations

import signal

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure

from svc.supervisor.child import (
    BACKOFF,
    FAILED,
    GROUP_LEADER,
    RUNNING,
    START_FAILED,
    STARTING,
    STOPPED,
    STOPPING,
    Child,
    ChildError,
    ChildSpec,
    Timing,
)
from svc.supervisor.logsink import LogSink


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
                crash_loop_window=60, probe_starting=0.5, probe_running=2)


def make(policy="on-failure", refused=None, timing=TIMING):
    reactor, probe, kills = ProcessReactor(), Probe(), []
    spec = ChildSpec("M", ["/usr/bin/python3", "-m", "twisted", "service-model"], {"A": "1"}, 9101, "/ready",
                     policy=policy, refused=refused)
    child = Child(spec, reactor=reactor, probe=probe, logs=LogSink("M", None, max_bytes=1 << 20, backups=1, ring_lines=100),
                  timing=timing, killer=lambda pid, sig: kills.append((pid, sig)))
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
    assert args[1:3] == ["-c", GROUP_LEADER] and args[3:] == child.spec.argv and env == {"A": "1"}
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
    reactor.exit(1, output=b"service-model: cannot listen on 127.0.0.1:9101: [Errno 98] Address already in use\n")
    assert child.state == START_FAILED
    assert "Address already in use" in child.last_error
    assert isinstance(d[0], Failure) and d[0].check(ChildError) and "Address already in use" in str(d[0].value)
    reactor.advance(100)
    assert len(reactor.spawned) == 1
    results(child.start())  # an operator may try again
    assert child.state == STARTING


def test_crash_while_starting_fails_the_start_action_and_restarts():
    child, reactor, probe, _ = make()
    d = results(child.start())
    reactor.exit(None, signal.SIGSEGV)
    assert child.state == BACKOFF and isinstance(d[0], Failure)
    reactor.advance(1)
    assert child.state == STARTING


@pytest.mark.parametrize("policy, code, sig, expected", [
    ("no", 3, None, FAILED),
    ("no", 0, None, STOPPED),
    ("on-failure", 0, None, STOPPED),
    ("always", 0, None, BACKOFF),
    ("on-failure", None, signal.SIGKILL, BACKOFF),
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


def test_actions_that_do_not_fit_the_state_fail():
    child, reactor, probe, _ = make()
    stop = results(child.stop())
    assert stop[0].check(ChildError) and "not running" in str(stop[0].value)
    running(child, reactor, probe)
    again = results(child.start())
    assert again[0].check(ChildError) and "running" in str(again[0].value)


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
