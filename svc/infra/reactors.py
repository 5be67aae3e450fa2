"""The reactor a process or a command runs on, as the type checker sees it.

A clock parameter is typed :class:`~twisted.internet.interfaces.IReactorTime`
(``task.Clock`` provides it, so the unit tests inject one), and a parameter
that needs one other part of the reactor names that interface
(``IReactorCore``, ``IReactorTCP``, ...).  zope.interface has no
intersection type, so what needs several parts at once names one of the two
interfaces below, each the union of its parts (as ``twisted.internet`` types
its own global reactor, ``_IReactorCommon``); the global reactor provides
every one of them, and :func:`global_reactor` says so, in the one place.

These are interfaces for the type checker: nothing asks ``providedBy`` of
them.  docs/CONTRIBUTING.md, "Types".
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast
from weakref import WeakKeyDictionary

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IDelayedCall,
    IReactorCore,
    IReactorFromThreads,
    IReactorPluggableNameResolver,
    IReactorProcess,
    IReactorSocket,
    IReactorTCP,
    IReactorTime,
)
from twisted.python.failure import Failure


class IClientReactor(IReactorCore, IReactorTime, IReactorTCP):
    """What a command's HTTP exchange runs on: system events, timeouts, TCP connections."""


class IServiceReactor(IClientReactor, IReactorSocket, IReactorProcess, IReactorFromThreads,
                      IReactorPluggableNameResolver):
    """What a process runs on: the client's parts, adopted listeners, child processes, threads' calls back."""


def global_reactor() -> IServiceReactor:
    """Twisted's global reactor (installing the default one on first use), typed as what it provides, with
    its clock made monotonic (:func:`use_monotonic_clock`)."""
    from twisted.internet import reactor

    use_monotonic_clock(reactor)
    return cast(IServiceReactor, reactor)


#: Set on a reactor whose ``seconds()`` is :func:`time.monotonic` (:func:`use_monotonic_clock`).
MONOTONIC_MARK = "_svc_monotonic_clock"


def use_monotonic_clock(reactor: Any) -> None:
    """Make ``reactor.seconds()`` (every timer, timeout, deadline, bucket and duration) monotonic.

    Twisted's reactor reads the wall clock, so a clock stepped while a
    process ran (an NTP correction, a virtual machine or laptop resumed)
    moved every timer with it: a step back parked job waits and timeouts
    for as long as the step and locked rate-limited keys out, a step
    forward killed running jobs as past their deadline and expired
    finished ones at once.  Calls already scheduled are moved onto the new
    clock in order.  Times that people read as dates (the supervisor's
    series and log lines) are converted back with :func:`wall_time`.
    """
    if getattr(reactor, MONOTONIC_MARK, False):
        return
    shift = time.monotonic() - reactor.seconds()
    # Every call the reactor holds, cancelled ones too (they stay in its heap until their time), is shifted alike,
    # and the heap is made again, so that the order twisted relies on holds.
    pending, new = getattr(reactor, "_pendingTimedCalls", None), getattr(reactor, "_newTimedCalls", None)
    calls = [*pending, *new] if pending is not None and new is not None else reactor.getDelayedCalls()
    for call in calls:
        call.time += shift
        call.seconds = time.monotonic
    if pending is not None:
        heapq.heapify(pending)
    reactor.seconds = time.monotonic
    setattr(reactor, MONOTONIC_MARK, True)


def wall_time(clock: IReactorTime, at: float) -> float:
    """``at``, a reading of ``clock.seconds()``, as seconds since the epoch (unchanged for a clock that is not
    monotonic: a test's ``task.Clock``)."""
    if not getattr(clock, MONOTONIC_MARK, False):
        return at
    return time.time() - (clock.seconds() - at)


_T = TypeVar("_T")


def cancelling(timer: IDelayedCall) -> Callable[[_T], _T]:
    """A Deferred's callback (``addBoth``) that cancels ``timer`` if it is still pending and passes the result on."""

    def cancel(result: _T) -> _T:
        if timer.active():
            timer.cancel()
        return result

    return cancel


class _Followers:
    """The waiters on one Deferred's result: each gets it in a Deferred of its own, and the source's chain ends
    with ``None``, so that its failure, handed on, is not also reported as unhandled when it is collected."""

    _NOT_YET = object()

    def __init__(self, source: Deferred) -> None:
        self.waiting: list[Deferred] = []
        self.result: Any = self._NOT_YET
        source.addBoth(self._fire)

    def _fire(self, result: Any) -> None:
        self.result = result
        waiting, self.waiting = self.waiting, []
        for out in waiting:
            self._hand(out)

    def _hand(self, out: Deferred) -> None:
        if isinstance(self.result, Failure):
            out.errback(self.result)
        else:
            out.callback(self.result)

    def follow(self) -> Deferred:
        out: Deferred = Deferred()
        if self.result is self._NOT_YET:
            self.waiting.append(out)
        else:
            self._hand(out)
        return out


_followers: WeakKeyDictionary[Deferred, _Followers] = WeakKeyDictionary()


def follow(d: Deferred) -> Deferred:
    """A new Deferred with ``d``'s result: any number of callers wait on one (a second restart joins the first).

    ``d``'s chain is taken over here: its result goes to each follower, and the chain itself ends with None
    (a failure is each follower's to handle; left in ``d`` as well, twisted logged it as an "Unhandled error
    in Deferred" once ``d`` was collected, beside the caller's own one-line answer).
    """
    followers = _followers.get(d)
    if followers is None:
        followers = _followers[d] = _Followers(d)
    return followers.follow()
