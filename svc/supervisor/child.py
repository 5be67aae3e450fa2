"""One supervised child process and its state machine.

States (SPEC "Server process states" leaves the transitions to us):

    stopped --start--> starting --first good probe--> running (ready)
    starting --exit 1 before ever ready--> start_failed    (refused: bad config)
    starting --port busy--> starting (no pid; retried on the back-off schedule)
             --still busy after port_wait--> start_failed
    starting|running --crash--> backoff --delay--> starting (policy on-failure/always)
    backoff | crash with policy "no" | crash loop --> failed (no more restarts)
    starting|running --stop--> stopping --exit--> stopped  (TERM to the group, KILL after the grace)
    (a child that cannot be spawned at all, or is refused by the supervisor: failed)

``running`` carries a ``ready`` flag from the child's readiness route, probed
every ``probe_running`` seconds.  A child is started as the leader of its own
process group (and asks the kernel for SIGTERM if the supervisor dies), so a
stop signals the whole group; a new process is spawned only after the old
one has exited, so a port is never reused too early.

A port that is busy when a child is to be spawned (an orphan of a previous
supervisor still exiting, another program) is not a reason to give up at
once: the child stays ``starting`` with no pid and ``last_error`` saying
why, the port is tried again on the back-off schedule (``backoff_initial``
doubling up to ``backoff_max``), and only after ``port_wait`` seconds of a
busy port does the child become ``start_failed``.  A child that exits 1
before it was ever ready saying "Address already in use" (it lost a race for
the port) is treated the same way.

Everything runs on an injected reactor (``spawnProcess``, ``callLater``,
``seconds``) with an injected readiness probe and group-kill function, so the
unit tests drive it with a fake reactor and ``task.Clock``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ProcessDone
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger

from svc.supervisor.logsink import LogSink

log = Logger()

STOPPED, STARTING, RUNNING, STOPPING, BACKOFF, FAILED, START_FAILED = (
    "stopped", "starting", "running", "stopping", "backoff", "failed", "start_failed",
)
STATES = (STOPPED, STARTING, RUNNING, STOPPING, BACKOFF, FAILED, START_FAILED)

#: Runs before the child's own program: become a session (and process group)
#: leader, ask for SIGTERM when the supervisor dies, give up if it already
#: died (the signal would never come), then exec the command.  The child's
#: program tells a stop by its supervisor's death from a normal stop by
#: comparing its parent with SERVICE_SUPERVISOR_PID (svc.process.supervisor_gone).
GROUP_LEADER = (
    "import os, sys\n"
    "os.setsid()\n"
    "try:\n"
    "    import ctypes; ctypes.CDLL(None).prctl(1, 15)\n"
    "except Exception:\n"
    "    pass\n"
    "sup = os.environ.get('SERVICE_SUPERVISOR_PID', '')\n"
    "if sup.isdigit() and os.getppid() != int(sup):\n"
    "    os._exit(1)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)

#: What a child's refusal says when its port is taken (svc.process.ListeningMultiService).
PORT_BUSY_TEXT = "Address already in use"


class ChildError(Exception):
    """An action on a child that cannot be done (answered 500 by the API)."""


@dataclass(frozen=True)
class Timing:
    """Timers of the process manager, in seconds."""

    stop_grace: float = 15.0
    start_timeout: float = 120.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    crash_loop_restarts: int = 5
    crash_loop_window: float = 60.0
    probe_starting: float = 0.5
    probe_running: float = 2.0
    port_wait: float = 60.0


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


class _Protocol(ProcessProtocol):
    def __init__(self, child: Child) -> None:
        self.child = child

    def outReceived(self, data: bytes) -> None:
        self.child.logs.feed("stdout", data)

    def errReceived(self, data: bytes) -> None:
        self.child.logs.feed("stderr", data)

    def processEnded(self, reason: Any) -> None:
        self.child._ended(self, reason.value)


def kill_group(pid: int, sig: int) -> None:
    """Signal the child's whole process group (it is the group leader)."""
    import os

    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind ``host:port`` now.

    SO_REUSEADDR as the children's listeners set it, so connections of a
    previous owner still in TIME_WAIT do not count as busy; on Linux a
    listening socket (also one on the wildcard address) does.
    """
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Child:
    """A supervised process: start, stop, restart, and what happened to it."""

    def __init__(
        self,
        spec: ChildSpec,
        *,
        reactor: Any,
        probe: Callable[[int, str], Deferred],
        logs: LogSink,
        timing: Timing = Timing(),
        killer: Callable[[int, int], None] = kill_group,
        port_free: Callable[[int], bool] = port_is_free,
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
        self._protocol: _Protocol | None = None
        self._restart_times: list[float] = []
        self._consecutive = 0
        self._timer: Any = None  # backoff restart or probe
        self._kill_timer: Any = None
        self._probing = False
        self._ready_waiters: list[Deferred] = []
        self._exit_waiters: list[Deferred] = []
        self._was_ready = False
        self._port_wait_since: float | None = None  # first time the port was found busy
        self._port_tries = 0

    @property
    def name(self) -> str:
        return self.spec.name

    # -- public actions ---------------------------------------------------------------

    def start(self) -> Deferred:
        """Spawn the child; fires when it is ready, fails with ChildError if it cannot start."""
        if self.state in (STARTING, RUNNING, STOPPING):
            return fail(ChildError(f"{self.name} is {self.state}: stop it first or restart it"))
        self._cancel_timer()
        self._restart_times.clear()
        self._consecutive = 0
        self._port_wait_since = None
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
            self._port_wait_since = None
            self._set(STOPPED, "stopped while waiting for its port")
            self._fail_ready_waiters("stopped before it was ready")
            return succeed(None)
        if self.state not in (STARTING, RUNNING):
            return fail(ChildError(f"{self.name} is {self.state}, not running"))
        d = self._wait_exit()
        self._set(STOPPING, "stopping: SIGTERM to the process group")
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
            self.last_error = self.spec.refused
            self._set(FAILED, f"not started: {self.spec.refused}")
            self._fail_ready_waiters(self.spec.refused)
            return
        if self.spec.wait_port and not self.port_free(self.spec.port):
            self._port_busy(f"port {self.spec.port} is in use")
            return
        self._protocol = protocol = self._new_protocol()
        try:
            transport = self._spawn_process(protocol)
        except Exception as e:  # noqa: BLE001 - any spawn failure is a failed start
            self._protocol = None
            self.last_error = f"cannot spawn: {e}"
            self._set(START_FAILED, self.last_error)
            self._fail_ready_waiters(self.last_error)
            return
        self.pid = transport.pid
        self.started_at = self.reactor.seconds()
        self.ready = False
        self._was_ready = False
        self._set(STARTING, f"spawned pid {self.pid}: {' '.join(self.spec.argv[1:4])} ...")
        self._schedule_probe(self.timing.probe_starting)

    def _port_busy(self, why: str) -> None:
        """The port is taken: try again on the back-off schedule until ``port_wait`` is used up."""
        now = self.reactor.seconds()
        if self._port_wait_since is None:
            self._port_wait_since, self._port_tries = now, 0
        waited = now - self._port_wait_since
        left = self.timing.port_wait - waited
        self.pid = None
        self.started_at = None
        self.ready = False
        if left <= 0:
            self._port_wait_since = None
            self.last_error = f"{why}; still in use after waiting {self.timing.port_wait:g} s (port_wait_ms)"
            self._set(START_FAILED, f"could not start: {self.last_error}")
            self._fail_ready_waiters(self.last_error)
            return
        delay = min(self.timing.backoff_max, self.timing.backoff_initial * 2 ** self._port_tries, left)
        self._port_tries += 1
        self.last_error = f"{why}; trying again in {delay:g} s (waiting up to {self.timing.port_wait:g} s)"
        self._set(STARTING, f"not spawned: {self.last_error}")
        self._cancel_timer()
        self._timer = self.reactor.callLater(delay, self._port_retry)

    def _port_retry(self) -> None:
        self._timer = None
        if self.state == STARTING and self._protocol is None:
            self._spawn()

    def _new_protocol(self) -> _Protocol:
        return _Protocol(self)

    def _spawn_process(self, protocol: _Protocol) -> Any:
        """Spawn the group-leader wrapper running the spec's command (a subclass may add descriptors)."""
        argv = [sys.executable, "-c", GROUP_LEADER, *self.spec.argv]
        return self.reactor.spawnProcess(protocol, sys.executable, argv, env=self.spec.env, path=self.spec.cwd)

    def _signal(self, sig: int) -> None:
        if self.pid is not None:
            self.killer(self.pid, sig)

    def _kill(self) -> None:
        self._kill_timer = None
        if self.state == STOPPING:
            self.logs.note(f"still running after {self.timing.stop_grace:g} s: SIGKILL to the process group")
            self._signal(signal.SIGKILL)

    # -- exits ------------------------------------------------------------------------------

    def _ended(self, protocol: _Protocol, reason: Any) -> None:
        if protocol is not self._protocol:
            return
        self._protocol = None
        self.logs.ended()
        if self._kill_timer is not None and self._kill_timer.active():
            self._kill_timer.cancel()
        self._kill_timer = None
        code = getattr(reason, "exitCode", None)
        sig = getattr(reason, "signal", None)
        if isinstance(reason, ProcessDone):
            code, sig = 0, None
        self.last_exit = f"killed by signal {sig}" if sig else f"exit code {code}"
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
                and PORT_BUSY_TEXT in tail:
            self._fire_exit_waiters()
            self._port_busy(tail)
            return
        if was == STARTING and not self._was_ready and code == 1 and not sig:
            self.last_error = tail or f"refused to start ({self.last_exit})"
            self._set(START_FAILED, f"could not start: {self.last_error}")
            self._fail_ready_waiters(self.last_error)
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
        now = self.reactor.seconds()
        window = self.timing.crash_loop_window
        self._restart_times = [t for t in self._restart_times if now - t < window]
        if len(self._restart_times) >= self.timing.crash_loop_restarts:
            self.last_error = (
                f"crash loop: restarted {len(self._restart_times)} times in {window:g} s; not restarting"
                + (f" (last: {self.last_error})" if self.last_error else "")
            )
            self._set(FAILED, self.last_error)
            self._fail_ready_waiters(self.last_error)
            return
        self._consecutive = 1 if ran >= window else self._consecutive + 1
        delay = min(self.timing.backoff_max, self.timing.backoff_initial * 2 ** (self._consecutive - 1))
        self._set(BACKOFF, f"exited ({self.last_exit}); restarting in {delay:g} s")
        self._fail_ready_waiters(f"{self.last_error or self.last_exit}; restarting in {delay:g} s")
        self._timer = self.reactor.callLater(delay, self._respawn)

    def _respawn(self) -> None:
        self._timer = None
        if self.state != BACKOFF:
            return
        self._restart_times.append(self.reactor.seconds())
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
        d.addCallbacks(lambda ok: self._probed(pid, bool(ok)), lambda f: self._probed(pid, False))

    def _probed(self, pid: int | None, ok: bool) -> None:
        self._probing = False
        if pid != self.pid or self.state not in (STARTING, RUNNING):
            return
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
        if self._port_wait_since is not None:  # the wait is over: its note is no error any more
            self._port_wait_since = None
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
        d.addBoth(lambda r: (timer.cancel() if timer.active() else None, r)[1])
        return d

    def _start_timed_out(self, d: Deferred) -> None:
        if d in self._ready_waiters:
            self._ready_waiters.remove(d)
            d.errback(ChildError(f"{self.name} did not become ready within {self.timing.start_timeout:g} s "
                                 f"(state {self.state})"))

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
        up = self.state in (STARTING, RUNNING) and self.started_at is not None
        return {
            "state": self.state,
            "ready": self.ready,
            "pid": self.pid,
            "restarts": self.restarts,
            "uptime_s": round(now - self.started_at, 1) if up else None,
            "last_error": self.last_error,
            "last_exit": self.last_exit,
            "policy": self.spec.policy,
        }
