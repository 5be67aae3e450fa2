"""The gateway's ``[gateway]`` table of ``conf/service.toml``.

Keys are declared once (``svc.config.setting`` fields of :class:`GatewayConfig`) with strict types; an unknown key
is refused with one line naming the file and the key.  The other tables of
the file (``[supervisor]``, ``[servers.<ID>]``) belong to the supervisor and
are not read here.  A missing file means every default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from svc import config as base
from svc.config import ConfigError, Key, apply_keys, keys_of, read_toml, setting, sub_table
from svc.protocol import GATEWAY_PORT, LOOPBACK, SUPERVISOR_PORT, UPSTREAM_RECV_TIMEOUT_MS, local_url


@dataclass(frozen=True)
class GatewayConfig:
    """A validated ``[gateway]`` table; each :func:`svc.config.setting` field is one key."""

    path: str
    host: str = setting(LOOPBACK, "Address the gateway listens on (a wildcard needs SERVICE_EXPOSE).")
    port: int = setting(GATEWAY_PORT, "Port of the gateway.", minimum=1, maximum=65535)
    keys_file: str = setting("conf/api_keys.toml", "The API key file ([keys.<name>] tables).")
    servers_dir: str = setting("conf/server",
                               "Directory of the model-server configs: the catalog the gateway routes to.")
    upstream_recv_timeout_ms: int = setting(
        UPSTREAM_RECV_TIMEOUT_MS,
        "Longest wait for a model server's whole reply (502 after it); a job wait budget at or above it is 502.",
        minimum=1)
    upstream_connect_timeout_ms: int = setting(5000, "Longest wait for a connection to a model server.", minimum=1)
    upstream_idle_timeout_s: int = setting(
        30,
        "Idle pooled connections to model servers are closed after this; kept below every model's "
        "peer_resp_timeout so a POST never meets a connection the server closed.", minimum=1)
    upstream_max_connections: int = setting(
        64, "Persistent connections kept per model server (the pool does not cap concurrency).", minimum=1)
    max_body_bytes: int = setting(
        64 * 1024 * 1024,
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
    max_connections: int = base.max_connections_setting(1024, "503 status 65")
    listen_backlog: int = base.listen_backlog_setting()

    def replace(self, **changes: object) -> "GatewayConfig":
        from dataclasses import replace

        return replace(self, **changes)


GATEWAY_KEYS: tuple[Key, ...] = keys_of(GatewayConfig)


def load_gateway_config(path: str) -> GatewayConfig:
    """``[gateway]`` of the service config with defaults (a missing file means defaults)."""
    data = read_toml(path) if os.path.exists(path) else {}
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
    return GatewayConfig(path=path, cors_origins=tuple(origins), **values)
