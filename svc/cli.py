"""``svcctl``: the command-line tool of the service.

Why it exists: operators need to issue API keys without ever storing a
plaintext key, and to call the gateway from a shell without hand-writing the
JSON envelope, base64 images and the Bearer header.  It has:

* ``svcctl keygen NAME [--scope S] [--qps N]``: a new key, printed once,
  with the ``[keys.NAME]`` entry to paste into ``conf/api_keys.toml``;
* ``svcctl hash KEY``: the SHA-256 that the key file stores for a key;
* ``svcctl keys add|disable|list`` (:mod:`svc.keyfile`): edit the key file
  and have the supervisor restart the gateway;
* ``svcctl infer MODEL IMAGE...`` and ``svcctl jobs submit|get|wait|result``
  (and ``jobs run``, in :mod:`svc.cli_jobs`: all of them plus a progress bar):
  a client of the gateway (SPEC "Gateway (port 8080)") that prints the JSON
  reply; exit 0 on a 2xx reply, 1 on any other HTTP status, 2 when no request
  could be made or completed (no token, unreadable image, connection failure,
  deadline), 130 when interrupted;
* ``svcctl openapi check|write``: the committed OpenAPI documents;
* ``svcctl weights list|pull|import|verify``: pretrained weights in the
  local cache (``svc.weightstore.cli``).

The HTTP client is treq under ``task.react``; one deadline covers the request
and the body read (a slow body cannot outlive it).  Twisted and treq are imported only by the
client commands, so ``--version``, ``keygen`` and ``hash`` start fast.  The
token comes from the environment, never from the command line, and is never
printed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from svc import __version__, version_line
from svc.auth import SCOPES, check_key_name, hash_key, new_key
from svc.protocol import GATEWAY_PORT, GATEWAY_RESTART_PATH, SUPERVISOR_PORT, UPSTREAM_RECV_TIMEOUT_MS, local_url
from svc.query import WAIT_DEFAULT_MS

DEFAULT_GATEWAY = local_url(GATEWAY_PORT)
GATEWAY_ENV = "SERVICE_GATEWAY_URL"
#: Variables holding the Bearer token, in the order they are consulted.
TOKEN_ENVS = ("SERVICE_API_KEY", "SERVICE_GATEWAY_AUTH_TOKEN", "SERVICE_API_TOKEN")
DEFAULT_TIMEOUT_S = 300.0
#: ``jobs wait``: the default wait budget (svc.query) and the margin the
#: client timeout keeps above the budget.
DEFAULT_WAIT_MS = WAIT_DEFAULT_MS
WAIT_MARGIN_S = 30.0
#: The gateway's default ``upstream_recv_timeout_ms`` (svc.protocol).  A
#: model server takes waits up to 300000 ms, but the gateway answers a budget
#: at or above this with 502, so ``jobs wait`` refuses such a budget before
#: sending it: the one number a wait through the gateway must stay below.
GATEWAY_RECV_TIMEOUT_MS = UPSTREAM_RECV_TIMEOUT_MS
GATEWAY_RESTART = f"POST {GATEWAY_RESTART_PATH}"

#: TOML bare keys; other key names (those with a '.') are written quoted.
_BARE_KEY = re.compile(r"[A-Za-z0-9_\-]+")

EXIT_OK, EXIT_HTTP, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CliError(Exception):
    """A failure reported as one line on stderr and exit status 2."""


def _fail(message: str) -> None:
    print(f"svcctl: {message}", file=sys.stderr)


# ---------------------------------------------------------------- keys


def key_entry(name: str, digest: str, scope: str = "inference", qps: int = 0) -> str:
    """The ``[keys.<name>]`` table of ``conf/api_keys.toml`` for one key, as TOML text.

    A name that is not a TOML bare key (one with a '.') is quoted, so that it
    stays one table name rather than nested tables.
    """
    table = name if _BARE_KEY.fullmatch(name) else json.dumps(name)
    return (f"[keys.{table}]\n"
            f'hash = "{digest}"\n'
            f'scope = "{scope}"\n'
            f"rate_limit_qps = {qps}\n"
            "enabled = true\n")


def _keygen(args: argparse.Namespace) -> int:
    problem = check_key_name(args.name)
    if problem:
        _fail(f"key name {args.name!r} {problem}")
        return EXIT_USAGE
    key = new_key()
    print(f"key: {key}\n")
    print(key_entry(args.name, hash_key(key), args.scope, args.qps), end="")
    sys.stdout.flush()
    print("\nThe key is shown once and cannot be recovered from its hash: give it to the client now.\n"
          "Paste the entry into conf/api_keys.toml, then restart the gateway so that it reloads the file:\n"
          f"  {GATEWAY_RESTART} on the supervisor (Bearer SERVICE_API_TOKEN), e.g.\n"
          '  curl -X POST -H "Authorization: Bearer $SERVICE_API_TOKEN" '
          f"{local_url(SUPERVISOR_PORT)}{GATEWAY_RESTART_PATH}",
          file=sys.stderr)
    return EXIT_OK


def _hash(args: argparse.Namespace) -> int:
    key = sys.stdin.readline().rstrip("\r\n") if args.key == "-" else args.key
    print(hash_key(key))
    return EXIT_OK


# ---------------------------------------------------------------- gateway client


@dataclass(frozen=True)
class HttpCall:
    """One request to the gateway, decided before the reactor starts."""

    method: str
    url: str
    body: bytes | None
    timeout: float


def parse_value(text: str) -> Any:
    """A ``--param``/``--option`` value: JSON when it parses, else the string itself.

    ``0.5`` is a number, ``true`` a boolean, ``[1,2]`` a list, ``abc`` and
    ``"5"`` strings.  NaN and Infinity are kept as strings (not JSON).
    """

    def no_constants(constant: str) -> Any:
        raise ValueError(constant)

    try:
        return json.loads(text, parse_constant=no_constants)
    except ValueError:
        return text


def _name_value(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, parse_value(value)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def find_token(env: Mapping[str, str], token_env: str | None = None) -> str:
    """The Bearer token from the environment; :class:`CliError` when none is set.

    ``token_env`` names the only variable to read; without it the first
    non-empty one of :data:`TOKEN_ENVS` is used.
    """
    names = (token_env,) if token_env else TOKEN_ENVS
    for name in names:
        if env.get(name):
            return env[name]
    if token_env:
        raise CliError(f"no token: {token_env} is not set (named by --token-env)")
    raise CliError(f"no token: set {', '.join(TOKEN_ENVS[:-1])} or {TOKEN_ENVS[-1]} "
                   "(or name another variable with --token-env)")


def request_body(images: list[str], params: list[tuple[str, Any]] | None = None,
                 options: list[tuple[str, Any]] | None = None, req_id: str | None = None) -> bytes:
    """The JSON inference request for image files (SPEC "Inference request").

    ``params``, ``options`` and ``req_id`` appear only when given; a repeated
    NAME keeps its last value.  An unreadable file raises :class:`CliError`.
    """
    encoded = []
    for path in images:
        try:
            with open(path, "rb") as f:
                encoded.append(base64.b64encode(f.read()).decode("ascii"))
        except OSError as e:
            raise CliError(f"cannot read image {path}: {e.strerror or e}") from None
    body: dict[str, Any] = {"images": encoded}
    if params:
        body["params"] = dict(params)
    if options:
        body["options"] = dict(options)
    if req_id is not None:
        body["req_id"] = req_id
    return json.dumps(body).encode("utf-8")


def plan_call(args: argparse.Namespace) -> HttpCall:
    """The request that an ``infer`` or ``jobs`` command makes (reads the image files).

    ``jobs wait`` sends ``?timeout=MS`` and keeps the client timeout above the
    wait budget: MS/1000 + 30 s, or ``--timeout-s`` when that is larger.  A
    budget at or above the gateway's receive timeout is refused here (the
    gateway would answer 502 without waiting).
    """
    base = args.gateway.rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"--gateway must be an http:// or https:// URL, got {args.gateway!r}")
    model = f"{base}/v1/models/{quote(args.model, safe='')}"
    timeout = args.timeout_s if args.timeout_s is not None else DEFAULT_TIMEOUT_S
    action = args.command if args.command == "infer" else args.action
    if action in ("infer", "submit"):
        body = request_body(args.images, args.param, args.option, args.req_id)
        return HttpCall("POST", f"{model}/{'infer' if action == 'infer' else 'jobs'}", body, timeout)
    job = f"{model}/jobs/{quote(args.job, safe='')}"
    if action == "get":
        return HttpCall("GET", job, None, timeout)
    if action == "result":
        return HttpCall("GET", f"{job}/result", None, timeout)
    if args.wait_ms >= GATEWAY_RECV_TIMEOUT_MS:
        raise CliError(f"--timeout {args.wait_ms}: a wait through the gateway must stay below its "
                       f"upstream_recv_timeout_ms ({GATEWAY_RECV_TIMEOUT_MS} ms); use at most "
                       f"{GATEWAY_RECV_TIMEOUT_MS - 1} and wait again to wait longer")
    budget = args.wait_ms / 1000 + WAIT_MARGIN_S
    return HttpCall("GET", f"{job}/wait?timeout={args.wait_ms}", None, max(budget, args.timeout_s or 0.0))


def _describe(error: BaseException, call: HttpCall) -> str:
    """One line for a request that could not be made or completed."""
    from twisted.internet import defer
    from twisted.internet import error as net
    from twisted.web.client import RequestTransmissionFailed, ResponseFailed, ResponseNeverReceived

    where = f"{call.method} {call.url}"
    timeouts = (defer.TimeoutError, defer.CancelledError, net.TimeoutError)
    # treq's own timeout cancels the request: the agent reports the cancellation as the reason.
    wrapped = isinstance(error, ResponseFailed | ResponseNeverReceived | RequestTransmissionFailed)
    if isinstance(error, timeouts) or (wrapped and any(r.check(*timeouts) for r in error.reasons)):
        return f"{where}: no complete reply within {call.timeout:g} s"
    if isinstance(error, net.ConnectionRefusedError):
        return f"{where}: connection refused (is the gateway running?)"
    if isinstance(error, net.DNSLookupError):
        return f"{where}: cannot resolve the host name"
    if wrapped:
        reasons = "; ".join(r.getErrorMessage() or r.type.__name__ for r in error.reasons) or "connection lost"
        return f"{where}: the connection failed ({reasons})"
    return f"{where}: {type(error).__name__}: {error}"


async def _exchange(reactor: Any, call: HttpCall, token: str) -> tuple[int, str, bytes, str | None]:
    from treq.client import HTTPClient
    from twisted.web.client import Agent, HTTPConnectionPool

    pool = HTTPConnectionPool(reactor, persistent=False)
    client = HTTPClient(Agent(reactor, connectTimeout=call.timeout, pool=pool))
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
               "User-Agent": f"svcctl/{__version__}"}
    if call.body is not None:
        headers["Content-Type"] = "application/json"
    # treq's timeout ends when the headers arrive; the caller's deadline also covers the body.
    response = await client.request(call.method, call.url, headers=headers, data=call.body, timeout=call.timeout)
    content = await response.content()
    retry_after = response.headers.getRawHeaders("retry-after", [None])[0]
    phrase = response.phrase.decode("latin-1") if isinstance(response.phrase, bytes) else str(response.phrase)
    return response.code, phrase, content, retry_after


def _print_reply(content: bytes) -> None:
    if not content:
        return
    try:
        print(json.dumps(json.loads(content), indent=2))
    except ValueError:
        text = content.decode("utf-8", errors="replace")
        print(text, end="" if text.endswith("\n") else "\n")


async def call_gateway(reactor: Any, call: HttpCall, token: str) -> int:
    """Make ``call`` with the Bearer token, print the reply; the exit status.

    One deadline of ``call.timeout`` covers connecting, the headers and the
    body.  The reply body is printed to stdout (JSON indented by 2); a
    non-2xx status also gets one line on stderr.
    """
    from twisted.internet.defer import ensureDeferred

    d = ensureDeferred(_exchange(reactor, call, token))
    d.addTimeout(call.timeout, reactor)
    interrupted: list[bool] = []

    def on_shutdown() -> None:  # Ctrl-C or SIGTERM: say so, not "connection lost"
        if not d.called:
            interrupted.append(True)
            d.cancel()

    trigger = reactor.addSystemEventTrigger("before", "shutdown", on_shutdown)
    try:
        status, phrase, content, retry_after = await d
    except Exception as e:
        if interrupted:
            _fail("interrupted")
            return EXIT_INTERRUPTED
        _fail(_describe(e, call))
        return EXIT_USAGE
    finally:
        reactor.removeSystemEventTrigger(trigger)
    _print_reply(content)
    if 200 <= status < 300:
        return EXIT_OK
    more = f" (Retry-After: {retry_after})" if retry_after else ""
    _fail(f"HTTP {status} {phrase}{more} from {call.method} {call.url}")
    return EXIT_HTTP


def _run_client(args: argparse.Namespace) -> int:
    try:
        token = find_token(os.environ, args.token_env)
        call = plan_call(args)
    except CliError as e:
        _fail(str(e))
        return EXIT_USAGE
    from twisted.internet import task

    codes: list[int] = []

    async def main(reactor: Any) -> None:
        codes.append(await call_gateway(reactor, call, token))

    try:
        task.react(main)
    except SystemExit as e:
        if not codes:  # the reactor stopped before the request began
            _fail("interrupted")
            return e.code if isinstance(e.code, int) and e.code else EXIT_INTERRUPTED
    return codes[0]


# ---------------------------------------------------------------- arguments


def _client_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gateway", default=os.environ.get(GATEWAY_ENV) or DEFAULT_GATEWAY, metavar="URL",
                        help=f"gateway base URL (default: ${GATEWAY_ENV}, else {DEFAULT_GATEWAY})")
    common.add_argument("--timeout-s", type=_positive_float, default=None, metavar="S",
                        help=f"deadline of the whole request in seconds (default {DEFAULT_TIMEOUT_S:g}; "
                             f"jobs wait: at least MS/1000 + {WAIT_MARGIN_S:g})")
    common.add_argument("--token-env", metavar="NAME",
                        help=f"read the Bearer token from this variable only (default: {', '.join(TOKEN_ENVS)})")
    return common


def _request_options() -> argparse.ArgumentParser:
    request = argparse.ArgumentParser(add_help=False)
    request.add_argument("model", metavar="MODEL", help="catalog model id")
    request.add_argument("images", metavar="IMAGE", nargs="+", help="image file, sent base64-encoded")
    request.add_argument("--param", type=_name_value, action="append", metavar="NAME=VALUE",
                         help="a model parameter; VALUE is JSON when it parses, else a string (repeatable)")
    request.add_argument("--option", type=_name_value, action="append", metavar="NAME=VALUE",
                         help="a request option, like --param (repeatable)")
    request.add_argument("--req-id", metavar="ID", help="client correlation id (echoed as task_id)")
    return request


def build_parser() -> argparse.ArgumentParser:
    """The ``svcctl`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="svcctl", description="Command-line tool of the inference service.")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    openapi = sub.add_parser("openapi", help="check or regenerate the committed OpenAPI documents")
    openapi.add_argument("mode", choices=("check", "write"))

    keygen = sub.add_parser("keygen", help="issue an API key and print its key-file entry",
                            description="Print a new API key once, and the [keys.NAME] entry for conf/api_keys.toml.")
    keygen.add_argument("name", metavar="NAME", help="key name (the X-Service-Key header of its replies)")
    keygen.add_argument("--scope", choices=SCOPES, default="inference", help="default: inference")
    keygen.add_argument("--qps", type=_non_negative_int, default=0, metavar="N",
                        help="requests per second for this key; 0 = unlimited (default)")

    hashing = sub.add_parser("hash", help="print the key-file hash of a key")
    hashing.add_argument("key", metavar="KEY", help="the key string; '-' reads one line from stdin")

    common, request = _client_options(), _request_options()
    sub.add_parser("infer", parents=[request, common], help="synchronous inference: POST /v1/models/MODEL/infer")

    jobs = sub.add_parser("jobs", help="asynchronous jobs: submit, get, wait, result")
    actions = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("submit", parents=[request, common], help="POST /v1/models/MODEL/jobs")
    for name, path in (("get", "JOB"), ("wait", "JOB/wait?timeout=MS"), ("result", "JOB/result")):
        action = actions.add_parser(name, parents=[common], help=f"GET /v1/models/MODEL/jobs/{path}")
        action.add_argument("model", metavar="MODEL", help="catalog model id")
        action.add_argument("job", metavar="JOB", help="job id (job_...)")
        if name == "wait":
            action.add_argument("--timeout", dest="wait_ms", type=_non_negative_int, default=DEFAULT_WAIT_MS,
                                metavar="MS", help=f"wait budget in milliseconds (default {DEFAULT_WAIT_MS}; below "
                                f"{GATEWAY_RECV_TIMEOUT_MS}, the gateway's upstream_recv_timeout_ms)")
    from svc import cli_jobs, keyfile
    from svc.weightstore import cli as weights

    cli_jobs.add_parser(actions, common)
    keyfile.add_parser(sub)
    weights.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``svcctl`` with ``argv`` (default: the command line); the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is not None:  # commands that live in their own modules
        return args.handler(args)
    if args.command == "openapi":
        from svc.openapi import committed as doc

        return doc.main([f"--{args.mode}"])
    if args.command == "keygen":
        return _keygen(args)
    if args.command == "hash":
        return _hash(args)
    if args.command in ("infer", "jobs"):
        return _run_client(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
