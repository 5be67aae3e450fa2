"""Which proxy a file pull goes through: the variables curl, requests and huggingface_hub read.

``https_proxy`` or ``http_proxy`` for the URL's scheme, else ``all_proxy`` (the
lowercase name first, then the uppercase), unless ``no_proxy``/``NO_PROXY`` names the host:
a suffix, a ``host:port`` or ``*`` (as ``urllib.request`` matches it), or an
IP network (``127.0.0.0/8``, ``10.0.0.0/8``), which httpx and so hub pulls
honour too (a weights probe: file pulls went through the proxy for a host of
such a range, where hub pulls went direct).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlsplit


def proxy_for(url: str, env: Mapping[str, str] | None = None) -> str | None:
    """The proxy URL a request for ``url`` goes through, or None for a direct connection."""
    # Undocumented, and so missing from typeshed's urllib.request; it is what urlopen's proxy handling uses.
    from urllib.request import proxy_bypass_environment  # type: ignore[attr-defined]

    env = os.environ if env is None else env

    def first(name: str) -> str:
        return (env.get(name.lower()) or env.get(name.upper()) or "").strip()

    parts = urlsplit(url)
    proxy = first(f"{parts.scheme}_proxy") or first("all_proxy")  # as curl and httpx (so hub pulls) take it
    if not proxy:
        return None
    skip = first("no_proxy")
    if skip and (proxy_bypass_environment(parts.netloc, {"no": skip}) or in_networks(parts.hostname, skip)):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def proxy_variable(env: Mapping[str, str], *schemes: str) -> str | None:
    """The variable that names the proxy of the first of ``schemes`` (``https``, ``all``) that has one, as
    :func:`proxy_for` reads them (the lowercase name first): what a line about that proxy tells the user to change."""
    for scheme in schemes:
        for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY"):
            if (env.get(name) or "").strip():
                return name
    return None


def in_networks(host: str | None, no_proxy: str) -> bool:
    """Whether ``host`` is an IP address inside one of the networks (``a.b.c.d/n``, ``v6::/n``) of ``no_proxy``."""
    try:
        address = ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return False
    for entry in (e.strip() for e in no_proxy.split(",")):
        try:
            if "/" in entry and address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False
