"""One supervised child process and its state machine.

States (docs/contract.md names them; the transitions are ours)::

    stopped --start--> starting --first good probe--> running (ready)
    starting --exit 1 before ever ready--> start_failed    (refused: bad config)
    starting --port busy--> starting (no pid; retried on the back-off schedule)
             --still busy after port_wait--> start_failed
    starting|running --crash--> backoff --delay--> starting (policy on-failure/always)
    backoff | crash with policy "no" | crash loop --> failed (no more restarts)
    starting|running --stop--> stopping --exit--> stopped  (TERM to the group, KILL after the grace)
    (a child that cannot be spawned at all, or is refused by the supervisor: failed)

``running`` carries a ``ready`` flag from the child's readiness route, probed every
``probe_running`` seconds.  A new process is spawned only after the old one has exited, so a port
is never reused too early; how a process is spawned and signalled (its own process group) is
:mod:`svc.supervisor.spawn`.

A port that is busy when a child is to be spawned (an orphan of a previous supervisor still
exiting, another program) keeps the child ``starting`` with no pid and ``last_error`` saying why;
it is tried again on the back-off schedule until ``port_wait`` is used up
(:mod:`svc.supervisor.backoff`, which also holds the crash-loop limit).  A child that exits 1
before it was ever ready saying "Address already in use" (it lost a race for the port) is
treated the same way.

Everything runs on an injected reactor (``spawnProcess``, ``callLater``, ``seconds``) with an
injected readiness probe and group-kill function: unit tests drive it with ``task.Clock``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ProcessDone
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from svc.infra.reactors import IServiceReactor, cancelling
from svc.supervisor import spawn
from svc.supervisor.backoff import Backoff, Timing
from svc.supervisor.logsink import LogSink
from svc.supervisor.spawn import ChildProtocol

log = Logger()

STOPPED, STARTING, RUNNING, STOPPING, BACKOFF, FAILED, START_FAILED = (
    "stopped", "starting", "running", "stopping", "backoff", "failed", "start_failed")
STATES = (STOPPED, STARTING, RUNNING, STOPPING, BACKOFF, FAILED, START_FAILED)


class ChildError(Exception):
    """An action on a child that cannot be done (answered 500 by the API)."""


@dataclass
class ChildSpec:
    """What to run and how to watch it."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    ready_path: str
    policy: str = "on-failure"
    cwd: str | None = None
    refused: str | None = None  # the supervisor refuses to spawn it (permanent failure)
    wait_port: bool = True  # a busy port is waited for (port_wait) before start_failed
    info: dict[str, Any] = field(default_factory=dict)


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
        self.spec = spec
        self.reactor = reactor
        self.probe = probe
        self.logs = logs
        self.timing = timing
        self.killer = killer
        self.port_free = port_free
        self.state = STOPPED
        self.ready = False
        self.pid: int | None = None
        self.restarts = 0
        self.started_at: float | None = None
        self.last_error: str | None = None
        self.last_exit: str | None = None
        self.phase: str | None = None  # what a starting child says it does (its /ready's 503 reason)
        self._protocol: ChildProtocol | None = None
        self.backoff = Backoff(timing)
        self._timer: IDelayedCall | None = None  # backoff restart or probe
        self._kill_timer: IDelayedCall | None = None
        self._probing = False
        self._ready_waiters: list[Deferred] = []
        self._exit_waiters: list[Deferred] = []
        self._was_ready = False

    @property
    def name(self) -> str:
        return self.spec.name

    # -- public actions ---------------------------------------------------------------

    def start(self) -> Deferred:
        """Spawn the child; fires when it is ready, fails with ChildError if it cannot start."""
        if self.state in (STARTING, RUNNING, STOPPING):
            return fail(ChildError(f"{self.name} is {self.state}: stop it first or restart it"))
        self._cancel_timer()
        self.backoff.reset()
        d = self._wait_ready()
        self._spawn()
        return d

    def stop(self) -> Deferred:
        """TERM the process group, KILL after the grace; fires once it has exited."""
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
            return fail(ChildError(f"{self.name} is {self.state}, not running"))
        d = self._wait_exit()
        self._set(STOPPING, "SIGTERM to the process group")
        self._cancel_timer()
        self.ready = False
        self._signal(signal.SIGTERM)
        self._kill_timer = self.reactor.callLater(self.timing.stop_grace, self._kill)
        return d

    def restart(self) -> Deferred:
        """Stop if running (waiting for the exit), then start; counts as a restart."""
        if self.state in (STARTING, RUNNING, STOPPING):
            d = self.stop()
        else:
            d = succeed(None)

        def again(_: Any) -> Deferred:
            self.restarts += 1
            return self.start()

        return d.addCallback(again)

    def shutdown(self) -> Deferred:
        """Stop for the supervisor's own shutdown: whatever the state, end up stopped."""
        if self.state in (STARTING, RUNNING, STOPPING, BACKOFF):
            return self.stop()
        return succeed(None)

    # -- spawning ---------------------------------------------------------------------------

    def _spawn(self) -> None:
        if self.spec.refused:
            self._give_up(FAILED, self.spec.refused, "not started: ")
            return
        if self.spec.wait_port and not self.port_free(self.spec.port):
            self._port_busy(f"port {self.spec.port} is in use")
            return
        self._protocol = protocol = self._new_protocol()
        try:
            transport = self._spawn_process(protocol)
        except Exception as e:  # noqa: BLE001 - any spawn failure is a failed start
            self._protocol = None
            self._give_up(START_FAILED, f"cannot spawn: {e}")
            return
        self.pid = transport.pid
        self.started_at = self.reactor.seconds()
        self.ready = False
        self.phase = None
        self._was_ready = False
        self._set(STARTING, f"spawned pid {self.pid}: {' '.join(self.spec.argv[1:4])} ...")
        self._schedule_probe(self.timing.probe_starting)

    def _port_busy(self, why: str) -> None:
        """The port is taken: try again on the back-off schedule until ``port_wait`` is used up."""
        delay = self.backoff.next_port_try(self.reactor.seconds())
        self.pid = None
        self.started_at = None
        self.ready = False
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
        argv = spawn.group_leader_argv(self.spec.argv)
        return self.reactor.spawnProcess(protocol, argv[0], argv, env=self.spec.env, path=self.spec.cwd)

    def _signal(self, sig: int) -> None:
        if self.pid is not None:
            self.killer(self.pid, sig)

    def _kill(self) -> None:
        self._kill_timer = None
        if self.state == STOPPING:
            self.logs.note(f"still running after {self.timing.stop_grace:g} s: SIGKILL to the process group")
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
        self.last_exit = spawn.describe_exit(reason)
        ran = self.reactor.seconds() - (self.started_at or self.reactor.seconds())
        self.pid = None
        self.ready = False
        was = self.state
        self._cancel_timer()
        if was == STOPPING:
            self._set(STOPPED, f"exited ({self.last_exit})")
            self._fail_ready_waiters("stopped before it was ready")
            self._fire_exit_waiters()
            return
        tail = " | ".join(self.logs.tail(2))
        if was == STARTING and not self._was_ready and code == 1 and not sig and self.spec.wait_port \
                and spawn.PORT_BUSY_TEXT in tail:
            self._fire_exit_waiters()
            self._port_busy(tail)
            return
        if was == STARTING and not self._was_ready and code == 1 and not sig:
            self._give_up(START_FAILED, tail or f"refused to start ({self.last_exit})", "could not start: ")
            self._fire_exit_waiters()
            return
        clean = code == 0 and not sig
        self.last_error = None if clean else (f"{self.last_exit}: {tail}" if tail else self.last_exit)
        self._fire_exit_waiters()
        if self.spec.policy == "no" or (clean and self.spec.policy == "on-failure"):
            state = STOPPED if clean else FAILED
            self._set(state, f"exited ({self.last_exit}); restart policy {self.spec.policy!r}: not restarting")
            self._fail_ready_waiters(self.last_error or "exited")
            return
        self._schedule_restart(ran)

    def _schedule_restart(self, ran: float) -> None:
        restarts = self.backoff.recent_restarts(self.reactor.seconds())
        if restarts >= self.timing.crash_loop_restarts:
            last = f" (last: {self.last_error})" if self.last_error else ""
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
        pid = self.pid
        d = self.probe(self.spec.port, self.spec.ready_path)
        d.addCallbacks(lambda ok: self._probed(pid, bool(ok), getattr(ok, "reason", None)),
                       lambda f: self._probed(pid, False))

    def _probed(self, pid: int | None, ok: bool, reason: str | None = None) -> None:
        self._probing = False
        if pid != self.pid or self.state not in (STARTING, RUNNING):
            return
        self.phase = None if ok else reason
        if ok and not self.ready:
            self._became_ready()
        elif not ok and self.ready:
            self.ready = False
            self.logs.note(f"not ready: {self.spec.ready_path} did not answer 200")
        interval = self.timing.probe_running if self.state == RUNNING else self.timing.probe_starting
        self._schedule_probe(interval)

    def _became_ready(self) -> None:
        self.ready = True
        self._was_ready = True
        if self.backoff.end_port_wait():  # the wait is over: its note is no error any more
            self.last_error = None
        if self.state == STARTING:
            self._set(RUNNING, "ready")
        else:
            self.logs.note("ready again")
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(None)

    # -- waiters and bookkeeping -----------------------------------------------------------------

    def _wait_ready(self) -> Deferred:
        d: Deferred = Deferred()
        self._ready_waiters.append(d)
        timer = self.reactor.callLater(self.timing.start_timeout, self._start_timed_out, d)
        d.addBoth(cancelling(timer))
        return d

    def _start_timed_out(self, d: Deferred) -> None:
        if d in self._ready_waiters:
            self._ready_waiters.remove(d)
            d.errback(ChildError(f"{self.name} did not become ready within {self.timing.start_timeout:g} s "
                                 f"(state {self.state})"))

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
        d: Deferred = Deferred()
        self._exit_waiters.append(d)
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
        self.logs.note(f"{state}: {why}")
        log.info("{name}: {state}: {why}", name=self.name, state=state, why=why)

    def snapshot(self) -> dict[str, Any]:
        """What /api/v1/status shows of this child."""
        now = self.reactor.seconds()
        started = self.started_at if self.state in (STARTING, RUNNING) else None
        return {
            "state": self.state,
            "ready": self.ready,
            "pid": self.pid,
            "restarts": self.restarts,
            "uptime_s": round(now - started, 1) if started is not None else None,
            "last_error": self.last_error,
            "last_exit": self.last_exit,
            "policy": self.spec.policy,
            "phase": self.phase if started is not None and not self.ready else None,
        }
