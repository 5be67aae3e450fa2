"""The quick start's command line, read twice: by ``bin/quickstart`` with the system's ``python3`` before it installs
anything (so ``--help`` or a mistyped option is answered at once, not after minutes of installing PyTorch), and by
:func:`svc.cli.quickstart.main`.  Standard library only, for that first read."""

from __future__ import annotations

import argparse


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The quick start's arguments (a probe's ``bin/quickstart --help`` started the install before it said anything)."""
    # No abbreviations: bin/quickstart's banner reads --prepare-only as written (a probe's --prep was "Starting").
    parser = argparse.ArgumentParser(prog="bin/quickstart", allow_abbrev=False, description="Install the service "
                                     "into .venv and run it: the supervisor, the gateway and the models of the profile.")
    parser.add_argument("--root", default=".", help="the checkout, or a folder of yours for an installed package "
                        "(default: the current directory)")
    parser.add_argument("--prepare-only", action="store_true", help="create the secrets, do not run the service")
    parser.add_argument("--weights", choices=("demo", "pretrained"), default=None,
                        help="demo or pretrained instead of the profile's weights")
    parser.add_argument("--accept-licence", "--accept-license", metavar="LICENCE", action="append", default=[],
                        dest="accept", help="pull pretrained weights under this non-permissive licence (e.g. "
                        "AGPL-3.0; repeatable); without it, a terminal is asked")
    return parser.parse_args(argv)
