"""Who a gateway request is: its bearer string checked against the credentials decided at start (svc.auth).

API keys first (the SHA-256 of the bearer looked up by digest, then compared with ``hmac.compare_digest``), then
the static tokens that are actually configured (each compared in constant time; an empty token never matches).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from svc.auth import INFERENCE_SCOPES, MANAGEMENT_TOKEN_NAME, STATIC_TOKEN_NAME, AuthSetup, KeyEntry, hash_key


@dataclass(frozen=True)
class Principal:
    """Who a request authenticated as: the ``X-Service-Key`` name and its rate."""

    name: str
    rate_limit_qps: int = 0


class Unauthorized(Exception):
    """Missing or wrong credentials; ``key`` names a disabled key when one matched."""

    def __init__(self, reason: str, key: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.key = key


class Authenticator:
    """Checks a bearer string against the keys, then the static tokens."""

    def __init__(self, setup: AuthSetup) -> None:
        self.setup = setup
        self._by_digest: dict[str, KeyEntry] = {k.hash: k for k in setup.keys}
        self._static: list[tuple[bytes, Principal]] = [
            (token.encode("utf-8"), Principal(name))
            for token, name in ((setup.gateway_token, STATIC_TOKEN_NAME), (setup.api_token, MANAGEMENT_TOKEN_NAME))
            if token
        ]
        self._metrics = setup.metrics_token.encode("utf-8")
        self._cluster = setup.cluster_token.encode("utf-8") if setup.cluster_token else None

    def authenticate(self, bearer: str | None) -> Principal:
        """The principal of an inference or job request, else :class:`Unauthorized`."""
        if not bearer:
            raise Unauthorized("missing bearer token")
        digest = hash_key(bearer)
        entry = self._by_digest.get(digest)
        if entry is not None and hmac.compare_digest(entry.hash, digest):
            if not entry.enabled:
                raise Unauthorized("the key is disabled", key=entry.name)
            if entry.scope not in INFERENCE_SCOPES:
                raise Unauthorized("the key's scope does not allow inference", key=entry.name)
            return Principal(entry.name, entry.rate_limit_qps)
        given = bearer.encode("utf-8")
        found: Principal | None = None
        for token, principal in self._static:  # every configured token is compared: no early exit
            if hmac.compare_digest(given, token):
                found = principal
        if found is None:
            raise Unauthorized("wrong bearer token")
        return found

    def is_metrics(self, bearer: str | None) -> bool:
        """True only for the metrics token (the other tokens get 401 on /metrics)."""
        return bool(bearer and hmac.compare_digest(bearer.encode("utf-8"), self._metrics))

    def is_cluster(self, bearer: str | None) -> bool:
        """True only for the cluster token (svc.gateway.cluster decides where it is accepted)."""
        return self._cluster is not None and bool(bearer and hmac.compare_digest(bearer.encode("utf-8"),
                                                                                 self._cluster))


def describe(setup: AuthSetup) -> dict[str, Any]:
    """What the startup log says about the mode (never a secret)."""
    return {
        "mode": setup.mode,
        "keys": len(setup.keys),
        "enabled_keys": sum(1 for k in setup.keys if k.enabled),
        "static_tokens": [n for t, n in ((setup.gateway_token, STATIC_TOKEN_NAME),
                                         (setup.api_token, MANAGEMENT_TOKEN_NAME)) if t],
    }
