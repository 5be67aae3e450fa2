"""A child's log output that never blocks its reactor on the supervisor's pipe.

The gateway and the model servers write their log (every access line) to
stdout, a pipe the supervisor reads.  A pipe holds 64 KiB: when the supervisor
stops reading (paused with SIGSTOP, its reactor held by a slow disk), the next
write blocked the child's reactor, and within seconds the public gateway
answered nothing.  Here a write goes to the pipe only as far as it takes it
without waiting (``poll`` for room, at most ``PIPE_BUF`` bytes at a time, which
a writable pipe takes whole); the rest waits in memory, up to
:data:`PENDING_LIMIT` bytes, and is written by the next write or a timer.
Past that, whole lines are dropped and counted, and one line says how many
once the pipe takes lines again.  When the supervisor reads, every line goes
out at once, as before.
"""

from __future__ import annotations

import atexit
import io
import os
import select
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from svc.infra.process import SUPERVISOR_PID_ENV

#: Bytes of log lines kept while the pipe is full; past it lines are dropped (and counted).
PENDING_LIMIT = 1 << 20
#: How often lines waiting for room are tried again when no new line comes.
RETRY_S = 0.2
#: How long the exit waits for room for the lines still waiting.
EXIT_WAIT_S = 1.0


class UnblockedOutput(io.TextIOBase):
    """A text stream on a pipe's file descriptor whose writes never wait for room (see the module)."""

    def __init__(self, fd: int, call_later: Callable[..., Any] | None = None, limit: int = PENDING_LIMIT) -> None:
        super().__init__()
        self.fd = fd
        self.call_later = call_later
        self.limit = limit
        self.pending = bytearray()
        self.dropped = 0
        self._retrying = False
        # Worker threads log too (a failed batch): the observer runs in the thread that logged.
        self._lock = threading.RLock()
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        with self._lock:
            if len(self.pending) + len(data) > self.limit:
                self.dropped += max(text.count("\n"), 1)
            else:
                self.pending += data
            self.drain()
        return len(text)

    def flush(self) -> None:
        self.drain()

    def drain(self, wait_s: float = 0.0) -> None:
        """Write what the pipe takes now (or within ``wait_s``); then the count of the lines dropped."""
        with self._lock:
            self._retrying = False
            self._drain(time.monotonic() + wait_s)

    def _drain(self, deadline: float) -> None:
        while self.pending or self.dropped:
            if not self.pending:
                self.pending += self._dropped_line()
            if not self._poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
                self._retry_later()
                return
            try:
                written = os.write(self.fd, self.pending[:select.PIPE_BUF])
            except BlockingIOError:  # another writer on the pipe took the room
                written = 0
            except OSError:  # the reader is gone (the supervisor died): nothing will read them
                self.pending.clear()
                self.dropped = 0
                return
            del self.pending[:written]

    def _dropped_line(self) -> bytes:
        from twisted.logger import formatTime

        count, self.dropped = self.dropped, 0
        return (f"{formatTime(time.time())} [svc.infra.output#warn] {count} log lines were dropped: the supervisor "
                "did not read this process's output\n").encode()

    def _retry_later(self) -> None:
        if self.call_later is None or self._retrying:
            return
        self._retrying = True
        try:
            self.call_later(RETRY_S, self.drain)
        except Exception:  # noqa: BLE001 - a reactor that no longer runs: the exit's drain writes them
            self._retrying = False


def unblock_log_output(options: Any, reactor: Any, env: Mapping[str, str] | None = None) -> UnblockedOutput | None:
    """Give a child of the supervisor (``SERVICE_SUPERVISOR_PID`` set) run by twist an unblocked log output
    instead of stdout; None (nothing changed) for a process started by hand or by twistd.  Called from a
    tap's ``makeService``, before twist starts logging to ``options.parent["logFile"]``."""
    import sys

    parent = getattr(options, "parent", None)
    if not (os.environ if env is None else env).get(SUPERVISOR_PID_ENV) or parent is None or "logFile" not in parent:
        return None
    stream: TextIO = parent["logFile"]
    if stream is not sys.stdout:
        return None
    stream.flush()
    # From any thread: the reactor's own timer, scheduled through callFromThread (callLater is not thread-safe).
    output = UnblockedOutput(stream.fileno(), lambda delay, f: reactor.callFromThread(reactor.callLater, delay, f))
    parent["logFile"] = output
    atexit.register(output.drain, EXIT_WAIT_S)
    return output
