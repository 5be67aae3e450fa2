"""``svcctl infer`` and ``svcctl jobs submit|get|wait|result``: calls to the gateway from a shell.

Why it exists: operators call the gateway without hand-writing the JSON
envelope, base64 images and the Bearer header.  A command is planned first
(:func:`plan_call`: the URL, the body read from the image files, the
deadline), then made through a :class:`svc.cli.http.Client` that prints the
JSON reply; exit 0 on a 2xx reply, 1 on any other HTTP status, 2 when no
request could be made or completed (no token, unreadable image, connection
failure, deadline), 130 when interrupted.  The token comes from the
environment, never from the command line, and is never printed.
"""

from __future__ import annotations

import argparse
import os
from typing import Any
from urllib.parse import quote

from svc.cli import jobs as cli_jobs
from svc.cli.args import (
    DEFAULT_GATEWAY,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WAIT_MS,
    GATEWAY_ENV,
    GATEWAY_RECV_TIMEOUT_MS,
    TOKEN_ENVS,
    WAIT_MARGIN_S,
    find_token,
    gateway_recv_timeout_ms,
    gateway_url,
    name_value,
    non_negative_int,
    positive_float,
    request_body,
)
from svc.cli.http import EXIT_INTERRUPTED, EXIT_USAGE, Client, CliError, HttpCall, call_gateway, fail, react


def plan_call(args: argparse.Namespace) -> HttpCall:
    """The request that an ``infer`` or ``jobs`` command makes (reads the image files).

    ``jobs wait`` sends ``?timeout=MS`` and keeps the client timeout above the
    wait budget: MS/1000 + 30 s, or ``--timeout-s`` when that is larger.  A
    ``--timeout`` at or above the gateway's receive timeout is refused here
    (the gateway would answer 502 without waiting); without one, the default
    is kept below it (a gateway set to 30000 or less refused a plain ``jobs
    wait`` naming a ``--timeout`` the user never gave).
    """
    base = gateway_url(args.gateway, os.environ).rstrip("/")
    model = f"{base}/v1/models/{quote(args.model, safe='')}"
    timeout = args.timeout_s if args.timeout_s is not None else DEFAULT_TIMEOUT_S
    action = args.command if args.command == "infer" else args.action
    if action in ("infer", "submit"):
        body = request_body(args.images, args.param, args.option, args.req_id, timeout)
        return HttpCall("POST", f"{model}/{'infer' if action == 'infer' else 'jobs'}", body, timeout)
    job = f"{model}/jobs/{quote(args.job, safe='')}"
    if action == "get":
        return HttpCall("GET", job, None, timeout)
    if action == "result":
        return HttpCall("GET", f"{job}/result", None, timeout)
    limit = gateway_recv_timeout_ms()
    if args.wait_ms is None:  # not given: the default, kept below a gateway configured under it
        wait_ms = min(DEFAULT_WAIT_MS, limit - 1)
    elif args.wait_ms >= limit:
        raise CliError(f"--timeout {args.wait_ms}: a wait through the gateway must stay below its "
                       f"upstream_recv_timeout_ms ({limit} ms); use at most {limit - 1} and wait again to wait longer")
    else:
        wait_ms = args.wait_ms
    budget = wait_ms / 1000 + WAIT_MARGIN_S
    return HttpCall("GET", f"{job}/wait?timeout={wait_ms}", None, max(budget, args.timeout_s or 0.0))


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


def client_options(timeout_help: str | None = None) -> argparse.ArgumentParser:
    """--gateway, --timeout-s and --token-env: the options of every gateway command (``jobs run`` too, with its
    own ``timeout_help``: there it bounds the whole run)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gateway", metavar="URL",
                        help=f"gateway base URL (default: ${GATEWAY_ENV}, else [gateway] host and port of "
                             f"conf/service.toml, else {DEFAULT_GATEWAY})")
    common.add_argument("--timeout-s", type=positive_float, default=None, metavar="S",
                        help=timeout_help or f"deadline of the whole request in seconds (default "
                                             f"{DEFAULT_TIMEOUT_S:g}; `jobs wait` takes at least its MS/1000 + "
                                             f"{WAIT_MARGIN_S:g})")
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

    jobs = sub.add_parser("jobs", help="asynchronous jobs: submit, get, wait, result, run")
    actions = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)
    submit = actions.add_parser("submit", parents=[request, common], help="POST /v1/models/MODEL/jobs")
    submit.set_defaults(handler=run, uses_client=True)
    for name, path in (("get", "JOB"), ("wait", "JOB/wait?timeout=MS"), ("result", "JOB/result")):
        action = actions.add_parser(name, parents=[common], help=f"GET /v1/models/MODEL/jobs/{path}")
        action.add_argument("model", metavar="MODEL", help="catalog model id")
        action.add_argument("job", metavar="JOB", help="job id (job_...)")
        action.set_defaults(handler=run, uses_client=True)
        if name == "wait":
            action.add_argument("--timeout", dest="wait_ms", type=non_negative_int, default=None,
                                metavar="MS", help=f"wait budget in milliseconds (default {DEFAULT_WAIT_MS}, or "
                                "1 less than the gateway's limit where that is lower; below "
                                f"{GATEWAY_RECV_TIMEOUT_MS} by default: the gateway's upstream_recv_timeout_ms, read from "
                                "conf/service.toml when it is here)")
    cli_jobs.add_parser(actions, client_options(cli_jobs.TIMEOUT_HELP))
