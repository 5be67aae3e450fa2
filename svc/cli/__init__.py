"""The command line: ``svcctl`` and the quick start.

- :mod:`svc.cli.commands`: ``svcctl``'s parser and its key commands;
- :mod:`svc.cli.gateway` and :mod:`svc.cli.jobs`: ``svcctl infer`` and ``svcctl jobs``;
- :mod:`svc.cli.keyfile`: ``svcctl keys``, the key file and the gateway's restart;
- :mod:`svc.cli.args`: argument and token helpers the commands share (a leaf);
- :mod:`svc.cli.http`: the HTTP client, exit codes and failure lines;
- :mod:`svc.cli.quickstart` and :mod:`svc.cli.quickstart_weights`: ``bin/quickstart``.

Nothing below this package imports it: the CLI is the top layer (the import-linter contracts in ``pyproject.toml``).
"""

from __future__ import annotations

from typing import Any


def main(argv: list[str] | None = None, client: Any = None) -> int:
    """The ``svcctl`` console script (``svc.cli:main``): :func:`svc.cli.commands.main`, imported when called.

    The console script of every install names this function, so a ``.venv`` made before the CLI
    became a package keeps working; importing a module of the package stays light.
    """
    from svc.cli.commands import main as run

    return run(argv, client)
