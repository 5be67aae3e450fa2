"""The command line: ``svcctl`` and the quick start.

- :mod:`svc.cli.commands`: ``svcctl``'s parser and its key commands;
- :mod:`svc.cli.gateway` and :mod:`svc.cli.jobs`: ``svcctl infer`` and ``svcctl jobs`` (:mod:`svc.cli.results`:
  the files of ``jobs run --out``);
- :mod:`svc.cli.keyfile`: ``svcctl keys``, the key file and the gateway's restart;
- :mod:`svc.cli.args`: argument and token helpers the commands share (a leaf);
- :mod:`svc.cli.http`: the HTTP client, exit codes and failure lines;
- :mod:`svc.cli.output`: stdout that cannot be written (a reader gone, a full device), for every command;
- :mod:`svc.cli.quickstart`, :mod:`svc.cli.quickstart_secrets` and :mod:`svc.cli.quickstart_weights`:
  ``bin/quickstart``.

Nothing below this package imports it: the CLI is the top layer (the import-linter contracts in ``pyproject.toml``).
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str] | None = None, client: Any = None) -> int:
    """The ``svcctl`` console script (``svc.cli:main``) and ``python -m svc.cli``: :func:`svc.cli.commands.main`,
    imported when called, with stdout guarded (:func:`svc.cli.output.run_guarded`).

    The console script of every install names this function, so a ``.venv`` made before the CLI
    became a package keeps working; importing a module of the package stays light.  Every way in
    goes through here, so that what a failed stdout means is decided in one place, and so is
    Ctrl-C where no command says more: ``svcctl: interrupted`` and 130 (docs/cli.md), also while
    the commands are imported, which takes a second or two (a traceback before).
    """
    try:
        from svc.cli.output import open_standard_streams, run_guarded

        open_standard_streams()  # before any file is opened: none may become stdout or stderr
        from svc.cli.commands import main as run

        return run_guarded(lambda: run(argv, client))
    except KeyboardInterrupt:
        print("svcctl: interrupted", file=sys.stderr)
        return 130
