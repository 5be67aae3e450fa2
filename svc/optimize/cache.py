"""Where compiled artefacts live: the service's state directory and the inductor cache under it.

``$SERVICE_STATE_DIR``, default ``$XDG_STATE_HOME/inference-service``, else
``~/.local/state/inference-service``: what the service writes for itself and
keeps across restarts (unlike the weights cache, ``$SERVICE_WEIGHTS_DIR``,
nothing in it is downloaded).  ``compile`` keeps its compiled packages in
``<state>/compiled`` (:mod:`svc.optimize.aot`), so a restart loads what the
first start compiled, and inductor its kernel cache in ``<state>/inductor``
(``TORCHINDUCTOR_CACHE_DIR``; one already in the environment is kept).

Torch-free; :func:`use_inductor_cache` must run before torch compiles
anything (``svc.model.torchenv.configure_compile_cache`` calls it at startup).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from svc.infra.userdirs import configured_dir

STATE_DIR_ENV = "SERVICE_STATE_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """The service's state directory (not created here)."""
    return configured_dir(STATE_DIR_ENV, "state", env)


def inductor_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where inductor caches compiled graphs and kernels: ``TORCHINDUCTOR_CACHE_DIR``, else ``<state>/inductor``."""
    env = os.environ if env is None else env
    if env.get(INDUCTOR_CACHE_ENV):
        return Path(env[INDUCTOR_CACHE_ENV]).expanduser()
    return state_dir(env) / "inductor"


def use_inductor_cache(env: MutableMapping[str, str] | None = None) -> Path:
    """Point inductor at :func:`inductor_cache_dir` (sets the variable in ``env``); the directory."""
    env = os.environ if env is None else env
    path = inductor_cache_dir(env)
    env[INDUCTOR_CACHE_ENV] = str(path)
    return path


def compiled_dir(env: dict[str, str] | None = None) -> Path:
    """Where ``compile`` keeps its packages (``svc.optimize.aot``): ``<state>/compiled``."""
    return state_dir(env) / "compiled"
