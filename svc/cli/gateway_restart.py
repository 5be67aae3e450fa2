"""The gateway's restart through the supervisor, after ``svcctl keys`` changed a key file (svc.cli.keyfile).

``POST /api/v1/servers/__gateway/restart`` with the management token
``SERVICE_API_TOKEN``; then ``GET /api/v1/status``, whose ``gateway.keys_file``
names the file the running gateway reads (the supervisor resolved it from its
own ``--config``).  The key file edited is compared with that one: a
configuration in the working directory is only a guess (an operator who keeps
the configs outside the checkout and runs ``svcctl`` there was told that every
change failed to apply), so it is used only when the supervisor does not say.
"""

from __future__ import annotations

import json
import os

from svc.cli.args import base_url, configured_url
from svc.cli.http import (
    EXIT_HTTP,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Client,
    CliError,
    HttpCall,
    Interrupted,
    Reply,
    exchange_once,
    fail,
    http_error_line,
    react,
)
from svc.contract.envelope import error_text
from svc.contract.protocol import GATEWAY_RESTART_PATH, SUPERVISOR_PORT, local_url
from svc.infra.reactors import IClientReactor

DEFAULT_SUPERVISOR = local_url(SUPERVISOR_PORT)
SUPERVISOR_ENV = "SERVICE_SUPERVISOR_URL"
RESTART_PATH = GATEWAY_RESTART_PATH
STATUS_PATH = "/api/v1/status"
RESTART_TIMEOUT_S = 60.0
STATUS_TIMEOUT_S = 10.0
INTERRUPTED = "interrupted: the key file is changed; the gateway restart may not have happened"
NOT_RESTARTED = "the key file is changed but the gateway was not restarted"


def supervisor_base(supervisor: str | None) -> str:
    """``--supervisor``, else ``$SERVICE_SUPERVISOR_URL``, else the configured or local default; CliError naming
    which one is not a URL."""
    return base_url(supervisor, "--supervisor", SUPERVISOR_ENV, configured_url("supervisor", SUPERVISOR_PORT),
                    os.environ).rstrip("/")


def restarted(reply: Reply) -> bool:
    """Whether the supervisor said it restarted the gateway: a 2xx whose body is its ``{"ok": true, ...}``."""
    if not 200 <= reply.status < 300:
        return False
    try:
        body = json.loads(reply.content)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("ok") is True


def restart_call(supervisor: str | None) -> HttpCall:
    """The supervisor request that restarts the gateway."""
    return HttpCall("POST", supervisor_base(supervisor) + RESTART_PATH, None, RESTART_TIMEOUT_S)


def restart_gateway(supervisor: str | None, token: str, client: Client) -> tuple[int, str | None]:
    """Ask the supervisor to restart the gateway: the exit status (one line on stderr when it fails), and the key
    file the gateway reads as the supervisor's status then says (None when it does not: an older supervisor)."""
    call = restart_call(supervisor)
    status_call = HttpCall("GET", supervisor_base(supervisor) + STATUS_PATH, None, STATUS_TIMEOUT_S)
    reads: list[str] = []

    async def main(reactor: IClientReactor) -> int:
        try:
            reply = await exchange_once(client, reactor, call, token)
        except Interrupted:
            fail(INTERRUPTED)
            return EXIT_INTERRUPTED
        except CliError as e:
            fail(f"{NOT_RESTARTED}: {e}".replace("(is the gateway running?)", "(is the supervisor running?)"))
            return EXIT_USAGE
        if not restarted(reply):  # a proxy's page, a redirect or cut JSON said "restarted" for a restart not made
            line = http_error_line(reply, call.method, call.url, "the supervisor's {\"ok\": true}", "supervisor")
            reason = error_text(reply.content, limit=500) if reply.status >= 400 else None  # its {ok: false, error}
            fail(f"{NOT_RESTARTED}: {line}" + (f": {reason}" if reason else ""))
            return EXIT_HTTP
        try:
            status, _, content = (await exchange_once(client, reactor, status_call, token))[:3]
            named = json.loads(content)["gateway"]["keys_file"] if status == 200 else None
        except (Interrupted, CliError, ValueError, KeyError, TypeError):
            named = None  # restarted all the same; which file it reads is then not known
        if isinstance(named, str):
            reads.append(named)
        return EXIT_OK

    code, _ = react(client, main)
    if code is None:
        fail(INTERRUPTED)
        return EXIT_INTERRUPTED, None
    return code, reads[0] if reads else None
