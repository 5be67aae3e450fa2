"""A model's processes on this host: one :class:`Child` per replica, acted on as one model.

Each replica is a whole :class:`svc.supervisor.child.Child` (its own port,
token, log file, state, restarts and back-off); this class only says what a
model-level action means (``/api/v1/servers/{id}/start|stop|restart``):

* ``start``: every replica that is not already starting, running or stopping
  starts, all at once; it answers when all of them are ready (the first
  failure fails it, naming the replica);
* ``stop``: every replica that runs (or waits to) stops, all at once;
* ``restart``: rolling, one replica at a time: stop it, start it, wait until
  it is ready, then wait ``settle`` seconds (the gateway's probe interval,
  so the gateway has seen it ready) before the next one, so the model keeps
  serving.  The replicas that serve nothing (stopped, crashed, starting) go
  first, and a serving replica is restarted only while another one serves:
  a roll that began with one replica down took the model down.  A replica
  that does not come back stops the roll (500 naming it), leaving the others
  running; so does a serving replica that no other could stand in for.  A
  second restart during a roll is the same roll, and an action on one
  replica during it is refused (:attr:`rolling`).

A model of one replica acts exactly as its one child did before replicas
existed (same messages, same status fields).  With several, the status
fields of the model are an aggregate (:meth:`snapshot`) and ``replicas``
lists each one.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, DeferredList, ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from svc.infra.reactors import follow
from svc.supervisor.child import (
    BACKOFF,
    FAILED,
    RUNNING,
    START_FAILED,
    STARTING,
    STOPPED,
    STOPPING,
    Child,
    ChildError,
    StartTimedOut,
)


def serving(child: Child) -> bool:
    """The replica takes requests: running and ready."""
    return child.state == RUNNING and child.ready


#: The model's ``state`` when its replicas differ: the first of these that any replica is in.
AGGREGATE_ORDER = (RUNNING, STARTING, STOPPING, BACKOFF, FAILED, START_FAILED, STOPPED)
ACTIVE = (STARTING, RUNNING, STOPPING)


class ReplicaSet:
    """The replicas of one catalog model, in index order."""

    def __init__(self, model_id: str, children: list[Child], *, reactor: IReactorTime, settle: float = 0.0) -> None:
        if not children:
            raise ValueError(f"{model_id}: a model has at least one replica")
        self.id = model_id
        self.children = children
        self.reactor = reactor
        self.settle = settle
        self._roll: Deferred | None = None  # the rolling restart under way
        self._stops = 0  # stops asked: one during a roll ends it (the last one asked wins)

    @property
    def name(self) -> str:
        return self.id

    @property
    def spec(self) -> Any:
        """Replica 0's spec (its ``info`` holds the model's config)."""
        return self.children[0].spec

    def replica(self, index: int) -> Child:
        """Replica ``index``; ChildError when the model has no such replica."""
        if not 0 <= index < len(self.children):
            raise ChildError(f"{self.id} has no replica {index} (it runs {len(self.children)})")
        return self.children[index]

    # -- actions ------------------------------------------------------------------------------

    def start(self) -> Deferred:
        if len(self.children) == 1:
            return self.children[0].start()
        return self._together([(c, c.start()) for c in self.children])  # each: done, joined or started

    def stop(self) -> Deferred:
        self._stops += 1
        if len(self.children) == 1:
            return self.children[0].stop()
        return self._together([(c, c.stop()) for c in self.children])  # each: stopped, or already

    def restart(self) -> Deferred:
        if len(self.children) == 1:
            return self.children[0].restart()
        roll = self._roll
        if roll is None:
            self._roll = roll = ensureDeferred(self._rolling())
            roll.addBoth(self._rolled)  # may run at once: a roll whose first replica fails to start at once
        return follow(roll)

    @property
    def rolling(self) -> bool:
        """A rolling restart is under way: the replicas are its to act on."""
        return self._roll is not None

    def _rolled(self, result: Any) -> Any:
        self._roll = None
        return result

    async def _rolling(self) -> None:
        # The replicas that serve nothing first (restarting them takes nothing away), in index order.
        order = sorted(range(len(self.children)), key=lambda i: serving(self.children[i]))
        stops = self._stops
        for n, i in enumerate(order):
            child = self.children[i]
            if n > 0 and self.settle > 0:
                await deferLater(self.reactor, self.settle, lambda: None)
            if self._stops != stops:  # the model was stopped meanwhile: no replica is started again
                raise ChildError(f"{self.id}: stopped before it started again")
            if serving(child) and not any(serving(c) for c in self.children if c is not child):
                raise ChildError(f"{self.id}: the rolling restart stopped at replica {i}: it is the only replica "
                                 f"that serves, and restarting it would take {self.id} down")
            try:
                await child.restart()
            except ChildError as e:
                if self._stops != stops:  # not the replica's failure: "the others keep running" was untrue
                    raise ChildError(f"{self.id}: stopped before it started again") from None
                raise ChildError(f"{self.id}: the rolling restart stopped at replica {i} (the others keep "
                                 f"running): {e}") from None

    def shutdown(self) -> Deferred:
        self._stops += 1  # a stop too: a roll under way ends with "stopped before it started again"
        return DeferredList([c.shutdown() for c in self.children], consumeErrors=True)

    def _together(self, actions: list[tuple[Child, Deferred]]) -> Deferred:
        """Wait for every action; fail with the first failure, named by its replica."""
        async def wait() -> None:
            results = await DeferredList([d for _, d in actions], consumeErrors=True)
            for (child, _), (ok, value) in zip(actions, results):
                if not ok:  # a start that timed out stays one (the supervisor logs it as slow, not failed)
                    error = StartTimedOut if value.check(StartTimedOut) else ChildError
                    raise error(f"{self.id} replica {self.children.index(child)}: {value.getErrorMessage()}")
        return ensureDeferred(wait())

    # -- views --------------------------------------------------------------------------------

    def replica_views(self) -> list[dict[str, Any]]:
        """Each replica as the status API lists it."""
        out = []
        for i, child in enumerate(self.children):
            snap = child.snapshot()
            info = child.spec.info
            out.append({"index": i, "name": child.name, "port": child.spec.port, "gpu": info.get("gpu"),
                        "cpus": list(info["cpus"]) if info.get("cpus") else None,
                        **{k: snap[k] for k in ("state", "ready", "pid", "restarts", "uptime_s", "last_error",
                                                "last_exit", "phase")}})
        return out

    def serving(self, key: str) -> Any:
        """``info[key]`` of the first ready replica's spec (None when none is ready or has it): what the model
        serves, where the last start attempt may have loaded something else (a replica that failed to start on
        a weights file while another served demo weights showed the model as "file", a UI probe)."""
        return next((c.spec.info.get(key) for c in self.children if c.ready and c.spec.info.get(key) is not None),
                    None)

    def snapshot(self) -> dict[str, Any]:
        """The model's status fields: its one child's, or an aggregate of its replicas.

        Aggregate (several replicas): ``state`` is the common state, else the
        first of AGGREGATE_ORDER any replica is in (``running`` while any
        runs); ``ready`` is true when any replica is ready (the model serves);
        ``pid`` is null (each replica has its own); ``restarts`` is the sum;
        ``uptime_s`` is the shortest among the replicas that are up;
        ``last_error`` is a current fault first (of the replicas not running, the one that exited last), else
        the error of the replica that exited last among those with one; ``last_exit`` is the exit of the
        replica that exited last (a replica killed now was shown with another's exit of an earlier rolling
        restart, a replicas probe; a replica failing now was hidden behind another's later, mended crash, a
        regression probe); ``phase`` is the first replica's that has one; each prefixed ``replica <n>:``.
        """
        snaps = [c.snapshot() for c in self.children]
        if len(snaps) == 1:
            return dict(snaps[0])
        states = {s["state"] for s in snaps}
        state = states.pop() if len(states) == 1 else next(s for s in AGGREGATE_ORDER if s in states)
        uptimes = [s["uptime_s"] for s in snaps if s["uptime_s"] is not None]

        def first(field: str) -> str | None:
            return next((f"replica {i}: {s[field]}" for i, s in enumerate(snaps) if s[field]), None)

        def latest(field: str, now_only: bool = False) -> str | None:
            found = [(c.exited_at or 0.0, -i, f"replica {i}: {s[field]}")
                     for i, (c, s) in enumerate(zip(self.children, snaps, strict=True))
                     if s[field] and not (now_only and s["state"] == "running")]
            return max(found)[2] if found else None

        def fault() -> str | None:
            return latest("last_error", now_only=True) or latest("last_error")

        return {
            "state": state,
            "ready": any(s["ready"] for s in snaps),
            "pid": None,
            "restarts": sum(s["restarts"] for s in snaps),
            "uptime_s": min(uptimes) if uptimes else None,
            "last_error": fault(),
            "last_exit": latest("last_exit"),
            "policy": snaps[0]["policy"],
            "phase": first("phase"),
        }
