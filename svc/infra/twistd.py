"""What the service's programs need of twistd itself: their options, pidfiles and log files, and the word a
daemon owes the launcher that forked it.

Split from svc.infra.process, which keeps what every process needs however it
was started (twist or twistd, in the foreground or not).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from twisted.python import usage

from svc import version_line

#: twistd's default pidfile: every twistd program started from one folder
#: writes it, so a second one exits with "Another twistd server is running".
TWISTD_DEFAULT_PIDFILE = "twistd.pid"


class ProgramOptions(usage.Options):
    """The options every twistd program of the service has: ``--version`` prints the project's version line."""

    def opt_version(self) -> None:
        """Print the project version and exit."""
        print(version_line())
        sys.exit(0)


def own_pidfile(options: Any, name: str) -> None:
    """Give a process of ours its own pidfile and log file, so that several run side by side from one folder.

    Called from a tap's ``postOptions``, which runs while twistd parses its
    command line and before it checks the pidfile: ``options.parent`` is then
    twistd's ServerOptions.  Only twistd's default ``twistd.pid`` is changed
    (an explicit ``--pidfile`` other than that is kept): in the foreground
    (``-n``) no pidfile is written at all (the process is stopped with Ctrl-C
    or a signal to the pid it prints), as a daemon it is
    ``twistd-<name>.pid``, which ``kill $(cat ...)`` needs.  ``python -m
    twisted`` (twist) has no pidfile option and is left alone.  Likewise a
    daemon without ``--logfile`` writes ``twistd-<name>.log``, not the
    ``twistd.log`` that two daemons of one folder shared, each at its own
    offset (lines overwritten, a rotation followed by one of them only).
    """
    parent = getattr(options, "parent", None)
    if parent is None or "pidfile" not in parent or parent["pidfile"] != TWISTD_DEFAULT_PIDFILE:
        return
    parent["pidfile"] = "" if parent.get("nodaemon") else f"twistd-{name}.pid"
    if not parent.get("nodaemon") and not parent.get("logfile") and not parent.get("syslog"):
        parent["logfile"] = os.path.abspath(f"twistd-{name}.log")


def private_daemon_log(options: Any) -> None:
    """Make a daemon's log file (twistd's ``--logfile``) the owner's only, 0600, before twistd opens it: it
    holds the access lines, and a job id is all it takes to read that job's result.  twistd opens it before
    it applies a daemon's umask, so it was 0644.  Nothing for a process under twist.

    SIGUSR1 is ignored from here on, too, wherever twistd writes a log file (a daemon's, or ``-n
    --logfile``): as it opens the file, twistd makes SIGUSR1 rotate it where the signal still has its
    default action, so a daemon renamed its log to ``.1`` on logrotate's usual ``postrotate`` signal while
    every other process ignored it (:func:`exit_zero_on_signals`;
    docs/operations.md).  twistd still rotates the file by size (1 MB) itself.

    twistd's options are kept for :func:`tell_launcher` too."""
    global _launcher
    parent = getattr(options, "parent", None)
    _launcher = parent
    logfile = parent.get("logfile") if parent is not None else None
    if parent is None or not logfile or logfile == "-":
        return
    import signal

    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):  # makeService runs before twistd's log starts
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if parent.get("nodaemon"):
        return
    try:
        os.close(os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        os.chmod(logfile, 0o600)
    except OSError:
        pass  # twistd's own open says what is wrong with the path


#: twistd's options (``ServerOptions``) in a process twistd started (set by :func:`private_daemon_log`); else None.
_launcher: Any = None


def tell_launcher(refusal: SystemExit) -> None:
    """A daemon's start refused after twistd forked it (a busy port): tell the launcher and remove the pidfile.

    The launcher (the ``twistd`` the user ran) waits on a status pipe for its
    daemon's word.  twistd writes it, and removes the pidfile, for an
    Exception, not for the SystemExit of a refusal; and since the launcher
    keeps the pipe's write end open itself, it waited forever, the dead
    daemon's pidfile left behind.  Written in twistd's form, the launcher
    prints it ("An error has occurred: ...", cut to 100 bytes; the whole line
    reaches the log file as the daemon exits, a moment after) and exits 1.
    Nothing under ``twistd -n`` or twist.
    """
    parent = _launcher
    pipe = parent.get("statusPipe") if parent is not None else None
    if pipe is None:
        return
    parent["statusPipe"] = None
    remove_own_pidfile()  # first: once told, the launcher returns, and its user may look for the file
    try:
        os.write(pipe, f"1 {refusal.code}".encode("ascii", "backslashreplace")[:100])
        os.close(pipe)
    except OSError:
        pass


def remove_own_pidfile() -> None:
    """Remove twistd's pidfile (``--pidfile``) if it names this process, for an exit that twistd does not see.

    twistd removes it after its reactor returns, which an exit through
    ``os._exit`` (svc.infra.process: ``exit_after_shutdown``, ``hard_exit``)
    never lets happen: a daemon whose model failed to load left a pidfile
    naming a dead pid, which ``kill $(cat ...)`` and a second twistd's
    "Another twistd server is running" check then trusted.  A file that names
    another pid (a second daemon's, written after ours) is left alone.
    Nothing under twist or ``twistd -n`` without ``--pidfile``.
    """
    parent = _launcher
    path = parent.get("pidfile") if parent is not None else None
    if not path:
        return
    try:
        with open(path, "rb") as f:
            named = f.read(32).strip()
        if named == str(os.getpid()).encode("ascii"):
            os.unlink(path)
    except OSError:
        pass
