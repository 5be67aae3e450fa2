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
* any other error (ENOSPC, EIO, a stdout the shell closed: EBADF): one line,
  ``svcctl: cannot write to stdout: ...``, and exit 2.

A descriptor 0, 1 or 2 that svcctl was started without is held on ``/dev/null``
first (:func:`open_standard_streams`), so that no file the command opens takes it.

In both cases the rest of the output goes to ``/dev/null`` (the descriptor
itself, so that the interpreter's own last flush is quiet too).  A command
that knows its status before it prints (a reply of the gateway) catches the
lost reader itself (:func:`svc.cli.http.print_reply`) and goes on, so an HTTP
error still exits 1.  A leaf of :mod:`svc.cli`: it imports nothing of it.
"""

from __future__ import annotations

import errno
import io
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


#: The descriptors a shell may have closed (``>&-``), how each is opened again on ``/dev/null`` and how read.
STANDARD_STREAMS = (("stdin", os.O_RDONLY, "r"), ("stdout", os.O_RDONLY, "w"), ("stderr", os.O_WRONLY, "w"))


def open_standard_streams() -> None:
    """Give a descriptor 0, 1 or 2 that svcctl was started without (``>&-``, ``2>&-``) ``/dev/null``, and its stream.

    Why: Python leaves ``sys.stdout`` (or ``sys.stderr``) None then, and the descriptor free for the next file
    opened.  A print to stdout failed with an AttributeError traceback, and ``print(..., file=sys.stderr)`` went
    to *stdout*: ``svcctl infer ... 2>&- > out.json`` put its stderr lines into out.json.  Now stderr's lines go
    nowhere, stdin reads empty, and stdout's descriptor is held read-only, so that its first write fails
    (EBADF) and :func:`run_guarded` reports it as any failed stdout: one line and exit 2, before a key file is
    changed.  A descriptor that something else took already is left to it: only the stream is made.
    """
    for fd, (name, flags, mode) in enumerate(STANDARD_STREAMS):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:  # free: hold it, so that no file of the command becomes stdout or stderr
            null = os.open(os.devnull, flags)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if name == "stdout":
                continue  # None: GuardedStdout fails its writes
            setattr(sys, name, open(fd, mode, buffering=1, closefd=False, errors="backslashreplace"))
        else:
            if name != "stdout":
                setattr(sys, name, open(os.devnull, mode, buffering=1, errors="backslashreplace"))


class GuardedStdout:
    """``sys.stdout`` while a command runs: a write or flush that fails raises :class:`StdoutError`, once.

    Everything written after the failure is dropped (the command may go on:
    a reply's exit status is still to be told), and the descriptor is pointed
    at ``/dev/null`` so that the interpreter's last flush at exit, of what the
    failed write left in the buffer, does not fail again.  Any other attribute
    is the stream's own (``isatty``, ``fileno``, ``encoding``).
    """

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.failure: StdoutError | None = None

    def write(self, text: str) -> int:
        if self.failure is not None:
            return len(text)
        try:
            if self.stream is None:  # started without a stdout (``>&-``): open_standard_streams
                raise OSError(errno.EBADF, os.strerror(errno.EBADF))
            raw = getattr(self.stream, "buffer", None)
            if isinstance(raw, io.RawIOBase):
                return self._write_all(raw, text)
            return self.stream.write(text)
        except OSError as e:
            raise self._failed(e) from None

    def _write_all(self, raw: io.RawIOBase, text: str) -> int:
        """``text`` written whole to an unbuffered stdout (``python -u``, ``PYTHONUNBUFFERED``), write after write.

        Its TextIOWrapper makes one write and ignores a short count: a reader that went away during a
        1 MB reply took 73728 bytes, and the rest was dropped without an error (exit 0, not 141).  A
        write after the short one meets the closed pipe (EPIPE) as any write does."""
        assert self.stream is not None
        self.stream.flush()
        data = memoryview(text.encode(self.stream.encoding, self.stream.errors or "strict"))
        while data:
            written = raw.write(data)
            if written is None:  # non-blocking, and full: what a buffered stdout raises then
                raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
            data = data[written:]
        return len(text)

    def flush(self) -> None:
        if self.failure is not None or self.stream is None:
            return
        try:
            self.stream.flush()
        except OSError as e:
            raise self._failed(e) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _failed(self, error: OSError) -> StdoutError:
        self.failure = StdoutError(error)
        if self.stream is None:  # its descriptor already fails every write
            return self.failure
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
    real: TextIO | None = sys.stdout
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
