"""``twistd -n service-model --server conf/server/<ID>.toml``: options and service.

Everything that can be refused before the reactor runs is refused here with
one line and exit code 1: the config file (types, unknown keys, the model
table against the plugin's schema), the plugin's declarations
(svc.model.plugincheck), the missing auth token, the device, a missing
weights file.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from twisted.logger import Logger
from twisted.python import usage

from svc.contract import jobid
from svc.contract.protocol import CPU_SHARE_ENV
from svc.contract.protocol import MODEL_PROGRAM as PROGRAM
from svc.contract.protocol import MODEL_TOKEN_ENV as AUTH_ENV
from svc.infra.reactors import IServiceReactor, global_reactor
from svc.infra.twistd import ProgramOptions

if TYPE_CHECKING:
    from twisted.application.service import IService

log = Logger()


class Options(ProgramOptions):
    synopsis = ("--server conf/server/<ID>.toml [--port N] [--device cpu|gpu] [--weights demo|pretrained[:VARIANT]] "
                "[--dev-no-auth]")
    longdesc = "Serve one catalog model on 127.0.0.1 (loopback only)."
    optParameters = [
        ["server", "s", None, "The model-server TOML file (conf/server/<ID>.toml)."],
        ["port", "p", None, "Listen on this port instead of the file's; 0 takes a free port, named in the "
         "'listening on 127.0.0.1:N' log line (for tests: no window between choosing a port and binding it).", int],
        ["device", None, None, "Override backend.device: cpu or gpu."],
        ["weights", None, None, "Override [model] weights: demo (random init) or pretrained[:VARIANT] (the default "
         "or named pretrained variant, from the weights cache); the supervisor passes its profile's choice."],
    ]
    optFlags = [
        [
            "dev-no-auth",
            None,
            f"Development only: run without {AUTH_ENV}; every route is then open to local callers.",
        ]
    ]

    def postOptions(self) -> None:
        if not self["server"]:
            raise usage.UsageError("--server is required (for example --server conf/server/MOBILENETV2.toml)")
        if self["device"] not in (None, "cpu", "gpu"):
            raise usage.UsageError(f"--device must be cpu or gpu, not {self['device']!r}")
        weights = self["weights"]
        if weights is not None and weights != "demo" and not (weights == "pretrained" or weights.startswith("pretrained:")):
            raise usage.UsageError(f"--weights must be demo, pretrained or pretrained:VARIANT, not {weights!r}")
        if self["port"] is not None and not 0 <= self["port"] <= 65535:
            raise usage.UsageError(f"--port must be 0..65535, not {self['port']}")
        from svc.infra.twistd import own_pidfile

        own_pidfile(self, f"{PROGRAM}-{os.path.splitext(os.path.basename(self['server']))[0]}")


def weights_override(factory: Any, choice: str) -> str:
    """The ``[model] weights`` value a ``--weights`` choice means for this plugin.

    ``demo`` is random init; ``pretrained[:VARIANT]`` is passed on as it is
    (the cache lookup resolves it), except for a plugin that declares no
    pretrained variants: it stays on random init, and the log says why, so a
    ``pretrained`` profile still starts every model.
    """
    from svc.model.weights import RANDOM
    from svc.weightstore.catalog import variants_of

    if choice == "demo":
        return RANDOM
    if not variants_of(factory):
        log.info("{id}: no pretrained variants are declared for this model: demo weights (random init)",
                 id=factory.catalog_id)
        return RANDOM
    return choice


def cpu_share(env: Any) -> int:
    """How many replicas of this model share this process's CPUs (``SERVICE_CPU_SHARE``, set by the
    supervisor; 1 when unset); ValueError with one line for anything but 1 to the most replicas a model has (a
    config probe: 20 digits were taken, and ``²`` passed ``isdigit`` to fail in ``int``)."""
    from svc.contract.query import parse_bounded_int
    from svc.infra.replicas import MAX_REPLICAS

    raw = env.get(CPU_SHARE_ENV) or "1"
    share = parse_bounded_int(raw, minimum=1, maximum=MAX_REPLICAS)
    if share is None:
        raise ValueError(f"{CPU_SHARE_ENV} must be a whole number from 1 to {MAX_REPLICAS} (replicas sharing these "
                         f"CPUs), not {raw!r}")
    return share


def prepare_torch(config: Any, share: int = 1) -> str:
    """The process's torch settings from ``[backend]``: malloc tuning, threads, device, compile cache; the torch
    device.

    ``backend.threads = 0`` divides the usable cores among ``share`` replicas
    and the workers (svc.model.torchenv.configure_threads).  A device that cannot
    be had (``gpu`` without CUDA), or a ``backend.optimize`` this device cannot
    run, is refused with one line.  Process-wide, so it is its own step: tests
    of the service tree replace it.
    """
    from svc.infra.process import refuse
    from svc.model import torchenv
    from svc.optimize.modes import ModeError
    from svc.optimize.support import check_setting

    try:
        if config.backend.tune_malloc:
            torchenv.tune_malloc()
        torchenv.configure_threads(config.backend.threads, config.backend.workers, share)
        device = torchenv.select_device(config.backend.device, config.gpu_mem_limit_mb)
        check_setting(config.backend.optimize, device)
        torchenv.configure_compile_cache()
        torchenv.quiet_cuda_notice(device)
        return device
    except torchenv.DeviceError as e:
        raise refuse(PROGRAM, f"{config.path}: {e}") from None
    except ModeError as e:
        raise refuse(PROGRAM, f"{config.path}: backend.optimize: {e}") from None


def makeService(options: Options, reactor: IServiceReactor | None = None) -> IService:
    """The model server's service, or a refusal (SystemExit, exit 1) before the reactor runs.

    twistd passes ``options`` only; ``reactor`` (default: the global one) lets
    tests build the service tree in-process without running a reactor.
    """
    from svc.auth import token_problem
    from svc.config import ConfigError, load_model_server_config
    from svc.infra.process import refuse
    from svc.infra.twistd import private_daemon_log
    from svc.model.api import PluginError, find_factory
    from svc.model.plugincheck import check_declarations, checked_config
    from svc.model.weights import WeightsError

    private_daemon_log(options)  # before twistd opens it

    path = options["server"]
    try:
        config = load_model_server_config(path)
        if options["port"] is not None:
            config = config.replace(port=options["port"])
        if options["device"] is not None:
            config = config.replace(backend=config.backend.__class__(**{**config.backend.__dict__, "device": options["device"]}))
        try:
            factory = find_factory(config.id)
        except PluginError as e:  # the file's `id` names no plugin (or two): one line naming the file and key
            raise ConfigError(path, "id", str(e)) from None
        check_declarations(factory)  # its config_schema is read next
        weights_from = None
        if options["weights"] is not None and "weights" in factory.config_schema.get("properties", {}):
            weights = weights_override(factory, options["weights"])
            if weights != config.model.get("weights"):  # the messages name the option, not the file
                weights_from = f"--weights {options['weights']}"
            config = config.replace(model={**config.model, "weights": weights})
        # Params bounds may come from the weights' own config (a diffusers folder's schedule length).
        table = checked_config(factory, config.model, path, weights_from=weights_from).config
    except (ConfigError, PluginError, WeightsError) as e:
        raise refuse(PROGRAM, str(e)) from None

    token = os.environ.get(AUTH_ENV) or None
    if problem := token_problem(os.environ, AUTH_ENV):
        raise refuse(PROGRAM, problem)
    if token is None and not options["dev-no-auth"]:
        raise refuse(
            PROGRAM,
            f"{AUTH_ENV} is not set: set it (the supervisor injects one) or pass --dev-no-auth for local development",
        )

    try:
        job_owner, job_secret = jobid.from_environment()
        share = cpu_share(os.environ)
    except ValueError as e:
        raise refuse(PROGRAM, str(e)) from None

    if reactor is None:
        reactor = global_reactor()
    from svc.infra.output import unblock_log_output

    unblock_log_output(options, reactor)  # a paused supervisor must not hold the model: never block on its pipe

    device = prepare_torch(config, share)

    from svc.infra.process import exit_zero_on_signals, open_file_limit
    from svc.modelserver.service import ModelServerService

    exit_zero_on_signals(reactor)
    open_file_limit(config.max_connections, f"{path}: max_connections")
    service = ModelServerService(
        reactor=reactor, config=config, factory=factory, model_config=table, device=device, auth_token=token,
        job_owner=job_owner, job_secret=job_secret,
    )
    service.listen_origin = "--port" if options["port"] is not None else f"{path}: port"  # a busy port's line
    service.weights_from = weights_from  # a load's refusal names it, as resolve_pretrained's do
    return service
