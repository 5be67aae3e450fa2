"""``twistd -n service-gateway [--config conf/service.toml] [--host H] [--port P] [--keys F] [--servers D]``.

Under the supervisor also ``--listen-fd N --ready-fd M``: accept on the
listening socket inherited on fd N instead of binding the port, and write a
line on fd M once accepting and another once no longer accepting
(svc.gateway.drain).  Started by hand, the
gateway binds its own port.

Fail-closed: everything that makes the gateway unsafe or useless is refused
here, before any socket listens, with one line and exit code 1 - no token or
key at all, no metrics token or one equal to another token, an unusable key
file without a static token, a wildcard bind without ``SERVICE_EXPOSE``, a
bad ``[gateway]`` or ``[cluster]`` table or catalog, a cluster token equal to
another token or key, peers without a cluster token or job secret, and a
``SERVICE_HOST_ID`` other than ``[cluster] host_id``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from twisted.logger import Logger
from twisted.python import usage

from svc.contract.protocol import GATEWAY_PROGRAM as PROGRAM
from svc.contract.protocol import HOST_ID_ENV, JOB_SECRET_ENV, SERVICE_CONFIG
from svc.infra.reactors import IServiceReactor, global_reactor
from svc.infra.twistd import ProgramOptions

if TYPE_CHECKING:
    from twisted.application.service import IService


class Options(ProgramOptions):
    synopsis = "[--config conf/service.toml] [--host H] [--port P] [--keys conf/api_keys.toml] [--servers conf/server]"
    longdesc = "Authenticate, rate-limit and route inference and job requests to the model servers."
    optParameters = [
        ["config", "c", SERVICE_CONFIG, "The service config (its [gateway] table; a missing file means defaults)."],
        ["host", None, None, "Listen on this address instead of the config's."],
        ["port", "p", None, "Listen on this port instead of the config's; 0 takes a free port, named in the "
         "'gateway on http://HOST:N/' log line (for tests: no window between choosing a port and binding it).", int],
        ["keys", "k", None, "The API key file instead of the config's keys_file."],
        ["servers", None, None, "The model-server config directory instead of the config's servers_dir."],
        ["listen-fd", None, None, "Accept on this inherited listening socket instead of binding (the supervisor's).",
         int],
        ["ready-fd", None, None,
         "Write a line on this inherited pipe once accepting, another once not (for the supervisor).", int],
    ]

    def postOptions(self) -> None:
        if self["port"] is not None and not 0 <= self["port"] <= 65535:
            raise usage.UsageError(f"--port must be 0..65535, not {self['port']}")
        for name in ("listen-fd", "ready-fd"):
            if self[name] is not None and self[name] < 3:
                raise usage.UsageError(f"--{name} must be an inherited descriptor >= 3, not {self[name]}")
        from svc.infra.twistd import own_pidfile

        own_pidfile(self, PROGRAM)


def makeService(options: Options, reactor: IServiceReactor | None = None) -> IService:
    """The gateway's service, or a refusal (SystemExit, exit 1) before anything listens.

    twistd passes ``options`` only; ``reactor`` (default: the global one) lets
    tests build the service tree in-process without running a reactor.
    """
    from svc.auth import Refused, cluster_problem, decide
    from svc.config import ConfigError, given_config_problem
    from svc.contract.jobid import secret_problem
    from svc.gateway.catalog import CatalogError, load_catalog, unknown_ids
    from svc.gateway.config import load_gateway_config
    from svc.infra.binds import bind_problem
    from svc.infra.process import refuse
    from svc.infra.twistd import private_daemon_log

    private_daemon_log(options)  # before twistd opens it

    env = dict(os.environ)
    if problem := given_config_problem(options["config"]):
        raise refuse(PROGRAM, problem)
    try:
        config = load_gateway_config(options["config"])
        overrides = {name: options[opt] for opt, name in (("host", "host"), ("port", "port"), ("keys", "keys_file"),
                                                           ("servers", "servers_dir")) if options[opt] is not None}
        config = config.replace(**overrides)
    except ConfigError as e:
        raise refuse(PROGRAM, str(e)) from None
    problem = bind_problem(config.host, env, "the gateway")
    if problem:
        raise refuse(PROGRAM, problem)
    problem = (cluster_problem(env, config.cluster.enabled) or host_id_problem(env, config.cluster.host_id)
               or secret_problem(env))
    if problem:
        raise refuse(PROGRAM, problem)
    try:
        setup = decide(env, config.keys_file)
    except Refused as e:
        raise refuse(PROGRAM, str(e)) from None
    if not os.path.isdir(config.servers_dir):  # "nodir: the model-server config directory ..." named no key
        origin = "--servers" if options["servers"] is not None else f"{config.path}: gateway.servers_dir"
        what = ("is not a folder" if os.path.exists(config.servers_dir)
                else f"does not exist (relative to {os.getcwd()})")
        raise refuse(PROGRAM, f"{origin}: {config.servers_dir} {what}")
    try:
        catalog = load_catalog(config.servers_dir, env)
    except (ConfigError, CatalogError) as e:
        raise refuse(PROGRAM, str(e)) from None
    for line in unknown_ids(catalog, env):
        Logger().warn("{problem}", problem=line)
    clash = next((up.id for up in catalog for r in up.replicas if r.port == config.port), None)
    if clash is not None:  # the supervisor refuses it too; a gateway started alone bound it and routed to itself
        origin = "--port" if options["port"] is not None else f"{config.path}: gateway.port"
        raise refuse(PROGRAM, f"{origin}: {config.port} is also the port of {clash}")

    if options["listen-fd"] is not None:
        from svc.gateway.drain import listening_family

        try:
            listening_family(options["listen-fd"])
        except OSError as e:
            raise refuse(PROGRAM, f"--listen-fd {options['listen-fd']}: {e}") from None

    if reactor is None:
        reactor = global_reactor()
    from svc.infra.output import unblock_log_output

    unblock_log_output(options, reactor)  # a paused supervisor must not stop the public port: never block on it

    from svc.config import model_server_configs
    from svc.gateway.service import GatewayService
    from svc.infra.process import exit_zero_on_signals, open_file_limit
    from svc.model.api import factories
    from svc.openapi.gateway import gateway_document

    exit_zero_on_signals(reactor)
    # A proxied request holds the client's connection and one to its model server.
    open_file_limit(2 * config.max_connections, f"{config.path}: gateway.max_connections")
    # The document it serves at /openapi.json, built as openapi/gateway.json is (the plugin lookup imports no torch).
    # A model whose plugin declares what cannot be used, or whose [model] table it refuses, is left out, as one
    # without a plugin is: its model server refuses to start with the same line, so the gateway answers 503 for
    # it, and serves the others.
    def refused(model_id: str, problem: str) -> None:
        Logger().warn("{problem}: {model} is left out of the gateway's OpenAPI document, and its model server "
                      "refuses to start (503 here)", problem=problem, model=model_id)

    try:
        configs = model_server_configs(config.servers_dir)
        openapi = gateway_document(configs, factories(), refused)
    except ConfigError:  # a config file changed since the catalog was read: no document, the routes still serve
        configs, openapi = [], None
    for model in configs:  # its deadline's 504, or partial 200, would never reach a client: the gateway's 502 would
        if 0 < config.upstream_recv_timeout_ms <= model.run_timeout_ms:
            Logger().warn("{model}: run_timeout_ms ({run} ms, {path}) is not below the gateway's "
                          "upstream_recv_timeout_ms ({recv} ms): a synchronous request that reaches its deadline gets "
                          "the gateway's 502, not the model's 504 or partial 200", model=model.id,
                          run=model.run_timeout_ms, path=model.path, recv=config.upstream_recv_timeout_ms)
    # Job ids name their replica and host under the deployment's secret (svc.gateway.owners).
    return GatewayService(reactor=reactor, config=config, setup=setup, catalog=catalog,
                          listen_fd=options["listen-fd"], ready_fd=options["ready-fd"],
                          job_secret=env.get(JOB_SECRET_ENV) or None, openapi=openapi)


def host_id_problem(env: dict[str, str], host_id: str) -> str | None:
    """Why the environment's host id contradicts the config's (None when they agree or none is given).

    The model servers mint job ids with ``SERVICE_HOST_ID`` and the gateway
    routes them by ``[cluster] host_id``: under the supervisor both come from
    the config; started by hand, a mismatch would send this host's jobs away.
    """
    given = env.get(HOST_ID_ENV)
    if given is not None and given != host_id:
        return (f"{HOST_ID_ENV}={given!r} differs from [cluster] host_id {host_id!r}: the model servers would "
                "mint job ids this gateway does not take for its own")
    return None
