"""Who may call the gateway: API keys, static tokens, scopes, fail-closed startup.

Everything here is decided once at startup (docs/contract.md, Authentication):

* the key file ``conf/api_keys.toml`` is loaded with tomlkit into
  :class:`KeyEntry` objects (``[keys.<name>]`` with ``hash``, ``scope``,
  ``rate_limit_qps``, ``enabled``; anything else is an error);
* the mode is ``api-keys`` when the file loaded with keys, ``static-token``
  when no usable file but a token is set; there is no anonymous mode;
* the metrics token is required and must differ from the other tokens, the
  management token (it opens the supervisor) from the inference token and
  from every key, and a wildcard bind needs ``SERVICE_EXPOSE``;
* on a host of a cluster (``[cluster] peers``), the cluster token
  ``SERVICE_CLUSTER_TOKEN`` that the gateways present to one another is
  required, must differ from every other token and key, and every host must
  share the job secret (:func:`cluster_problem`).  The gateway accepts it only
  on a job poll, wait or result forwarded by a peer for a job of its own host
  (svc.gateway.cluster), never in place of a key.

Per request, the gateway's ``Authenticator`` (svc.gateway.credentials) checks the bearer string:
API keys first (the SHA-256 of the bearer looked up by digest, then compared
with ``hmac.compare_digest``), then the static tokens that are actually
configured (each compared in constant time; an empty token never matches).
The dictionary lookup by digest leaks, through timing, at most whether some
stored digest shares a hash bucket with the digest of the attacker's guess:
nothing that helps to find a key, which is a 256-bit random string.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace

from svc.config import ConfigError, Key, apply_keys, keys_of, read_toml, setting
from svc.contract.protocol import JOB_SECRET_ENV
from svc.infra.trust import file_problem

SCOPES = ("inference", "admin", "all")
#: Scopes whose keys the gateway accepts for inference and jobs (docs/contract.md, Authentication: all three do).
INFERENCE_SCOPES = frozenset(SCOPES)

#: ``X-Service-Key`` names of the credentials that are not keys of the file.
STATIC_TOKEN_NAME = "static-token"
MANAGEMENT_TOKEN_NAME = "management-token"
METRICS_TOKEN_NAME = "metrics-token"
CLUSTER_TOKEN_NAME = "cluster-token"
RESERVED_KEY_NAMES = frozenset({STATIC_TOKEN_NAME, MANAGEMENT_TOKEN_NAME, METRICS_TOKEN_NAME, CLUSTER_TOKEN_NAME})

#: Key names: what can appear in a header, a log line and a metrics label.
KEY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
HASH_RE = r"[0-9a-f]{64}"
#: TOML bare keys; other key names (those with a '.') are written quoted.
_BARE_KEY = re.compile(r"[A-Za-z0-9_\-]+")

GATEWAY_TOKEN_ENV = "SERVICE_GATEWAY_AUTH_TOKEN"
API_TOKEN_ENV = "SERVICE_API_TOKEN"
METRICS_TOKEN_ENV = "SERVICE_METRICS_TOKEN"
#: What one gateway of a cluster presents to another when it forwards a job request (svc.gateway.cluster).
CLUSTER_TOKEN_ENV = "SERVICE_CLUSTER_TOKEN"
#: What a token from the environment may hold: one bearer credential of visible ASCII (RFC 6750), so that a
#: client can send it as it is. A token of spaces was taken, and no ``Authorization`` header could match it.
TOKEN_RE = re.compile(r"[\x21-\x7e]+")


def new_key() -> str:
    """A new API key: 32 random bytes as 64 lowercase hex characters."""
    return secrets.token_hex(32)


def hash_key(key: str) -> str:
    """The lowercase hex SHA-256 of a key string, as stored in the key file."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_entry(name: str, digest: str, scope: str = "inference", qps: int = 0) -> str:
    """The ``[keys.<name>]`` table of ``conf/api_keys.toml`` for one key, as TOML text.

    The one writer of a key-file entry (``svcctl keygen`` prints it, ``svcctl
    keys add`` and the quick start append it), so that every entry reads the
    same.  A name that is not a TOML bare key (one with a '.') is quoted, so
    that it stays one table name rather than nested tables.
    """
    table = name if _BARE_KEY.fullmatch(name) else json.dumps(name)
    return (f"[keys.{table}]\n"
            f'hash = "{digest}"\n'
            f'scope = "{scope}"\n'
            f"rate_limit_qps = {qps}\n"
            "enabled = true\n")


def issue_key(name: str, scope: str = "inference", qps: int = 0) -> tuple[str, str]:
    """A new key and its key-file entry (:func:`key_entry` of its hash); the key itself is stored nowhere."""
    key = new_key()
    return key, key_entry(name, hash_key(key), scope, qps)


def check_key_name(name: str) -> str | None:
    """Why ``name`` cannot name a key (None when it can)."""
    if not KEY_NAME_RE.fullmatch(name):
        return "must be 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
    if name in RESERVED_KEY_NAMES:
        return f"is reserved for a static token ({', '.join(sorted(RESERVED_KEY_NAMES))})"
    return None


@dataclass(frozen=True)
class KeyEntry:
    """One ``[keys.<name>]`` of the key file; each :func:`svc.config.setting` field is one key of the table."""

    name: str
    hash: str = setting(None, "Lowercase hex SHA-256 of the key string (required).", pattern=HASH_RE, secret=True)
    scope: str = setting("inference", "inference, admin or all.", choices=SCOPES)
    rate_limit_qps: int = setting(0, "Requests per second for this key; 0 = unlimited.", minimum=0)
    enabled: bool = setting(True, "false disables the key without deleting it.")


KEY_ENTRY_KEYS: tuple[Key, ...] = keys_of(KeyEntry)


def load_key_file(path: str) -> list[KeyEntry]:
    """Every entry of the key file; raises ConfigError naming the key and problem.

    A missing file raises ConfigError with problem ``file not found``; an
    empty or comment-only file gives an empty list.
    """
    data = read_toml(path)
    for name in data:
        if name != "keys":
            raise ConfigError(path, name, "unknown table or key; the file holds only [keys.<name>] tables")
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise ConfigError(path, "keys", "must be a table of [keys.<name>] tables")
    entries = []
    seen: dict[str, str] = {}
    for name, table in keys.items():
        where = f"keys.{name}"
        problem = check_key_name(name)
        if problem:
            raise ConfigError(path, where, f"key name {problem}")
        if not isinstance(table, dict):
            raise ConfigError(path, where, "must be a table")
        if "hash" not in table:
            raise ConfigError(path, where + ".hash", "required key is missing")
        values = apply_keys(path, table, KEY_ENTRY_KEYS, prefix=where + ".")
        if values["hash"] in seen:
            raise ConfigError(path, where + ".hash", f"the same hash as keys.{seen[values['hash']]}")
        seen[values["hash"]] = name
        entries.append(KeyEntry(name=name, **values))
    return entries


class UntrustedKeyFile(ConfigError):
    """A key file that another user could have written (:func:`load_trusted_key_file`)."""


def load_trusted_key_file(path: str, uid: int | None = None) -> list[KeyEntry]:
    """:func:`load_key_file` for the gateway that accepts its keys: a file another user could have written (owned
    by another user but root, or writable by its group or others, :mod:`svc.infra.trust`) raises ConfigError, as
    any local user could add an API key to it (a security probe: it was read without a word).  ``svcctl keys``
    edits the file with :func:`load_key_file` alone: root edits the service user's file; ``keys list`` checks it
    here, for the gateway's user ``uid`` (default this process's), so that it says what the gateway will."""
    problem = file_problem(path, uid)
    if problem:
        raise UntrustedKeyFile(path, None, f"{problem}: another user could add an API key to it; give it to this user "
                                           f"(uid {os.getuid() if uid is None else uid}) or root, writable by its "
                                           "owner only (chmod 600)")
    return load_key_file(path)


class Refused(Exception):
    """A gateway that must not start; ``str()`` is the one-line reason."""


@dataclass(frozen=True)
class AuthSetup:
    """Credentials of the gateway, decided once at startup."""

    mode: str  # "api-keys" or "static-token"
    keys: tuple[KeyEntry, ...]
    gateway_token: str | None
    api_token: str | None
    metrics_token: str
    warnings: tuple[str, ...] = ()
    cluster_token: str | None = None


def token_problem(env: Mapping[str, str], *names: str) -> str | None:
    """Why one of the environment's tokens ``names`` that is set cannot be a client's bearer token (None when
    all can): only spaces, or a space, a control or a non-ASCII character in it (a client's UTF-8 never matched
    the process's own bytes). Every process refuses to start with such a token instead of accepting no one."""
    for name in names:
        value = env.get(name)
        if value and not TOKEN_RE.fullmatch(value):
            what = "only spaces" if not value.strip() else "a space, a control or a non-ASCII character"
            return f"{name} has {what}: a token must be printable ASCII without spaces (a bearer token)"
    return None


def separate_tokens_problem(env: Mapping[str, str]) -> str | None:
    """Why the environment's tokens are unusable together (None when fine): the metrics token is required and
    differs from the inference and management tokens, and the management token, which opens the supervisor,
    differs from the inference token (or every holder of that one could manage the service).  Shared with the
    supervisor, which refuses to start, or to spawn the gateway, for the same reasons."""
    metrics = env.get(METRICS_TOKEN_ENV) or ""
    if not metrics:
        return f"{METRICS_TOKEN_ENV} is not set: the gateway needs its own metrics token (also on loopback)"
    for name, other, differ in ((GATEWAY_TOKEN_ENV, METRICS_TOKEN_ENV, "the metrics token must differ from the "
                                 "inference and management tokens"),
                                (API_TOKEN_ENV, METRICS_TOKEN_ENV, "the metrics token must differ from the "
                                 "inference and management tokens"),
                                (GATEWAY_TOKEN_ENV, API_TOKEN_ENV, "the management token opens the supervisor and "
                                 "must differ from the inference token")):
        if env.get(name) and env.get(other) and hmac.compare_digest(env[name].encode(), env[other].encode()):
            return f"{other} equals {name}: {differ}"
    return None


def cluster_problem(env: Mapping[str, str], has_peers: bool) -> str | None:
    """Why the cluster settings of the environment are unusable (None when fine).

    ``SERVICE_CLUSTER_TOKEN``, when set, must differ from every other token
    and from the job secret.  With peers configured it is required (a peer's
    forwarded request could not be told from a client's, nor could this host
    forward), and so is ``SERVICE_JOB_SECRET`` (a secret made up per host
    would make every other host's job ids unverifiable).  Shared with the
    supervisor, which refuses to spawn the gateway for the same reasons.
    """
    token = env.get(CLUSTER_TOKEN_ENV) or ""
    if token:
        for name in (GATEWAY_TOKEN_ENV, API_TOKEN_ENV, METRICS_TOKEN_ENV, JOB_SECRET_ENV):
            if env.get(name) and hmac.compare_digest(env[name].encode(), token.encode()):
                return f"{CLUSTER_TOKEN_ENV} equals {name}: the cluster token must differ from every other token"
    if has_peers and not token:
        return (f"[cluster] peers is set but {CLUSTER_TOKEN_ENV} is not: the gateways of a cluster authenticate "
                "to one another with it (the same value on every host)")
    if has_peers and not env.get(JOB_SECRET_ENV):
        return (f"[cluster] peers is set but {JOB_SECRET_ENV} is not: every host of a cluster must sign job ids "
                "with the same secret")
    return None


def key_of(keys: list[KeyEntry], token: str | None) -> str | None:
    """The name of the key whose hash is ``token``'s (None when no key is ``token``, or no token)."""
    if token is None:
        return None
    digest = hash_key(token)
    return next((key.name for key in keys if hmac.compare_digest(key.hash, digest)), None)


#: The length under which a static token is called guessable at start (as ``SERVICE_JOB_SECRET``'s least).
SHORT_TOKEN = 16


#: The tokens no API key may equal, and why (checked by the gateway and, at its start, by the supervisor).
KEY_COLLISIONS = (
    (METRICS_TOKEN_ENV, "the metrics token must differ from every inference credential"),
    (API_TOKEN_ENV, "the management token opens the supervisor, which no key may"),
    (CLUSTER_TOKEN_ENV, "the cluster token must differ from every key"),
    (GATEWAY_TOKEN_ENV, "a key is checked first, so the static token would be that key (refused while it is "
                        "disabled, and limited as it is): remove the key (svcctl keys remove), or change the token"),
)


def key_token_problem(keys: list[KeyEntry], keys_file: str, env: Mapping[str, str]) -> str | None:
    """Why these tokens of ``env`` cannot be used with the API keys of ``keys_file``: one of them is a key."""
    for name, differ in KEY_COLLISIONS:
        key_name = key_of(keys, env.get(name) or None)
        if key_name is not None:
            return f"{name} is the API key {key_name} of {keys_file}: {differ}"
    return None


def short_token_warnings(env: Mapping[str, str], *names: str) -> tuple[str, ...]:
    """One warning per token of ``names`` that is set and shorter than :data:`SHORT_TOKEN`: a one-character token
    started the gateway, and opened the supervisor, without a word (a security probe).  Warned, not refused: a
    short token is a choice the operator may have made, not a token no client can send."""
    return tuple(f"{name} has {len(env[name])} character{'s' if len(env[name]) != 1 else ''}: a token that short "
                 f"can be guessed; use {SHORT_TOKEN * 2} random characters or more (svcctl keygen makes 64)"
                 for name in names if 0 < len(env.get(name) or "") < SHORT_TOKEN)


def decide(env: Mapping[str, str], keys_file: str) -> AuthSetup:
    """The gateway's credentials and mode, or :class:`Refused` with the reason; a token too short to be safe is
    among the setup's warnings (:func:`short_token_warnings`).
    """
    setup = _decide(env, keys_file)
    short = short_token_warnings(env, GATEWAY_TOKEN_ENV, API_TOKEN_ENV, METRICS_TOKEN_ENV, CLUSTER_TOKEN_ENV)
    return replace(setup, warnings=setup.warnings + short) if short else setup


def _decide(env: Mapping[str, str], keys_file: str) -> AuthSetup:
    """The gateway's credentials and mode, or :class:`Refused` with the reason.

    The rules of docs/contract.md, Authentication: no anonymous mode; an empty or comment-only key file is zero
    keys (refused without a static token, a warning with one); a key file
    that cannot be used stops the gateway when no static token is set.
    """
    problem = token_problem(env, GATEWAY_TOKEN_ENV, API_TOKEN_ENV, METRICS_TOKEN_ENV, CLUSTER_TOKEN_ENV) or \
        separate_tokens_problem(env)
    if problem:
        raise Refused(problem)
    cluster_token = env.get(CLUSTER_TOKEN_ENV) or None
    gateway_token = env.get(GATEWAY_TOKEN_ENV) or None
    api_token = env.get(API_TOKEN_ENV) or None
    has_token = gateway_token is not None or api_token is not None
    tokens = f"{GATEWAY_TOKEN_ENV} or {API_TOKEN_ENV}"
    try:
        keys = load_trusted_key_file(keys_file)
    except ConfigError as e:
        if not has_token:
            if e.problem == "file not found":
                raise Refused(f"no API key file at {keys_file} and neither {tokens} is set: "
                              "no credential would be accepted (there is no anonymous mode)") from None
            raise Refused(f"the key file cannot be used and no static token is set: {e}") from None
        note = "no key file" if e.problem == "file not found" else f"the key file cannot be used ({e})"
        return AuthSetup("static-token", (), gateway_token, api_token, env[METRICS_TOKEN_ENV],
                         (f"{note}: static-token mode, only {tokens} is accepted",), cluster_token)
    if not any(key.enabled for key in keys) and not has_token:
        what = "no keys" if not keys else "no enabled key"
        raise Refused(f"the key file {keys_file} has {what} and neither {tokens} is set: "
                      "no credential would be accepted (there is no anonymous mode)")
    if not keys:
        return AuthSetup("static-token", (), gateway_token, api_token, env[METRICS_TOKEN_ENV],
                         (f"the key file {keys_file} has no keys: static-token mode, only {tokens} is accepted",),
                         cluster_token)
    if problem := key_token_problem(keys, keys_file, env):
        raise Refused(problem)
    return AuthSetup("api-keys", tuple(keys), gateway_token, api_token, env[METRICS_TOKEN_ENV],
                     cluster_token=cluster_token)
