"""Job ids that name the process owning the job, in a form clients cannot steer.

A job lives in one model-server process (a replica of its model, on one
host), so a poll, wait or result must reach that process.  The id carries its
owner instead of the gateway keeping a table, which would not survive a
gateway restart and could not be shared between hosts.  The owner is signed:
an HMAC over the random part, the replica index and the host id, keyed with
the deployment's job secret, so a client cannot edit an id to reach another
replica's or another host's jobs; an id that does not verify is simply an
unknown job.

Layout (all lowercase hex after the ``job_`` prefix, so the documented
pattern ``^job_[0-9a-f]+$`` holds)::

    job_ <12 random bytes> <replica index, 1 byte> <host id, UTF-8, 0-32 bytes> <8-byte tag>

Every host of a cluster must share the secret (``SERVICE_JOB_SECRET``); the
supervisor passes its own to the gateway and every model server it starts
(docs/ARCHITECTURE.md, "One asynchronous job").
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from svc.contract.protocol import HOST_ID_ENV, JOB_SECRET_ENV, REPLICA_ENV

PREFIX = "job_"
RANDOM_BYTES = 12
TAG_BYTES = 8
MAX_REPLICAS = 256
#: A host id as ``[cluster] host_id`` accepts it; "" is the single-host default.
HOST_ID_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_ID_RE = re.compile(r"job_(?:[0-9a-f]{2})+")
_FIXED = RANDOM_BYTES + 1 + TAG_BYTES


@dataclass(frozen=True)
class JobOwner:
    """The process a job lives in: the host id ("" on a single host) and the replica index."""

    host: str = ""
    replica: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.replica < MAX_REPLICAS:
            raise ValueError(f"replica index {self.replica} is outside 0..{MAX_REPLICAS - 1}")
        if self.host and not HOST_ID_RE.fullmatch(self.host):
            raise ValueError(f"host id {self.host!r} must match {HOST_ID_RE.pattern}")


#: The shortest ``SERVICE_JOB_SECRET`` taken: it keys the HMAC of every job id, and one of a few characters (a
#: config probe set ``x``) could be found by trying, letting a client make ids that steer its requests.
MIN_SECRET_CHARS = 16


def secret_problem(env: Mapping[str, str]) -> str | None:
    """Why ``SERVICE_JOB_SECRET`` cannot be used (None: unset, or fine): under :data:`MIN_SECRET_CHARS`, or not
    printable ASCII without spaces (the rule of every token of the service)."""
    secret = env.get(JOB_SECRET_ENV)
    if not secret:
        return None
    if len(secret) < MIN_SECRET_CHARS or not all(33 <= ord(c) <= 126 for c in secret):
        return (f"{JOB_SECRET_ENV} must be at least {MIN_SECRET_CHARS} printable ASCII characters without spaces "
                "(it signs job ids); `python3 -c 'import secrets; print(secrets.token_hex(32))'` makes one")
    return None


def new_secret() -> str:
    """A fresh job secret (hex), for a deployment that was not given one."""
    return secrets.token_hex(32)


def _tag(secret: str, body: bytes) -> bytes:
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).digest()[:TAG_BYTES]


def mint(owner: JobOwner, secret: str) -> str:
    """A new job id owned by ``owner``, signed with ``secret``."""
    body = secrets.token_bytes(RANDOM_BYTES) + bytes([owner.replica]) + owner.host.encode("utf-8")
    return PREFIX + (body + _tag(secret, body)).hex()


def _split(job_id: str) -> tuple[bytes, bytes, JobOwner] | None:
    """The signed body, the tag and the owner an id claims (None: not an id of this layout)."""
    if not _ID_RE.fullmatch(job_id):
        return None
    raw = bytes.fromhex(job_id[len(PREFIX):])
    if len(raw) < _FIXED:
        return None
    body, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
    try:
        host = body[RANDOM_BYTES + 1:].decode("utf-8")
        owner = JobOwner(host, body[RANDOM_BYTES])
    except ValueError:  # not UTF-8, or not a host id
        return None
    return body, tag, owner


def parse_unverified(job_id: str) -> JobOwner | None:
    """The owner an id claims, without checking its tag (for logs and metrics only)."""
    split = _split(job_id)
    return split[2] if split else None


def parse(job_id: str, secret: str) -> JobOwner | None:
    """The owner of ``job_id`` if its tag verifies with ``secret``; None for a malformed or forged id."""
    split = _split(job_id)
    if split is None:
        return None
    body, tag, owner = split
    return owner if hmac.compare_digest(tag, _tag(secret, body)) else None


def from_environment(env: Mapping[str, str] | None = None) -> tuple[JobOwner, str]:
    """This process's job owner and secret from the environment the supervisor gives it.

    ``SERVICE_REPLICA`` and ``SERVICE_HOST_ID`` default to replica 0 on a
    single host; without ``SERVICE_JOB_SECRET`` (a model server started by
    hand) a secret is made for this process alone.  Raises ValueError with
    one line for a replica index or host id out of shape.
    """
    env = os.environ if env is None else env
    if problem := secret_problem(env):
        raise ValueError(problem)
    raw = env.get(REPLICA_ENV) or "0"
    if not raw.isdigit():
        raise ValueError(f"{REPLICA_ENV} must be a replica index (0-{MAX_REPLICAS - 1}), not {raw!r}")
    try:
        owner = JobOwner(env.get(HOST_ID_ENV) or "", int(raw))
    except ValueError as e:
        raise ValueError(f"{REPLICA_ENV}/{HOST_ID_ENV}: {e}") from None
    return owner, env.get(JOB_SECRET_ENV) or new_secret()
