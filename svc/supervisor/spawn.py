"""How a child process is spawned, watched and signalled; nothing about its states.

A child runs as the leader of its own process group (``GROUP_LEADER``), so
a stop signals the whole group (``kill_group``); its output and its end
reach the supervisor through ``ChildProtocol``.  ``port_is_free`` tells
whether a child's port could be bound now, ``bind_listening_socket`` binds
the socket the supervisor holds for the gateway.  The state machine that decides
when to do which is :mod:`svc.supervisor.child`.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
from typing import Any, Protocol

from twisted.internet.error import ProcessDone
from twisted.internet.protocol import ProcessProtocol

from svc.contract.protocol import CPU_AFFINITY_ENV
from svc.supervisor.logsink import LogSink

#: Runs before the child's own program: become a session (and process group)
#: leader, ask for SIGTERM when the supervisor dies, give up if it already
#: died (the signal would never come), pin the process to the CPUs of
#: SERVICE_CPU_AFFINITY when given (a replica's ``cpus``; inherited by every
#: thread it starts), then exec the command.  The child's program tells a
#: stop by its supervisor's death from a normal stop by comparing its parent
#: with SERVICE_SUPERVISOR_PID (svc.infra.process.supervisor_gone).  A CPU list
#: that cannot be applied is one line on stderr and exit 1: a refused start.
GROUP_LEADER = (
    "import os, sys\n"
    "os.setsid()\n"
    "try:\n"
    "    import ctypes; ctypes.CDLL(None).prctl(1, 15)\n"
    "except Exception:\n"
    "    pass\n"
    "sup = os.environ.get('SERVICE_SUPERVISOR_PID', '')\n"
    "if sup.isdigit() and os.getppid() != int(sup):\n"
    "    sys.stderr.write('the supervisor (pid %s) is gone: not starting\\n' % sup)\n"
    "    os._exit(1)\n"
    f"cpus = os.environ.get('{CPU_AFFINITY_ENV}', '')\n"
    "if cpus:\n"
    "    try:\n"
    "        os.sched_setaffinity(0, [int(c) for c in cpus.split(',')])\n"
    "    except (OSError, ValueError, AttributeError) as e:\n"
    f"        sys.stderr.write('{CPU_AFFINITY_ENV}=%s cannot be applied: %s\\n' % (cpus, e))\n"
    "        os._exit(1)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)

#: The signals that stop a child cleanly when someone sends them (``kill``, a terminal): its exit by one of them,
#: even before its program could turn it into exit 0 (while Python imports), is a stop, not a crash to restart.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})

#: What a child's refusal says when its port is taken (svc.infra.process.ListeningMultiService).
PORT_BUSY_TEXT = "Address already in use"


def group_leader_argv(argv: list[str]) -> list[str]:
    """The arguments of ``spawnProcess`` that run ``argv`` under the group-leader wrapper.

    ``-P``: the wrapper's imports (ctypes) come from the interpreter, not from the working directory.
    """
    return [sys.executable, "-P", "-c", GROUP_LEADER, *argv]


class Watcher(Protocol):
    """What a :class:`ChildProtocol` reports to: the child's log sink and the end of its process."""

    logs: LogSink

    def process_ended(self, protocol: Any, reason: Any) -> None: ...


class ChildProtocol(ProcessProtocol):
    """One child process: stdout and stderr to its log sink, its end to the child."""

    pid: int | None  # the process's, set once spawned (svc.supervisor.handover)

    def __init__(self, child: Watcher) -> None:
        self.child = child

    def outReceived(self, data: bytes) -> None:
        self.child.logs.feed("stdout", data)

    def errReceived(self, data: bytes) -> None:
        self.child.logs.feed("stderr", data)

    def processEnded(self, reason: Any) -> None:
        self.child.process_ended(self, reason.value)


def describe_exit(reason: Any) -> str:
    """``exit code N`` or ``killed by signal N`` from a processEnded reason."""
    if isinstance(reason, ProcessDone):
        return "exit code 0"
    sig = getattr(reason, "signal", None)
    return f"killed by signal {sig}" if sig else f"exit code {getattr(reason, 'exitCode', None)}"


def kill_group(pid: int, sig: int) -> None:
    """Signal the child's whole process group (it is the group leader)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind ``host:port`` now: False while another holds it.

    SO_REUSEADDR as the children's listeners set it, so connections of a
    previous owner still in TIME_WAIT do not count as busy; on Linux a
    listening socket (also one on the wildcard address) does.  Any other
    failure to bind (a port below 1024 without the privilege, an address the
    host lacks) is raised: waiting would not change it, and it was reported
    as "in use" for a minute while nothing listened there.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


#: Connections the kernel queues while no gateway accepts (capped by net.core.somaxconn).
BACKLOG = 1024


def bind_listening_socket(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A non-blocking listening TCP socket on ``host:port`` (SO_REUSEADDR, as Twisted binds)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
