"""The catalog the gateway routes to: id, loopback port, ``server_uri``, token.

It comes from the same ``conf/server/*.toml`` files the model servers read,
so a model's port and legacy path are spelled once.  The token the gateway
presents to each model server comes from the environment: the supervisor
injects ``SERVICE_UPSTREAM_TOKENS`` (a JSON object, catalog id -> token);
``SERVICE_UPSTREAM_TOKEN`` is one token for every model (a gateway started by
hand in front of model servers started by hand).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

from svc.config import model_server_configs
from svc.protocol import UPSTREAM_TOKENS_ENV as TOKENS_ENV

TOKEN_ENV = "SERVICE_UPSTREAM_TOKEN"


class CatalogError(Exception):
    """A catalog the gateway cannot route with; ``str()`` is one line."""


@dataclass(frozen=True)
class Upstream:
    """One model server as the gateway sees it."""

    id: str
    port: int
    server_uri: str
    async_enabled: bool
    token: str | None
    peer_resp_timeout: int = 600  # the model server closes idle connections after this many seconds

    def url(self, path: str, query: bytes = b"") -> bytes:
        """The absolute URL of ``path`` on this model server (literal 127.0.0.1: no name lookups).

        Characters a URL cannot carry are percent-encoded (existing escapes
        are kept: the routes quote client-given segments such as job ids);
        ``query`` is passed as the client sent it.
        """
        return f"http://127.0.0.1:{self.port}{quote(path, safe='/%')}".encode("ascii") + (b"?" + query if query else b"")


class Catalog:
    """Upstreams by catalog id and by exact legacy ``server_uri``."""

    def __init__(self, upstreams: list[Upstream]) -> None:
        self.by_id: dict[str, Upstream] = {}
        self.by_uri: dict[str, Upstream] = {}
        ports: dict[int, str] = {}
        for up in upstreams:
            for table, key, what in ((self.by_id, up.id, "catalog id"), (self.by_uri, up.server_uri, "server_uri"),
                                     (ports, up.port, "port")):
                if key in table:
                    other = table[key] if isinstance(table[key], str) else table[key].id
                    raise CatalogError(f"{up.id} and {other} have the same {what} {key!r}")
            self.by_id[up.id] = up
            self.by_uri[up.server_uri] = up
            ports[up.port] = up.id

    def __iter__(self):
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)

    def pool_idle_timeout(self, configured_s: float) -> float:
        """The pool's idle timeout: ``configured_s``, kept below every model's own
        ``peer_resp_timeout`` (a model closing a pooled connection first would fail the next request on it)."""
        shortest = min((u.peer_resp_timeout for u in self), default=configured_s + 1)
        return min(configured_s, shortest * 0.5) if shortest <= configured_s else configured_s


def upstream_tokens(env: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """Per-model tokens and the one fallback token from the environment."""
    raw = env.get(TOKENS_ENV) or ""
    tokens: dict[str, str] = {}
    if raw:
        try:
            tokens = json.loads(raw)
        except ValueError as e:
            raise CatalogError(f"{TOKENS_ENV} is not valid JSON: {e}") from None
        if not isinstance(tokens, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tokens.items()):
            raise CatalogError(f"{TOKENS_ENV} must be a JSON object of catalog id -> token string")
    return tokens, env.get(TOKEN_ENV) or None


def load_catalog(servers_dir: str, env: Mapping[str, str]) -> Catalog:
    """The catalog of ``servers_dir`` with each model's upstream token.

    Raises ``svc.config.ConfigError`` for a bad model config and
    :class:`CatalogError` for a catalog that cannot be routed.
    """
    try:
        configs = model_server_configs(servers_dir)
    except FileNotFoundError:
        raise CatalogError(f"the model-server config directory {servers_dir} does not exist") from None
    tokens, fallback = upstream_tokens(env)
    return Catalog([
        Upstream(c.id, c.port, c.server_uri, c.async_enabled, tokens.get(c.id) or fallback, c.peer_resp_timeout)
        for c in configs
    ])
