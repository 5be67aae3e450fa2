"""Process-level helpers shared by the twistd plugins: fatal exits, thread pools."""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IReactorCore, IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from svc.infra.reactors import IServiceReactor
from svc.infra.twistd import remove_own_pidfile, tell_launcher

#: Runs a function somewhere (a thread pool, or inline in unit tests) and
#: returns a Deferred of its result.
Runner = Callable[..., Deferred]

log = Logger()

#: Set by the supervisor in every child's environment: the pid the child was
#: started under, so a child can tell that its supervisor is gone.
SUPERVISOR_PID_ENV = "SERVICE_SUPERVISOR_PID"

#: A child whose supervisor is gone ends this long after the stop signal,
#: whatever it was doing, so that a new supervisor gets its port back.
ORPHAN_EXIT_S = 1.5


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` runs (another user's counts): a temporary file named by a pid that does not is
    a killed process's leftover, to remove."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Descriptors a process holds beside its connections: log files, pipes, the epoll and waker, listening
#: sockets, shared libraries' and torch's own.
FD_RESERVE = 64


def open_file_limit(needed: int, setting: str) -> int:
    """Raise this process's soft open-file limit to its hard one; warn when ``needed`` descriptors do not fit.

    A soft limit of 1024 (systemd's and most shells' default) is below what
    ``max_connections`` admits (the gateway's 1024, each proxied request two
    descriptors): past the limit twisted's accept loop closed connections with
    no reply, and the gateway's own upstream sockets failed.  ``setting``
    names the key that ``needed`` comes from, for the warning.  Returns the
    soft limit now in force.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in ((hard,) if hard != resource.RLIM_INFINITY else (1 << 20, 1 << 16)):
        if soft >= target:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
            break
        except (ValueError, OSError):
            continue
    if needed + FD_RESERVE > soft:
        log.warn("{setting} admits about {needed} open connections, and this process may open {soft} files (its "
                 "hard limit, ulimit -Hn): past that, new connections are closed with no reply; raise the limit "
                 "(LimitNOFILE= in a systemd unit) or lower {setting}", setting=setting, needed=needed, soft=soft)
    return soft


def refuse(program: str, message: str) -> SystemExit:
    """The one-line refusal of a process that cannot start (exit code 1)."""
    return SystemExit(f"{program}: {message}")


def exit_after_shutdown(reactor: IReactorCore, program: str, message: str, code: int = 1) -> None:
    """Log ``message``, stop the reactor cleanly, then exit with ``code``.

    For failures found after the reactor started (a model whose weights do
    not load): twistd itself would exit 0 after ``reactor.stop()``.  A
    daemon's pidfile goes first, since twistd's own removal never runs.
    """
    log.critical("{program}: {message}", program=program, message=message)

    def _exit() -> None:
        remove_own_pidfile()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    reactor.addSystemEventTrigger("after", "shutdown", _exit)
    reactor.stop()


def hard_exit(code: int) -> None:
    """Flush our output and end the process now, threads and all.

    Used when a thread we cannot interrupt (a forward pass, a model being
    built) would otherwise keep the interpreter alive past our promises:
    Python joins non-daemon threads at exit, and torch cannot be cancelled.
    A daemon's pidfile is removed first (twistd's own removal never runs).
    """
    try:
        remove_own_pidfile()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def supervisor_gone(env: dict[str, str] | None = None) -> bool:
    """True when this process was started by a supervisor that no longer exists.

    The supervisor puts its pid in ``SERVICE_SUPERVISOR_PID``; when it dies
    the kernel re-parents us (to pid 1 or a subreaper) and sends the
    parent-death signal (SIGTERM).  A process started by hand has no such
    variable and is never an orphan in this sense.
    """
    value = (os.environ if env is None else env).get(SUPERVISOR_PID_ENV, "")
    if not value.isdigit():
        return False
    return os.getppid() != int(value)


def start_watchdog(seconds: float, why: str, code: int = 0) -> threading.Timer:
    """Hard-exit after ``seconds`` of wall time, even if the reactor is stuck.

    The last line of defence of a bounded shutdown: the normal path runs on
    the reactor (``callLater``) and ends well before; this daemon timer only
    fires if something blocks the reactor thread, which would stop any
    reactor-timed exit from ever running.
    """

    def _fire() -> None:
        sys.stderr.write(f"{why}: still running after {seconds:g} s; exiting now\n")
        hard_exit(code)

    timer = threading.Timer(seconds, _fire)
    timer.daemon = True
    timer.start()
    return timer


def freeze_heap() -> int:
    """Exempt every object alive now from later collections, after collecting the young generations.

    A model server holds a few hundred thousand long-lived objects after
    startup (torch, its modules, the import graph); a full collection walks
    all of them, 100-300 ms on the reactor thread of a 2-core machine, and
    every request waiting on that thread waits with it.  Called once the
    process has built what it keeps for life; what it allocates afterwards is
    collected as usual.  Returns the number of objects frozen.

    Only generations 0 and 1 are collected first (well under a millisecond):
    they hold what the load and the warm-up just left behind.  A full
    collection at this point took 180-200 ms of a model server's start and
    found nothing (measured with MobileNetV2 on the development machine):
    the automatic collections during the imports had already freed the
    cycles that died there.
    """
    gc.collect(1)
    gc.freeze()
    return gc.get_freeze_count()


class ThreadPoolService(Service):
    """A fixed-size ThreadPool started and stopped with the service tree.

    Stopping joins the threads, which blocks the calling thread (the reactor)
    until their work ends: a pool still running work (a forward pass, a model
    being built) is therefore left running instead, and ``abandoned`` says so;
    its owner then ends the process with :func:`hard_exit`.
    """

    def __init__(self, name: str, size: int) -> None:
        self.setName(name)
        self.pool = ThreadPool(minthreads=size, maxthreads=size, name=name)
        self.abandoned = False

    def startService(self) -> None:
        super().startService()
        self.pool.start()

    @property
    def busy(self) -> int:
        """Threads of the pool running work right now."""
        return len(self.pool.working)

    def stopService(self) -> None:
        super().stopService()
        busy = self.busy
        if busy:
            self.abandoned = True
            log.warn("{name} pool: {busy} thread(s) still running work; not joining them (the process exits)",
                     name=self.name, busy=busy)
            return
        self.pool.stop()

    def runner(self, reactor: IReactorFromThreads) -> Runner:
        """Run a function in this pool; fires with its result."""
        pool = self.pool
        return lambda f, *args, **kwargs: deferToThreadPool(reactor, pool, f, *args, **kwargs)


def inline_runner(f: Callable, *args: Any, **kwargs: Any) -> Deferred:
    """Runs the function at once on the calling thread (unit tests)."""
    return maybeDeferred(f, *args, **kwargs)


def exit_zero_on_signals(reactor: IServiceReactor) -> None:
    """Make SIGTERM, SIGINT and SIGHUP a clean stop that exits 0.

    twistd and twist re-raise the stopping signal after a clean shutdown, so
    the exit status would say "killed by SIGTERM".  A graceful stop is a
    normal exit for our processes: once the reactor has installed its own
    handlers, ours replace them for these signals.  SIGHUP is what a closing
    terminal sends its foreground processes (the quick start's supervisor);
    by default it killed them at once, without stopping the children.  A
    second signal during the shutdown changes nothing.  SIGUSR1, the signal
    logrotate's ``postrotate`` usually sends, ended the process (its default
    action): it is ignored (a daemon's since :func:`private_daemon_log`, before
    twistd could make it rotate its own log), since the supervisor follows
    moved log files itself.
    """
    import signal

    from twisted.internet.error import ReactorNotRunning

    def _stop_once() -> None:
        try:
            reactor.stop()
        except ReactorNotRunning:  # already stopping: Ctrl-C pressed twice
            pass

    orphan_watchdog: list[threading.Timer] = []

    def _stop(signum: int, frame: Any) -> None:
        log.info("received signal {signum}: shutting down", signum=signum)
        # The kernel's parent-death signal comes when the thread of the
        # supervisor that spawned us ends, and again at each re-parenting:
        # the first one may arrive while another thread of the dying
        # supervisor is still our parent.  So every signal looks again, and
        # the first one that finds the supervisor gone bounds the exit.
        if not orphan_watchdog and supervisor_gone():
            orphan_watchdog.append(start_watchdog(ORPHAN_EXIT_S, f"pid {os.getpid()} (orphaned: the supervisor is gone)"))
        reactor.callFromThread(_stop_once)

    def _install() -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, _stop)
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def _ignore_while_exiting() -> None:
        # The reactor has stopped and the process exits: Python puts a handler of its own back to the default as
        # it finalizes, and a second signal in that window killed the process (exit -2, not 0). Ignored ones stay.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)

    reactor.callWhenRunning(_install)
    reactor.addSystemEventTrigger("after", "shutdown", _ignore_while_exiting)


class ListeningMultiService(MultiService):
    """A service tree with a listener whose failure to bind is a one-line refusal.

    twistd binds in ``privilegedStartService``, twist (``python -m twisted``)
    in ``startService``: both turn ``CannotListenError`` into the process's
    refusal (exit 1) naming the address.  Subclasses set ``program`` and
    ``listen_address``.
    """

    program = "service"
    listen_address = "?"
    #: Where the port came from, when a file's key or an option names it ("conf/server/M.toml: port").
    listen_origin = ""

    def _refusal(self, error: CannotListenError) -> SystemExit:
        origin = f"{self.listen_origin}: " if self.listen_origin else ""
        return refuse(self.program, f"{origin}cannot listen on {self.listen_address}: {error.socketError}")

    def privilegedStartService(self) -> None:
        try:
            try:
                super().privilegedStartService()
            except CannotListenError as e:
                raise self._refusal(e) from None
        except SystemExit as refusal:  # twistd's daemon is forked by now: its launcher waits for word
            tell_launcher(refusal)
            raise

    def startService(self) -> None:
        try:
            super().startService()
        except CannotListenError as e:
            raise self._refusal(e) from None
