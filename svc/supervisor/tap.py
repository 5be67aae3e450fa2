"""``twistd -n service-supervisor [--config conf/service.toml] [--host H] [--port P] [--profile cpu|gpu|auto]
[--weights demo|pretrained] [--demo-models ID,...]``.

Fail-closed: no ``SERVICE_API_TOKEN``, no usable ``SERVICE_METRICS_TOKEN``
(missing, or equal to the inference or the management token: the gateway
child would be refused for it), a token that is an API key of the gateway's
key file, a wildcard bind without ``SERVICE_EXPOSE`` =
docker/unsafe, a bad config or profile, no complete copy of the web UI's
files, a logs folder that another running supervisor holds
(svc.supervisor.logsink.LogDirLock): one line, exit 1, before anything
listens or is spawned.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.python import usage

from svc.contract.protocol import SERVICE_CONFIG
from svc.contract.protocol import SUPERVISOR_PROGRAM as PROGRAM
from svc.infra.reactors import IServiceReactor, global_reactor
from svc.infra.twistd import ProgramOptions

if TYPE_CHECKING:
    from collections.abc import Mapping

    from twisted.application.service import IService

    from svc.supervisor.config import SupervisorConfig

log = Logger()


def key_tokens(config: SupervisorConfig, env: Mapping[str, str]) -> str | None:
    """Why the supervisor must not start with these tokens: one is an API key of the gateway's key file (the
    management token would let every holder of that key in here; the metrics, static and cluster tokens the
    gateway refuses, and the supervisor then ran with no gateway, the service looking healthy with every inference
    refused).  The gateway's own check (svc.auth.key_token_problem).  A key file that cannot be read is the
    gateway's to report."""
    from svc.auth import key_token_problem, load_key_file
    from svc.config import ConfigError

    path = os.path.abspath(config.gateway_keys_file)
    try:
        keys = load_key_file(path)
    except ConfigError:
        return None
    return key_token_problem(keys, path, env)


def ui_dir() -> str | None:
    """The web UI's files: the checkout's ui/, else the installed copy (setup.py data_files) beside the installed
    code or under ``sys.prefix`` (svc.infra.install.data_dir); None when no folder holds every file the supervisor
    serves (a partial copy failed the start with a traceback).

    Never the working directory's ``ui/``: a folder of the user's, not the service's.
    """
    from svc.infra.install import data_dir
    from svc.supervisor.api import UI_FILES

    found = data_dir("ui", sorted({name for name, _ in UI_FILES.values()}))
    return None if found is None else str(found)


#: The refusal when :func:`ui_dir` finds no complete copy of the UI.
NO_UI = ("the web UI's files are missing: no complete copy in the checkout's ui/, in share/inference-service/ui "
         "beside the installed package, or in {prefix}/share/inference-service/ui; reinstall the service")


class Options(ProgramOptions):
    synopsis = ("[--config conf/service.toml] [--host H] [--port P] [--profile cpu|gpu|auto] [--weights demo|pretrained] "
                "[--demo-models ID,...]")
    longdesc = "Spawn and watch the gateway and the model servers; serve the management API and the web UI."
    optParameters = [
        ["config", "c", SERVICE_CONFIG, "The service config (its [supervisor] and [servers.<ID>] tables)."],
        ["host", None, None, "Listen on this address instead of the config's."],
        ["port", "p", None, "Listen on this port instead of the config's.", int],
        ["profile", None, None, "cpu, gpu or auto instead of the config's profile."],
        ["weights", None, None, "demo or pretrained instead of the profile's weights."],
        ["demo-models", None, "", "Comma-separated catalog ids kept on demo weights whatever the configs say (but "
         "a local weights file): bin/quickstart names those whose pretrained weights it could not get."],
    ]

    def postOptions(self) -> None:
        if self["profile"] not in (None, "cpu", "gpu", "auto"):
            raise usage.UsageError(f"--profile must be cpu, gpu or auto, not {self['profile']!r}")
        if self["weights"] not in (None, "demo", "pretrained"):
            raise usage.UsageError(f"--weights must be demo or pretrained, not {self['weights']!r}")
        if self["port"] is not None and not 1 <= self["port"] <= 65535:
            raise usage.UsageError(f"--port must be 1..65535, not {self['port']}")
        from svc.infra.twistd import own_pidfile

        own_pidfile(self, PROGRAM)


def check_bind(host: str, env: dict[str, str]) -> str | None:
    """Why binding ``host`` is refused (None when allowed)."""
    from svc.infra.binds import bind_problem

    return bind_problem(host, env, "the management API")


def gateway_bind_problem(config: Any, env: dict[str, str]) -> str | None:
    """Why the gateway would refuse its ``[gateway] host`` (a wildcard without SERVICE_EXPOSE): the supervisor
    refuses to start for it, rather than serve its API and models with the gateway ``start_failed``."""
    from svc.infra.binds import bind_problem

    problem = bind_problem(config.gateway_host, env, "the gateway")
    return f"[gateway] host: {problem}" if problem else None


def makeService(options: Options, reactor: IServiceReactor | None = None) -> IService:
    """The supervisor's service, or a refusal (SystemExit, exit 1) before anything listens or is spawned.

    twistd passes ``options`` only; ``reactor`` (default: the global one) lets
    tests build the service tree in-process without running a reactor.
    """
    from dataclasses import replace

    from svc.infra.twistd import private_daemon_log

    private_daemon_log(options)  # before twistd opens it

    from svc.config import ConfigError, given_config_problem
    from svc.infra.process import exit_zero_on_signals, open_file_limit, refuse
    from svc.supervisor.config import check_device, check_folders, load_profile, load_supervisor_config

    env = dict(os.environ)
    token = env.get("SERVICE_API_TOKEN") or ""
    if not token:
        raise refuse(PROGRAM, "SERVICE_API_TOKEN is not set: the management API needs it (no anonymous mode)")
    from svc.auth import (
        API_TOKEN_ENV,
        CLUSTER_TOKEN_ENV,
        GATEWAY_TOKEN_ENV,
        METRICS_TOKEN_ENV,
        separate_tokens_problem,
        short_token_warnings,
        token_problem,
    )

    # Its own token, and those it hands the gateway (which would refuse them: a supervisor without its gateway).
    from svc.contract.jobid import secret_problem

    problem = token_problem(env, API_TOKEN_ENV, METRICS_TOKEN_ENV, GATEWAY_TOKEN_ENV, CLUSTER_TOKEN_ENV) or \
        separate_tokens_problem(env) or secret_problem(env)
    if problem:
        raise refuse(PROGRAM, problem)
    for warning in short_token_warnings(env, API_TOKEN_ENV):  # its own; the gateway says the others
        log.warn("{warning}", warning=warning)
    if problem := given_config_problem(options["config"]):
        raise refuse(PROGRAM, problem)
    try:
        config = load_supervisor_config(options["config"])
        overrides = {k: options[k] for k in ("host", "port") if options[k] is not None}
        config = replace(config, **overrides)
        check_folders(config)
        profile = load_profile(config, options["profile"])
        check_device(config, profile, options["profile"])
        if options["weights"] is not None:
            profile = replace(profile, weights=options["weights"])
    except ConfigError as e:
        raise refuse(PROGRAM, str(e)) from None
    refusal = check_bind(config.host, env) or gateway_bind_problem(config, env) or key_tokens(config, env)
    if refusal:
        raise refuse(PROGRAM, refusal)
    ui = ui_dir()
    if ui is None:
        raise refuse(PROGRAM, NO_UI.format(prefix=sys.prefix))

    if reactor is None:
        reactor = global_reactor()

    from svc.model.api import factories
    from svc.supervisor.manager import ChildManager
    from svc.supervisor.probe import HttpProbe
    from svc.supervisor.service import SupervisorService

    found = factories()

    def describe(model_id: str) -> dict:
        # needs_image: whether "Try it" asks for a photo (an image-to-image model of category generation does).
        factory = found.get(model_id)
        if factory is None:
            return {"category": None, "task": None, "needs_image": None}
        return {"category": factory.category, "task": factory.task, "needs_image": bool(factory.needs_image)}

    def default_variant(model_id: str) -> str | None:
        from svc.weightstore.catalog import find_variant, variants_of

        factory = found.get(model_id)
        return find_variant(factory, None).name if factory is not None and variants_of(factory) else None

    from svc.supervisor.logsink import LogDirLock

    log_lock = LogDirLock(config.log_dir)  # before any log file of the folder is opened
    try:
        if in_use := log_lock.acquire():
            raise refuse(PROGRAM, in_use)
        probe = HttpProbe(reactor, hosts=probe_hosts(config))
        demo_models = tuple(m.strip() for m in options["demo-models"].split(",") if m.strip())
        manager = ChildManager(reactor=reactor, config=config, profile=profile, probe=probe, env=env,
                               describe=describe, default_variant=default_variant, demo_models=demo_models)
    except (ConfigError, ValueError) as e:
        log_lock.release()
        raise refuse(PROGRAM, str(e)) from None
    except OSError as e:  # log_dir not a directory, say: one line, not a traceback
        log_lock.release()
        where = ""
        if e.filename and os.path.abspath(str(e.filename)).startswith(os.path.abspath(config.log_dir)):
            where = f"{config.path}: supervisor.log_dir: "  # the key to change, not only a path under it
        raise refuse(PROGRAM, where + f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")) from None
    exit_zero_on_signals(reactor)
    open_file_limit(config.max_connections, f"{config.path}: supervisor.max_connections")
    from svc.web.httplimits import HttpLimits

    return SupervisorService(reactor=reactor, manager=manager, token=token, host=config.host, port=config.port,
                             ui_dir=ui, fetch=probe.fetch, limits=HttpLimits.from_config(config), log_lock=log_lock)


def probe_hosts(config: Any) -> dict[int, str]:
    """The gateway's address for the probe when it is bound to one other than 127.0.0.1 (a cluster host's own).

    A wildcard bind answers on 127.0.0.1 too; an IPv6 address is kept as it is written (the probe brackets it
    in a URL, svc.contract.protocol.http_url).
    """
    from svc.infra.binds import is_wildcard

    host = config.gateway_host.strip()
    if host in ("127.0.0.1", "localhost") or is_wildcard(host):
        return {}
    return {config.gateway_port: host}
