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

from collections.abc import Callable
from typing import Any, TypeVar, cast

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
    """Twisted's global reactor (installing the default one on first use), typed as what it provides."""
    from twisted.internet import reactor

    return cast(IServiceReactor, reactor)


_T = TypeVar("_T")


def cancelling(timer: IDelayedCall) -> Callable[[_T], _T]:
    """A Deferred's callback (``addBoth``) that cancels ``timer`` if it is still pending and passes the result on."""

    def cancel(result: _T) -> _T:
        if timer.active():
            timer.cancel()
        return result

    return cancel


def follow(d: Deferred) -> Deferred:
    """A new Deferred with ``d``'s result, leaving ``d``'s own chain as it is (several callers wait on one)."""
    out: Deferred = Deferred()

    def copy(result: Any) -> Any:
        if isinstance(result, Failure):
            out.errback(result)
        else:
            out.callback(result)
        return result

    d.addBoth(copy)
    return out
