"""``svcctl``: the command-line tool of the service.

For now it reports the version and checks or writes the committed OpenAPI
documents; the gateway issue adds the key tool and the inference client.
"""

from __future__ import annotations

import argparse
import sys

from svc import version_line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="svcctl", description="Command-line tool of the inference service.")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command")
    openapi = sub.add_parser("openapi", help="check or regenerate the committed OpenAPI documents")
    openapi.add_argument("mode", choices=("check", "write"))
    args = parser.parse_args(argv)
    if args.command == "openapi":
        from svc import openapi as doc

        return doc.main([f"--{args.mode}"])
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
