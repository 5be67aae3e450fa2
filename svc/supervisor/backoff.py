"""When a child is tried again: the back-off schedule and the crash-loop limit.

Pure arithmetic over the times the child passes in (its reactor's
``seconds()``), so it holds no timers and reads no clock:

* a crash is followed by a wait of ``backoff_initial`` doubling per
  consecutive crash up to ``backoff_max``; a process that ran a whole
  ``crash_loop_window`` starts the doubling over;
* ``crash_loop_restarts`` automatic restarts within ``crash_loop_window``
  end the restarts (the child is ``failed``);
* a busy port is tried again on the same doubling schedule, for at most
  ``port_wait`` seconds from the first time it was found busy.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The longest wait between two tries of a busy port (a bind, cheap): a freed port is noticed within it.
PORT_RETRY_MAX_S = 4.0


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


class Backoff:
    """One child's restart history and port wait."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.reset()

    def reset(self) -> None:
        """A start asked for (API, supervisor start): the history so far no longer counts."""
        self._restarts: list[float] = []  # times of the automatic restarts
        self._consecutive = 0
        self.port_since: float | None = None  # first time the port was found busy in this wait
        self._port_tries = 0
        self._error_before_wait: str | None = None  # the error the wait's note took the place of

    # -- crashes -----------------------------------------------------------------------------

    def recent_restarts(self, now: float) -> int:
        """Automatic restarts within the last ``crash_loop_window``; at ``crash_loop_restarts`` no more."""
        window = self.timing.crash_loop_window
        self._restarts = [t for t in self._restarts if now - t < window]
        return len(self._restarts)

    def crash_delay(self, ran: float) -> float:
        """The wait before respawning a process that crashed after running ``ran`` seconds."""
        self._consecutive = 1 if ran >= self.timing.crash_loop_window else self._consecutive + 1
        return min(self.timing.backoff_max, self.timing.backoff_initial * 2 ** (self._consecutive - 1))

    def restarted(self, now: float) -> None:
        """An automatic restart happened at ``now``."""
        self._restarts.append(now)

    # -- a busy port ---------------------------------------------------------------------------

    def next_port_try(self, now: float, error: str | None = None) -> float | None:
        """Seconds until the busy port is tried again, or None once ``port_wait`` is used up (the wait ends).
        ``error``: the child's last error when the port is found busy, kept while the wait's note shows.

        The delays double as a crash's do, but never past :data:`PORT_RETRY_MAX_S`: at the crash back-off's
        30 s a port freed meanwhile was noticed up to 30 s late (a start answered after 63 s, the port free
        from 26 s).
        """
        if self.port_since is None:
            self.port_since, self._port_tries, self._error_before_wait = now, 0, error
        left = self.timing.port_wait - (now - self.port_since)
        if left <= 0:
            self.port_since = None
            return None
        delay = min(self.timing.backoff_max, PORT_RETRY_MAX_S, self.timing.backoff_initial * 2 ** self._port_tries,
                    left)
        self._port_tries += 1
        return delay

    def end_port_wait(self, error: str | None = None) -> str | None:
        """The port wait is over (the port found free, ready, stopped); the error to show now: the one the wait's
        note took the place of if a wait was under way (a crash's, before its respawn found the port busy: a
        regression probe saw it wiped), else ``error``."""
        waiting, self.port_since = self.port_since is not None, None
        return self._error_before_wait if waiting else error
