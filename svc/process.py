"""Process-level helpers shared by the twistd plugins: fatal exits, thread pools."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

#: Runs a function somewhere (a thread pool, or inline in unit tests) and
#: returns a Deferred of its result.
Runner = Callable[..., Deferred]

log = Logger()


def refuse(program: str, message: str) -> SystemExit:
    """The one-line refusal of a process that cannot start (exit code 1)."""
    return SystemExit(f"{program}: {message}")


def exit_after_shutdown(reactor: Any, program: str, message: str, code: int = 1) -> None:
    """Log ``message``, stop the reactor cleanly, then exit with ``code``.

    For failures found after the reactor started (a model whose weights do
    not load): twistd itself would exit 0 after ``reactor.stop()``.
    """
    log.critical("{program}: {message}", program=program, message=message)

    def _exit() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    reactor.addSystemEventTrigger("after", "shutdown", _exit)
    reactor.stop()


def freeze_heap() -> int:
    """Collect once, then exempt every surviving object from later collections.

    A model server holds a few hundred thousand long-lived objects after
    startup (torch, its modules, the import graph); a full collection walks
    all of them, 100-300 ms on the reactor thread of a 2-core machine, and
    every request waiting on that thread waits with it.  Called once the
    process has built what it keeps for life; what it allocates afterwards is
    collected as usual.  Returns the number of objects frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class ThreadPoolService(Service):
    """A fixed-size ThreadPool started and stopped with the service tree."""

    def __init__(self, name: str, size: int) -> None:
        self.setName(name)
        self.pool = ThreadPool(minthreads=size, maxthreads=size, name=name)

    def startService(self) -> None:
        super().startService()
        self.pool.start()

    def stopService(self) -> None:
        super().stopService()
        self.pool.stop()

    def runner(self, reactor: Any) -> Runner:
        """Run a function in this pool; fires with its result."""
        pool = self.pool
        return lambda f, *args, **kwargs: deferToThreadPool(reactor, pool, f, *args, **kwargs)


def inline_runner(f: Callable, *args: Any, **kwargs: Any) -> Deferred:
    """Runs the function at once on the calling thread (unit tests)."""
    return maybeDeferred(f, *args, **kwargs)


def exit_zero_on_signals(reactor: Any) -> None:
    """Make SIGTERM and SIGINT a clean stop that exits 0.

    twistd and twist re-raise the stopping signal after a clean shutdown, so
    the exit status would say "killed by SIGTERM".  A graceful stop is a
    normal exit for our processes: once the reactor has installed its own
    handlers, ours replace them for these two signals.
    """
    import signal

    def _stop(signum: int, frame: Any) -> None:
        log.info("received signal {signum}: shutting down", signum=signum)
        reactor.callFromThread(reactor.stop)

    def _install() -> None:
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)

    reactor.callWhenRunning(_install)


class ListeningMultiService(MultiService):
    """A service tree with a listener whose failure to bind is a one-line refusal.

    twistd binds in ``privilegedStartService``, twist (``python -m twisted``)
    in ``startService``: both turn ``CannotListenError`` into the process's
    refusal (exit 1) naming the address.  Subclasses set ``program`` and
    ``listen_address``.
    """

    program = "service"
    listen_address = "?"

    def _refusal(self, error: CannotListenError) -> SystemExit:
        return refuse(self.program, f"cannot listen on {self.listen_address}: {error.socketError}")

    def privilegedStartService(self) -> None:
        try:
            super().privilegedStartService()
        except CannotListenError as e:
            raise self._refusal(e) from None

    def startService(self) -> None:
        try:
            super().startService()
        except CannotListenError as e:
            raise self._refusal(e) from None
