"""Argument types, the token lookup and the request body that ``svcctl``'s gateway commands share.

A leaf of :mod:`svc.cli`: :mod:`svc.cli.gateway` (``infer``, ``jobs submit|get|wait|result``),
:mod:`svc.cli.jobs` (``jobs run``) and :mod:`svc.cli.keyfile` import it, and it imports none of
them, so the commands that use each other's parsers do not import each other back.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import select
import stat
import sys
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import tomlkit
from tomlkit.exceptions import TOMLKitError

from svc.auth import KEY_ENTRY_KEYS
from svc.cli.http import CliError
from svc.contract.protocol import (
    GATEWAY_MAX_BODY_BYTES,
    GATEWAY_PORT,
    LOOPBACK,
    SERVICE_CONFIG,
    UPSTREAM_RECV_TIMEOUT_MS,
    local_url,
)
from svc.contract.query import WAIT_DEFAULT_MS

DEFAULT_GATEWAY = local_url(GATEWAY_PORT)
GATEWAY_ENV = "SERVICE_GATEWAY_URL"
#: Variables holding the Bearer token, in the order they are consulted: the management token first, as the
#: contract has the command-line client send it (docs/contract.md), then an API key for a user who has
#: only that, then the static inference token.
TOKEN_ENVS = ("SERVICE_API_TOKEN", "SERVICE_API_KEY", "SERVICE_GATEWAY_AUTH_TOKEN")
DEFAULT_TIMEOUT_S = 300.0
#: ``jobs wait``: the default wait budget (svc.contract.query) and the margin the
#: client timeout keeps above the budget.
DEFAULT_WAIT_MS = WAIT_DEFAULT_MS
WAIT_MARGIN_S = 30.0
#: The gateway's default ``upstream_recv_timeout_ms`` (svc.contract.protocol).  A
#: model server takes waits up to 300000 ms, but the gateway answers a budget
#: at or above its receive timeout with 502, so ``jobs wait`` refuses such a
#: budget before sending it (:func:`gateway_recv_timeout_ms`).
GATEWAY_RECV_TIMEOUT_MS = UPSTREAM_RECV_TIMEOUT_MS


def base_url(given: str | None, flag: str, env_name: str, default: str, env: Mapping[str, str]) -> str:
    """The base URL a command talks to: ``flag``'s value, else the variable ``env_name``'s, else ``default``.

    Raises :class:`CliError` for one that is not an http(s) URL with a host (or whose port is not a port, or
    that holds ``user:password@``, which failed inside the HTTP client with the password in its line, or a
    query or fragment, which the routes were appended to), naming
    where it came from: a bad ``SERVICE_GATEWAY_URL`` was reported as a bad ``--gateway`` that no one had
    given."""
    if given is not None:
        value, source = given, flag
    elif env.get(env_name):
        value, source = env[env_name], f"{env_name} (the default of {flag})"
    else:
        return default
    shown = re.sub(r"//[^/?#]*@", "//", value)  # never a user name or password in a line
    problem = f"{source} must be an http:// or https:// URL, got {shown!r}"
    if shown != value:
        raise CliError(f"{source} must be a URL without a user name or password (svcctl sends its token in "
                       f"Authorization), got {shown!r} with them (not shown)")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - read for its check: a port that is not a number raises ValueError
    except ValueError as e:  # an unclosed IPv6 bracket, a port out of range
        raise CliError(f"{problem} ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(problem)
    if "?" in value or "#" in value:  # the routes were appended after it: ...:8080?x=1/v1/models/...
        raise CliError(f"{source} must be an http:// or https:// URL without a query or fragment (a path is kept, "
                       f"as a prefix of the routes), got {shown!r}")
    return value


def gateway_url(given: str | None, env: Mapping[str, str]) -> str:
    """``--gateway``, else ``$SERVICE_GATEWAY_URL``, else where this folder's gateway listens (:func:`base_url`,
    :func:`configured_url`)."""
    return base_url(given, "--gateway", GATEWAY_ENV, configured_url("gateway", GATEWAY_PORT), env)


def configured_url(table: str, default_port: int, service_config: str = SERVICE_CONFIG) -> str:
    """``http://host:port`` of ``[gateway]`` or ``[supervisor]`` in this folder's service configuration: where
    that process listens when started here.  With the supervisor on another port, ``keys add`` sent the
    management token to 127.0.0.1:8787, whatever listened there.  The local default for a missing or
    unusable value (the process would refuse it)."""
    values = service_table(table, service_config)
    host, port = values.get("host", LOOPBACK), values.get("port", default_port)
    if (not isinstance(host, str) or not host or any(c in host for c in "/@[]?# ") or not isinstance(port, int)
            or isinstance(port, bool) or not 0 < port < 65536):
        _say_once(f"{service_config}: [{table}] host {host!r} and port {port!r} are not an address: using "
                  f"{local_url(default_port)}")
        return local_url(default_port)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


_said: set[str] = set()


def _say_once(line: str) -> None:
    """One stderr line, once per process: svcctl went on with its defaults without a word (the management token
    to 127.0.0.1:8787 when the file that named another port could not be read)."""
    if line not in _said:
        _said.add(line)
        print(f"svcctl: {line}", file=sys.stderr)


def service_table(name: str, service_config: str = SERVICE_CONFIG) -> dict:
    """``[name]`` of the service configuration in this folder ({} when there is none or it does not parse:
    the process would refuse such a file, and the defaults are the best guess)."""
    try:
        with open(service_config, encoding="utf-8") as f:
            table = tomlkit.parse(f.read().removeprefix("\ufeff")).unwrap().get(name, {})
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, TOMLKitError) as e:
        _say_once(f"{service_config} cannot be read ({e}): using the default addresses and files")
        return {}
    return table if isinstance(table, dict) else {}


def gateway_table(service_config: str = SERVICE_CONFIG) -> dict:
    """``[gateway]`` of the service configuration in this folder (:func:`service_table`)."""
    return service_table("gateway", service_config)


def gateway_recv_timeout_ms(service_config: str = SERVICE_CONFIG) -> int:
    """The gateway's ``upstream_recv_timeout_ms``: its configured value in this folder, else the default.

    A wait at or above it is refused before it is sent; with the 180000 fixed,
    a gateway configured higher had such waits refused that it would take, and
    one configured lower answered them 502 (``jobs run`` after it had submitted
    the job)."""
    return _gateway_setting(service_config, "upstream_recv_timeout_ms", GATEWAY_RECV_TIMEOUT_MS)


def gateway_max_body_bytes(service_config: str = SERVICE_CONFIG) -> int:
    """The gateway's ``max_body_bytes``: its configured value in this folder, else the default."""
    return _gateway_setting(service_config, "max_body_bytes", GATEWAY_MAX_BODY_BYTES)


def _gateway_setting(service_config: str, key: str, default: int) -> int:
    """An integer of ``[gateway]`` in this folder's service configuration, checked as the gateway checks it (its
    own key's type and bounds, ``svc.gateway.config``), else ``default``.

    A value the gateway refuses is said once, and svcctl goes on with the
    default rather than in silence (10^13, above the gateway's bound, was used)."""
    from svc.gateway.config import GATEWAY_KEYS

    table = gateway_table(service_config)
    if key not in table:
        return default
    try:
        return next(k for k in GATEWAY_KEYS if k.name == key).check(table[key])
    except ValueError as e:
        _say_once(f"{service_config}: [gateway] {key} {e} (the gateway refuses it): using {default}")
        return default


def parse_value(text: str) -> Any:
    """A ``--param``/``--option`` value: JSON when it parses, else the string itself.

    ``0.5`` is a number, ``true`` a boolean, ``[1,2]`` a list, ``abc`` and
    ``"5"`` strings.  NaN and Infinity are kept as strings (not JSON).
    """

    def no_constants(constant: str) -> Any:
        raise ValueError(constant)

    try:
        return json.loads(text, parse_constant=no_constants)
    except ValueError:
        return text


def name_value(text: str) -> tuple[str, Any]:
    """An argparse type: ``NAME=VALUE`` with VALUE read by :func:`parse_value`."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, parse_value(value)


def positive_ms(text: str) -> int:
    """An argparse type: a number of milliseconds > 0 (``jobs run --poll-ms``; its bound above: the caller's).

    Its own message for every refusal: ``--poll-ms abc`` was "expected an integer >= 0", and 0 then refused
    as "> 0"."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of milliseconds > 0, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0 (``--timeout``; ``--qps`` through :func:`key_qps`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def key_qps(text: str) -> int:
    """An argparse type: a key's ``rate_limit_qps`` (``keygen``/``keys add --qps``), within the key file's bounds.

    Checked by the key-file loader's own declaration of the key (:data:`svc.auth.KEY_ENTRY_KEYS`), so that no
    entry is made that the gateway, and every later ``keys`` command, would refuse: one above its bound
    (:data:`svc.config.INT_MAXIMUM`) was written, and the gateway's restart failed on the file."""
    value = non_negative_int(text)
    try:
        next(key for key in KEY_ENTRY_KEYS if key.name == "rate_limit_qps").check(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"a key's rate_limit_qps {e}") from None
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (``--timeout-s``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def find_token(env: Mapping[str, str], token_env: str | None = None) -> str:
    """The Bearer token from the environment; :class:`CliError` when none is set.

    ``token_env`` names the only variable to read; without it the first
    non-empty one of :data:`TOKEN_ENVS` is used.
    """
    if token_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token_env):  # a token given by mistake: not shown
        raise CliError("--token-env takes the name of a variable (letters, digits and '_'), and what it was given "
                       "is not one (not shown: it may be a token)")
    names = (token_env,) if token_env else TOKEN_ENVS
    for name in names:
        if env.get(name):
            return checked_token(name, env[name])
    if token_env:
        raise CliError(f"no token: {token_env} is not set (named by --token-env)")
    raise CliError(f"no token: set {', '.join(TOKEN_ENVS[:-1])} or {TOKEN_ENVS[-1]} "
                   "(or name another variable with --token-env)")


def checked_token(name: str, value: str) -> str:
    """``value``, the token of the variable ``name``; :class:`CliError` naming the variable, never the value, when
    it holds a character that no bearer token carries: one outside printable ASCII (``SERVICE_API_TOKEN=$'\\xe9'``
    failed inside the request, ``POST ...: UnicodeEncodeError``, after a connection was made).  The whitespace
    around it is the gateway's to strip, as a token read from a file with its newline worked."""
    if all(" " <= c <= "~" for c in value.strip()):
        return value
    raise CliError(f"{name} holds a character outside printable ASCII, which no bearer token carries (its value "
                   "is not shown; nothing sent)")


#: The arguments that become a segment of a request's path: dest and metavar.
PATH_ARGUMENTS = {"model": "MODEL", "job": "JOB"}


def check_path_arguments(args: argparse.Namespace) -> None:
    """:class:`CliError` for a MODEL or JOB that is not valid UTF-8 (bytes a shell passed, ``$'M\\xff'``): no
    URL can carry it, and quoting it into one failed with a UnicodeEncodeError traceback.  Shown as the bytes
    it was given, escaped.  An empty one (an unset shell variable, ``"$JOB"``) is refused too: it made another
    path, ``.../jobs/``, and the gateway's 404 "no route" read as if the service lacked the route."""
    for dest, metavar in PATH_ARGUMENTS.items():
        value = getattr(args, dest, None)
        if not isinstance(value, str):
            continue
        if not value.strip():
            raise CliError(f"{metavar} is empty (nothing sent)")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
            raise CliError(f"{metavar} {shown} is not valid UTF-8 (nothing sent)") from None


def request_body(images: list[str], params: list[tuple[str, Any]] | None = None,
                 options: list[tuple[str, Any]] | None = None, req_id: str | None = None,
                 wait_s: float = DEFAULT_TIMEOUT_S) -> bytes:
    """The JSON inference request for image files (docs/contract.md, Requests).

    ``params``, ``options`` and ``req_id`` appear only when given; a repeated
    NAME keeps its last value.  An unreadable file raises :class:`CliError`,
    and so do files whose base64 alone would pass the gateway's
    ``max_body_bytes`` (:func:`gateway_max_body_bytes`), before any is read:
    the gateway would answer 413, and reading and encoding a 300 MB file
    first took 1.3 GB of memory (a CLI probe).  A file whose size is known
    only once read (a pipe, ``/dev/stdin``, a device) is read up to what is
    left of the limit, within ``wait_s`` seconds (:func:`_read_stream`).
    """
    limit = gateway_max_body_bytes()
    sizes: list[int | None] = []
    for path in images:
        try:
            st = os.stat(path)
        except OSError as e:
            raise CliError(f"cannot read image {path}: {e.strerror or e}") from None
        sizes.append(st.st_size if stat.S_ISREG(st.st_mode) else None)  # a pipe's size: known only once read
    known = sum(_base64_size(size) for size in sizes if size is not None)
    if known > limit:
        raise _too_large(known, limit)
    encoded = []
    for path, size in zip(images, sizes):
        try:
            if size is None:
                data = _read_stream(path, 3 * ((limit - known) // 4), wait_s)  # the most bytes that fit, as base64
                known += _base64_size(len(data))
                if known > limit:
                    raise _too_large(known, limit, read_to_limit=True)
            else:
                with open(path, "rb") as f:
                    data = f.read()
            encoded.append(base64.b64encode(data).decode("ascii"))
        except OSError as e:
            raise CliError(f"cannot read image {path}: {e.strerror or e}") from None
    body: dict[str, Any] = {"images": encoded}
    if params:
        body["params"] = dict(params)
    if options:
        body["options"] = dict(options)
    if req_id is not None:
        body["req_id"] = req_id
    return json.dumps(body).encode("utf-8")


def _base64_size(size: int) -> int:
    return 4 * ((size + 2) // 3)


def _too_large(encoded_size: int, limit: int, read_to_limit: bool = False) -> CliError:
    """The one line for images over the gateway's ``max_body_bytes`` (``read_to_limit``: a pipe, read that far)."""
    return CliError(f"the images are {'at least ' if read_to_limit else ''}{encoded_size} bytes as base64, more "
                    f"than the gateway takes in one request (max_body_bytes {limit}; it would answer 413): send "
                    "fewer or smaller images")


def _read_stream(path: str, most: int, wait_s: float) -> bytes:
    """At most ``most`` + 1 bytes of a file that is not a regular file, all come within ``wait_s`` seconds.

    ``/dev/zero`` was read until MemoryError, 100 MB from a pipe were read before the gateway's 413, and
    a FIFO that no one writes held svcctl forever, whatever ``--timeout-s`` said: the file is opened
    without blocking (a FIFO then opens with no writer yet) and polled, each wait within the deadline.
    One byte past ``most`` says that it is too large, without reading the rest."""
    deadline = time.monotonic() + wait_s
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        chunks, size = [], 0
        while size <= most:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise CliError(f"cannot read image {path}: it did not all come within {wait_s:g} s (--timeout-s; "
                               "nothing sent)")
            try:
                chunk = os.read(fd, min(1 << 20, most + 1 - size))
            except BlockingIOError:  # ready, then taken by another reader of the same pipe
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
