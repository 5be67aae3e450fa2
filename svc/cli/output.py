"""svcctl's stdout: what a failed write means for the exit status, decided once at the entry.

Why it is its own module: every command writes its result to stdout (a reply,
a key, a table), most with a plain ``print``.  When the reader goes away
(``svcctl keys list | head -1``, ``| true``) or the device is full (``>
/dev/full``), that write raises wherever it happens: in a command, inside the
reactor (Twisted then logged "main function encountered error" and the command
said "interrupted"), or in the interpreter's last flush at exit.  Rather than
catch it in each command, :func:`run_guarded` runs the command with
:data:`sys.stdout` behind a :class:`GuardedStdout`, whose failed write raises
:class:`StdoutError`: an exception that says it was stdout, not a file the
command writes, so the entry can answer it the same way for every command:

* the reader went away (EPIPE): quiet, as a writer that a shell's pipe kills;
  the exit status is the command's own when it has a failure to report, else
  :data:`EXIT_PIPE` (141, 128 + SIGPIPE, what the shell reports for such a writer);
* any other error (ENOSPC, EIO): one line, ``svcctl: cannot write to stdout: ...``,
  and exit 2.

In both cases the rest of the output goes to ``/dev/null`` (the descriptor
itself, so that the interpreter's own last flush is quiet too).  A command
that knows its status before it prints (a reply of the gateway) catches the
lost reader itself (:func:`svc.cli.http.print_reply`) and goes on, so an HTTP
error still exits 1.  A leaf of :mod:`svc.cli`: it imports nothing of it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TextIO, cast

EXIT_USAGE = 2
#: A reader that went away with nothing else to report: 128 + SIGPIPE, as the shell reports a writer the pipe killed.
EXIT_PIPE = 141


class StdoutError(Exception):
    """Writing stdout failed; ``error`` is the OSError it raised.

    A class of its own, not the OSError: a command catches OSError around its
    files (``--out``, the key file) and would report a lost stdout as one of them.
    """

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error

    @property
    def gone(self) -> bool:
        """Whether the reader went away (EPIPE), rather than the device failing."""
        return isinstance(self.error, BrokenPipeError)


class GuardedStdout:
    """``sys.stdout`` while a command runs: a write or flush that fails raises :class:`StdoutError`, once.

    Everything written after the failure is dropped (the command may go on:
    a reply's exit status is still to be told), and the descriptor is pointed
    at ``/dev/null`` so that the interpreter's last flush at exit, of what the
    failed write left in the buffer, does not fail again.  Any other attribute
    is the stream's own (``isatty``, ``fileno``, ``encoding``).
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.failure: StdoutError | None = None

    def write(self, text: str) -> int:
        if self.failure is not None:
            return len(text)
        try:
            return self.stream.write(text)
        except OSError as e:
            raise self._failed(e) from None

    def flush(self) -> None:
        if self.failure is not None:
            return
        try:
            self.stream.flush()
        except OSError as e:
            raise self._failed(e) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _failed(self, error: OSError) -> StdoutError:
        self.failure = StdoutError(error)
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError):  # not a file descriptor (a test's capture): nothing to point
            pass
        return self.failure


def run_guarded(command: Callable[[], int]) -> int:
    """Run ``command`` with stdout guarded; its exit status, or the one a failed stdout gives (module docstring).

    The output is flushed here, so that an error of the last write is met
    here too and not in the interpreter's flush at exit (a traceback and status
    120 there).  SystemExit (argparse's ``--version``, a usage error) passes
    through once flushed the same way.
    """
    real = sys.stdout
    guard = GuardedStdout(real)
    sys.stdout = cast(TextIO, guard)
    code: int | None = None
    try:
        try:
            code = command()
        except SystemExit:
            guard.flush()  # what argparse wrote before it exits (--version)
            raise
        guard.flush()
    except StdoutError:
        pass
    finally:
        sys.stdout = real
    failure = guard.failure
    if failure is None:
        assert code is not None  # only the guard raises StdoutError, and it keeps it as its failure
        return code
    if failure.gone:
        return code if code else EXIT_PIPE
    print(f"svcctl: cannot write to stdout: {failure.error.strerror or failure.error}", file=sys.stderr)
    return EXIT_USAGE
