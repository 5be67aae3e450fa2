"""The children of the supervisor: which to run, how, and in what order.

The gateway starts first, then the model servers of the active profile (at once when the gateway's port is
busy: its wait is no reason for theirs).  A model runs as ``[servers.<ID>] replicas`` processes (default 1), each a
child of its own (:class:`svc.supervisor.replicaset.ReplicaSet` groups them)
on the port the layout gives it (:mod:`svc.infra.replicas`).  Each replica gets a
``SERVICE_AUTH_TOKEN`` generated here at startup, its ``SERVICE_REPLICA``
index, ``SERVICE_CPU_SHARE`` (how many replicas share its CPUs: torch's
threads are divided by it), and with ``devices``/``cpus`` its
``CUDA_VISIBLE_DEVICES`` and CPU affinity; the gateway gets the layout and
the tokens as ``SERVICE_UPSTREAM_PORTS`` and ``SERVICE_UPSTREAM_TOKENS``
(JSON by catalog id, a list per replica).  A port used twice (two models,
two replicas, a replica and the gateway or the supervisor) refuses to start,
one line naming both.  Children inherit the supervisor's environment plus
what is injected, and ``SERVICE_HOST_ID`` is ``[cluster] host_id`` for all of
them (job ids name the host).  They run ``python -P`` with the supervisor's own
code first on ``PYTHONPATH`` (svc.infra.install.child_pythonpath): a
``models/`` folder in the working directory is no plugin folder of theirs.
The gateway is refused (permanent failure, no retry) when
``SERVICE_METRICS_TOKEN`` is missing or equal to the inference or the
management token, and for the cluster settings it would refuse
(svc.auth.cluster_problem).  The gateway is a ``GatewayChild``
(svc.supervisor.handover): the supervisor holds its listening socket, and a
restart hands it from the old process to the new one, refusing no connection.
Each model server gets the profile's weights choice as ``--weights``
(``svc.supervisor.config.weights_choice``), decided again from its config
file at each spawn (a ``[model] weights`` edited before a restart is what the
restart runs), and the catalog and status views say per model whether it
runs on demo, pretrained or file weights, read from the configs only (the
supervisor never imports torch): a ready replica's, else the last start's.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, ensureDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.auth import API_TOKEN_ENV, CLUSTER_TOKEN_ENV, GATEWAY_TOKEN_ENV, METRICS_TOKEN_ENV
from svc.config import ConfigError, ModelServerConfig, load_model_server_config, model_server_configs
from svc.contract.jobid import new_secret
from svc.contract.protocol import (
    CLIENT_KEY_ENV,
    CPU_AFFINITY_ENV,
    CPU_SHARE_ENV,
    GATEWAY_CHILD,
    GATEWAY_PROGRAM,
    HEALTH_PATH,
    HOST_ID_ENV,
    JOB_SECRET_ENV,
    MODEL_INFER,
    MODEL_PROGRAM,
    MODEL_TOKEN_ENV,
    READY_PATH,
    REPLICA_ENV,
    UPSTREAM_PORTS_ENV,
    UPSTREAM_TOKENS_ENV,
    http_url,
)
from svc.infra.install import child_pythonpath
from svc.infra.process import SUPERVISOR_PID_ENV
from svc.infra.reactors import IServiceReactor
from svc.infra.replicas import LayoutError, encode, find_clash, replica_name, replica_ports
from svc.supervisor.backoff import Timing
from svc.supervisor.child import STARTING, Child, ChildError, ChildSpec, StartTimedOut
from svc.supervisor.config import Profile, SupervisorConfig, weights_choice
from svc.supervisor.handover import GatewayChild
from svc.supervisor.logsink import LogSink
from svc.supervisor.preflight import GatewayKeyFile, gateway_moved, gateway_refusal, model_config_problem
from svc.supervisor.replicaset import ReplicaSet
from svc.supervisor.spawn import bind_listening_socket, kill_group, port_is_free

log = Logger()

#: The credentials only the gateway (and the supervisor itself) use: never in a model server's environment.
GATEWAY_ONLY_SECRETS = frozenset({API_TOKEN_ENV, GATEWAY_TOKEN_ENV, METRICS_TOKEN_ENV, CLUSTER_TOKEN_ENV})

GATEWAY = GATEWAY_CHILD


def _twist(*args: str) -> list[str]:
    """A child command: this interpreter running a twistd plugin of ours (twist runner).

    ``-P``: not the working directory first on the child's ``sys.path``, where a user's own ``models/`` folder
    shadowed the plugin package; the code comes from the ``PYTHONPATH`` of :func:`child_pythonpath`.
    """
    return [sys.executable, "-P", "-m", "twisted", "--log-format", "text", *args]


class ChildManager:
    """Builds, starts and stops every child."""

    def __init__(
        self,
        *,
        reactor: IServiceReactor,
        config: SupervisorConfig,
        profile: Profile,
        probe: Callable[[int, str], Deferred],
        env: dict[str, str] | None = None,
        killer: Callable[[int, int], None] = kill_group,
        catalog: list[ModelServerConfig] | None = None,
        describe: Callable[[str], dict] | None = None,
        cwd: str | None = None,
        port_free: Callable[[int], bool] = port_is_free,
        binder: Callable[[str, int], Any] | None = None,
        default_variant: Callable[[str], str | None] | None = None,
        demo_models: tuple[str, ...] = (),
    ) -> None:
        self.reactor = reactor
        self.config = config
        self.profile = profile
        self.env = dict(os.environ if env is None else env)
        self.catalog = catalog if catalog is not None else model_server_configs(config.servers_dir)
        self.describe = describe or (lambda model_id: {})
        self._variant_of = default_variant or (lambda model_id: None)
        self._demo_models = demo_models
        self.stopping = False  # stop_all began: start_all spawns no more models
        # Per model: the --weights argument of its server and what the status API says of its weights.
        self.weights = {c.id: self._weights_choice(c.id, c.model.get("weights")) for c in self.catalog}
        known = {c.id for c in self.catalog}
        # --demo-models as the profile's demo: a misspelt id was dropped without a word (its model pulled weights)
        for what, named in ((f"profile {profile.name!r} names models", profile.models),
                            (f"profile {profile.name!r} names demo", profile.demo),
                            ("--demo-models names ids", demo_models)):
            if unknown := [m for m in named if m not in known]:
                raise ValueError(f"{what} without a config in {config.servers_dir}: {unknown}")
        timing = Timing(
            stop_grace=config.stop_grace_ms / 1000.0,
            start_timeout=config.start_timeout_ms / 1000.0,
            backoff_initial=config.backoff_initial_ms / 1000.0,
            backoff_max=config.backoff_max_ms / 1000.0,
            crash_loop_restarts=config.crash_loop_restarts,
            crash_loop_window=config.crash_loop_window_ms / 1000.0,
            port_wait=config.port_wait_ms / 1000.0,
        )
        self.ports = self._layout()
        # One token per replica: a model server accepts only its own (svc.modelserver.app).
        self.tokens = {c.id: [secrets.token_hex(32) for _ in self.ports[c.id]] for c in self.catalog}
        self.children: dict[str, Child] = {}
        self.sets: dict[str, ReplicaSet] = {}
        # The job secret signs job ids (svc.contract.jobid): the environment's (a cluster shares one), else new.
        self.job_secret = self.env.get(JOB_SECRET_ENV) or new_secret()
        # SERVICE_HOST_ID: the model servers mint job ids naming this host, which the gateway routes by.
        # (SERVICE_SUPERVISOR_PID is set at each spawn, svc.supervisor.child: a daemon's pid is known only then.)
        base = {**self.env, "PYTHONUNBUFFERED": "1", JOB_SECRET_ENV: self.job_secret,
                HOST_ID_ENV: config.cluster.host_id}
        for name in (REPLICA_ENV, CPU_SHARE_ENV, CPU_AFFINITY_ENV, SUPERVISOR_PID_ENV, "PYTHONPATH"):
            base.pop(name, None)  # set per replica or spawn, or (PYTHONPATH) below
        if pythonpath := child_pythonpath(self.env):  # the children run the code this supervisor runs
            base["PYTHONPATH"] = pythonpath
        base.pop(CLIENT_KEY_ENV, None)  # a client's key, when the shell that started the supervisor had one
        self.gateway_keys = GatewayKeyFile(config, cwd)  # the key file the gateway reads, checked at each start
        specs = [
            ChildSpec(
                name=GATEWAY,
                argv=_twist(GATEWAY_PROGRAM, "--config", config.path),
                env={**base, UPSTREAM_TOKENS_ENV: encode(self.tokens), UPSTREAM_PORTS_ENV: encode(self.ports)},
                port=config.gateway_port,
                ready_path=HEALTH_PATH,
                policy=config.gateway_restart,
                cwd=cwd,
                refused=gateway_refusal(self.env, config.cluster.enabled),
                preflight=self.gateway_keys.problem,
                restart_preflight=partial(gateway_moved, config),
            )
        ]
        replicas_of: dict[str, list[str]] = {}
        for model in self.catalog:
            specs.extend(self._replica_specs(model, base, cwd))
            replicas_of[model.id] = [spec.name for spec in specs[-len(self.ports[model.id]):]]
        for spec in specs:
            logs = LogSink(spec.name, config.log_dir, clock=reactor, max_bytes=config.log_max_bytes,
                           backups=config.log_backups, ring_lines=config.log_ring_lines)
            if spec.name == GATEWAY:
                if binder is None:  # the gateway's own listen_backlog, on the socket held for it
                    def binder(host: str, port: int) -> Any:
                        return bind_listening_socket(host, port, config.gateway_listen_backlog)
                self.children[spec.name] = GatewayChild(spec, host=config.gateway_host, env=self.env, binder=binder,
                                                        drain_s=config.gateway_recv_timeout_ms / 1000.0 + 2.0,
                                                        reactor=reactor, probe=probe, logs=logs, timing=timing,
                                                        killer=killer, port_free=port_free)
            else:
                self.children[spec.name] = Child(spec, reactor=reactor, probe=probe, logs=logs, timing=timing,
                                                 killer=killer, port_free=port_free)
        # A rolling restart waits one gateway probe interval (and a little) between two replicas.
        settle = config.gateway_probe_interval_ms / 1000.0 + 0.5
        for model_id, names in replicas_of.items():
            self.sets[model_id] = ReplicaSet(model_id, [self.children[n] for n in names], reactor=reactor,
                                             settle=settle)

    def _layout(self) -> dict[str, tuple[int, ...]]:
        """Every model's replica ports; ValueError (one line) for a port used twice."""
        unknown = sorted(set(self.config.servers) - {c.id for c in self.catalog})
        if unknown:
            raise ValueError(f"{self.config.path}: servers.{unknown[0]}: no model-server config has this id in "
                             f"{self.config.servers_dir}")
        ports = {}
        uses = [(self.config.port, "the supervisor ([supervisor] port)"),
                (self.config.gateway_port, "the gateway ([gateway] port)")]
        for model in self.catalog:
            settings = self.config.server(model.id)
            try:
                ports[model.id] = replica_ports(model.port, settings.replicas, settings.ports)
            except LayoutError as e:
                raise ValueError(f"{self.config.path}: servers.{model.id}: {e}") from None
            for i, port in enumerate(ports[model.id]):
                where = model.path if i == 0 and not settings.ports else f"[servers.{model.id}] of {self.config.path}"
                uses.append((port, f"{model.id} replica {i} ({where})" if len(ports[model.id]) > 1
                             else f"{model.id} ({where})"))
        clash = find_clash(uses)
        if clash:
            raise ValueError(clash)
        return ports

    def _weights_choice(self, model_id: str, table_weights: Any) -> tuple[str | None, dict]:
        profile = self.profile
        return weights_choice("demo" if model_id in profile.demo else profile.weights, table_weights,
                              self._variant_of(model_id), model_id in self._demo_models)

    def _weights_flag(self, model: ModelServerConfig, info: dict) -> str | None:
        """``--weights`` for a spawn of ``model`` now: its config file read again, so that a ``[model] weights`` (and
        the catalog's ``info["async"]``) edited before a restart is what the restart runs.  A file that no longer
        loads keeps the last choice: the model server reads it too, and says what is wrong."""
        try:
            now = load_model_server_config(model.path)
        except (ConfigError, OSError):
            return self.weights[model.id][0]
        info["async"] = now.async_enabled
        self.weights[model.id] = self._weights_choice(model.id, now.model.get("weights"))
        return self.weights[model.id][0]

    def _replica_specs(self, model: ModelServerConfig, base: dict[str, str], cwd: str | None) -> list[ChildSpec]:
        """One child per replica of ``model``: its port, token, index, devices and CPUs."""
        settings = self.config.server(model.id)
        ports = self.ports[model.id]
        specs = []
        # A model server needs none of the gateway's and the supervisor's credentials: a model process
        # (running whatever code its weights or plugin bring) could otherwise drive the management API.
        own = {name: value for name, value in base.items() if name not in GATEWAY_ONLY_SECRETS}
        for i, port in enumerate(ports):
            env = {**own, MODEL_TOKEN_ENV: self.tokens[model.id][i], REPLICA_ENV: str(i),
                   CPU_SHARE_ENV: str(settings.cpu_share(i))}
            gpu, cpus = settings.gpu_of(i), settings.cpus_of(i)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = str(gpu)
            if cpus:
                env[CPU_AFFINITY_ENV] = ",".join(map(str, cpus))
            def argv(flag: str | None, port: int = port) -> list[str]:
                # --port always: the port this supervisor probes and the gateway routes to, whatever the file says now.
                return _twist(MODEL_PROGRAM, "--server", model.path, "--device", self.profile.device,
                              *(("--weights", flag) if flag else ()), "--port", str(port))

            info = {"config": model, "model": model.id, "replica": i, "gpu": gpu, "cpus": cpus}

            def argv_now(argv: Callable[[str | None], list[str]] = argv, info: dict = info) -> list[str]:
                flag = self._weights_flag(model, info)  # the config file read again at each spawn
                info["weights"] = self.weights[model.id][1]  # what this replica's process loads
                return argv(flag)

            specs.append(ChildSpec(
                name=replica_name(model.id, i, len(ports)),
                argv=argv(self.weights[model.id][0]),  # as decided from the configs just read
                argv_now=argv_now,
                preflight=partial(model_config_problem, model, self.profile.device),
                env=env,
                port=port,
                ready_path=READY_PATH,
                policy=settings.restart,
                cwd=cwd,
                info=info,
            ))
        return specs

    @property
    def gateway(self) -> Child:
        return self.children[GATEWAY]

    def metrics_token(self, name: str) -> str | None:
        """The Bearer that child ``name``'s ``/metrics`` wants: its generated token, or the gateway's metrics token."""
        if name == GATEWAY:
            return self.env.get(METRICS_TOKEN_ENV) or None
        child = self.children.get(name)
        if child is None:
            return None
        return self.tokens[child.spec.info["model"]][child.spec.info["replica"]]

    def models(self) -> list[ReplicaSet]:
        """Every catalog model, in catalog order."""
        return list(self.sets.values())

    def target(self, name: str) -> Child | ReplicaSet:
        """What ``/api/v1/servers/{name}/...`` acts on: the gateway or a model; ChildError when unknown."""
        if name == GATEWAY:
            return self.gateway
        found = self.sets.get(name)
        if found is None:
            raise ChildError(f"unknown server {name[:80]!r}")
        return found

    def process(self, name: str, replica: int | None = None) -> Child:
        """One process: the gateway, or replica ``replica`` (default 0) of model ``name``; ChildError otherwise."""
        target = self.target(name)
        if isinstance(target, ReplicaSet):
            return target.replica(replica or 0)
        if replica is not None:
            raise ChildError("the gateway has no replicas")
        return target

    def start_all(self) -> Deferred:
        """The gateway first (until ready or failed, or found waiting for its port), then the profile's models."""
        return ensureDeferred(self._start_all())

    async def _start_all(self) -> None:
        gateway = self.gateway
        started = gateway.start().addErrback(lambda f: self._not_ready(GATEWAY, gateway.snapshot(), f))
        if not (gateway.state == STARTING and gateway.pid is None):  # its port busy: up to port_wait (60 s) alone
            await started  # the models start anyway
        if self.stopping:  # the shutdown ended the gateway's start (its port wait, say): no model is spawned now
            return
        results = await DeferredList([self.sets[m].start() for m in self.profile.models], consumeErrors=True)
        if self.stopping:  # "stopped before it was ready" of every model: a Ctrl-C while they load, no failure
            return
        for (ok, value), name in zip(results, self.profile.models):
            if not ok:
                self._not_ready(name, self.sets[name].snapshot(), value)

    @staticmethod
    def _not_ready(name: str, snapshot: dict, failure: Failure) -> None:
        """A start not ready in time and still starting (slow: modes measured, a loaded machine) is info; any other
        failure a warning, though the child is starting again by now (killed while it loaded, then respawned: it was
        logged as still starting after start_timeout_ms, long before that time)."""
        if failure.check(StartTimedOut) and snapshot["state"] == STARTING:
            log.info("{name} is still starting after start_timeout_ms ({phase}); the supervisor keeps "
                     "waiting for it", name=name, phase=snapshot.get("phase") or "no phase reported yet")
        else:
            log.warn("{name} not ready: {error}", name=name, error=failure.getErrorMessage())

    def stop_all(self) -> Deferred:
        """Every child ends: the gateway first, then the models.

        The gateway's socket closes at once, so new connections are refused
        (a load balancer in front sends them to another host at once), and
        the requests it already holds finish against models still running.
        Models first answered every request of the gateway's last seconds
        503 "not reachable" while its ``/healthz`` still said 200, so a load
        balancer kept sending them there (found by a scaling probe).
        """
        return ensureDeferred(self._stop_all())

    async def _stop_all(self) -> None:
        self.stopping = True
        for child in self.children.values():  # from now on nothing is spawned: an API start, a back-off
            child.closing()
        await DeferredList([self.gateway.shutdown()], consumeErrors=True)
        await DeferredList([s.shutdown() for s in self.models()], consumeErrors=True)
        for child in self.children.values():
            child.logs.close()

    # -- views --------------------------------------------------------------------------

    def model_info(self, model: ReplicaSet) -> dict[str, Any]:
        config: ModelServerConfig = model.spec.info["config"]
        return {
            "id": config.id,
            **self.describe(config.id),
            "server_uri": config.server_uri,
            "infer_path": MODEL_INFER.format(model_id=config.id),
            "port": model.children[0].spec.port,
            "async": config.async_enabled if (served := model.serving("async")) is None else served,
            "in_profile": config.id in self.profile.models,
            "weights": dict(model.serving("weights") or self.weights[config.id][1]),
        }

    def catalog_view(self) -> list[dict[str, Any]]:
        return [self.model_info(m) for m in self.models()]

    def status_view(self) -> dict[str, Any]:
        gateway = {
            "id": GATEWAY,
            "url": http_url(self.config.gateway_host, self.config.gateway_port),
            "port": self.config.gateway_port,
            "keys_file": self.gateway_keys.path,  # what svcctl keys compares the file it edited with
            **self.gateway.snapshot(),
        }
        return {
            "profile": self.profile.name,
            "device": self.profile.device,
            "weights": self.profile.weights,
            "pid": os.getpid(),  # whose status it is: the quick start trusts only its own supervisor's
            "gateway": gateway,
            "servers": [{**self.model_info(m), **m.snapshot(), "replicas": m.replica_views()} for m in self.models()],
        }
