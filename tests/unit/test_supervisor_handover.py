"""The gateway child's handover on a fake reactor: the socket it holds, the
ready and closed lines, and every way a restart can end."""

from __future__ import annotations

import signal

import pytest
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.python.failure import Failure

from svc.supervisor.child import BACKOFF, RUNNING, START_FAILED, STARTING, STOPPED, STOPPING, ChildError, ChildSpec
from svc.supervisor.handover import LISTEN_FD, READY_FD, GatewayChild
from svc.supervisor.logsink import LogSink
from tests.unit.test_supervisor_child import TIMING, Probe, ProcessReactor, results


class FdReactor(ProcessReactor):
    """Also records the childFDs of each spawn."""

    def __init__(self) -> None:
        super().__init__()
        self.fds: list[dict] = []

    def spawnProcess(self, protocol, executable, args, env=None, path=None, **kw):
        self.fds.append(kw.get("childFDs"))
        return super().spawnProcess(protocol, executable, args, env, path)

    def protocol(self, index: int = -1):
        return self.spawned[index][0]


class FakeSocket:
    def __init__(self) -> None:
        self.closed = False

    def fileno(self) -> int:
        return 77

    def close(self) -> None:
        self.closed = True


class Binder:
    def __init__(self, error: OSError | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.sockets: list[FakeSocket] = []
        self.error = error

    def __call__(self, host: str, port: int) -> FakeSocket:
        self.calls.append((host, port))
        if self.error is not None:
            raise self.error
        self.sockets.append(FakeSocket())
        return self.sockets[-1]


def make(host="127.0.0.1", env=None, binder=None, refused=None, port_free=lambda port: True, drain_s=0.0,
         restart_preflight=None):
    reactor, probe, kills, binder = FdReactor(), Probe(), [], binder or Binder()
    spec = ChildSpec("__gateway", ["/usr/bin/python3", "-m", "twisted", "service-gateway"], {}, 8080, "/healthz",
                     refused=refused, restart_preflight=restart_preflight)
    child = GatewayChild(spec, host=host, env=env or {}, binder=binder, drain_s=drain_s, reactor=reactor, probe=probe,
                         logs=LogSink("__gateway", None, clock=reactor, max_bytes=1 << 20, backups=1, ring_lines=200), timing=TIMING,
                         killer=lambda pid, sig: kills.append((pid, sig)), port_free=port_free)
    return child, reactor, probe, kills, binder


def line(reactor, index, text: bytes, fd=READY_FD):
    reactor.protocol(index).childDataReceived(fd, text)


def ended(reactor, index, code=0, sig=None):
    reason = ProcessDone(0) if code == 0 and sig is None else ProcessTerminated(code, sig)
    reactor.protocol(index).processEnded(Failure(reason))


def running(child, reactor):
    d = results(child.start())
    line(reactor, 0, b"ready 1001\n")
    assert (child.state, child.ready, child.pid, d) == (RUNNING, True, 1001, [None])


def notes(child):
    return [text for _, _, stream, text in child.logs.ring if stream == "supervisor"]


def test_the_socket_is_bound_once_and_handed_over_as_fd_3_with_a_ready_pipe_on_fd_4():
    child, reactor, probe, _, binder = make()
    d = results(child.start())
    assert binder.calls == [("127.0.0.1", 8080)]
    assert reactor.fds[0] == {0: "w", 1: "r", 2: "r", READY_FD: "r", LISTEN_FD: 77}
    assert reactor.spawned[0][2][-4:] == ["--ready-fd", "4", "--listen-fd", "3"]
    reactor.advance(0.5)
    assert child.state == STARTING and d == [] and probe.calls == 1  # the probe says not yet
    line(reactor, 0, b"rea")
    line(reactor, 0, b"dy 1001\n")  # the ready line, whole lines only
    assert (child.state, child.ready, d) == (RUNNING, True, [None])


def test_restart_starts_the_new_gateway_beside_the_old_one_then_retires_the_old_one():
    child, reactor, _, kills, binder = make()
    running(child, reactor)
    d = results(child.restart())
    assert len(reactor.spawned) == 2 and reactor.fds[1][LISTEN_FD] == 77 and len(binder.calls) == 1
    assert (child.state, child.pid, child.restarts, kills, d) == (RUNNING, 1001, 0, [], [])
    line(reactor, 1, b"ready 1002\n")
    assert (child.state, child.pid, child.ready, child.restarts) == (RUNNING, 1002, True, 1)
    assert kills == [(1001, signal.SIGTERM)] and d == []  # the old one may still accept
    line(reactor, 0, b"closed 1001\n")
    assert d == [None]
    ended(reactor, 0)
    assert child.state == RUNNING and child.pid == 1002 and "previous pid 1001 exited (exit code 0)" in notes(child)
    reactor.advance(TIMING.stop_grace)
    assert kills == [(1001, signal.SIGTERM)]  # no SIGKILL for a process that exited
    snapshot = child.snapshot()
    assert (snapshot["state"], snapshot["pid"], snapshot["restarts"]) == (RUNNING, 1002, 1)
    assert not binder.sockets[0].closed


def test_the_restart_also_answers_when_the_old_one_exits_without_its_closed_line():
    child, reactor, _, kills, _ = make()
    running(child, reactor)
    d = results(child.restart())
    line(reactor, 1, b"ready 1002\n")
    ended(reactor, 0, code=None, sig=9)
    assert d == [None] and child.pid == 1002 and child.state == RUNNING


def test_an_old_gateway_that_does_not_exit_is_killed_after_the_grace():
    child, reactor, _, kills, _ = make()
    running(child, reactor)
    d = results(child.restart())
    line(reactor, 1, b"ready 1002\n")
    reactor.advance(TIMING.stop_grace)
    assert kills == [(1001, signal.SIGTERM), (1001, signal.SIGKILL)] and d == [None]


def test_no_handover_once_the_supervisor_shuts_down():
    child, reactor, _, kills, _ = make()
    running(child, reactor)
    results(child.shutdown())
    d = results(child.restart())
    assert d[0].check(ChildError) and str(d[0].value) == "__gateway: the supervisor is shutting down"
    assert len(reactor.spawned) == 1


def test_an_old_gateway_draining_long_requests_is_killed_only_after_its_receive_timeout():
    """A wait or a sync request may take up to upstream_recv_timeout_ms: a restart (a key reload) killed the
    old gateway after stop_grace, resetting them; it now waits for the gateway's own drain bound."""
    child, reactor, _, kills, _ = make(drain_s=182.0)
    running(child, reactor)
    d = results(child.restart())
    line(reactor, 1, b"ready 1002\n")
    line(reactor, 0, b"closed 1001\n")
    assert d == [None]  # answered once the old one accepts no more
    reactor.advance(181.9)
    assert kills == [(1001, signal.SIGTERM)]  # still answering what it holds
    reactor.advance(0.1)
    assert kills == [(1001, signal.SIGTERM), (1001, signal.SIGKILL)]
    assert "previous pid 1001 still running after 182 s: SIGKILL" in notes(child)


@pytest.mark.parametrize("how", ["stop", "shutdown"])
def test_a_stopping_gateway_is_killed_only_after_its_receive_timeout_too(how):
    """A stop through the management API, or the supervisor's own (a host taken down), killed the gateway after
    stop_grace (15 s): a 22 s request it held was cut, and HAProxy ran it again on another host (a scaling probe)."""
    child, reactor, _, kills, _ = make(drain_s=182.0)
    running(child, reactor)
    done = results(getattr(child, how)())
    reactor.advance(181.9)
    assert kills == [(1001, signal.SIGTERM)] and done == []  # still answering what it holds
    reactor.advance(0.1)
    assert kills == [(1001, signal.SIGTERM), (1001, signal.SIGKILL)]
    assert "still running after 182 s: SIGKILL to the process group" in notes(child)
    ended(reactor, 0, sig=signal.SIGKILL)
    assert done == [None]


def test_a_new_gateway_that_exits_before_ready_fails_the_restart_and_the_old_one_stays():
    child, reactor, _, kills, binder = make()
    running(child, reactor)
    d = results(child.restart())
    line(reactor, 1, b"service-gateway: unknown key gateway.no_such_key\n", fd=2)
    ended(reactor, 1, code=1)
    assert isinstance(d[0].value, ChildError)
    message = str(d[0].value)
    assert "exited before it was ready (exit code 1)" in message and "no_such_key" in message
    assert "previous gateway (pid 1001) still serves" in message
    assert (child.state, child.pid, child.restarts, kills) == (RUNNING, 1001, 0, [])
    assert not binder.sockets[0].closed
    assert results(child.restart()) == [] and len(reactor.spawned) == 3  # a later restart may try again


def test_a_new_gateway_that_never_says_ready_is_stopped_and_the_restart_fails():
    child, reactor, _, kills, _ = make()
    running(child, reactor)
    d = results(child.restart())
    reactor.advance(TIMING.start_timeout)
    assert isinstance(d[0].value, ChildError) and "did not become ready within 60 s" in str(d[0].value)
    assert kills == [(1002, signal.SIGTERM)] and child.pid == 1001 and child.state == RUNNING
    reactor.advance(TIMING.stop_grace)
    assert kills[-1] == (1002, signal.SIGKILL)
    ended(reactor, 1, code=None, sig=9)
    assert child.state == RUNNING and child.pid == 1001


def test_restarts_asked_for_during_a_handover_share_one_more_handover_after_it():
    """Two ``svcctl keys add`` at once: the second restart was 500 "already under way", and joining the first
    would not do either (its new gateway may have read the key file before the second edit). One more handover
    runs once the first has ended, shared by every restart asked for meanwhile; each answers when it is done."""
    child, reactor, _, kills, _ = make()
    running(child, reactor)
    first = results(child.restart())
    second, third = results(child.restart()), results(child.restart())
    assert len(reactor.spawned) == 2 and first == second == third == []
    line(reactor, 1, b"ready 1002\n")
    line(reactor, 0, b"closed 1001\n")
    assert first == [None] and second == third == [] and len(reactor.spawned) == 3  # the one after, spawned
    line(reactor, 2, b"ready 1003\n")
    line(reactor, 1, b"closed 1002\n")
    assert second == third == [None] and (child.pid, child.restarts) == (1003, 2)
    assert kills == [(1001, signal.SIGTERM), (1002, signal.SIGTERM)]


def test_the_restart_asked_for_during_a_handover_that_fails_still_runs():
    """The edit it was asked for (a key added) must still be read: the failed handover's new gateway never
    served, and the old one read the key file before the edit."""
    child, reactor, _, _, _ = make()
    running(child, reactor)
    first, second = results(child.restart()), results(child.restart())
    reactor.advance(TIMING.start_timeout)  # the first new gateway never says ready
    assert "did not become ready" in str(first[0].value) and second == [] and len(reactor.spawned) == 3
    line(reactor, 2, b"ready 1003\n")
    line(reactor, 0, b"closed 1001\n")
    assert second == [None] and child.pid == 1003


def test_a_stop_calls_off_the_restart_waiting_for_a_handover():
    child, reactor, _, _, _ = make()
    running(child, reactor)
    first, second = results(child.restart()), results(child.restart())
    stopped = results(child.stop())
    assert "restart abandoned: the gateway is being stopped" in str(first[0].value)
    assert "stopped before it started again" in str(second[0].value)
    ended(reactor, 0)
    ended(reactor, 1)
    assert stopped == [None] and child.state == STOPPED and len(reactor.spawned) == 2


def test_stop_during_a_handover_ends_both_processes_and_closes_the_socket():
    child, reactor, _, kills, binder = make()
    running(child, reactor)
    d = results(child.restart())
    stopped = results(child.stop())
    assert isinstance(d[0].value, ChildError) and "abandoned" in str(d[0].value)
    assert sorted(kills) == [(1001, signal.SIGTERM), (1002, signal.SIGTERM)] and child.state == STOPPING
    ended(reactor, 0)
    assert child.state == STOPPED and stopped == [] and binder.sockets[0].closed  # the new one still exiting
    ended(reactor, 1)
    assert stopped == [None]


def test_a_stop_lets_the_socket_go_before_the_process_exits():
    """New connections are refused once the stopping gateway stops accepting, not queued for nobody and reset."""
    child, reactor, _, kills, binder = make()
    running(child, reactor)
    stopped = results(child.stop())
    assert kills == [(1001, signal.SIGTERM)] and child.state == STOPPING and binder.sockets[0].closed
    ended(reactor, 0)
    assert child.state == STOPPED and stopped == [None]
    results(child.start())
    assert len(binder.sockets) == 2 and reactor.fds[1][LISTEN_FD] == 77  # a start binds again


def test_a_gateway_signalled_directly_lets_the_socket_go_once_it_no_longer_accepts():
    """``kill -TERM`` to the gateway: it stopped accepting and drained, while the supervisor's socket kept taking
    connections that nobody accepted, which hung up to 14 s and were reset (lifecycle probe). Its ``closed`` line
    lets the socket go, as a stop does; a respawn after a crash binds it again."""
    child, reactor, _, kills, binder = make()
    running(child, reactor)
    line(reactor, 0, b"closed 1001\n")
    assert binder.sockets[0].closed and kills == [] and child.state == RUNNING  # still draining: not a stop
    assert "pid 1001 no longer accepts (a signal sent to it: its clean stop)" in notes(child)
    ended(reactor, 0, code=1)  # a drain that ends in a failure: the policy respawns it, on a new socket
    reactor.advance(TIMING.backoff_initial)
    assert len(binder.sockets) == 2 and reactor.fds[-1][LISTEN_FD] == 77 and not binder.sockets[1].closed


def test_the_old_gateways_closed_line_in_a_restart_keeps_the_socket():
    child, reactor, _, _, binder = make()
    running(child, reactor)
    results(child.restart())
    line(reactor, 0, b"closed 1001\n")  # the old one, before the new one is ready: the handover needs the socket
    assert not binder.sockets[0].closed


def test_a_crash_respawns_on_the_same_socket():
    child, reactor, _, _, binder = make()
    running(child, reactor)
    ended(reactor, 0, code=None, sig=9)
    assert child.state == BACKOFF and not binder.sockets[0].closed
    reactor.advance(TIMING.backoff_initial)
    assert child.state == STARTING and reactor.fds[1][LISTEN_FD] == 77 and len(binder.calls) == 1
    line(reactor, 1, b"ready 1002\n")
    assert (child.state, child.pid, child.restarts) == (RUNNING, 1002, 1)


def test_a_port_edit_refuses_an_asked_restart_but_not_a_crash_respawn():
    """A regression probe: the check of an edited [gateway] port (a restart cannot move the socket) ran before a
    crash respawn too, so a gateway killed while such an edit waited was ``start_failed`` and the service had no
    gateway; it respawns on its socket, and only an asked restart is refused, the running gateway serving on."""
    moved = "service.toml changes [gateway] port 8080 -> 8081: ..."
    child, reactor, _, _, binder = make(restart_preflight=lambda: moved)
    running(child, reactor)
    refused = results(child.restart())
    assert isinstance(refused[0].value, ChildError) and str(refused[0].value) == f"{moved} (nothing was stopped)"
    assert (child.state, child.pid) == (RUNNING, 1001)
    ended(reactor, 0, code=None, sig=9)
    reactor.advance(TIMING.backoff_initial)
    assert child.state == STARTING and reactor.fds[1][LISTEN_FD] == 77
    line(reactor, 1, b"ready 1002\n")
    assert (child.state, child.pid, child.restarts) == (RUNNING, 1002, 1)


def test_the_old_gateway_crashing_during_a_handover_lets_the_new_one_take_over():
    child, reactor, _, kills, _ = make()
    running(child, reactor)
    d = results(child.restart())
    ended(reactor, 0, code=None, sig=9)
    assert child.state == BACKOFF
    line(reactor, 1, b"ready 1002\n")
    assert (child.state, child.pid, d, kills) == (RUNNING, 1002, [None], [])
    reactor.advance(TIMING.backoff_max)
    assert len(reactor.spawned) == 2  # the back-off respawn was cancelled


def test_a_refused_first_start_closes_the_socket_and_the_next_start_binds_again():
    child, reactor, _, _, binder = make()
    d = results(child.start())
    ended(reactor, 0, code=1)
    assert child.state == START_FAILED and isinstance(d[0].value, ChildError) and binder.sockets[0].closed
    results(child.start())
    assert len(binder.calls) == 2 and reactor.fds[1][LISTEN_FD] == 77


def test_no_socket_for_a_wildcard_without_service_expose_or_a_busy_port():
    child, reactor, _, _, binder = make(host="0.0.0.0")
    results(child.start())
    assert binder.calls == [] and LISTEN_FD not in reactor.fds[0]  # the gateway refuses the bind itself
    assert reactor.spawned[0][2][-2:] == ["--ready-fd", "4"]
    child, reactor, _, _, binder = make(host="0.0.0.0", env={"SERVICE_EXPOSE": "docker"})
    results(child.start())
    assert binder.calls == [("0.0.0.0", 8080)] and reactor.fds[0][LISTEN_FD] == 77
    child, reactor, _, kills, binder = make(binder=Binder(OSError(98, "Address already in use")))
    running(child, reactor)
    assert LISTEN_FD not in reactor.fds[0] and any("binds the port itself" in n for n in notes(child))
    d = results(child.restart())  # without a held socket: stop, then start
    assert kills == [(1001, signal.SIGTERM)] and len(reactor.spawned) == 1
    ended(reactor, 0)
    assert len(reactor.spawned) == 2 and d == []


def test_a_refused_gateway_never_binds():
    child, reactor, _, _, binder = make(refused="SERVICE_METRICS_TOKEN is not set")
    d = results(child.start())
    assert binder.calls == [] and reactor.spawned == [] and isinstance(d[0].value, ChildError)


def test_shutdown_waits_for_every_gateway_process_and_closes_the_socket():
    child, reactor, _, kills, binder = make()
    running(child, reactor)
    results(child.restart())
    line(reactor, 1, b"ready 1002\n")
    done = results(child.shutdown())
    assert kills == [(1001, signal.SIGTERM), (1002, signal.SIGTERM)]
    ended(reactor, 1)
    assert done == [] and binder.sockets[0].closed is True  # stopped: the socket is closed at once
    ended(reactor, 0)
    assert done == [None]


def test_a_port_held_by_another_process_is_waited_for_then_bound_and_held():
    """An orphaned gateway of a killed supervisor still holds the port for up to 2 s: the new
    supervisor waits for it (port_wait) instead of failing, then binds and holds the socket."""
    busy = [True]
    child, reactor, _, _, binder = make(port_free=lambda port: not busy[0])
    d = results(child.start())
    assert (child.state, child.pid, binder.calls, reactor.spawned) == (STARTING, None, [], [])
    assert "port 8080 is in use" in child.last_error
    busy[0] = False
    reactor.advance(TIMING.backoff_initial)
    assert binder.calls == [("127.0.0.1", 8080)] and len(reactor.spawned) == 1
    line(reactor, 0, b"ready 1001\n")
    assert (child.state, child.ready, child.last_error, d) == (RUNNING, True, None, [None])
    busy[0] = True  # our own socket now holds the port: a restart never waits for itself
    r = results(child.restart())
    assert len(reactor.spawned) == 2 and len(binder.calls) == 1
    line(reactor, 1, b"ready 1002\n")
    line(reactor, 0, b"closed 1001\n")
    assert r == [None] and child.pid == 1002


def test_the_closed_socket_is_a_warning_in_the_supervisors_output_and_info_at_its_shutdown():
    """It was noted in the gateway's log file only: while no gateway runs, connections are refused, which the
    supervisor's own output did not say (logs probe); at the supervisor's shutdown it is what was asked."""
    from twisted.logger import LogLevel, capturedLogs

    closed = "__gateway: listening socket closed: connections are refused until the gateway starts again"

    def closing_lines(events):
        return [(e["log_level"], e["log_format"].format(**e)) for e in events if "socket closed" in e["log_format"]
                .format(**e)]

    child, reactor, _, _, binder = make()
    with capturedLogs() as events:
        results(child.start())
        ended(reactor, 0, code=1)  # a refused start
    assert child.state == START_FAILED and closing_lines(events) == [(LogLevel.warn, closed)]
    child, reactor, _, _, binder = make()
    running(child, reactor)
    with capturedLogs() as events:
        results(child.shutdown())
    assert binder.sockets[0].closed and closing_lines(events) == [(LogLevel.info, closed)]


class HeldProbe:
    """A probe whose replies the test gives: each call's Deferred waits in ``pending``."""

    def __init__(self) -> None:
        self.pending: list = []

    def __call__(self, port: int, path: str):
        from twisted.internet.defer import Deferred

        self.pending.append(d := Deferred())
        return d


def test_a_probe_sent_before_the_ready_line_that_fails_after_it_does_not_unmake_the_ready_gateway():
    """A slow first start: the probe sent while the gateway was starting timed out after its ready line came,
    and the supervisor warned "not ready" then "ready again" two seconds later on a healthy start."""
    child, reactor, _, _, _ = make()
    child.probe = probe = HeldProbe()
    d = results(child.start())
    reactor.advance(0.5)
    assert len(probe.pending) == 1  # sent while starting: no answer yet (the gateway is still importing)
    line(reactor, 0, b"ready 1001\n")
    assert (child.state, child.ready, d) == (RUNNING, True, [None])
    probe.pending.pop().callback(False)  # its timeout, now
    assert child.ready and not any("not ready" in text for text in notes(child)), notes(child)
    reactor.advance(TIMING.probe_running)
    assert len(probe.pending) == 1  # probed on, as before
    probe.pending.pop().callback(False)  # a probe sent after the ready line does count
    assert not child.ready and notes(child)[-1] == "not ready: /healthz did not answer 200"
