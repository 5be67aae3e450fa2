"""The gateway's ``[gateway]`` table of ``conf/service.toml``, and the ``[cluster]`` table it routes jobs with.

Keys are declared once (``svc.config.setting`` fields of :class:`GatewayConfig`) with strict types; an unknown key
is refused with one line naming the file and the key.  ``[cluster]`` is
declared in svc.cluster_config (the supervisor reads it too).  The other
tables of the file (``[supervisor]``, ``[servers.<ID>]``) belong to the
supervisor and are not read here.  A missing file means every default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from svc import config as base
from svc.cluster_config import ClusterConfig, cluster_from_table
from svc.config import ConfigError, Key, apply_keys, keys_of, read_toml, setting, sub_table
from svc.contract.protocol import GATEWAY_MAX_BODY_BYTES, GATEWAY_PORT, LOOPBACK, SUPERVISOR_PORT, local_url

#: ``rate_limit_store`` of in-process buckets.
LOCAL_STORE = "local"


@dataclass(frozen=True)
class GatewayConfig:
    """A validated ``[gateway]`` table; each :func:`svc.config.setting` field is one key."""

    path: str
    host: str = setting(LOOPBACK, "Address the gateway listens on (a wildcard needs SERVICE_EXPOSE).")
    port: int = setting(GATEWAY_PORT, "Port of the gateway.", minimum=1, maximum=65535)
    keys_file: str = setting("conf/api_keys.toml", "The API key file ([keys.<name>] tables).")
    servers_dir: str = setting("conf/server",
                               "Directory of the model-server configs: the catalog the gateway routes to.")
    upstream_recv_timeout_ms: int = base.upstream_recv_timeout_setting()
    upstream_connect_timeout_ms: int = setting(5000, "Longest wait for a connection to a model server.", minimum=1)
    upstream_idle_timeout_s: int = setting(
        30,
        "Idle pooled connections to model servers are closed after this; kept below every model's "
        "peer_resp_timeout so a POST never meets a connection the server closed.", minimum=1)
    upstream_max_connections: int = setting(
        64, "Persistent connections kept per model server (the pool does not cap concurrency).", minimum=1)
    max_body_bytes: int = setting(
        GATEWAY_MAX_BODY_BYTES,
        "Largest request body the gateway accepts (413 status 61 above); each model server has its own limit.",
        minimum=1024)
    cors_origins: tuple[str, ...] = setting(
        None,
        "Browser origins whose calls the gateway answers with CORS headers; default: the supervisor UI "
        "(http://127.0.0.1:<port> and http://localhost:<port> of [supervisor]).", type=list)
    idle_timeout_s: int = setting(660, "Client connections idle this long are closed.", minimum=1)
    replica_probe_interval_ms: int = setting(
        1000, "How often the /ready of each replica of a model with several is probed; a replica that refused a "
        "connection or failed its probe gets requests again once a probe answers 200.", minimum=100, maximum=60000)
    header_timeout_ms: int = base.header_timeout_setting()
    body_timeout_ms: int = base.body_timeout_setting()
    max_connections: int = base.max_connections_setting(1024, "503 status 65")
    listen_backlog: int = base.listen_backlog_setting()
    key_max_in_flight: int = setting(
        512, "Requests one key may have in flight at once, job waits included (429 status 429 with Retry-After 1 "
        "past it): within its rate a key could otherwise hold every connection of a model server with parked "
        "waits. Keep it below the models' max_connections; 0: no limit.", minimum=0)
    rate_limit_store: str = setting(
        LOCAL_STORE,
        'Where the per-key token buckets live: "local" (this process) or "redis://HOST:PORT/DB" (shared by every '
        "gateway using that Redis; this gateway falls back to local buckets while it is unreachable).")
    rate_limit_timeout_ms: int = setting(
        100, "Longest wait for Redis's answer to one request's rate-limit check; past it that request is checked "
        "against the local bucket and Redis is retried in the background.", minimum=1, maximum=10000)
    rate_limit_retry_ms: int = setting(
        1000, "While Redis is unreachable, how often the gateway tries to reconnect.", minimum=10)
    cluster: ClusterConfig = field(default_factory=ClusterConfig.single_host)

    def replace(self, **changes: Any) -> "GatewayConfig":
        from dataclasses import replace

        return replace(self, **changes)


GATEWAY_KEYS: tuple[Key, ...] = keys_of(GatewayConfig)


@dataclass(frozen=True)
class RedisAddress:
    """``redis://HOST:PORT/DB`` of ``rate_limit_store``."""

    host: str
    port: int
    db: int

    def __str__(self) -> str:
        return f"redis://{self.host}:{self.port}/{self.db}"


def redis_address(value: str) -> RedisAddress | None:
    """The Redis of a ``rate_limit_store`` value (None: ``local``); ValueError naming the problem."""
    if value == LOCAL_STORE:
        return None
    try:
        parts = urlsplit(value)
        port = parts.port or 6379
    except ValueError as e:
        raise ValueError(f"{value!r} is not a URL: {e}") from None
    db = parts.path.lstrip("/") or "0"
    if parts.scheme != "redis" or not parts.hostname:
        raise ValueError(f'must be "local" or "redis://HOST:PORT/DB", got {value!r}')
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f'must be "redis://HOST:PORT/DB" without a user, password or query, got {value!r}')
    if not db.isdigit() or not 0 <= int(db) <= 15:
        raise ValueError(f"the database must be a number 0-15, got {db!r} in {value!r}")
    return RedisAddress(parts.hostname, port, int(db))


def load_gateway_config(path: str) -> GatewayConfig:
    """``[gateway]`` of the service config with defaults (a missing file means defaults)."""
    data = read_toml(path) if os.path.exists(path) else {}
    for name in data:  # the supervisor refuses these too: a gateway started alone ignored a misspelt [gatway]
        if name not in ("gateway", "supervisor", "servers", "cluster"):
            raise ConfigError(path, name, "unknown table; known: gateway, supervisor, servers, cluster")
    values = apply_keys(path, sub_table(path, data, "gateway"), GATEWAY_KEYS, prefix="gateway.")
    origins = values.pop("cors_origins")
    if origins is None:
        supervisor = sub_table(path, data, "supervisor")
        port = supervisor.get("port", SUPERVISOR_PORT)
        origins = [local_url(port), f"http://localhost:{port}"]
    for origin in origins:
        if not isinstance(origin, str) or not origin.startswith(("http://", "https://")) or origin.endswith("/"):
            raise ConfigError(path, "gateway.cors_origins",
                              f"each origin must be scheme://host[:port] without a path, got {origin!r}")
    for key in ("keys_file", "servers_dir"):  # "" reached the file system as a path: no key or file named
        if not values[key].strip():
            raise ConfigError(path, f"gateway.{key}", "must name a " + ("file" if key == "keys_file" else "folder")
                              + ", got an empty string")
    try:
        redis_address(values["rate_limit_store"])
    except ValueError as e:
        raise ConfigError(path, "gateway.rate_limit_store", str(e)) from None
    cluster = cluster_from_table(path, sub_table(path, data, "cluster"))
    return GatewayConfig(path=path, cors_origins=tuple(origins), cluster=cluster, **values)
