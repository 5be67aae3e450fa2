"""The gateway child: the supervisor owns its listening socket, and a restart is a handover.

Keys are reloaded only by restarting the gateway, so a restart must not turn
clients away.  The supervisor binds the gateway's address (``[gateway]`` host
and port, the same wildcard rule as the gateway's) when the gateway first
starts, and gives the open socket to every gateway process as fd 3
(``--listen-fd 3``); the process adopts it instead of binding.  A restart:

1. spawns the new gateway on the same socket while the old one still
   accepts (both accept from one kernel backlog: no connection is refused);
2. waits for the new process's ready line on its own pipe (fd 4,
   ``--ready-fd 4``): a probe through the shared socket could be answered by
   the old process, the pipe cannot;
3. makes the new process the current one (pid, restarts + 1) and sends
   SIGTERM to the old process group: it stops accepting, says so on its
   pipe (``closed``), finishes the requests it holds, and exits (SIGKILL
   after ``upstream_recv_timeout_ms`` + 2 s, or ``stop_grace`` when longer);
4. answers the restart once the old process said ``closed`` (or exited):
   from then on every new connection reaches the new process, so a key
   added before the restart works on the next request.

If the new process exits or stays silent for ``start_timeout``, it is
stopped, the old one keeps serving, and the restart fails (the API answers
500 with the new process's last lines).  A gateway that crashes is respawned
on the same socket: connections wait in the backlog meanwhile.  The socket
is closed when no gateway is meant to serve (stopped, failed, refused), so
clients are refused then instead of waiting for nothing.

When the supervisor cannot bind (an address the bind refuses; a wildcard
without SERVICE_EXPOSE stops the supervisor at start, svc.supervisor.tap),
the gateway is started without a socket and binds, or refuses, by itself as
when started by hand; restarts
then stop the old process before starting the new one.  A port held by
another process is waited for first, as a model's is, and the gateway is
``start_failed`` if it is still held after ``port_wait``.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from svc.infra.binds import bind_problem
from svc.infra.reactors import follow
from svc.supervisor.child import BACKOFF, FAILED, RUNNING, START_FAILED, STARTING, STOPPED, Child, ChildError, ChildSpec
from svc.supervisor.spawn import ChildProtocol, bind_listening_socket, describe_exit, group_leader_argv

log = Logger()

#: Descriptors of the gateway process: the listening socket and the ready pipe.
LISTEN_FD, READY_FD = 3, 4
class _GatewayProtocol(ChildProtocol):
    """One gateway process: whole lines to the log (two processes may write at
    once during a handover), its own last lines, and the ready pipe."""

    def __init__(self, child: GatewayChild) -> None:
        super().__init__(child)
        self.gateway = child
        self.pid: int | None = None
        self.tail: deque[str] = deque(maxlen=3)
        self._partial: dict[int, bytes] = {}
        self._signalled = False

    def childDataReceived(self, fd: int, data: bytes) -> None:
        buffered = self._partial.get(fd, b"") + data
        *lines, rest = buffered.split(b"\n")
        self._partial[fd] = rest[-65536:]
        for raw in lines:
            self._line(fd, raw.decode("utf-8", "replace").rstrip("\r"))

    def _line(self, fd: int, text: str) -> None:
        if fd == READY_FD:
            if text.startswith("ready") and not self._signalled:
                self._signalled = True
                self.gateway.ready_line(self)
            elif text.startswith("closed"):
                self.gateway.closed_line(self)
            return
        self.tail.append(text)
        self.child.logs.line("stdout" if fd == 1 else "stderr", text)

    def processEnded(self, reason: Any) -> None:
        for fd, rest in list(self._partial.items()):
            if rest and fd != READY_FD:
                self._line(fd, rest.decode("utf-8", "replace"))
        self._partial.clear()
        super().processEnded(reason)


@dataclass
class _Handover:
    protocol: _GatewayProtocol
    pid: int
    done: Deferred
    timer: IDelayedCall


@dataclass
class _Retiring:
    """An old gateway process after SIGTERM: ``closed`` fires when it accepts no more."""

    pid: int
    kill_timer: IDelayedCall
    closed: list[Deferred]


class GatewayChild(Child):
    """The ``__gateway`` child: one status entry, however many processes a handover overlaps."""

    def __init__(
        self,
        spec: ChildSpec,
        *,
        host: str,
        env: dict[str, str],
        binder: Callable[[str, int], Any] = bind_listening_socket,
        drain_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(spec, **kwargs)
        # A retired or stopping gateway answers what it holds before it exits: up to its upstream_recv_timeout_ms and
        # the second it gives idle connections (docs/operations.md, "Shutdown"); it is killed only after that, so that
        # a key reload, a stop or a host's shutdown loses nothing (a request cut was run again on another host).
        self.kill_grace = max(self.timing.stop_grace, drain_s)
        # The socket this child holds is its own: only a port held by someone
        # else (an orphaned gateway of a killed supervisor) is waited for.
        port_free = self.port_free
        self.port_free = lambda port: self.listener is not None or port_free(port)
        self.host = host
        self.env = env
        self.binder = binder
        self.listener: Any = None  # the socket held for the gateway, or None
        self._handover: _Handover | None = None
        self._retiring: dict[_GatewayProtocol, _Retiring] = {}
        self._retired_waiters: list[Deferred] = []
        self._keep_listener = False
        self._again: Deferred | None = None  # the restart asked for during a handover, run once it ends


    def _listening_socket(self) -> Any:
        if self.listener is None:
            if bind_problem(self.host, self.env, "the gateway"):
                return None  # the gateway itself refuses it, with its own message
            try:
                self.listener = self.binder(self.host, self.spec.port)
            except OSError as e:
                self.logs.note(f"cannot hold {self.host}:{self.spec.port} for the gateway ({e}); "
                               "it binds the port itself")
                return None
            self.logs.note(f"holding the listening socket {self.host}:{self.spec.port}; "
                           "each gateway process accepts on it")
        return self.listener

    def _close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            self.logs.note(why := "listening socket closed: connections are refused until the gateway starts again")
            (log.info if self._closing else log.warn)("{name}: {why}", name=self.name, why=why)

    def _set(self, state: str, why: str) -> None:
        super()._set(state, why)
        if state in (STOPPED, FAILED, START_FAILED) and self._handover is None and not self._keep_listener:
            self._close_listener()

    # -- spawning ----------------------------------------------------------------------------

    def _new_protocol(self) -> _GatewayProtocol:
        return _GatewayProtocol(self)

    def _spawn_process(self, protocol: ChildProtocol) -> Any:
        """The gateway with the ready pipe on fd 4 and, when held, the socket on fd 3.

        childFDs are dup2'd into place, which makes them inheritable, so they
        survive the group-leader wrapper's exec.
        """
        fds: dict[int, Any] = {0: "w", 1: "r", 2: "r", READY_FD: "r"}
        extra = ["--ready-fd", str(READY_FD)]
        sock = self._listening_socket()
        if sock is not None:
            fds[LISTEN_FD] = sock.fileno()
            extra += ["--listen-fd", str(LISTEN_FD)]
        argv = group_leader_argv([*self.spec.argv, *extra])
        transport = self.reactor.spawnProcess(protocol, argv[0], argv, env=self.spawn_env(),
                                              path=self.spec.cwd, childFDs=fds)
        protocol.pid = transport.pid
        return transport

    def ready_line(self, protocol: _GatewayProtocol) -> None:
        """A gateway process wrote its ready line: it accepts on the socket now."""
        if self._handover is not None and protocol is self._handover.protocol:
            self._promote()
        elif protocol is self._protocol and self.state == STARTING and not self.ready:
            self._became_ready()
            self._schedule_probe(self.timing.probe_running)

    # -- restart as a handover --------------------------------------------------------------

    def restart(self) -> Deferred:
        """Start the new gateway beside the running one, then retire the old one.

        Fires once the new process accepts and the old one no longer does; fails (the old one still serving)
        if it exits or is not ready within ``start_timeout``.  Without a held
        socket, or when not running, it is a plain stop-then-start.
        """
        if self._handover is not None:
            return self._restart_after(self._handover.done)
        if self._closing:
            return fail(ChildError(f"{self.name}: the supervisor is shutting down"))
        if problem := self.spec.restart_problem():  # the running gateway keeps serving
            return fail(ChildError(problem))
        if self.state != RUNNING or self._protocol is None or self.listener is None:
            self._keep_listener = True
            d = super().restart()

            def settle(result: Any) -> Any:
                self._keep_listener = False
                if self.state not in (STARTING, RUNNING, BACKOFF):
                    self._close_listener()
                return result

            return d.addBoth(settle)
        protocol = self._new_protocol()
        try:
            transport = self._spawn_process(protocol)
        except Exception as e:  # noqa: BLE001 - the old gateway keeps serving
            return fail(ChildError(f"{self.name}: cannot spawn the new gateway: {e}"))
        done: Deferred = Deferred()
        timer = self.reactor.callLater(self.timing.start_timeout, self._handover_timed_out)
        self._handover = _Handover(protocol, transport.pid, done, timer)
        self.logs.note(f"handover: spawned pid {transport.pid} on the same socket beside pid {self.pid}; "
                       "waiting for its ready line")
        return follow(done)

    def _restart_after(self, current: Deferred) -> Deferred:
        """A restart asked for while one is under way: one more, once that one ends.

        Joining the running one would not do: its new gateway may have read
        the key file before the edit this restart is asked for (``svcctl keys
        add`` run twice at once answered 500 to the second, whose key was live
        only by chance).  Every request made meanwhile shares the one after; a
        stop (or the supervisor's shutdown) in the meantime calls it off.
        """
        if self._again is None:
            self._again = again = Deferred[None]()
            stops = self._stops

            def rerun(_: Any) -> Deferred:
                self._again = None
                if self._stops != stops or self._closing:
                    return fail(ChildError(f"{self.name}: stopped before it started again"))
                return self.restart()

            follow(current).addBoth(rerun).chainDeferred(again)
        return follow(self._again)

    def _promote(self) -> None:
        h = self._handover
        assert h is not None
        self._handover = None
        if h.timer.active():
            h.timer.cancel()
        old_protocol, old_pid = self._protocol, self.pid
        self._cancel_timer()
        self._protocol, self.pid = h.protocol, h.pid
        self.started_at = self.reactor.seconds()
        self.restarts += 1
        self.last_error = None
        closed: Deferred = succeed(None)
        if old_protocol is not None and old_pid is not None:
            closed = self._retire(old_protocol, old_pid)  # type: ignore[arg-type]
            self.logs.note(f"handover: pid {h.pid} accepts; SIGTERM to the previous pid {old_pid}, "
                           "which finishes its requests and exits")
        if self.state == RUNNING:
            self.ready = self._was_ready = True
        else:  # the old process died meanwhile (back-off): the new one takes over
            self.state = STARTING
            self._became_ready()
        self._schedule_probe(self.timing.probe_running)
        closed.chainDeferred(h.done)

    def _handover_timed_out(self) -> None:
        h, self._handover = self._handover, None
        if h is None:
            return
        self._retire(h.protocol, h.pid)
        why = (f"the new gateway (pid {h.pid}) did not become ready within {self.timing.start_timeout:g} s; "
               f"the previous one (pid {self.pid}) still serves")
        self.logs.note(f"handover failed: {why}")
        h.done.errback(ChildError(f"{self.name}: {why}"))

    def _abort_handover(self, why: str) -> None:
        h, self._handover = self._handover, None
        if h is None:
            return
        if h.timer.active():
            h.timer.cancel()
        self._retire(h.protocol, h.pid)
        self.logs.note(f"handover abandoned: {why}")
        h.done.errback(ChildError(f"{self.name}: restart abandoned: {why}"))

    # -- old processes ------------------------------------------------------------------------

    def _retire(self, protocol: _GatewayProtocol, pid: int) -> Deferred:
        """SIGTERM now, SIGKILL after the grace; its exit no longer changes the state.

        Fires once the process accepts no more: its ``closed`` line, its exit, or the SIGKILL.
        """
        self.killer(pid, signal.SIGTERM)
        timer = self.reactor.callLater(self.kill_grace, self._kill_retired, protocol)
        closed: Deferred = Deferred()
        self._retiring[protocol] = _Retiring(pid, timer, [closed])
        return closed

    def closed_line(self, protocol: _GatewayProtocol) -> None:
        """A gateway process accepts no more (its ``closed`` line; a retiring one's exit or SIGKILL too).  The
        current one says so after a signal sent to it (its clean stop): the socket is let go at once, as by a stop,
        so new connections are refused, not left in a backlog nobody accepts from until its drain ends."""
        retiring = self._retiring.get(protocol)
        if retiring is not None:
            waiters, retiring.closed = retiring.closed, []
            for d in waiters:
                d.callback(None)
        elif protocol is self._protocol and self._handover is None and not self._keep_listener:
            if self.listener is not None:
                self.logs.note(f"pid {self.pid} no longer accepts (a signal sent to it: its clean stop)")
            self._close_listener()

    def _kill_retired(self, protocol: _GatewayProtocol) -> None:
        retiring = self._retiring.get(protocol)
        if retiring is not None:
            self.logs.note(f"previous pid {retiring.pid} still running after {self.kill_grace:g} s: SIGKILL")
            self.killer(retiring.pid, signal.SIGKILL)
            self.closed_line(protocol)

    def process_ended(self, protocol: Any, reason: Any) -> None:
        if protocol in self._retiring:
            self.closed_line(protocol)
            retiring = self._retiring.pop(protocol)
            if retiring.kill_timer.active():
                retiring.kill_timer.cancel()
            self.logs.note(f"previous pid {retiring.pid} exited ({describe_exit(reason)})")
            if not self._retiring:
                waiters, self._retired_waiters = self._retired_waiters, []
                for d in waiters:
                    d.callback(None)
            return
        h = self._handover
        if h is not None and protocol is h.protocol:
            self._handover = None
            if h.timer.active():
                h.timer.cancel()
            said = " | ".join(protocol.tail) or "no output"
            why = f"the new gateway (pid {h.pid}) exited before it was ready ({describe_exit(reason)}): {said}"
            self.last_error = why
            self.logs.note(f"handover failed: {why}; the previous one (pid {self.pid}) still serves")
            h.done.errback(ChildError(f"{self.name}: {why}; the previous gateway (pid {self.pid}) still serves"))
            return
        super().process_ended(protocol, reason)

    def _retired_gone(self) -> Deferred:
        if not self._retiring:
            return succeed(None)
        d: Deferred = Deferred()
        self._retired_waiters.append(d)
        return d

    # -- stopping ------------------------------------------------------------------------------

    def stop(self) -> Deferred:
        """Stop the current process, a new one being handed over, and the old ones still finishing.

        The held socket is let go at once (not when the process has exited):
        the socket closes as soon as the gateway stops accepting, so new
        connections are refused (a load balancer sends them elsewhere)
        instead of waiting in a backlog nobody will accept from, to be reset.
        """
        self._stops += 1  # before the handover is abandoned: the restart waiting on it reads it (counted twice)
        self._abort_handover("the gateway is being stopped")
        if not self._keep_listener:
            self._close_listener()
        return super().stop().addCallback(lambda _: self._retired_gone())

    def shutdown(self) -> Deferred:
        """The supervisor stops: every gateway process ends, then the socket is closed."""
        self._abort_handover("the supervisor is stopping")

        def closed(result: Any) -> Any:
            self._close_listener()
            return result

        return super().shutdown().addCallback(lambda _: self._retired_gone()).addBoth(closed)
