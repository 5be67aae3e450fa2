"""The supervisor's configuration: ``[supervisor]`` and ``[servers.<ID>]`` of
``conf/service.toml``, and the profiles under ``conf/profiles/``.

``[gateway]`` belongs to the gateway, which validates it; the supervisor only
reads the gateway's address from it.  ``[cluster]`` (svc.cluster_config) gives
the children their host id and decides whether the gateway needs a cluster
token.  Keys are declared once (svc.config.setting fields)
with strict types; an unknown key is refused with one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from svc import config as base
from svc.cluster_config import ClusterConfig, cluster_from_table
from svc.config import ConfigError, Key, apply_keys, keys_of, read_toml, setting, sub_table
from svc.contract.protocol import GATEWAY_PORT, LOOPBACK, SUPERVISOR_PORT
from svc.infra.replicas import MAX_REPLICAS, PORT_STRIDE

POLICIES = ("on-failure", "always", "no")
WEIGHTS_CHOICES = ("demo", "pretrained")
PRETRAINED = "pretrained"


@dataclass(frozen=True)
class SupervisorConfig:
    """``[supervisor]`` (each :func:`svc.config.setting` field is one key), the servers' policies and the
    gateway's address."""

    path: str
    host: str = setting(LOOPBACK, "Address of the management API and UI (a wildcard needs SERVICE_EXPOSE).")
    port: int = setting(SUPERVISOR_PORT, "Port of the management API and UI.", minimum=1, maximum=65535)
    profile: str = setting("auto", "cpu, gpu, or auto (gpu when an NVIDIA driver is present).",
                           choices=("auto", "cpu", "gpu"))
    servers_dir: str = setting("conf/server", "Directory of the model-server configs (the catalog).")
    profiles_dir: str = setting("conf/profiles", "Directory of the profile files.")
    log_dir: str = setting("logs", "Directory of the children's log files (<id>.log).")
    log_max_bytes: int = setting(5 * 1024 * 1024, "Size at which a child's log file is rotated.", minimum=1024)
    log_backups: int = setting(3, "Rotated log files kept per child (0 keeps none).", minimum=0)
    log_ring_lines: int = setting(2000, "Lines per child kept in memory for the logs API.", minimum=10)
    stop_grace_ms: int = setting(15000, "After SIGTERM, how long a child may take before SIGKILL (the gateway: at "
                                        "least `upstream_recv_timeout_ms` + 2 s, to answer what it holds).", minimum=0)
    start_timeout_ms: int = setting(180000, "How long a start action waits for readiness before answering 500.",
                                    minimum=1000)
    backoff_initial_ms: int = setting(1000, "First restart delay after a crash; doubles per crash (at most "
                                                         "backoff_max_ms).", minimum=0)
    backoff_max_ms: int = setting(30000, "Largest restart delay.", minimum=0)
    crash_loop_restarts: int = setting(5, "Restarts within crash_loop_window_ms after which a child is failed.",
                                       minimum=1)
    crash_loop_window_ms: int = setting(60000, "Window of the crash-loop detection.", minimum=1000)
    port_wait_ms: int = setting(
        60000,
        "How long a child whose port is busy at start (an orphan of a previous supervisor still exiting) is retried, "
        "on the back-off schedule, before it is start_failed.", minimum=0)
    gateway_restart: str = setting("on-failure", "Restart policy of the gateway child.", choices=POLICIES)
    header_timeout_ms: int = base.header_timeout_setting()
    body_timeout_ms: int = base.body_timeout_setting()
    max_connections: int = base.max_connections_setting(128, "503 {ok: false, error}")
    listen_backlog: int = base.listen_backlog_setting()
    # setting() fields have no dataclass default: mypy takes each call for one (the ignores below).
    servers: dict  # type: ignore[misc]  # catalog id -> ServerSettings, for the ids that have a [servers.<ID>] table
    gateway_host: str  # type: ignore[misc]
    gateway_port: int  # type: ignore[misc]
    gateway_listen_backlog: int = 1024
    gateway_probe_interval_ms: int = 1000
    gateway_recv_timeout_ms: int = 180000
    gateway_keys_file: str = "conf/api_keys.toml"
    cluster: ClusterConfig = field(default_factory=ClusterConfig.single_host)

    def server(self, server_id: str) -> ServerSettings:
        """``[servers.<ID>]`` of a model (the defaults when the file has no such table)."""
        return self.servers.get(server_id) or ServerSettings()

    @property
    def server_policies(self) -> dict[str, str]:
        """The restart policy of every model that has a ``[servers.<ID>]`` table."""
        return {server_id: settings.restart for server_id, settings in self.servers.items()}


@dataclass(frozen=True)
class ServerSettings:
    """One ``[servers.<ID>]`` table: how the supervisor runs that model (svc.infra.replicas for the port layout)."""

    restart: str = setting("on-failure", "Restart policy: on-failure, always or no.", choices=POLICIES,
                           dataclass_default=True)
    replicas: int = setting(
        1, f"Processes of this model on this host (1 to {MAX_REPLICAS}); the gateway spreads requests over the "
        "ready ones.", minimum=1, maximum=MAX_REPLICAS, dataclass_default=True)
    ports: tuple[int, ...] = setting(
        (), f"The port of each replica; default: the config's port, then port + {PORT_STRIDE} per replica "
        f"(9101, 9201, 9301 ...).", type=list, dataclass_default=True)
    devices: tuple[int, ...] = setting(
        (), "GPU indices: replica i gets CUDA_VISIBLE_DEVICES = devices[i % len(devices)]; default: not set.",
        type=list, dataclass_default=True)
    cpus: tuple[tuple[int, ...], ...] = setting(
        (), "CPU lists, for example [[0, 1], [2, 3]]: replica i runs on cpus[i % len(cpus)] (its CPU affinity); "
        "default: every CPU.", type=list, dataclass_default=True)

    def cpus_of(self, index: int) -> tuple[int, ...]:
        """Replica ``index``'s CPU list (empty: not pinned)."""
        return self.cpus[index % len(self.cpus)] if self.cpus else ()

    def gpu_of(self, index: int) -> int | None:
        """Replica ``index``'s GPU (None: CUDA_VISIBLE_DEVICES is not set)."""
        return self.devices[index % len(self.devices)] if self.devices else None

    def cpu_share(self, index: int) -> int:
        """How many replicas of this model run on replica ``index``'s CPUs: every replica when none is pinned,
        else the most on any one of its CPUs (lists that overlap, ``[[0], [1], [0, 1]]``, share CPUs too: counting
        equal lists only, the third ran two threads on the cores the other two used)."""
        if not self.cpus:
            return self.replicas
        return max(sum(1 for i in range(self.replicas) if cpu in self.cpus_of(i)) for cpu in self.cpus_of(index))


@dataclass(frozen=True)
class Profile:
    """A profile file ``conf/profiles/<name>.toml``; each :func:`svc.config.setting` field is one key."""

    name: str
    device: str = setting("cpu", "backend.device given to every model server of the profile.", choices=("cpu", "gpu"))
    models: tuple[str, ...] = setting([], "Catalog ids started by the supervisor.", type=list)
    weights: str = setting(
        "demo",
        "demo (random-init weights, nothing to download) or pretrained (each model's default pretrained variant, "
        "from the weights cache filled by svcctl weights pull), for the models whose [model] weights says nothing "
        "(random). A model whose [model] weights names a local file or a pretrained variant keeps it; a model "
        "without pretrained variants stays on demo.", choices=WEIGHTS_CHOICES,
        dataclass_default=True)
    demo: tuple[str, ...] = setting(
        (), "Models of the profile kept on demo weights under weights = pretrained (their [model] weights says "
        "nothing); an explicit [model] weights still wins.", type=list, dataclass_default=True)


SUPERVISOR_KEYS: tuple[Key, ...] = keys_of(SupervisorConfig)
SERVER_KEYS: tuple[Key, ...] = keys_of(ServerSettings)
PROFILE_KEYS: tuple[Key, ...] = keys_of(Profile)


def weights_choice(profile_weights: str, table_weights: Any, default_variant: str | None,
                   demo: bool = False) -> tuple[str | None, dict]:
    """What a model server runs on: its ``--weights`` argument (None: none given) and the status API's
    ``{"kind", "variant"}``, from the profile's ``weights``, the server config's ``[model] weights`` and the
    plugin's default variant (None when it declares none).

    Derived from the configs alone (the supervisor never imports torch nor reads weights).  The server
    config's explicit choice wins: a local path is kept, and ``pretrained`` or ``pretrained:VARIANT`` runs
    that variant under either profile (docs/models.md, "Real models in three commands").  A model whose
    config says nothing (``random``, the default) follows the profile: ``demo``, or under ``pretrained`` the
    plugin's default variant; a plugin without variants stays on demo (the model server says so in its log).
    ``demo`` True puts the model on demo weights whatever the configs say, but a local path (the quick start
    asks so for a model whose pretrained weights it could not get).
    """
    table = table_weights if isinstance(table_weights, str) else "random"
    is_pretrained = table == PRETRAINED or table.startswith(PRETRAINED + ":")
    if table != "random" and not is_pretrained:
        return None, {"kind": "file", "variant": None}
    if demo:
        return "demo", {"kind": "demo", "variant": None}
    if is_pretrained:
        named = table.partition(":")[2] or default_variant
        if default_variant is None:  # no variants: the model server refuses its config in one line
            return None, {"kind": "pretrained", "variant": named}
        return f"{PRETRAINED}:{named}", {"kind": "pretrained", "variant": named}
    if profile_weights != PRETRAINED:
        return "demo", {"kind": "demo", "variant": None}
    if default_variant is None:
        return PRETRAINED, {"kind": "demo", "variant": None}
    return f"{PRETRAINED}:{default_variant}", {"kind": "pretrained", "variant": default_variant}


@dataclass(frozen=True)
class _GatewayRead:
    """The ``[gateway]`` keys the supervisor reads itself (it binds the gateway's socket and probes its
    replicas), checked as the gateway checks them (the same bounds: ``tests/unit/test_taps.py``)
    before anything listens: a bare ``int()`` gave a traceback for ``port = "abc"``, and bound port 1 for
    ``port = true``."""

    host: str = setting(LOOPBACK, "Address the gateway listens on.")
    port: int = setting(GATEWAY_PORT, "Port of the gateway.", minimum=1, maximum=65535)
    listen_backlog: int = base.listen_backlog_setting()
    replica_probe_interval_ms: int = setting(1000, "How often the gateway probes the replicas' /ready.",
                                             minimum=100, maximum=60000)
    upstream_recv_timeout_ms: int = base.upstream_recv_timeout_setting()  # a retired gateway drains this long
    keys_file: str = setting("conf/api_keys.toml", "The API key file ([keys.<name>] tables).")  # checked at restarts


GATEWAY_READ = keys_of(_GatewayRead)
GATEWAY_KEYS_READ = frozenset(k.name for k in GATEWAY_READ)


def load_supervisor_config(path: str) -> SupervisorConfig:
    """``[supervisor]`` and ``[servers.<ID>]`` of the service config (a missing file means defaults)."""
    data = read_toml(path) if os.path.exists(path) else {}
    for name in data:
        if name not in ("gateway", "supervisor", "servers", "cluster"):
            raise ConfigError(path, name, "unknown table; known: gateway, supervisor, servers, cluster")
    values = apply_keys(path, sub_table(path, data, "supervisor"), SUPERVISOR_KEYS, prefix="supervisor.")
    if values["backoff_initial_ms"] > values["backoff_max_ms"]:  # every delay, the first too, was the largest
        raise ConfigError(path, "supervisor.backoff_initial_ms",
                          f"{values['backoff_initial_ms']} is above backoff_max_ms ({values['backoff_max_ms']})")
    servers = {}
    for server_id, table in sub_table(path, data, "servers").items():
        if not isinstance(table, dict):
            raise ConfigError(path, f"servers.{server_id}", "must be a table")
        servers[server_id] = server_settings(path, server_id, table)
    table = sub_table(path, data, "gateway")  # the gateway checks the rest of it when it starts
    gateway = apply_keys(path, {k: v for k, v in table.items() if k in GATEWAY_KEYS_READ}, GATEWAY_READ,
                         prefix="gateway.")
    return SupervisorConfig(
        path=path,
        servers=servers,
        gateway_host=gateway["host"],
        gateway_port=gateway["port"],
        # The supervisor holds the gateway's listening socket (svc/supervisor/handover.py).
        gateway_listen_backlog=gateway["listen_backlog"],
        # A rolling restart lets the gateway see a restarted replica ready before it stops the next one.
        gateway_probe_interval_ms=gateway["replica_probe_interval_ms"],
        gateway_recv_timeout_ms=gateway["upstream_recv_timeout_ms"],
        gateway_keys_file=gateway["keys_file"],
        cluster=cluster_from_table(path, sub_table(path, data, "cluster")),
        **values,
    )


def _ints(path: str, key: str, values: list, minimum: int, maximum: int | None = None) -> tuple[int, ...]:
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum \
                or (maximum is not None and value > maximum):
            bounds = f"{minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            raise ConfigError(path, key, f"must be an array of integers ({bounds}), got {value!r} in it")
    return tuple(values)


def server_settings(path: str, server_id: str, table: dict) -> ServerSettings:
    """One ``[servers.<ID>]`` table, checked: the arrays' items, one port per replica, CPUs this host has."""
    prefix = f"servers.{server_id}."
    values = apply_keys(path, table, SERVER_KEYS, prefix=prefix)
    ports = _ints(path, prefix + "ports", values["ports"], 1, 65535)
    if ports and len(ports) != values["replicas"]:
        raise ConfigError(path, prefix + "ports", f"lists {len(ports)} port(s) for {values['replicas']} replica(s) "
                                                  "(replicas): give one port per replica")
    for index, port in enumerate(ports):  # one line naming the port and both replicas, as for any port used twice
        if port in ports[:index]:
            raise ConfigError(path, prefix + "ports", f"port {port} is used twice: by replica {ports.index(port)} "
                                                      f"and by replica {index}")
    devices = _ints(path, prefix + "devices", values["devices"], 0)
    cpus = []
    available = available_cpus()
    for entry in values["cpus"]:
        if not isinstance(entry, list) or not entry:
            raise ConfigError(path, prefix + "cpus", f"must be an array of CPU lists such as [[0, 1], [2, 3]], "
                                                     f"got {entry!r} in it")
        listed = _ints(path, prefix + "cpus", entry, 0)
        missing = sorted(set(listed) - available)
        if missing:
            raise ConfigError(path, prefix + "cpus", f"CPU {missing[0]} is not available on this host "
                                                     f"(available: {', '.join(map(str, sorted(available)))})")
        cpus.append(listed)
    return ServerSettings(restart=values["restart"], replicas=values["replicas"], ports=ports, devices=devices,
                          cpus=tuple(cpus))


def available_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity; every CPU where affinity is not supported)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return set(range(os.cpu_count() or 1))


#: The file the NVIDIA kernel driver provides while it is loaded.
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"


def nvidia_present(driver_file: str = NVIDIA_DRIVER_FILE) -> bool:
    """True when an NVIDIA driver is loaded (checked without importing torch: the supervisor never does)."""
    return os.path.exists(driver_file)


#: Signs of a GPU that CUDA may use where the driver has no /proc file: WSL2's GPU device, Jetson's, the driver's.
GPU_DEVICE_FILES = ("/dev/dxg", "/dev/nvhost-ctrl-gpu", "/dev/nvidiactl")


def gpu_possible() -> bool:
    """Whether CUDA may run here: an NVIDIA driver (:func:`nvidia_present`, what ``auto`` goes by), or a device
    of :data:`GPU_DEVICE_FILES` (WSL2, where CUDA works without the driver's /proc file, and Jetson)."""
    return nvidia_present() or any(os.path.exists(path) for path in GPU_DEVICE_FILES)


def check_device(config: SupervisorConfig, profile: Profile, given: str | None,
                 gpu_present: Callable[[], bool] | None = None) -> None:
    """A profile whose models run on a GPU, on a machine without an NVIDIA driver: ``ConfigError`` naming the choice
    (``given``: ``--profile``, else the config's key).  The supervisor started, and each model server then refused
    with advice (``backend.device``, ``--device``) that the profile overrides."""
    if profile.device == "gpu" and not (gpu_present or gpu_possible)():
        problem = (f"the {profile.name!r} profile runs its models on an NVIDIA GPU, but this machine shows none (no "
                   f"{NVIDIA_DRIVER_FILE}, nor {' or '.join(GPU_DEVICE_FILES)}): choose the cpu profile, or auto")
        raise (ConfigError("--profile", None, problem) if given
               else ConfigError(config.path, "supervisor.profile", problem))


def check_folders(config: SupervisorConfig) -> None:
    """Refuse ``servers_dir`` and ``profiles_dir`` that are no folder, and a ``log_dir`` that cannot be one
    (empty, or a file): ``svc.config.ConfigError`` naming the key, where the supervisor's start gave
    "No such file or directory" or "cpu.toml: file not found" without it.  Relative paths are the
    supervisor's working directory's, so this is checked where it starts, not where the file is read.
    """
    for key, must_exist in (("servers_dir", True), ("profiles_dir", True), ("log_dir", False)):
        value = getattr(config, key)
        if not value.strip():
            raise ConfigError(config.path, f"supervisor.{key}", "must name a folder, got an empty string")
        if os.path.exists(value) and not os.path.isdir(value):
            raise ConfigError(config.path, f"supervisor.{key}", f"{value} is not a folder")
        if must_exist and not os.path.exists(value):
            raise ConfigError(config.path, f"supervisor.{key}",
                              f"{value} does not exist (relative to {os.getcwd()})")


def load_profile(config: SupervisorConfig, name: str | None = None,
                 gpu_present: Callable[[], bool] = nvidia_present) -> Profile:
    """The profile chosen by name (or by the config); ``auto`` is ``gpu`` when ``gpu_present()``, else ``cpu``.

    ``gpu_present`` is injected so that both branches can be tested on any host.
    """
    given = name
    name = name or config.profile
    if name == "auto":
        name = "gpu" if gpu_present() else "cpu"
    path = os.path.join(config.profiles_dir, f"{name}.toml")
    if not os.path.exists(path):  # "profiles/gpu.toml: file not found" named neither the choice nor the folder's key
        problem = (f"{name!r} has no profile file: {path} does not exist (relative to {os.getcwd()}; "
                   "supervisor.profiles_dir)")
        raise (ConfigError("--profile", None, problem) if given
               else ConfigError(config.path, "supervisor.profile", problem))
    values = apply_keys(path, read_toml(path), PROFILE_KEYS)
    models = values["models"]
    if not all(isinstance(m, str) for m in models):
        raise ConfigError(path, "models", "must be an array of catalog ids")
    twice = sorted({m for m in models if models.count(m) > 1})
    if twice:  # a second entry started nothing more: a slip for another id, most likely
        raise ConfigError(path, "models", f"names {', '.join(twice)} more than once")
    # ``demo`` may name models that ``models`` leaves out (trimming ``models`` refused the start): they are not
    # started, and what they are checked against is the catalog (svc.supervisor.manager).
    return Profile(name, values["device"], tuple(models), values["weights"], tuple(values["demo"]))
