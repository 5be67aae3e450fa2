"""``svcctl infer`` and ``svcctl jobs submit|get|wait|result``: calls to the gateway from a shell.

Why it exists: operators call the gateway without hand-writing the JSON
envelope, base64 images and the Bearer header.  A command is planned first
(:func:`plan_call`: the URL, the body read from the image files, the
deadline), then made through a :class:`svc.cli_http.Client` that prints the
JSON reply; exit 0 on a 2xx reply, 1 on any other HTTP status, 2 when no
request could be made or completed (no token, unreadable image, connection
failure, deadline), 130 when interrupted.  The token comes from the
environment, never from the command line, and is never printed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from svc.cli_http import EXIT_INTERRUPTED, EXIT_USAGE, Client, CliError, HttpCall, call_gateway, fail, react
from svc.protocol import GATEWAY_PORT, UPSTREAM_RECV_TIMEOUT_MS, local_url
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


def name_value(text: str) -> tuple[str, Any]:
    """An argparse type: ``NAME=VALUE`` with VALUE read by :func:`parse_value`."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, parse_value(value)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (``--qps``, ``--timeout``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (``--timeout-s``)."""
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
    """The JSON inference request for image files (docs/contract.md, Requests).

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


def run(args: argparse.Namespace, client: Client) -> int:
    """``svcctl infer`` and ``svcctl jobs submit|get|wait|result``: one request through ``client``; the exit status."""
    try:
        token = find_token(os.environ, args.token_env)
        call = plan_call(args)
    except CliError as e:
        fail(str(e))
        return EXIT_USAGE
    code, stopped = react(client, lambda reactor: call_gateway(client, reactor, call, token))
    if code is None:  # the reactor stopped before the request began
        fail("interrupted")
        return stopped or EXIT_INTERRUPTED
    return code


# ---------------------------------------------------------------- arguments


def client_options() -> argparse.ArgumentParser:
    """--gateway, --timeout-s and --token-env: the options of every gateway command (``jobs run`` too)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gateway", default=os.environ.get(GATEWAY_ENV) or DEFAULT_GATEWAY, metavar="URL",
                        help=f"gateway base URL (default: ${GATEWAY_ENV}, else {DEFAULT_GATEWAY})")
    common.add_argument("--timeout-s", type=positive_float, default=None, metavar="S",
                        help=f"deadline of the whole request in seconds (default {DEFAULT_TIMEOUT_S:g}; "
                             f"jobs wait: at least MS/1000 + {WAIT_MARGIN_S:g})")
    common.add_argument("--token-env", metavar="NAME",
                        help=f"read the Bearer token from this variable only (default: {', '.join(TOKEN_ENVS)})")
    return common


def request_options() -> argparse.ArgumentParser:
    """MODEL, IMAGE..., --param, --option and --req-id: what an inference request is made of."""
    request = argparse.ArgumentParser(add_help=False)
    request.add_argument("model", metavar="MODEL", help="catalog model id")
    request.add_argument("images", metavar="IMAGE", nargs="+", help="image file, sent base64-encoded")
    request.add_argument("--param", type=name_value, action="append", metavar="NAME=VALUE",
                         help="a model parameter; VALUE is JSON when it parses, else a string (repeatable)")
    request.add_argument("--option", type=name_value, action="append", metavar="NAME=VALUE",
                         help="a request option, like --param (repeatable)")
    request.add_argument("--req-id", metavar="ID", help="client correlation id (echoed as task_id)")
    return request


def add_parsers(sub: Any) -> None:
    """Register ``infer`` and ``jobs submit|get|wait|result|run`` on the ``svcctl`` subcommands."""
    common, request = client_options(), request_options()
    infer = sub.add_parser("infer", parents=[request, common], help="synchronous inference: POST /v1/models/MODEL/infer")
    infer.set_defaults(handler=run, uses_client=True)

    jobs = sub.add_parser("jobs", help="asynchronous jobs: submit, get, wait, result")
    actions = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)
    submit = actions.add_parser("submit", parents=[request, common], help="POST /v1/models/MODEL/jobs")
    submit.set_defaults(handler=run, uses_client=True)
    for name, path in (("get", "JOB"), ("wait", "JOB/wait?timeout=MS"), ("result", "JOB/result")):
        action = actions.add_parser(name, parents=[common], help=f"GET /v1/models/MODEL/jobs/{path}")
        action.add_argument("model", metavar="MODEL", help="catalog model id")
        action.add_argument("job", metavar="JOB", help="job id (job_...)")
        action.set_defaults(handler=run, uses_client=True)
        if name == "wait":
            action.add_argument("--timeout", dest="wait_ms", type=non_negative_int, default=DEFAULT_WAIT_MS,
                                metavar="MS", help=f"wait budget in milliseconds (default {DEFAULT_WAIT_MS}; below "
                                f"{GATEWAY_RECV_TIMEOUT_MS}, the gateway's upstream_recv_timeout_ms)")
    from svc import cli_jobs

    cli_jobs.add_parser(actions, common)
