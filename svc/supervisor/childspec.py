"""What a supervised child is before it runs: its spec, the states it can be in, and the error of an
action that does not fit its state (:mod:`svc.supervisor.child` is the state machine itself).

States (docs/contract.md names them; the transitions are ours)::

    stopped --start--> starting --first good probe--> running (ready)
    starting --exit 1 before ever ready--> start_failed    (refused: bad config)
    starting --port busy--> starting (no pid; retried on the back-off schedule)
             --still busy after port_wait--> start_failed
    starting|running --crash--> backoff --delay--> starting (policy on-failure/always)
    backoff | crash with policy "no" | crash loop --> failed (no more restarts)
    starting|running --stop--> stopping --exit--> stopped  (TERM to the group, KILL after the grace)
    (a child that cannot be spawned at all, or is refused by the supervisor: failed)
    any state --the supervisor's shutdown--> stopped, and nothing is spawned any more

``running`` carries a ``ready`` flag from the child's readiness route, probed every
``probe_running`` seconds.  A port that is busy when a child is to be spawned (an orphan of a
previous supervisor still exiting, another program) keeps the child ``starting`` with no pid and
``last_error`` saying why; it is tried again on the back-off schedule until ``port_wait`` is used
up.  A child that exits 1 before it was ever ready saying "Address already in use" (it lost a race
for the port) is treated the same way.  A restart that a stop overtakes while the old process
exits does not start the child again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STOPPED, STARTING, RUNNING, STOPPING, BACKOFF, FAILED, START_FAILED = (
    "stopped", "starting", "running", "stopping", "backoff", "failed", "start_failed")
STATES = (STOPPED, STARTING, RUNNING, STOPPING, BACKOFF, FAILED, START_FAILED)


class ChildError(Exception):
    """An action on a child that cannot be done (answered 500 by the API)."""


class StartTimedOut(ChildError):
    """A start not ready within ``start_timeout_ms``: slow (its modes measured, a loaded machine), not failed."""

    @classmethod
    def of(cls, name: str, seconds: float, state: str) -> "StartTimedOut":
        return cls(f"{name} did not become ready within {seconds:g} s (state {state})")


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
    #: The command as of each spawn, when it follows a file (a model's ``--weights`` its config); else ``argv``.
    argv_now: Callable[[], list[str]] | None = None
    #: Why a start or restart asked of this child must not go on, checked before anything is stopped (the model's
    #: edited config, the gateway's key file: svc.supervisor.preflight); None lets it go on.
    preflight: Callable[[], str | None] | None = None
    #: What a restart asked through the API checks besides :attr:`preflight`: the gateway's ``host`` and ``port``
    #: edited since the supervisor bound its socket.  Not a respawn's check: a crashed gateway comes back on that
    #: socket (it was refused, and the service left without a gateway, by a port edit not applied yet).
    restart_preflight: Callable[[], str | None] | None = None

    def problem(self) -> str | None:
        """What :attr:`preflight` finds (None without one)."""
        return self.preflight() if self.preflight else None

    def restart_problem(self) -> str | None:
        """What :attr:`restart_preflight`, then :attr:`preflight`, finds, said to be found before anything stopped
        (a respawn after a crash says the same problem without it: its process had exited)."""
        problem = (self.restart_preflight() if self.restart_preflight else None) or self.problem()
        return f"{problem} (nothing was stopped)" if problem else None
