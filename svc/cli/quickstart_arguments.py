"""The quick start's command line, read twice: by ``bin/quickstart`` with the system's ``python3`` before it installs
anything (so ``--help`` or a mistyped option is answered at once, not after minutes of installing PyTorch), and by
:func:`svc.cli.quickstart.main` (``python -m svc.cli.quickstart``, which installs nothing).  Standard library only
(and ``svc/__init__.py``, which is no more), for that first read."""

from __future__ import annotations

import argparse

from svc import version_line

#: The program and what it does, as each entry point says it in its usage and ``--help``: ``bin/quickstart``
#: installs into .venv first, ``python -m svc.cli.quickstart`` runs the code already installed.
PROGRAMS = {
    "python -m svc.cli.quickstart": "Run the service in this folder (or --root): the installed default configuration "
    "copied into it when it has none, the secrets made once, then the supervisor, the gateway and the models of the "
    "profile. Installs nothing: run it with the environment the service is installed in.",
    "bin/quickstart": "Install the service into .venv and run it: the supervisor, the gateway and the models of the "
    "profile.",
}


def arguments(argv: list[str] | None = None, prog: str = "python -m svc.cli.quickstart") -> argparse.Namespace:
    """The quick start's arguments, with the usage and description of ``prog`` (a key of :data:`PROGRAMS`): a probe's
    ``python -m svc.cli.quickstart --help`` said ``usage: bin/quickstart`` and "Install the service into .venv"."""
    # No abbreviations: bin/quickstart's banner reads --prepare-only as written (a probe's --prep was "Starting").
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False, description=PROGRAMS[prog])
    parser.add_argument("--version", action="version", version=version_line())
    parser.add_argument("--root", default=".", help="the checkout, or a folder of yours for an installed package "
                        "(default: the current directory)")
    parser.add_argument("--prepare-only", action="store_true", help="create the secrets, do not run the service")
    parser.add_argument("--weights", choices=("demo", "pretrained"), default=None,
                        help="demo or pretrained instead of the profile's weights")
    parser.add_argument("--accept-licence", "--accept-license", metavar="LICENCE", action="append", default=[],
                        dest="accept", help="pull pretrained weights under this non-permissive licence (e.g. "
                        "AGPL-3.0; repeatable); without it, a terminal is asked")
    return parser.parse_args(argv)
