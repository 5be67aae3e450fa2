"""One supervised child process and its state machine (states and transitions: :mod:`svc.supervisor.childspec`).

A new process is spawned only after the old one has exited, so a port is never reused too early; how a process
is spawned and signalled is :mod:`svc.supervisor.spawn`, the back-off, the port wait and the crash-loop limit
:mod:`svc.supervisor.backoff`.  The reactor, the readiness probe and the group-kill function are injected."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ProcessDone
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from svc.infra.process import SUPERVISOR_PID_ENV
from svc.infra.reactors import IServiceReactor, cancelling, follow
from svc.supervisor import spawn
from svc.supervisor.backoff import Backoff, Timing
from svc.supervisor.childspec import (  # noqa: F401 - the states and the spec are named from here too
    BACKOFF,
    FAILED,
    RUNNING,
    START_FAILED,
    STARTING,
    STATES,
    STOPPED,
    STOPPING,
    ChildError,
    ChildSpec,
    StartTimedOut,
)
from svc.supervisor.logsink import LogSink
from svc.supervisor.spawn import ChildProtocol

log = Logger()

class Child:
    """A supervised process: start, stop, restart, and what happened to it."""

    def __init__(
        self,
        spec: ChildSpec,
        *,
        reactor: IServiceReactor,
        probe: Callable[[int, str], Deferred],
        logs: LogSink,
        timing: Timing = Timing(),
        killer: Callable[[int, int], None] = spawn.kill_group,
        port_free: Callable[[int], bool] = spawn.port_is_free,
    ) -> None:
        self.spec, self.reactor, self.probe, self.logs = spec, reactor, probe, logs
        self.timing, self.killer, self.port_free = timing, killer, port_free
        self.kill_grace = timing.stop_grace  # how long a stopping process may take after SIGTERM before SIGKILL
        self.state, self.ready, self.restarts = STOPPED, False, 0
        self.pid: int | None = None
        self.started_at: float | None = None
        self.last_error: str | None = None  # why the last start or run failed
        self.last_exit: str | None = None  # how its process last exited, and when (reactor seconds):
        self.exited_at: float | None = None
        self.phase: str | None = None  # what a starting child says it does (its /ready's 503 reason)
        self._protocol: ChildProtocol | None = None
        self.backoff = Backoff(timing)
        self._timer: IDelayedCall | None = None  # backoff restart or probe
        self._kill_timer: IDelayedCall | None = None
        self._probing, self._was_ready, self._readied = False, False, 0  # _readied: times it became ready
        self._ready_waiters: list[Deferred] = []
        self._exit_waiters: list[Deferred] = []
        self._restarting: Deferred | None = None  # a restart waiting for the old process to exit
        self._stops = 0  # stops asked: a start waiting for an exit is called off by a stop asked after it
        self._closing = False  # the supervisor is shutting down: nothing is spawned any more
        self._first_line = 0  # the ring's first line of the current process (its own output for last_error)

    @property
    def name(self) -> str:
        return self.spec.name

    # -- public actions ---------------------------------------------------------------

    def start(self, checked: bool = False) -> Deferred:
        """Spawn the child; fires when ready, fails with ChildError if it cannot (``checked``: preflight done).
        Running, it is done; starting, it waits for that start; stopping, it starts once stopped."""
        if self.state in (STARTING, RUNNING):
            return succeed(None) if self.ready else self._wait_ready()
        if self.state == STOPPING:  # starts once stopped, unless a stop asked after it wins (the last call wins)
            stops = self._stops
            return self._wait_exit().addCallback(lambda _: self.start(checked) if self._stops == stops else fail(
                ChildError(f"{self.name}: stopped before it started again")))
        if self._closing:
            return fail(ChildError(f"{self.name}: the supervisor is shutting down"))
        if not checked and (problem := self.spec.problem()):
            if self.state != BACKOFF:  # nothing runs: the status says why not (it read "stopped", no error)
                self._give_up(START_FAILED, problem, "not started: ")
            return fail(ChildError(problem))
        self._cancel_timer()
        self.backoff.reset()
        self.last_error = None  # a new start: an earlier failure is no longer this child's state
        d = self._wait_ready()
        self._spawn()
        return d

    def stop(self) -> Deferred:
        """TERM the process group, KILL after the grace; fires once it has exited (or now: nothing runs).
        A restart or a start still waiting for the old process to exit is called off: the stop wins."""
        self._restarting, self._stops = None, self._stops + 1
        if self.state == BACKOFF:
            self._cancel_timer()
            self._set(STOPPED, "stopped during back-off")
            return succeed(None)
        if self.state == STOPPING:
            return self._wait_exit()
        if self.state == STARTING and self._protocol is None:  # waiting for its port: nothing runs
            self._cancel_timer()
            self.backoff.end_port_wait()
            self._set(STOPPED, "stopped while waiting for its port")
            self._fail_ready_waiters("stopped before it was ready")
            return succeed(None)
        if self.state not in (STARTING, RUNNING):
            return succeed(None)  # stopped, failed or refused: nothing runs, as asked
        d = self._wait_exit()
        self._set(STOPPING, "SIGTERM to the process group")
        self._cancel_timer()
        self.ready = False
        self._signal(signal.SIGTERM)
        self._kill_timer = self.reactor.callLater(self.kill_grace, self._kill)
        return d

    def restart(self) -> Deferred:
        """Stop if running (waiting for the exit), then start; counts as a restart. A second restart while one waits
        for the exit is the same restart, and a start it overtakes answers with it; a stop or shutdown calls it off."""
        if self._restarting is not None:
            return follow(self._restarting)
        # Before the stop: a restart that cannot start (in a shutdown, too) takes nothing down.
        if problem := f"{self.name}: the supervisor is shutting down" if self._closing else self.spec.restart_problem():
            return fail(ChildError(problem))
        overtaken, self._ready_waiters = self._ready_waiters, []  # not "stopped before it was ready": it will be
        d = self.stop() if self.state in (STARTING, RUNNING, STOPPING) else succeed(None)
        self._restarting = pending = Deferred[None]()

        def again(_: Any) -> Deferred:
            self._ready_waiters.extend(overtaken)
            if self._restarting is not pending or self._closing:
                self._fail_ready_waiters("stopped before it started again")
                return fail(ChildError(f"{self.name}: stopped before it started again"))
            self._restarting = None
            self.restarts += 1
            return self.start(checked=True)  # the preflight ran before the stop

        d.addCallback(again).chainDeferred(pending)
        return follow(pending)

    def closing(self) -> None:
        """The supervisor's shutdown began: nothing is spawned now; what runs runs on until :meth:`shutdown`."""
        self._closing = True

    def shutdown(self) -> Deferred:
        """Stop for the supervisor's own shutdown: whatever the state, end up stopped, and spawn nothing more."""
        self.closing()
        if self.state in (STARTING, RUNNING, STOPPING, BACKOFF):
            return self.stop()
        return succeed(None)

    # -- spawning ---------------------------------------------------------------------------

    def _spawn(self) -> None:
        if self.spec.refused:
            self._give_up(FAILED, self.spec.refused, "not started: ")
            return
        if self._closing:  # a port retry or a back-off that outlived the shutdown's stop
            self._set(STOPPED, "not spawned: the supervisor is shutting down")
            self._fail_ready_waiters("the supervisor is shutting down")
            return
        try:
            if self.spec.wait_port and not self.port_free(self.spec.port):
                self._port_busy(f"port {self.spec.port} is in use")
                return
        except OSError as e:  # not a port in use (no privilege, no such address): no wait changes it
            self._give_up(START_FAILED, f"cannot listen on port {self.spec.port}: {e.strerror or e}", "not started: ")
            return
        self._protocol = protocol = self._new_protocol()
        try:
            transport = self._spawn_process(protocol)
        except Exception as e:  # noqa: BLE001 - any spawn failure is a failed start
            self._protocol = None
            self._give_up(START_FAILED, f"cannot spawn: {e}")
            return
        self.pid = transport.pid
        self._first_line = self.logs.next_seq
        self.started_at = self.reactor.seconds()
        self.ready, self.phase, self._was_ready = False, None, False
        self.last_error = self.backoff.end_port_wait(self.last_error)  # free: the wait's note goes, once
        program = next((i for i, a in enumerate(self.spec.argv) if a.startswith("service-")), 1)  # not "-P -m twisted"
        self._set(STARTING, f"spawned pid {self.pid}: {' '.join(self.spec.argv[program:program + 3])} ...")
        self._schedule_probe(self.timing.probe_starting)

    def _port_busy(self, why: str) -> None:
        """The port is taken: try again on the back-off schedule until ``port_wait`` is used up."""
        delay = self.backoff.next_port_try(self.reactor.seconds(), self.last_error)
        self.pid, self.started_at, self.ready = None, None, False
        if delay is None:
            self._give_up(START_FAILED, f"{why}; still in use after waiting {self.timing.port_wait:g} s (port_wait_ms)",
                          "could not start: ")
            return
        self.last_error = f"{why}; trying again in {delay:g} s (waiting up to {self.timing.port_wait:g} s)"
        self._set(STARTING, f"not spawned: {self.last_error}")
        self._cancel_timer()
        self._timer = self.reactor.callLater(delay, self._port_retry)

    def _port_retry(self) -> None:
        self._timer = None
        if self.state == STARTING and self._protocol is None:
            self._spawn()

    def _new_protocol(self) -> ChildProtocol:
        return ChildProtocol(self)

    def _spawn_process(self, protocol: ChildProtocol) -> Any:
        """Spawn the group-leader wrapper running the spec's command (a subclass may add descriptors)."""
        argv = spawn.group_leader_argv(self.spec.argv_now() if self.spec.argv_now else self.spec.argv)
        return self.reactor.spawnProcess(protocol, argv[0], argv, env=self.spawn_env(), path=self.spec.cwd)

    def spawn_env(self) -> dict[str, str]:
        """The spec's environment with ``SERVICE_SUPERVISOR_PID`` = this pid now (twistd without -n forks later)."""
        return {**self.spec.env, SUPERVISOR_PID_ENV: str(os.getpid())}

    def _signal(self, sig: int) -> None:
        if self.pid is not None:
            self.killer(self.pid, sig)

    def _kill(self) -> None:
        self._kill_timer = None
        if self.state == STOPPING:
            self.logs.note(f"still running after {self.kill_grace:g} s: SIGKILL to the process group")
            self._signal(signal.SIGKILL)

    # -- exits ------------------------------------------------------------------------------

    def process_ended(self, protocol: ChildProtocol, reason: Any) -> None:
        """The protocol's process exited (``reason`` from processEnded): decide what comes next."""
        if protocol is not self._protocol:
            return
        self._protocol = None
        self.logs.ended()
        if self._kill_timer is not None and self._kill_timer.active():
            self._kill_timer.cancel()
        self._kill_timer = None
        code = 0 if isinstance(reason, ProcessDone) else getattr(reason, "exitCode", None)
        sig = None if isinstance(reason, ProcessDone) else getattr(reason, "signal", None)
        self.last_exit, self.exited_at = spawn.describe_exit(reason), self.reactor.seconds()
        ran = self.reactor.seconds() - (self.started_at or self.reactor.seconds())
        self.pid, self.ready = None, False
        was = self.state
        self._cancel_timer()
        if was == STOPPING:
            self._set(STOPPED, f"exited ({self.last_exit})")
            self._fail_ready_waiters("stopped before it was ready")
            self._fire_exit_waiters()
            return
        # Killed (9) or terminated (15) by someone: no last words, its output is about what it did before.
        tail = "" if sig in (signal.SIGKILL, signal.SIGTERM) else " | ".join(self.logs.last_words(self._first_line))
        if was == STARTING and not self._was_ready and code == 1 and not sig and self.spec.wait_port \
                and spawn.PORT_BUSY_TEXT in tail:
            self._fire_exit_waiters()
            self._port_busy(tail)
            return
        if was == STARTING and not self._was_ready and code == 1 and not sig:
            self._give_up(START_FAILED, tail or f"refused to start ({self.last_exit})", "could not start: ")
            self._fire_exit_waiters()
            return
        clean = (code == 0 and not sig) or sig in spawn.STOP_SIGNALS  # someone's stop, however early it came
        self.last_error = None if clean else (f"{self.last_exit}: {tail}" if tail else self.last_exit)
        self._fire_exit_waiters()
        if self._closing or self.spec.policy == "no" or (clean and self.spec.policy == "on-failure"):
            why = "the supervisor is shutting down" if self._closing else f"restart policy {self.spec.policy!r}"
            self._set(STOPPED if clean or self._closing else FAILED, f"exited ({self.last_exit}); {why}: not restarted")
            self._fail_ready_waiters(self.last_error or self.last_exit or "exited")
            return
        self._schedule_restart(ran)

    def _schedule_restart(self, ran: float) -> None:
        restarts = self.backoff.recent_restarts(self.reactor.seconds())
        if restarts >= self.timing.crash_loop_restarts:
            last = f" (last: {self.last_error or self.last_exit})" if self.last_error or self.last_exit else ""
            self._give_up(FAILED, f"crash loop: restarted {restarts} times in {self.timing.crash_loop_window:g} s; "
                                  f"not restarting{last}")
            return
        delay = self.backoff.crash_delay(ran)
        self._set(BACKOFF, f"exited ({self.last_exit}); restarting in {delay:g} s")
        self._fail_ready_waiters(f"{self.last_error or self.last_exit}; restarting in {delay:g} s")
        self._timer = self.reactor.callLater(delay, self._respawn)

    def _respawn(self) -> None:
        self._timer = None
        if self.state != BACKOFF:
            return
        if problem := self.spec.problem():  # broken since its start: a gateway then refused every API key
            self._give_up(START_FAILED, problem, "not restarted: ")
            return
        self.backoff.restarted(self.reactor.seconds())
        self.restarts += 1
        self._spawn()

    # -- readiness --------------------------------------------------------------------------

    def _schedule_probe(self, delay: float) -> None:
        self._cancel_timer()
        self._timer = self.reactor.callLater(delay, self._probe_now)

    def _probe_now(self) -> None:
        self._timer = None
        if self.state not in (STARTING, RUNNING) or self._probing:
            return
        self._probing = True
        pid, readied = self.pid, self._readied  # a probe sent before the ready line cannot undo it (a slow start)
        d = self.probe(self.spec.port, self.spec.ready_path)
        d.addCallbacks(lambda ok: self._probed(pid, bool(ok), getattr(ok, "reason", None), readied),
                       lambda f: self._probed(pid, False, None, readied))

    def _probed(self, pid: int | None, ok: bool, reason: str | None = None, readied: int = 0) -> None:
        self._probing = False
        if pid != self.pid or self.state not in (STARTING, RUNNING):
            return
        if ok or readied == self._readied:  # else a probe sent before the ready line failed late: stale
            self.phase = None if ok else reason
            if ok and not self.ready:
                self._became_ready()
            elif not ok and self.ready:
                self.ready = False
                self.logs.note(why := f"not ready: {self.spec.ready_path} did not answer 200")
                log.warn("{name}: {why}", name=self.name, why=why)
        interval = self.timing.probe_running if self.state == RUNNING else self.timing.probe_starting
        self._schedule_probe(interval)

    def _became_ready(self) -> None:
        self.ready, self._readied = True, self._readied + 1
        self._was_ready = True
        self.backoff.end_port_wait()  # the wait is over (its note was cleared when the port was found free)
        if self.state == STARTING:
            self._set(RUNNING, "ready")
        else:
            self.logs.note("ready again")
            log.info("{name}: ready again", name=self.name)
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(None)

    # -- waiters and bookkeeping -----------------------------------------------------------------

    def _wait_ready(self) -> Deferred:
        self._ready_waiters.append(d := Deferred[None]())
        d.addBoth(cancelling(self.reactor.callLater(self.timing.start_timeout, self._start_timed_out, d)))
        return d

    def _start_timed_out(self, d: Deferred) -> None:
        if d in self._ready_waiters:
            self._ready_waiters.remove(d)
            d.errback(StartTimedOut.of(self.name, self.timing.start_timeout, self.state))

    def _give_up(self, state: str, error: str, note: str = "") -> None:
        """A start that cannot succeed: ``error`` becomes ``last_error``, the log note and the waiters' failure."""
        self.last_error = error
        self._set(state, note + error)
        self._fail_ready_waiters(error)

    def _fail_ready_waiters(self, why: str) -> None:
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.errback(ChildError(f"{self.name} could not start: {why}"))

    def _wait_exit(self) -> Deferred:
        self._exit_waiters.append(d := Deferred[None]())
        return d

    def _fire_exit_waiters(self) -> None:
        waiters, self._exit_waiters = self._exit_waiters, []
        for d in waiters:
            d.callback(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _set(self, state: str, why: str) -> None:
        self.state = state
        self.logs.note(f"{state}: {why}")  # a failure at error, a crash's back-off at warn: not among the info
        (log.error if state in (FAILED, START_FAILED) else log.warn if state == BACKOFF else log.info)(
            "{name}: {state}: {why}", name=self.name, state=state, why=why)

    def snapshot(self) -> dict[str, Any]:
        """What /api/v1/status shows of this child."""
        now = self.reactor.seconds()
        started = self.started_at if self.state in (STARTING, RUNNING) else None
        return {"state": self.state, "ready": self.ready, "pid": self.pid, "restarts": self.restarts,
                "uptime_s": round(now - started, 1) if started is not None else None,
                "last_error": self.last_error, "last_exit": self.last_exit, "policy": self.spec.policy,
                "phase": self.phase if started is not None and not self.ready else None}
