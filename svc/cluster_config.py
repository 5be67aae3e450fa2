"""The ``[cluster]`` table of ``conf/service.toml``: this host's id and its peers' gateways.

Several hosts run the same stack behind HAProxy (docs/scaling.md).  A
job lives in the model server of the host that admitted it, and its id names
that host (svc.contract.jobid); the gateway that receives a poll, wait or result for
another host's job forwards it to that host's gateway, found here by host id
(svc.gateway.cluster).  Read by the gateway (routing) and by the supervisor,
which gives every child ``SERVICE_HOST_ID`` from ``host_id`` so that the
model servers mint ids the gateway recognises as its own.

The table is the same on every host but for ``host_id``: ``peers`` may name
this host too (it is never forwarded to).  Keys are declared once
(:func:`svc.config.setting` fields); a problem is one line naming the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from svc.config import ConfigError, Key, apply_keys, keys_of, read_toml, setting, sub_table
from svc.contract.jobid import HOST_ID_RE

#: ``host_id``: "" (a single host, the default) or a host id as job ids carry it.
HOST_ID_PATTERN = f"(?:{HOST_ID_RE.pattern})?"


@dataclass(frozen=True)
class ClusterConfig:
    """A validated ``[cluster]`` table; each :func:`svc.config.setting` field is one key."""

    host_id: str = setting(
        "", "This host's id: job ids minted here name it (lowercase letters, digits, '-'; 1-32). "
        "Empty on a single host.", pattern=HOST_ID_PATTERN)
    peers: dict = setting(
        {}, "Host id -> base URL of that host's gateway (http://ADDRESS:PORT), the same table on every host; "
        "a job request for another host's job is forwarded there.", type=dict)
    peer_timeout_ms: int = setting(
        10000, "Longest wait for a peer gateway's whole reply to a forwarded poll or result (a forwarded wait gets "
        "its budget on top, up to upstream_recv_timeout_ms); past it the job is 404 job not found.", minimum=1)
    peer_connect_timeout_ms: int = setting(
        2000, "Longest wait for a connection to a peer gateway; a peer that is gone makes its jobs 404 "
        "job not found after at most this long.", minimum=1)

    @classmethod
    def single_host(cls) -> "ClusterConfig":
        """Every default: no ``[cluster]`` table."""
        return cls(**{key.name: key.default for key in CLUSTER_KEYS})

    @property
    def enabled(self) -> bool:
        """True when this host is one of several (peers are configured)."""
        return bool(self.peers)


CLUSTER_KEYS: tuple[Key, ...] = keys_of(ClusterConfig)


def peer_url_problem(url: Any) -> str | None:
    """Why ``url`` cannot be a peer gateway's base URL (None when it can)."""
    if not isinstance(url, str):
        return f"must be a string http://ADDRESS:PORT, got {type(url).__name__}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"{url!r} is not a URL: {e}"
    if parts.scheme != "http" or not parts.hostname:
        return f"must be http://ADDRESS:PORT (gateways speak plain HTTP on the private network), got {url!r}"
    if port is None:
        return f"must name the gateway's port (http://ADDRESS:PORT), got {url!r}"
    if ":" in parts.hostname:
        return f"must be an IPv4 address or a host name (peers are reached over IPv4), got {url!r}"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        return f"must be only http://ADDRESS:PORT, without a path, query or user, got {url!r}"
    return None


def cluster_from_table(path: str, table: dict) -> ClusterConfig:
    """The ``[cluster]`` table's values, checked: each problem one line naming the key."""
    peers = table.get("peers", {})
    if not isinstance(peers, dict):
        raise ConfigError(path, "cluster.peers", "must be a table of host id = \"http://ADDRESS:PORT\"")
    values = apply_keys(path, table, CLUSTER_KEYS, prefix="cluster.")
    checked: dict[str, str] = {}
    for host, url in peers.items():
        if not HOST_ID_RE.fullmatch(host):
            raise ConfigError(path, f"cluster.peers.{host}", f"a host id must match {HOST_ID_RE.pattern}")
        problem = peer_url_problem(url)
        if problem:
            raise ConfigError(path, f"cluster.peers.{host}", problem)
        checked[host] = url.rstrip("/")
    if checked and not values["host_id"]:
        raise ConfigError(path, "cluster.host_id",
                          "required when cluster.peers is set: the id of this host among its peers")
    values["peers"] = checked
    return ClusterConfig(**values)


def load_cluster_config(path: str) -> ClusterConfig:
    """``[cluster]`` of the service config (a missing file or table: a single host)."""
    data = read_toml(path) if os.path.exists(path) else {}
    return cluster_from_table(path, sub_table(path, data, "cluster"))


def own_entry_problem(cluster: ClusterConfig, gateway_port: int) -> str | None:
    """What is wrong with this host's own ``peers`` entry, seen from its gateway's port; None when nothing.

    The table is copied to every host with ``host_id`` changed: a ``host_id`` left at another host's id makes
    this gateway sign its jobs with that id, and its peers send those jobs' reads to the other host, which
    answers 404 with nothing in any log.  The entry's port can show it (a port mapped elsewhere may differ on
    purpose: the gateway warns, it does not refuse)."""
    own = cluster.peers.get(cluster.host_id)
    if not own:
        return None
    port = urlsplit(own).port
    if port is not None and port != gateway_port:
        return (f"cluster.peers.{cluster.host_id} is {own}, but this gateway listens on port {gateway_port}: is "
                f"host_id {cluster.host_id!r} this host's id? Its peers send the reads of its jobs to {own}")
    return None

