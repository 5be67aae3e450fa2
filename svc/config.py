"""Loading and validating the TOML configuration under ``conf/``.

Every key is declared once in a table (name, type, default, bounds, meaning);
the loader checks types strictly, refuses unknown keys and reports the first
problem as one line naming the file, the key and the problem.  The same
tables document the keys in the README.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

REQUIRED = object()


class ConfigError(Exception):
    """A configuration file that cannot be used; ``str()`` is one line."""

    def __init__(self, path: str, key: str | None, problem: str) -> None:
        self.path, self.key, self.problem = path, key, problem
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + problem)


_TYPE_NAMES = {bool: "a boolean", int: "an integer", str: "a string", float: "a number", list: "an array"}


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


@dataclass(frozen=True)
class Key:
    """One configuration key: its type, default and bounds."""

    name: str
    type: type
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple | None = None
    pattern: str | None = None

    def check(self, value: Any) -> Any:
        """``value`` converted to the key's type; raises ValueError with the problem."""
        if self.type is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif self.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, self.type)
        if not ok:
            raise ValueError(f"must be {_TYPE_NAMES.get(self.type, self.type.__name__)}, got {_describe(value)}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be at least {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"must be at most {self.maximum}, got {value}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(repr(c) for c in self.choices)}, got {value!r}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise ValueError(f"must match {self.pattern}, got {value!r}")
        return float(value) if self.type is float else value


def read_toml(path: str) -> dict:
    """The file parsed with tomlkit as plain Python values."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, None, f"cannot read: {e}") from None
    try:
        return tomlkit.parse(text).unwrap()
    except TOMLKitError as e:
        raise ConfigError(path, None, f"not valid TOML: {e}") from None


def apply_keys(path: str, table: Mapping[str, Any], keys: tuple[Key, ...], prefix: str = "") -> dict[str, Any]:
    """Values for ``keys`` from ``table`` with defaults; unknown keys refused."""
    known = {k.name: k for k in keys}
    for name in table:
        if name not in known:
            raise ConfigError(path, prefix + name, f"unknown key; known keys: {', '.join(sorted(known))}")
    out: dict[str, Any] = {}
    for key in keys:
        if key.name in table:
            try:
                out[key.name] = key.check(table[key.name])
            except ValueError as e:
                raise ConfigError(path, prefix + key.name, str(e)) from None
        elif key.default is REQUIRED:
            raise ConfigError(path, prefix + key.name, "required key is missing")
        else:
            out[key.name] = key.default
    return out


def sub_table(path: str, data: Mapping[str, Any], name: str) -> dict:
    """The table ``name`` of ``data`` (empty when absent)."""
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(path, name, f"must be a table, got {_describe(value)}")
    return value


# --- model-server configuration ------------------------------------------------

#: Paths a model server answers itself; a ``server_uri`` must not shadow them.
RESERVED_PATHS = ("/healthz", "/ready", "/metrics", "/openapi.json", "/jobs", "/v1/")


def http_limit_keys(*, max_connections: int, refusal: str) -> tuple[Key, ...]:
    """The listener limits of one process's HTTP server (svc.web.limits.HttpLimits), declared once for all three.

    ``refusal`` names the reply a connection past ``max_connections`` gets.
    """
    return (
        Key("header_timeout_ms", int, 10000,
            "A request's headers must be complete this long after its first byte (408 and close after it).",
            minimum=1),
        Key("max_connections", int, max_connections,
            f"Open HTTP connections served at once; the next one gets {refusal} and is closed.", minimum=1),
        Key("listen_backlog", int, 1024,
            "Queue of connections not yet accepted (the kernel caps it at net.core.somaxconn).", minimum=1,
            maximum=65535),
    )


MODEL_SERVER_KEYS: tuple[Key, ...] = (
    Key("id", str, REQUIRED, "Catalog id of the model served.", pattern=r"[A-Z][A-Z0-9_]{0,63}"),
    Key("port", int, REQUIRED, "Loopback TCP port of this model server.", minimum=1, maximum=65535),
    Key(
        "server_uri",
        str,
        REQUIRED,
        "Legacy path of synchronous inference (the gateway also routes it).",
        pattern=r"/[A-Za-z0-9._~\-/]{1,200}",
    ),
    Key("async_enabled", bool, False, "When false, all /jobs routes answer 404."),
    Key("async_timeout", int, 600000, "Job budget in ms (wait for a worker plus inference); 0 = none.", minimum=0),
    Key("async_max_queue", int, 8, "Admission limit on pending + running jobs.", minimum=1),
    Key("async_job_ttl", int, 300000, "How long finished jobs stay readable, in ms.", minimum=0),
    Key("async_max_completed", int, 100, "LRU cap on finished jobs kept.", minimum=1),
    Key("max_queue_depth", int, 0, "Sync wait-queue limit in image items; 0 = unlimited.", minimum=0),
    Key("max_batch_size", int, 1, "Above 1, items are collected into batches of up to this size.", minimum=1, maximum=1024),
    Key(
        "max_batch_delay_ms",
        int,
        5,
        "Batch collection window in ms: how long a batch may wait for items still being decoded.",
        minimum=0,
        maximum=10000,
    ),
    Key("max_request_items", int, 16, "Maximum entries of images per request.", minimum=1, maximum=4096),
    Key("peer_resp_timeout", int, 600, "Peer I/O timeout in seconds (idle HTTP connections are closed after it).", minimum=1),
    Key("gpu_mem_limit_mb", int, 2048, "Per-process GPU memory cap in MiB (0 = unlimited); GPU only.", minimum=0),
    Key("run_timeout_ms", int, 30000, "Deadline of a synchronous request in ms (504 or partial 68 after it).", minimum=1),
    Key("max_body_bytes", int, 32 * 1024 * 1024, "Largest request body in bytes (413 status 61 above).", minimum=1024),
    Key("max_image_pixels", int, 40_000_000, "Largest decoded image (width x height); larger images fail their item.", minimum=1),
    Key("rate_limit_qps", float, 0.0, "Per-client-IP request rate limit after authentication; 0 = unlimited.", minimum=0),
    Key("shutdown_grace_ms", int, 10000, "On SIGTERM, how long running work may take to finish.", minimum=0),
    *http_limit_keys(max_connections=1024, refusal="503 status 65"),
)

BACKEND_KEYS: tuple[Key, ...] = (
    Key("device", str, "gpu", "'cpu' or 'gpu'.", choices=("cpu", "gpu")),
    Key("threads", int, 0, "Torch intra-op threads; 0 = the number of CPU cores divided by workers.", minimum=0, maximum=1024),
    Key("workers", int, 1, "Inference threads (batches run at once).", minimum=1, maximum=64),
    Key("decode_threads", int, 2, "Threads that parse large bodies and, without decode_in_worker or on a GPU, decode images.",
        minimum=1, maximum=64),
    Key("worker_nice", int, 5, "Nice value of the inference threads (0..19): HTTP and decoding win the CPU over batches.",
        minimum=0, maximum=19),
    Key("tune_malloc", bool, True, "Tune glibc malloc (no mmap churn, no trimming) at startup: about 2x faster batches.") ,
    Key("decode_in_worker", bool, True,
        "CPU only: decode a batch's images in the inference thread right before its forward pass, not in the "
        "decode pool, so no decode thread preempts torch's threads (bench/README.md). On a GPU images are always "
        "decoded in the decode pool, overlapping the forward pass."),
)


@dataclass(frozen=True)
class BackendConfig:
    device: str
    threads: int
    workers: int
    decode_threads: int
    worker_nice: int
    tune_malloc: bool
    decode_in_worker: bool


@dataclass(frozen=True)
class ModelServerConfig:
    """A validated ``conf/server/<ID>.toml`` (the ``[model]`` table unchecked)."""

    path: str
    id: str
    port: int
    server_uri: str
    async_enabled: bool
    async_timeout: int
    async_max_queue: int
    async_job_ttl: int
    async_max_completed: int
    max_queue_depth: int
    max_batch_size: int
    max_batch_delay_ms: int
    max_request_items: int
    peer_resp_timeout: int
    gpu_mem_limit_mb: int
    run_timeout_ms: int
    max_body_bytes: int
    max_image_pixels: int
    rate_limit_qps: float
    shutdown_grace_ms: int
    header_timeout_ms: int
    max_connections: int
    listen_backlog: int
    backend: BackendConfig
    model: dict = field(default_factory=dict)

    def replace(self, **changes: Any) -> "ModelServerConfig":
        from dataclasses import replace

        return replace(self, **changes)


def load_model_server_config(path: str) -> ModelServerConfig:
    """Read and validate a model-server TOML file."""
    data = read_toml(path)
    top = {k: v for k, v in data.items() if k not in ("backend", "model")}
    values = apply_keys(path, top, MODEL_SERVER_KEYS)
    uri = values["server_uri"]
    if any(uri == p.rstrip("/") or uri.startswith(p.rstrip("/") + "/") for p in RESERVED_PATHS):
        raise ConfigError(path, "server_uri", f"{uri!r} collides with a path the server answers itself")
    backend = BackendConfig(**apply_keys(path, sub_table(path, data, "backend"), BACKEND_KEYS, prefix="backend."))
    return ModelServerConfig(path=path, backend=backend, model=sub_table(path, data, "model"), **values)


def model_server_configs(directory: str) -> list[ModelServerConfig]:
    """Every ``*.toml`` of a ``conf/server`` directory, sorted by id."""
    configs = [
        load_model_server_config(os.path.join(directory, name))
        for name in sorted(os.listdir(directory))
        if name.endswith(".toml")
    ]
    return sorted(configs, key=lambda c: c.id)
