"""The catalog the gateway routes to: id, ``server_uri``, and each replica's loopback port and token.

It comes from the same ``conf/server/*.toml`` files the model servers read,
so a model's port and legacy path are spelled once.  A model runs as one or
more replicas (svc.infra.replicas): the supervisor injects their ports as
``SERVICE_UPSTREAM_PORTS`` and their tokens as ``SERVICE_UPSTREAM_TOKENS``
(JSON by catalog id, a list per replica; a model it does not name runs one
replica on its config's port).  ``SERVICE_UPSTREAM_TOKENS`` may also give one
token per model (id -> token, the shape before replicas), and
``SERVICE_UPSTREAM_TOKEN`` is one token for every model (a gateway started
by hand in front of model servers started by hand).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from svc.config import model_server_configs
from svc.contract.protocol import UPSTREAM_PORTS_ENV as PORTS_ENV
from svc.contract.protocol import UPSTREAM_TOKENS_ENV as TOKENS_ENV
from svc.infra.replicas import LayoutError, decode_ports, decode_tokens, find_clash

TOKEN_ENV = "SERVICE_UPSTREAM_TOKEN"


class CatalogError(Exception):
    """A catalog the gateway cannot route with; ``str()`` is one line."""


@dataclass(frozen=True)
class Replica:
    """One model-server process: replica ``index`` of model ``model``."""

    model: str
    index: int
    port: int
    token: str | None

    @property
    def key(self) -> tuple[str, int]:
        return self.model, self.index

    def url(self, path: str, query: bytes = b"") -> bytes:
        """The absolute URL of ``path`` on this process (literal 127.0.0.1: no name lookups).

        Characters a URL cannot carry are percent-encoded (existing escapes
        are kept: the routes quote client-given segments such as job ids);
        ``query`` is passed as the client sent it.
        """
        return f"http://127.0.0.1:{self.port}{quote(path, safe='/%')}".encode("ascii") + (b"?" + query if query else b"")


@dataclass(frozen=True)
class Upstream:
    """One catalog model as the gateway sees it: ``port`` and ``token`` are replica 0's."""

    id: str
    port: int
    server_uri: str
    async_enabled: bool
    token: str | None
    peer_resp_timeout: int = 600  # the model server closes idle connections after this many seconds
    replicas: tuple[Replica, ...] = field(default=())
    max_connections: int = 1024  # the model server's own cap (503 past it)

    def __post_init__(self) -> None:
        if not self.replicas:  # one process on the config's port
            object.__setattr__(self, "replicas", (Replica(self.id, 0, self.port, self.token),))

    def url(self, path: str, query: bytes = b"") -> bytes:
        """``path`` on replica 0."""
        return self.replicas[0].url(path, query)


class Catalog:
    """Upstreams by catalog id and by exact legacy ``server_uri``."""

    def __init__(self, upstreams: list[Upstream]) -> None:
        self.by_id: dict[str, Upstream] = {}
        self.by_uri: dict[str, Upstream] = {}
        for up in upstreams:
            for table, key, what in ((self.by_id, up.id, "catalog id"), (self.by_uri, up.server_uri, "server_uri")):
                if key in table:
                    raise CatalogError(f"{up.id} and {table[key].id} have the same {what} {key!r}")
            self.by_id[up.id] = up
            self.by_uri[up.server_uri] = up
        clash = find_clash((r.port, r.model if len(up.replicas) == 1 else f"{r.model} replica {r.index}")
                           for up in upstreams for r in up.replicas)
        if clash:
            raise CatalogError(clash)

    def __iter__(self) -> Iterator[Upstream]:
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)

    def pool_idle_timeout(self, configured_s: float) -> float:
        """The pool's idle timeout: ``configured_s``, kept below every model's own
        ``peer_resp_timeout`` (a model closing a pooled connection first would fail the next request on it)."""
        shortest = min((u.peer_resp_timeout for u in self), default=configured_s + 1)
        return min(configured_s, shortest * 0.5) if shortest <= configured_s else configured_s

    def connection_problems(self, pool: int, key_max_in_flight: int) -> list[str]:
        """Models whose ``max_connections`` the gateway alone can use up: its idle pool of ``pool`` connections
        (the server then refuses its own probes and other clients, 503, until they expire), or one key's
        ``key_max_in_flight`` requests (parked waits locking every other key out)."""
        problems = []
        for up in self:
            if up.max_connections <= pool:
                problems.append(f"{up.id}: max_connections {up.max_connections} is not above the gateway's "
                                f"upstream_max_connections {pool}: its idle pooled connections can fill the model "
                                "server")
            if key_max_in_flight == 0 or up.max_connections <= key_max_in_flight:
                problems.append(f"{up.id}: max_connections {up.max_connections} is not above key_max_in_flight "
                                f"{key_max_in_flight or '0 (no limit)'}: one key's requests can take every "
                                "connection")
        return problems


def upstream_tokens(env: Mapping[str, str]) -> tuple[dict[str, tuple[str, ...] | str], str | None]:
    """Per-model tokens (a tuple per replica, or one string) and the one fallback token from the environment."""
    try:
        tokens = decode_tokens(TOKENS_ENV, env.get(TOKENS_ENV) or "")
    except LayoutError as e:
        raise CatalogError(str(e)) from None
    return tokens, env.get(TOKEN_ENV) or None


def load_catalog(servers_dir: str, env: Mapping[str, str]) -> Catalog:
    """The catalog of ``servers_dir`` with each model's replicas (ports and tokens) from the environment.

    Raises ``svc.config.ConfigError`` for a bad model config and
    :class:`CatalogError` for a catalog that cannot be routed.
    """
    configs = model_server_configs(servers_dir)
    tokens, fallback = upstream_tokens(env)
    try:
        layout = decode_ports(PORTS_ENV, env.get(PORTS_ENV) or "")
    except LayoutError as e:
        raise CatalogError(str(e)) from None
    upstreams = []
    for c in configs:
        ports = layout.get(c.id, (c.port,))
        given = tokens.get(c.id)
        if isinstance(given, tuple) and len(given) != len(ports):
            raise CatalogError(f"{TOKENS_ENV} has {len(given)} token(s) for {c.id}, which runs {len(ports)} "
                               f"replica(s) ({PORTS_ENV})")
        per_replica = given if isinstance(given, tuple) else (given,) * len(ports)
        replicas = tuple(Replica(c.id, i, port, per_replica[i] or fallback) for i, port in enumerate(ports))
        upstreams.append(Upstream(c.id, ports[0], c.server_uri, c.async_enabled, replicas[0].token,
                                  c.peer_resp_timeout, replicas, c.max_connections))
    return Catalog(upstreams)


def unknown_ids(catalog: Catalog, env: Mapping[str, str]) -> list[str]:
    """A line for each variable of tokens or ports that names an id no model config has (the catalog's ids are
    those of ``servers_dir``): a misspelt id left its model without a token or on its config's port, and the
    gateway said only "no upstream token for" the model.  Read after :func:`load_catalog`, which checked them."""
    lines = []
    named: dict[str, Mapping[str, object]] = {TOKENS_ENV: upstream_tokens(env)[0],
                                              PORTS_ENV: decode_ports(PORTS_ENV, env.get(PORTS_ENV) or "")}
    for name, ids in named.items():
        unknown = sorted(set(ids) - set(catalog.by_id))
        if unknown:
            lines.append(f"{name} names {', '.join(unknown)}, which no model config has: not used")
    return lines
