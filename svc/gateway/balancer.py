"""Which replica of a model gets a request: the ready one with the fewest requests outstanding.

The gateway counts the requests it has sent to each replica and not yet had
answered (synchronous inference and job submissions: the work a replica is
asked to do; job polls and waits go to the job's own replica and are not
counted), and knows whether each replica is ready:

* a replica is ready until it refuses a connection or does not admit a
  request (503 status 65 with no results: loading, stopping, too many
  connections), and not ready from then until its readiness probe
  (:mod:`svc.gateway.readiness`) answers 200 again;
* its probe says so every ``replica_probe_interval_ms``.

:meth:`Balancer.pick` takes the ready replicas not yet tried for this
request (all untried ones when none is ready: the request then meets what
they answer, as with one process; only ready ones once a replica answered
it with a full queue's 429, which is the answer when none is left), keeps
those with the fewest outstanding requests and picks one of them at
random, so equal replicas share the load
without a rotation that a client could synchronise with.  A model of one
replica always gets its one process: with one replica the gateway behaves
exactly as before replicas existed.

State only, no I/O and no clock: the app counts around each forward and the
probe reports; everything runs on the reactor thread.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from svc.gateway.catalog import Replica, Upstream


class Balancer:
    """Outstanding requests and readiness of every replica."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()
        self.outstanding: dict[tuple[str, int], int] = {}
        self.down: set[tuple[str, int]] = set()

    def pick(self, upstream: Upstream, tried: Iterable[Replica] = (), ready_only: bool = False) -> Replica | None:
        """The replica for the next attempt of a request, or None when every replica was tried.

        ``ready_only``: a ready one or None (a request that holds a replica's answer already, a 429 of a full
        queue: a replica known not to be ready would only turn it into a hang or a 503 "not running")."""
        done = {r.key for r in tried}
        untried = [r for r in upstream.replicas if r.key not in done]
        if ready_only:
            untried = [r for r in untried if r.key not in self.down]
        if len(untried) <= 1:
            return untried[0] if untried else None
        candidates = [r for r in untried if r.key not in self.down] or untried
        fewest = min(self.outstanding.get(r.key, 0) for r in candidates)
        return self.rng.choice([r for r in candidates if self.outstanding.get(r.key, 0) == fewest])

    def started(self, replica: Replica) -> None:
        """A request was sent to ``replica``."""
        self.outstanding[replica.key] = self.outstanding.get(replica.key, 0) + 1

    def finished(self, replica: Replica) -> None:
        """``replica`` answered (or failed) a request counted by :meth:`started`."""
        left = self.outstanding.get(replica.key, 0) - 1
        if left > 0:
            self.outstanding[replica.key] = left
        else:
            self.outstanding.pop(replica.key, None)

    def mark_down(self, replica: Replica) -> None:
        """``replica`` refused a connection or did not admit a request: skipped until a probe says ready."""
        self.down.add(replica.key)

    def probed(self, replica: Replica, ready: bool) -> None:
        """What ``replica``'s readiness probe said."""
        if ready:
            self.down.discard(replica.key)
        else:
            self.down.add(replica.key)

    def is_ready(self, replica: Replica) -> bool:
        return replica.key not in self.down
