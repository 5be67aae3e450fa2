"""Which listening addresses a process may bind: a wildcard (every address) only when the operator says so.

The gateway and the supervisor listen on loopback by default; a wildcard
bind exposes them (and the supervisor's management API) to every network
the host is on, so it takes ``SERVICE_EXPOSE`` (``docker`` in a container,
whose own network is the boundary, or ``unsafe``).  Every spelling the
socket layer takes as the wildcard counts, not only ``0.0.0.0`` and ``::``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

EXPOSE_ENV = "SERVICE_EXPOSE"
#: A bind on every address: the spellings that need no parsing (the rest: :func:`is_wildcard`).
WILDCARDS = ("0.0.0.0", "::", "", "*", "[::]")
#: ``::ffff:0.0.0.0``: IPv4's wildcard mapped into IPv6.
_MAPPED_ANY = bytes(10) + b"\xff\xff" + bytes(4)


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every address of the machine, however it is spelled.

    Not only ``0.0.0.0`` and ``::``: the socket layer binds ``0``, ``0.0``
    and ``0x0`` (``inet_aton``'s short forms), ``::0``, ``0:0:0:0:0:0:0:0``
    and ``::ffff:0.0.0.0`` to the same wildcard, and a name to whatever it
    resolves to (the bind would resolve it too).  A name that does not
    resolve is not a wildcard: its bind fails on its own.
    """
    name = host.strip()
    if name in WILDCARDS:
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    name = name.partition("%")[0]  # an IPv6 zone (fe80::1%eth0)
    try:
        return not any(socket.inet_aton(name))
    except (OSError, ValueError):
        pass
    try:
        packed = socket.inet_pton(socket.AF_INET6, name)
    except (OSError, ValueError):
        pass
    else:
        return not any(packed) or packed == _MAPPED_ANY
    try:
        resolved = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError, ValueError):
        return False
    return any(info[4][0] != name and is_wildcard(str(info[4][0])) for info in resolved)


def bind_problem(host: str, env: Mapping[str, str], what: str) -> str | None:
    """Why binding ``host`` is refused (None when allowed): wildcards need SERVICE_EXPOSE."""
    if is_wildcard(host) and env.get(EXPOSE_ENV) not in ("docker", "unsafe"):
        return (f"refusing the wildcard bind {host!r}: set {EXPOSE_ENV}=docker (in a container) or "
                f"{EXPOSE_ENV}=unsafe to expose {what}")
    return None
