"""``svcctl``: the command-line tool of the service.

Why it exists: operators need to issue API keys without ever storing a
plaintext key, and to call the gateway from a shell without hand-writing the
JSON envelope, base64 images and the Bearer header.  It has:

* ``svcctl keygen NAME [--scope S] [--qps N]``: a new key, printed once,
  with the ``[keys.NAME]`` entry to paste into ``conf/api_keys.toml``;
* ``svcctl hash KEY``: the SHA-256 that the key file stores for a key;
* ``svcctl keys add|disable|enable|remove|list`` (:mod:`svc.cli.keyfile`): edit the key file
  and have the supervisor restart the gateway;
* ``svcctl infer MODEL IMAGE...`` and ``svcctl jobs submit|get|wait|result``
  (:mod:`svc.cli.gateway`; ``jobs run``, in :mod:`svc.cli.jobs`: all of them
  plus a progress bar): a client of the gateway (docs/contract.md, Routes)
  that prints the JSON reply; exit 0 on a 2xx reply, 1 on any other HTTP
  status, 2 when no request could be made or completed (no token, unreadable
  image, connection failure, deadline), 130 when interrupted;
* ``svcctl openapi check|write``: the committed OpenAPI documents;
* ``svcctl cache list|prune``: the compiled cache of the model servers
  (:mod:`svc.optimize.prune`);
* ``svcctl weights list|pull|import|verify``: pretrained weights in the
  local cache (``svc.weightstore.cli``).

This module is the command table: the parser and the dispatch, and the two
commands that need nothing else (``keygen``, ``hash``).  The commands that
make requests take a :class:`svc.cli.http.Client` (:func:`main`'s
``client``; the real one is treq under ``task.react``, :mod:`svc.cli.http`).
Twisted and treq are imported only by those commands, so ``--version``,
``keygen`` and ``hash`` start fast.  The token comes from the environment,
never from the command line, and is never printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from svc import version_line
from svc.auth import SCOPES, check_key_name, hash_key, issue_key
from svc.cli import gateway as cli_gateway
from svc.cli.args import TOKEN_ENVS, check_path_arguments, key_qps
from svc.cli.http import EXIT_OK, EXIT_USAGE, Client, CliError, HttpClient, fail
from svc.contract.protocol import GATEWAY_RESTART_PATH, SUPERVISOR_PORT, local_url

GATEWAY_RESTART = f"POST {GATEWAY_RESTART_PATH}"


# ---------------------------------------------------------------- keys


def _keygen(args: argparse.Namespace) -> int:
    problem = check_key_name(args.name)
    if problem:
        fail(f"key name {args.name!r} {problem}")
        return EXIT_USAGE
    key, entry = issue_key(args.name, args.scope, args.qps)
    print(f"key: {key}\n")
    print(entry, end="")
    sys.stdout.flush()
    from svc.cli.gateway_restart import restart_call
    from svc.cli.keyfile import default_keys_file

    try:  # the supervisor and the key file that `keys add` would use ($SERVICE_SUPERVISOR_URL, [gateway] keys_file)
        restart = restart_call(None).url
    except CliError:
        restart = f"{local_url(SUPERVISOR_PORT)}{GATEWAY_RESTART_PATH}"
    print("\nThe key is shown once and cannot be recovered from its hash: give it to the client now.\n"
          f"Paste the entry into {default_keys_file()}, then restart the gateway so that it reloads the file:\n"
          f"  {GATEWAY_RESTART} on the supervisor (Bearer SERVICE_API_TOKEN), e.g.\n"
          f'  curl -X POST -H "Authorization: Bearer $SERVICE_API_TOKEN" {restart}',
          file=sys.stderr)
    return EXIT_OK


def _openapi(args: argparse.Namespace) -> int:
    from svc.config import ConfigError
    from svc.openapi import committed as doc

    try:
        return doc.main([f"--{args.mode}"], prog=f"svcctl: openapi {args.mode}", write_command="svcctl openapi write")
    except ConfigError as e:  # run outside the checkout (conf/server and openapi/ are relative to it), or a bad file
        hint = "" if os.path.isdir(os.path.join("conf", "server")) else " (run it in the checkout)"
        print(f"svcctl: openapi {args.mode}: {e}{hint}", file=sys.stderr)
        return 2


def _hash(args: argparse.Namespace) -> int:
    """The key's hash as the gateway will compute it: of the key without the whitespace around it (the gateway
    strips it from the bearer string), refused when no bearer token can carry it (an empty key, a space or a
    character outside visible ASCII inside it, several lines on stdin), as its hash would never match."""
    raw = sys.stdin.read() if args.key == "-" else args.key
    key = raw.strip()
    problem = ("the key is empty" + (" (nothing on stdin)" if args.key == "-" else "") if not key
               else "stdin holds more than one line: give one key" if args.key == "-" and "\n" in key
               else "the key has a space or a character outside visible ASCII, which no bearer token carries"
               if not all("!" <= c <= "~" for c in key) else None)
    if problem:
        print(f"svcctl: hash: {problem}", file=sys.stderr)
        return 2
    print(hash_key(key))
    return EXIT_OK


# ---------------------------------------------------------------- arguments


class Parser(argparse.ArgumentParser):
    """svcctl's parsers: an option is taken only by its whole name, never by a prefix (``allow_abbrev``).

    ``--token s3cr3t`` was taken as ``--token-env`` and the secret echoed in its line.  The class,
    not the flag: ``add_subparsers`` makes every subcommand's parser of its parser's class, so
    each one, in whichever module adds it, is one of these."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but an unknown option's value is not shown in the error: ``--tok SECRET`` (a token
        mistyped for the refused ``--token``) was echoed, ``unrecognized arguments: --tok SECRET``."""
        self.refuse_options_before_command(list(sys.argv[1:] if args is None else args))
        namespace, extras = self.parse_known_args(args, namespace)
        chosen = self.chosen(namespace)  # its usage, not the top level's: the extras came from its arguments
        extras = chosen.take_trailing_words(namespace, extras)
        if extras:
            chosen.error(f"unrecognized arguments: {' '.join(hide_option_values(extras))}{chosen.hint(extras)}")
        return namespace

    def refuse_options_before_command(self, argv: list[str]) -> None:
        """An option this parser does not know before the command (``svcctl --tok VALUE keys list``): its value
        was taken as the command and echoed, ``invalid choice: 'VALUE'``.  Refused with the value hidden."""
        known = {o for action in self._actions for o in action.option_strings}
        leading = []
        for arg in argv:
            if not arg.startswith("-") or arg in ("-", "--"):
                break
            leading.append(arg)
        if any(arg.split("=", 1)[0] not in known for arg in leading):
            shown = hide_option_values(argv[:len(leading) + ("=" not in leading[-1])])  # a value that follows
            self.error(f"unrecognized arguments: {' '.join(shown)} (options go after the command: svcctl COMMAND "
                       "[options])")

    def chosen(self, namespace: Any) -> Parser:
        """The innermost subcommand's parser that ``namespace`` names (``svcctl keys add``), else this one."""
        parser = self
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            inner = subs[0].choices.get(getattr(namespace, subs[0].dest, None) or "") if subs else None
            if not isinstance(inner, Parser):
                return parser
            parser = inner

    def take_trailing_words(self, namespace: Any, extras: list[str]) -> list[str]:
        """``extras`` less the words that this parser's ``*`` positional (``jobs run``'s IMAGE...) takes: argparse
        gives such a positional its share where it reads the first positional, so the files of
        ``jobs run MODEL --param x=1 a.png`` were "unrecognized" (``infer``'s ``+`` IMAGE... took them)."""
        star = [a for a in self._actions if not a.option_strings and a.nargs == "*"]
        cut = extras.index("--") if "--" in extras else len(extras)  # after it every word is one (``-- -b.png``)
        words = extras[:cut] + extras[cut + 1:]
        if not star or not words or any(arg.startswith("-") for arg in extras[:cut]):
            return extras
        setattr(namespace, star[-1].dest, [*(getattr(namespace, star[-1].dest) or []), *words])
        return []

    def hint(self, extras: list[str]) -> str:
        """The whole names of this parser's options that an unknown one begins (``--keys``: ``--keys-file``), as
        prefixes were taken before 0.14.0; empty when none."""
        known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        names = [arg.split("=", 1)[0] for arg in extras if arg.startswith("--")]
        wholes = sorted({o for name in names for o in known if o.startswith(name) and o != name})
        return f" (options are taken by their whole name: did you mean {' or '.join(wholes)}?)" if wholes else ""


def hide_option_values(extras: list[str]) -> list[str]:
    """``extras`` with the value of each unknown option replaced by ``...``: the word after one (``--tok VALUE``)
    and what follows its ``=`` (``--tok=VALUE``); an argument that follows no option is shown as it is."""
    shown, after_option = [], False
    for arg in extras:
        if arg.startswith("-") and arg != "-":
            shown.append(arg.split("=", 1)[0] + ("=..." if "=" in arg else ""))
            after_option = "=" not in arg
        else:
            shown.append("..." if after_option else arg)
            after_option = False
    return shown


#: ``--token`` (and ``--token=VALUE``): no such flag (docs/cli.md), refused before parsing, as argparse's own
#: error echoes what it does not know, and this is a secret.
NO_TOKEN_FLAG = (f"there is no --token flag (a token on the command line shows in the process list; its value is "
                 f"not shown): set {', '.join(TOKEN_ENVS)}, or name another variable with --token-env")


def token_flag_given(argv: list[str]) -> bool:
    """Whether ``argv`` gives ``--token`` or ``--token=...`` as an option (not after ``--``)."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--token" or arg.startswith("--token="):
            return True
    return False


def build_parser() -> argparse.ArgumentParser:
    """The ``svcctl`` argument parser with every subcommand."""
    parser = Parser(prog="svcctl", description="Command-line tool of the inference service.")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    openapi = sub.add_parser("openapi", help="check or regenerate the committed OpenAPI documents")
    openapi.add_argument("mode", choices=("check", "write"))
    openapi.set_defaults(handler=_openapi)

    keygen = sub.add_parser("keygen", help="issue an API key and print its key-file entry",
                            description="Print a new API key once, and the [keys.NAME] entry for conf/api_keys.toml.")
    keygen.add_argument("name", metavar="NAME", help="key name (the X-Service-Key header of its replies)")
    keygen.add_argument("--scope", choices=SCOPES, default="inference", help="default: inference")
    keygen.add_argument("--qps", type=key_qps, default=0, metavar="N",
                        help="requests per second for this key; 0 = unlimited (default)")
    keygen.set_defaults(handler=_keygen)

    hashing = sub.add_parser("hash", help="print the key-file hash of a key")
    hashing.add_argument("key", metavar="KEY", help="the key string; '-' reads one line from stdin")
    hashing.set_defaults(handler=_hash)

    from svc.cli import keyfile
    from svc.optimize import prune
    from svc.weightstore import cli as weights

    cli_gateway.add_parsers(sub)
    keyfile.add_parser(sub)
    weights.add_parser(sub)
    prune.add_parser(sub)
    return parser


def main(argv: list[str] | None = None, client: Client | None = None) -> int:
    """Run ``svcctl`` with ``argv`` (default: the command line); the exit status.

    ``client`` makes the requests of the commands that call the gateway or
    the supervisor (default: the real :class:`svc.cli.http.HttpClient`).
    """
    if token_flag_given(sys.argv[1:] if argv is None else argv):
        fail(NO_TOKEN_FLAG)
        return EXIT_USAGE
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:  # no command: a usage error, its help on stderr (stdout is for what a command prints)
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "uses_client", False):
        try:
            check_path_arguments(args)  # before any command of the gateway quotes them into its URL
        except CliError as e:
            fail(str(e))
            return EXIT_USAGE
        return handler(args, client if client is not None else HttpClient())
    return handler(args)


if __name__ == "__main__":
    from svc.cli import main as entry  # the one entry, which guards stdout

    sys.exit(entry())
