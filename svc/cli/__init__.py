"""The command line: ``svcctl`` and the quick start.

- :mod:`svc.cli.commands`: ``svcctl``'s parser and its key commands;
- :mod:`svc.cli.gateway` and :mod:`svc.cli.jobs`: ``svcctl infer`` and ``svcctl jobs`` (:mod:`svc.cli.results`:
  the files of ``jobs run --out``);
- :mod:`svc.cli.keyfile`: ``svcctl keys`` and the key file; :mod:`svc.cli.gateway_restart`: the gateway's restart
  that follows, and which key file the supervisor says it reads;
- :mod:`svc.cli.args`: argument and token helpers the commands share (a leaf);
- :mod:`svc.cli.http`: the HTTP client, exit codes and failure lines;
- :mod:`svc.cli.output`: stdout that cannot be written (a reader gone, a full device), for every command;
- :mod:`svc.cli.quickstart`, :mod:`svc.cli.quickstart_secrets` and :mod:`svc.cli.quickstart_weights`:
  ``bin/quickstart``.

Nothing below this package imports it: the CLI is the top layer (the import-linter contracts in ``pyproject.toml``).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing alone took 30 ms to import, Ctrl-C in them a traceback: only mypy reads it
    from typing import Any

#: svcctl's exit status when interrupted, as svc.cli.http has it (not imported here: this runs first).
EXIT_INTERRUPTED = 130


def _say_interrupted() -> None:
    """``svcctl: interrupted`` on stderr, when there is one (with none, ``print`` would write it to stdout)."""
    if sys.stderr is not None:
        print("svcctl: interrupted", file=sys.stderr)


def _interrupted_early(signum: int, frame: object) -> None:
    """SIGINT's handler from this package's import to :func:`main`: the line and 130, as main's own answer.

    Python's own handler raised KeyboardInterrupt wherever the interpreter was (runpy looking for
    ``__main__``, an import of this package): a traceback and exit 1, in the first 40 to 80 ms."""
    _say_interrupted()
    raise SystemExit(EXIT_INTERRUPTED)


def _started_as_svcctl() -> bool:
    """Whether this process is ``svcctl`` (the console script) or ``python -m svc.cli``, not a program that
    imports the package (``python -m svc.cli.quickstart``, the tests), whose Ctrl-C is its own."""
    argv = sys.orig_argv
    return (os.path.basename(sys.argv[0]) == "svcctl" or "-msvc.cli" in argv
            or any(a == "-m" and b == "svc.cli" for a, b in zip(argv, argv[1:])))


def _catch_early_interrupts() -> None:
    """Install :func:`_interrupted_early` (when SIGINT has Python's own handler: not where it is ignored, in the
    background), as the first thing the entry does; :func:`main` hands SIGINT back to Python."""
    if not _started_as_svcctl():
        return
    try:
        import signal

        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupted_early)
    except KeyboardInterrupt:  # in the import of signal
        _say_interrupted()
        raise SystemExit(EXIT_INTERRUPTED) from None


def _end_early_interrupts() -> None:
    """SIGINT back to Python's KeyboardInterrupt, which :func:`main` and the commands answer."""
    signal = sys.modules.get("signal")
    if signal is not None and signal.getsignal(signal.SIGINT) is _interrupted_early:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_catch_early_interrupts()


def main(argv: list[str] | None = None, client: Any = None) -> int:
    """The ``svcctl`` console script (``svc.cli:main``) and ``python -m svc.cli``: :func:`svc.cli.commands.main`,
    imported when called, with stdout guarded (:func:`svc.cli.output.run_guarded`).

    The console script of every install names this function, so a ``.venv`` made before the CLI
    became a package keeps working; importing a module of the package stays light.  Every way in
    goes through here, so that what a failed stdout means is decided in one place, and so is
    Ctrl-C where no command says more: ``svcctl: interrupted`` and 130 (docs/cli.md), also while
    the commands are imported, which takes a second or two (a traceback before), and from this
    package's import to here (:func:`_catch_early_interrupts`).
    """
    try:
        _end_early_interrupts()
        from svc.cli.output import open_standard_streams, run_guarded

        open_standard_streams()  # before any file is opened: none may become stdout or stderr
        from svc.cli.commands import main as run

        return run_guarded(lambda: run(argv, client))
    except KeyboardInterrupt:
        _say_interrupted()
        return EXIT_INTERRUPTED
