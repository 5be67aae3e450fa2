"""The per-user directories the service keeps its files in, after the XDG base directory spec.

``$XDG_CACHE_HOME`` (default ``~/.cache``) holds what can be fetched again
(the weights cache, ``svc.weightstore.cache``), ``$XDG_STATE_HOME`` (default
``~/.local/state``) what the service writes for itself and keeps across
restarts (compiled packages, ``svc.optimize.cache``); each under a folder
named after the product.  Each user of these has its own environment
variable that replaces the whole path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from svc import PRODUCT

#: kind -> (the XDG variable, its default under the home directory)
BASES = {"cache": ("XDG_CACHE_HOME", (".cache",)), "state": ("XDG_STATE_HOME", (".local", "state"))}


def product_dir(kind: str, env: Mapping[str, str] | None = None) -> Path:
    """``<XDG base of kind>/inference-service`` (not created here)."""
    env = os.environ if env is None else env
    variable, default = BASES[kind]
    base = env.get(variable) or os.path.join(os.path.expanduser("~"), *default)
    return Path(base) / PRODUCT


def configured_dir(variable: str, kind: str, env: Mapping[str, str] | None = None, *under: str) -> Path:
    """``$variable`` when set (``~`` expanded), else ``under`` inside :func:`product_dir` of ``kind``."""
    env = os.environ if env is None else env
    if env.get(variable):
        return Path(env[variable]).expanduser()
    return product_dir(kind, env).joinpath(*under)
