"""Loading and validating the TOML configuration under ``conf/``.

Every key is declared once, as a field of the dataclass that holds its value
(:func:`setting`: type, default, bounds, meaning); :func:`keys_of` derives the
table of :class:`Key` from those fields, in field order.  The loader checks
types strictly, refuses unknown keys and reports the first problem as one
line naming the file, the key and the problem.  The same tables document the
keys in docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from svc.contract.protocol import HEALTH_PATH, JOBS, METRICS_PATH, OPENAPI_PATH, READY_PATH, SERVICE_CONFIG

REQUIRED = object()


class ConfigError(Exception):
    """A configuration file that cannot be used; ``str()`` is one line."""

    def __init__(self, path: str, key: str | None, problem: str) -> None:
        self.path, self.key, self.problem = path, key, problem
        # A key is the file's text (a table name with an escape sequence or a newline reached a terminal's log
        # raw, a security probe), and a path may hold such characters too: shown escaped unless printable.
        shown, named = (v if v is None or v.isprintable() else ascii(v)[1:-1] for v in (key, path))
        where = f"{named}: {shown}: " if shown else f"{named}: "
        super().__init__(where + problem)


#: The bound of an integer key that names none of its own: 10^12, as milliseconds 31 years.  A larger
#: duration broke where it became a timer (``shutdown_grace_ms`` 2^63 killed the shutdown watchdog).
INT_MAXIMUM = 10**12

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
    #: A value that may be a secret (a key file's ``hash``, where a raw key is pasted by mistake): never echoed.
    secret: bool = False

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
        if self.type is float and not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")  # TOML has nan and inf
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be at least {self.minimum}, got {value}")
        maximum = self.maximum if self.maximum is not None or self.type is not int else INT_MAXIMUM
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum}, got {value}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(repr(c) for c in self.choices)}, got {value!r}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            got = f"a value of {len(value)} characters (not shown)" if self.secret else repr(value)
            raise ValueError(f"must match {self.pattern}, got {got}")
        return float(value) if self.type is float else value


#: Where :func:`setting` keeps a field's :class:`Key` (its name and type are filled in by :func:`keys_of`).
_KEY_METADATA = "svc.config.key"


def setting(default: Any, doc: str, *, type: type | None = None, minimum: float | None = None,
            maximum: float | None = None, choices: tuple | None = None, pattern: str | None = None,
            secret: bool = False, dataclass_default: bool = False) -> Any:
    """A dataclass field that is also a configuration key: the key's one declaration.

    Why: the table that validates a file and the dataclass that carries its
    values used to list every key twice.  The key's name is the field's name
    and its type the field's annotation, unless ``type`` says otherwise (an
    array checked as ``list`` and kept as a tuple).  ``default`` is the
    config default (:data:`REQUIRED`: none); the field itself has no default,
    so the loader passes every value, unless ``dataclass_default`` makes the
    config default also the constructor's.
    """
    key = Key("", type, default, doc, minimum, maximum, choices, pattern, secret)  # type: ignore[arg-type]
    if dataclass_default:
        return field(default=default, metadata={_KEY_METADATA: key})
    return field(metadata={_KEY_METADATA: key})


def keys_of(cls: type) -> tuple[Key, ...]:
    """The configuration keys declared by the :func:`setting` fields of dataclass ``cls``, in field order.

    The order is the order in which :func:`apply_keys` checks them, so the
    first problem of a file is reported first.
    """
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        key = f.metadata.get(_KEY_METADATA)
        if key is not None:
            keys.append(dataclasses.replace(key, name=f.name, type=key.type or hints[f.name]))
    return tuple(keys)


def not_a_file(path: str) -> str | None:
    """Why ``path`` cannot be read as a file without blocking: a FIFO (or a device, a socket) made every
    process wait in ``open()`` forever, with nothing printed; None for a regular file, or one that is not
    there (the caller's open says so)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None  # a directory: open() says "Is a directory"
    return "cannot read: not a regular file (a FIFO, a device or a socket)"


def given_config_problem(path: str, default: str = SERVICE_CONFIG) -> str | None:
    """Why a ``--config`` given on the command line cannot be used: one that does not exist was taken as every
    default (port 8080, ``conf/api_keys.toml``, ...) without a word, as only the default file may be missing."""
    if path != default and not os.path.exists(path):
        return (f"{path}: file not found (a --config that is given must exist; only the default {default} may be "
                "missing, meaning every default)")
    return None


def read_toml(path: str) -> dict:
    """The file parsed with tomlkit as plain Python values (a leading UTF-8 byte order mark, which some editors
    write, is skipped: it was refused as "Empty key at line 1 col 0", naming nothing the user could see)."""
    problem = not_a_file(path)
    if problem:
        raise ConfigError(path, None, problem)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if os.path.islink(path):  # not "no file": the operator made a link, and it points nowhere
            raise ConfigError(path, None, f"a symbolic link to {os.readlink(path)}, which does not exist") from None
        raise ConfigError(path, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, None, f"cannot read: {e}") from None
    try:
        return tomlkit.parse(text.removeprefix("\ufeff")).unwrap()
    except TOMLKitError as e:  # tomlkit names the end of the text by the NUL it reads there ("Unexpected
        # character: '\x00'", an unclosed array), which the file does not have
        problem = str(e) if "\x00" in text else str(e).replace("Unexpected character: '\\x00'",
                                                                "Unexpected end of file", 1)
        raise ConfigError(path, None, f"not valid TOML: {problem}") from None


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

#: Paths a ``server_uri`` must not take: a model server's own, and the gateway's ``/v1/`` and ``/v2/`` (the
#: Open Inference Protocol), which the gateway answers before any legacy path.
RESERVED_PATHS = (HEALTH_PATH, READY_PATH, METRICS_PATH, OPENAPI_PATH, JOBS, "/v1/", "/v2/")


# The listener limits of one process's HTTP server (svc.web.limits.HttpLimits), declared once for all three
# processes: each config dataclass ends with these four fields.

def header_timeout_setting() -> Any:
    """The ``header_timeout_ms`` key of every process."""
    return setting(10000,
                   "A request's headers must be complete this long after its first byte (408 and close after it).",
                   minimum=1)


def body_timeout_setting() -> Any:
    """The ``body_timeout_ms`` key of every process."""
    return setting(60000,
                   "A request's body must be complete this long after its headers (408 and close after it).",
                   minimum=1)


def max_connections_setting(default: int, refusal: str) -> Any:
    """The ``max_connections`` key; ``refusal`` names the reply a connection past it gets."""
    return setting(default, "Open HTTP connections served at once; past it the one idle longest between requests "
                   f"is closed for the next, and with none idle the next one gets {refusal} and is closed.", minimum=1)


def upstream_recv_timeout_setting() -> Any:
    """The gateway's ``upstream_recv_timeout_ms``, which the supervisor reads too (how long a retired gateway drains)."""
    from svc.contract.protocol import UPSTREAM_RECV_TIMEOUT_MS

    return setting(UPSTREAM_RECV_TIMEOUT_MS, "Longest wait for a model server's whole reply (502 after it); a job "
                   "wait budget at or above it is 502.", minimum=1)


def listen_backlog_setting() -> Any:
    """The ``listen_backlog`` key of every process."""
    return setting(1024, "Queue of connections not yet accepted (the kernel caps it at net.core.somaxconn).",
                   minimum=1, maximum=65535)


@dataclass(frozen=True)
class BackendConfig:
    """The ``[backend]`` table of a model-server config."""

    device: str = setting("gpu", "'cpu' or 'gpu'.", choices=("cpu", "gpu"))
    threads: int = setting(0, "Torch intra-op threads; 0 = the CPUs this process may run on (its affinity) / workers / the replicas sharing them (SERVICE_CPU_SHARE).",
                           minimum=0, maximum=1024)
    workers: int = setting(1, "Inference threads (batches run at once).", minimum=1, maximum=64)
    decode_threads: int = setting(
        2, "Threads that parse large bodies and, without decode_in_worker or on a GPU, decode images.",
        minimum=1, maximum=64)
    worker_nice: int = setting(
        5, "Nice value of the inference threads (0..19): HTTP and decoding win the CPU over batches.",
        minimum=0, maximum=19)
    tune_malloc: bool = setting(
        True, "Tune glibc malloc (no mmap churn, no trimming, one arena for every thread) at startup: about 2x "
        "faster batches.")
    decode_in_worker: bool = setting(
        True,
        "CPU only: decode a batch's images in the inference thread right before its forward pass, not in the "
        "decode pool, so no decode thread preempts torch's threads (bench/README.md). On a GPU images are always "
        "decoded in the decode pool, overlapping the forward pass.")
    optimize: str = setting(
        "auto",
        "Optimised execution: 'auto' (measure the candidate modes at warm-up, keep the fastest that passes the "
        "accuracy gate), 'eager', or a mode such as 'channels_last', 'channels_last+jit', 'compile', "
        "'channels_last+bf16'; on a GPU also 'fp16' and 'cuda_graphs'. Checked at startup against the device "
        "(docs/optimize.md).")


@dataclass(frozen=True)
class ModelServerConfig:
    """A validated ``conf/server/<ID>.toml`` (the ``[model]`` table unchecked)."""

    path: str
    id: str = setting(REQUIRED, "Catalog id of the model served.", pattern=r"[A-Z][A-Z0-9_]{0,63}")
    port: int = setting(REQUIRED, "Loopback TCP port of this model server.", minimum=1, maximum=65535)
    server_uri: str = setting(REQUIRED, "Legacy path of synchronous inference (the gateway also routes it).",
                              pattern=r"/[A-Za-z0-9._~\-/]{1,200}")
    async_enabled: bool = setting(False, "When false, all /jobs routes answer 404.")
    async_timeout: int = setting(600000, "Job budget in ms (wait for a worker plus inference); 0 = none.", minimum=0)
    async_max_queue: int = setting(8, "Admission limit on pending + running jobs.", minimum=1)
    async_job_ttl: int = setting(300000, "How long finished jobs stay readable, in ms.", minimum=1)
    async_max_completed: int = setting(100, "LRU cap on finished jobs kept.", minimum=1)
    max_queue_depth: int = setting(0, "Sync wait-queue limit in image items; 0 = unlimited.", minimum=0)
    max_batch_size: int = setting(1, "Above 1, items are collected into batches of up to this size.",
                                  minimum=1, maximum=1024)
    max_batch_delay_ms: int = setting(
        5, "Batch collection window in ms: how long a batch may wait for items still being decoded.",
        minimum=0, maximum=10000)
    max_request_items: int = setting(16, "Maximum entries of images per request.", minimum=1, maximum=4096)
    peer_resp_timeout: int = setting(600, "Peer I/O timeout in seconds (idle HTTP connections are closed after it).",
                                     minimum=1)
    gpu_mem_limit_mb: int = setting(2048, "Per-process GPU memory cap in MiB (0 = unlimited); GPU only.", minimum=0)
    run_timeout_ms: int = setting(30000, "Deadline of a synchronous request in ms (504 or partial 68 after it).",
                                  minimum=1)
    max_body_bytes: int = setting(32 * 1024 * 1024, "Largest request body in bytes (413 status 61 above).",
                                  minimum=1024)
    max_image_pixels: int = setting(
        40_000_000, "Largest decoded image (width x height); larger images fail their item.", minimum=1)
    rate_limit_qps: float = setting(
        0.0, "Per-client-IP request rate limit after authentication; 0 = unlimited.", minimum=0)
    shutdown_grace_ms: int = setting(10000, "On SIGTERM, how long running work may take to finish.", minimum=0)
    header_timeout_ms: int = header_timeout_setting()
    body_timeout_ms: int = body_timeout_setting()
    max_connections: int = max_connections_setting(1024, "503 status 65")
    listen_backlog: int = listen_backlog_setting()
    # setting() fields have no dataclass default: mypy takes each call for one (hence the ignore).
    backend: BackendConfig  # type: ignore[misc]
    model: dict = field(default_factory=dict)

    def replace(self, **changes: Any) -> "ModelServerConfig":
        from dataclasses import replace

        return replace(self, **changes)


MODEL_SERVER_KEYS: tuple[Key, ...] = keys_of(ModelServerConfig)
BACKEND_KEYS: tuple[Key, ...] = keys_of(BackendConfig)
MODEL_SERVER_KEY_NAMES = frozenset(k.name for k in MODEL_SERVER_KEYS)


def load_model_server_config(path: str) -> ModelServerConfig:
    """Read and validate a model-server TOML file."""
    data = read_toml(path)
    top = {k: v for k, v in data.items() if k not in ("backend", "model")}
    for name, value in top.items():  # [backnd]: "unknown key; known keys: ..." listed neither table
        if isinstance(value, dict) and name not in MODEL_SERVER_KEY_NAMES:
            raise ConfigError(path, name, "unknown table; known: backend, model")
    values = apply_keys(path, top, MODEL_SERVER_KEYS)
    uri = values["server_uri"]
    if any(uri == p.rstrip("/") or uri.startswith(p.rstrip("/") + "/") for p in RESERVED_PATHS):
        raise ConfigError(path, "server_uri", f"{uri!r} collides with a path the server answers itself")
    if 0 < values["max_queue_depth"] < values["max_request_items"]:  # such a request could never be admitted
        raise ConfigError(path, "max_queue_depth", f"{values['max_queue_depth']} is below max_request_items "
                                                   f"({values['max_request_items']}): a request of that many images "
                                                   "would be 429 on an idle server, forever; 0 is unlimited")
    backend = BackendConfig(**apply_keys(path, sub_table(path, data, "backend"), BACKEND_KEYS, prefix="backend."))
    return ModelServerConfig(path=path, backend=backend, model=sub_table(path, data, "model"), **values)


def model_server_configs(directory: str) -> list[ModelServerConfig]:
    """Every ``*.toml`` of a ``conf/server`` directory, sorted by id; two configs of one ``id`` or one
    ``server_uri`` are refused naming both files (the supervisor kept the second of two ids silently)."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        raise ConfigError(directory, None, "the model-server config directory does not exist") from None
    except OSError as e:
        raise ConfigError(directory, None, f"cannot list the model-server configs: {e.strerror or e}") from None
    configs = [load_model_server_config(os.path.join(directory, name)) for name in names if name.endswith(".toml")]
    for key in ("id", "server_uri"):
        seen: dict[str, ModelServerConfig] = {}
        for config in configs:
            value = getattr(config, key)
            if value in seen:
                raise ConfigError(config.path, key, f"{value!r} is the {key} of {seen[value].path} too")
            seen[value] = config
    return sorted(configs, key=lambda c: c.id)
