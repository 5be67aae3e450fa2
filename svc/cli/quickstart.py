"""First-run setup of a local service, used by ``bin/quickstart``.

Run in a folder without ``conf/`` (an installed package has no checkout to run
in), it first copies the installed default configuration there
(``share/inference-service/conf``, :mod:`svc.cli.quickstart_conf`), with one line
saying so, and into a ``conf/`` without ``service.toml`` the files it lacks;
without installed defaults, or in no folder, it refuses, one line and exit 1.

Creates, once, ``secrets/local.env`` (mode 0600) with the management, inference
and metrics tokens (all different) and a first API key, and puts that key's
hash in the gateway's key file as ``[keys.local]`` (``conf/api_keys.toml``,
created mode 0600 if missing; :mod:`svc.cli.quickstart_secrets`).  The key is
printed once: in the block that follows the start (or at once with
``--prepare-only``), with the path of the secrets file; later runs keep what
exists.  Then the supervisor runs in the foreground with those
secrets in its environment (profile ``auto``: cpu on a machine without CUDA);
while the models load, one line per change says what each does (loading,
measuring mode N of M, ready), and once every model is ready (or has
failed) one block says where the UI,
the management token and the first API key are, and what to run first, read
from the status of its own supervisor only (the status's ``pid``).  In a
folder whose service already runs (its supervisor answers with the folder's
management token) it starts nothing: one line, exit 1.

Weights: the profile's ``weights`` (or ``--weights``) says demo or pretrained.
Every pretrained variant the service would run is looked up in the weights
cache first: what is cached is served as it is, and only what is missing is
pulled with ``svcctl weights pull`` (``svc.weightstore.cli``, in a child
process, which prints the size and licences, asks on a terminal for a
non-permissive licence that ``--accept-licence`` did not name, and shows its
progress) when its source answers.  A model whose variant is still missing
(an offline machine, a refused licence, a failed pull) starts on demo
weights alone, with one line naming it and why (``service-supervisor
--demo-models``), so a first run never ends without a running service.

    python -m svc.cli.quickstart [--root DIR] [--prepare-only] [--weights demo|pretrained] [--accept-licence L]...
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

from svc.cli.quickstart_arguments import arguments
from svc.cli.quickstart_conf import (  # noqa: F401 - the quick start's configuration step, named here too
    DEFAULT_CONF,
    REQUIRED_CONF,
    conf_problem,
    copy_default_conf,
)
from svc.cli.quickstart_secrets import (  # noqa: F401 - the quick start's secrets step, named here too
    FIRST_KEY_NAME,
    KEY_FILE,
    SECRETS,
    QuickstartError,
    prepare,
    read_env_file,
)
from svc.cli.quickstart_weights import (  # noqa: F401 - the quick start's weights step, named here too
    can_connect,
    fetch_missing,
    is_cached,
    pretrained_pulls,
    run_pull,
    source_hosts,
    uncached_outside_profile,
)
from svc.infra.install import drop_working_directory

SERVICE_CONFIG = os.path.join("conf", "service.toml")


def svcctl_command(root: str = ".") -> str:
    """The ``svcctl`` beside the running interpreter (``sys.executable``'s bin folder), relative to ``root`` when it
    is under it: ``.venv/bin/svcctl`` after ``bin/quickstart``, the environment's own path after an install; else
    ``python -m svc.cli``, the same program (a ``pip install --user`` puts its scripts in ``~/.local/bin``)."""
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "svcctl")
    base = os.path.abspath(root)
    if os.path.commonpath([script, base]) == base:
        script = os.path.relpath(script, base)
    if not os.path.exists(os.path.join(base, script)):  # pip install --user: the script is elsewhere
        return f"{shlex.quote(sys.executable)} -m svc.cli"
    return shlex.quote(script)


def service_addresses(root: str = ".") -> tuple[str, str]:
    """The supervisor's (UI) and the gateway's base URLs, from ``conf/service.toml`` or the defaults."""
    import tomllib

    try:
        with open(os.path.join(root, SERVICE_CONFIG), "rb") as f:
            doc = tomllib.load(f)
    except (OSError, ValueError):
        doc = {}
    sup, gw = doc.get("supervisor", {}), doc.get("gateway", {})
    return (f"http://{sup.get('host', '127.0.0.1')}:{sup.get('port', 8787)}/",
            f"http://{gw.get('host', '127.0.0.1')}:{gw.get('port', 8080)}")


def next_steps(status: dict, *, ui_url: str, gateway_url: str, api_key: str | None,
               secrets_path: str = SECRETS, svcctl: str | None = None) -> str:
    """The block printed once every model has settled: what runs, and what to do next.

    ``status`` is the supervisor's ``GET /api/v1/status``; ``api_key`` the
    first API key when this run generated it (on later runs the block says
    where it is instead of printing it again); ``svcctl`` the command to show
    (default :func:`svcctl_command` of the working directory: it said
    ``.venv/bin/svcctl`` where there was no ``.venv``).
    """
    servers = profile_servers(status)
    ready = [s["id"] for s in servers if s.get("ready")]
    gateway = status.get("gateway", {})
    if len(ready) == len(servers):
        lines = [f"== All models ready: {len(ready)} on the {status.get('profile')} profile "
                 f"({status.get('device')}), " + (f"gateway {gateway_url}" if gateway.get("ready") else
                                                  "but not the gateway:")]
    else:
        lines = [f"== {len(ready)} of {len(servers)} models ready on the {status.get('profile')} profile; not ready:"]
        for s in servers:
            if not s.get("ready"):
                why = f": {s['last_error']}" if s.get("last_error") else ""
                lines.append(f"     {s['id']} ({s.get('state')}{why}; its log: logs/{s['id']}.log)")
    others = [s["id"] for s in status.get("servers", []) if not in_profile(s)]
    if others:
        lines.append(f"   Not in the profile, stopped (start one in the web UI): {', '.join(others)}")
    if not gateway.get("ready"):
        why = f": {gateway['last_error']}" if gateway.get("last_error") else ""
        lines.append(f"   The gateway is not ready ({gateway.get('state')}{why}; its log: logs/__gateway.log)")
        if "in use" in (gateway.get("last_error") or ""):  # whatever holds the port would get the first request
            lines.append(f"   Another program holds {gateway_url}: stop it, or set [gateway] port in "
                         "conf/service.toml and run this again; Start in the web UI retries the same port.")
    key = api_key if api_key else f"SERVICE_API_KEY in {secrets_path}"
    lines += [
        f"   Web UI:            {ui_url}  (paste the management token)",
        f"   Management token:  SERVICE_API_TOKEN in {secrets_path} (mode 0600)",
        f"   First API key:     {key}",
    ]
    if gateway.get("ready"):  # else the first request (with the management token) went to whatever answered there
        lines += [
            "   Try it from another shell" + (" in this folder" if not os.path.isabs(secrets_path) else "")
            + " (some.jpg: any photo of yours):",
            f"     set -a; . {secrets_path}; set +a; {svcctl or svcctl_command()} infer MOBILENETV2 some.jpg "
            "--param top_k=3",
        ]
    lines.append("   More in README.md, \"Try it\". Ctrl-C stops everything.")
    return "\n".join(lines) + "\n"


def progress_lines(seen: dict[str, str], status: dict) -> list[str]:
    """One line per model whose doing changed since ``seen`` (updated): loading, measuring mode N of M, ready.

    What a model does is its status: ``ready``, else the phase its model
    server reports while it loads (``svc.supervisor.child``: the ``/ready``
    reason, such as ``measuring mode 2 of 4 (compile)``), else its state.
    """
    lines = []
    for server in profile_servers(status):
        if not_started(server):
            continue  # "stopped" before its first start would read as a failure
        if server.get("ready"):
            doing = "ready"
        elif server.get("state") in ("starting", "running"):
            phase = server.get("phase") or "starting"
            doing = phase.removeprefix("the model is loading: ")
        else:
            doing = server.get("state") or "?"
        if seen.get(server["id"]) != doing:
            seen[server["id"]] = doing
            lines.append(f"   {server['id']}: {doing}")
    return lines


def profile_servers(status: dict) -> list[dict]:
    """The model servers of the status that the supervisor starts: those of its profile.

    The catalog's other models are listed too (``in_profile`` false), stopped
    until someone starts them: the quick start neither waits for them nor
    counts them as not ready.
    """
    return [s for s in status.get("servers", []) if in_profile(s)]


def in_profile(server: dict) -> bool:
    """Whether the supervisor starts ``server``: its status's ``in_profile`` (absent: it does)."""
    return bool(server.get("in_profile", True))


def not_started(child: dict) -> bool:
    """Whether the supervisor has not spawned ``child`` yet: stopped, with no exit and no error behind it.

    The supervisor starts every child of the profile, one after the other, so
    such a child is on its way, not stopped.
    """
    return (child.get("state") == "stopped" and child.get("last_exit") is None and not child.get("last_error")
            and child.get("pid") is None)


def settled(status: dict) -> bool:
    """True once no child is still on its way: each is ready, or stopped trying (failed, start_failed, ...)."""
    children = [status.get("gateway", {}), *profile_servers(status)]
    return all(c.get("ready") or (c.get("state") not in ("starting", "backoff", "running") and not not_started(c))
               for c in children)


def fetch_status(ui_url: str, token: str, timeout: float = 5.0) -> dict | None:
    """The supervisor's status, or None while it does not answer yet."""
    parts = urlsplit(ui_url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        from svc.web.site import QUICKSTART_USER_AGENT  # its access-log lines are debug: not in the terminal

        connection.request("GET", "/api/v1/status", headers={"Authorization": f"Bearer {token}",
                                                               "User-Agent": QUICKSTART_USER_AGENT})
        reply = connection.getresponse()
        body = reply.read()
        return json.loads(body) if reply.status == 200 else None
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def already_running(ui_url: str, token: str) -> str | None:
    """Why no second service starts in this folder: its supervisor answers on ``ui_url`` with this folder's
    management token (None when nothing answers so).  A second quick start took that supervisor's readiness
    for its own and printed the whole next-steps block, then failed with its own supervisor's refusal."""
    status = fetch_status(ui_url, token)
    if status is None:
        return None
    pid = status.get("pid")
    return (f"a service of this folder already runs: its supervisor (pid {pid}) answers on {ui_url}; use it as it "
            f"is, or stop it first (Ctrl-C in its terminal, or kill -TERM {pid})")


def own_status(status: dict | None, pid: int) -> dict | None:
    """``status`` when the supervisor that answered is the quick start's own (``pid``), else None.

    While its supervisor still imports, another one on the same port (a run
    started meanwhile in the same folder, with the same token) may answer:
    its readiness is not this run's.
    """
    return status if status is not None and status.get("pid") == pid else None


def weights_said(weights: str, pretrained: list[str], demo: Mapping[str, str]) -> str:
    """The weights the supervisor starts on, in words: the profile's, and under ``demo`` the models whose configs
    name a variant, which run it (``MODEL:VARIANT`` in ``pretrained``, less those left on demo): an upgrade probe
    read "(demo weights)" while two models served their pulled variants."""
    served = [spec for spec in pretrained if spec.partition(":")[0] not in demo]
    if weights == "pretrained":  # those left on demo were named above, one line each (a new-user probe: all seven
        if pretrained and not served:  # were on demo while this line said "pretrained weights")
            return "pretrained weights asked, none to be had: demo weights"
        return "pretrained weights" + (f"; demo for {', '.join(sorted(demo))}" if demo else "")
    return f"{weights} weights" + (f"; pretrained by their configs: {', '.join(served)}" if served else "")


def main(argv: list[str] | None = None) -> int:
    """Prepare the secrets, run the supervisor, and say what to do once the models are up.

    The supervisor runs as a child (its output goes to this terminal) rather
    than replacing this process, so that this process can watch the status
    and print the next-steps block once, after the last model settled.
    """
    args = arguments(argv)
    if problem := conf_problem(args.root):  # else its secrets and key file went anywhere
        print(f"quickstart: {problem}", file=sys.stderr, flush=True)
        return 1
    first_run = not os.path.lexists(os.path.join(args.root, SECRETS))
    # Named whole where the run's folder is not the shell's: "secrets/local.env" read another folder's (a probe).
    secrets_path = SECRETS if os.path.samefile(args.root, ".") else os.path.join(os.path.abspath(args.root), SECRETS)
    try:
        values = prepare(args.root, show_key=args.prepare_only)  # else shown once, in the next-steps block
    except QuickstartError as e:
        print(f"quickstart: {e}", file=sys.stderr, flush=True)
        return 1
    if args.prepare_only:
        if not first_run:  # else nothing at all was said (a new-user probe)
            print(f"{secrets_path} exists: nothing to prepare (the first API key is its SERVICE_API_KEY)", flush=True)
        return 0
    os.chdir(args.root)
    ui_url, gateway_url = service_addresses()
    if running := already_running(ui_url, values["SERVICE_API_TOKEN"]):
        print(f"quickstart: {running}", file=sys.stderr, flush=True)
        return 1
    env = {**os.environ, **{k: v for k, v in values.items() if k != "SERVICE_API_KEY"}}
    from svc.config import ConfigError
    from svc.supervisor.config import load_profile, load_supervisor_config

    try:
        weights = args.weights or load_profile(load_supervisor_config(SERVICE_CONFIG)).weights
        pulls = pretrained_pulls(".", weights)
        demo = fetch_missing(pulls, env, accept=tuple(args.accept))
        demo.update(uncached_outside_profile(".", weights, env))
    except ConfigError as e:  # one line naming the file and the key, as the supervisor would refuse it
        show_unseen_key(values if first_run else None)
        print(f"quickstart: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"Starting the supervisor ({weights_said(weights, [spec for spec, _ in pulls], demo)}): UI and management "
          f"API on {ui_url}, gateway on "
          f"{gateway_url}; the models load for a minute or two (logs below)...", flush=True)
    # twist, as the supervisor runs its children: it writes info and above, so the debug lines of this
    # process's own status poll (svc.web.site) stay out of the terminal; twistd would write them all.  This
    # interpreter with -P (svc.supervisor.manager._twist): a models/ folder here is the user's, not the plugins',
    # and a pip install --user has no twist script beside the interpreter.
    command = [sys.executable, "-P", "-m", "twisted", "--log-format", "text", "service-supervisor", "--weights", weights]
    if demo:
        command += ["--demo-models", ",".join(demo)]
    child = subprocess.Popen(command, env=env)

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signal.SIGTERM)

    # Ctrl-C reaches the supervisor from the terminal too (same process group): a second stop signal changes
    # nothing there.  A SIGINT sent to this process alone (kill -INT <pid>) did nothing when it was ignored.
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    seen: dict[str, str] = {}
    while child.poll() is None:
        status = own_status(fetch_status(ui_url, values["SERVICE_API_TOKEN"]), child.pid)
        for line in progress_lines(seen, status or {}):
            print(line, flush=True)
        if status is not None and settled(status):
            print(next_steps(status, ui_url=ui_url, gateway_url=gateway_url, secrets_path=secrets_path,
                             api_key=values["SERVICE_API_KEY"] if first_run else None), flush=True)
            first_run = False  # shown
            break
        try:
            child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
    code = child.wait()
    show_unseen_key(values if first_run else None)
    return exit_status(code)


def show_unseen_key(values: dict[str, str] | None) -> None:
    """The first API key of a first run that ends before its next-steps block (a bad setting, a supervisor that
    stops): shown now, or it was never shown (the next run only names the secrets file)."""
    if values is not None:
        print("Your first API key (shown once; it is also in the secrets file):", flush=True)
        print(f"  {values['SERVICE_API_KEY']}", flush=True)


def exit_status(returncode: int) -> int:
    """The quick start's exit status for the supervisor's ``returncode``: its own, or 128 + N when signal N killed
    it, with a line that says so (the supervisor could not: ``sys.exit(-9)`` exited 247 in silence)."""
    if returncode >= 0:
        return returncode
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = " (when nobody sent it, usually the kernel's OOM killer: see `dmesg`)" if name == "SIGKILL" else ""
    print(f"quickstart: the supervisor was killed by {name} ({-returncode}){hint}; its model servers and gateway "
          "stop on their own within seconds", file=sys.stderr, flush=True)
    return 128 - returncode


if __name__ == "__main__":
    drop_working_directory()  # python -m put it first: a models/ folder of the user's there is no plugin folder
    sys.exit(main())
