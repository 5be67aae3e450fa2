"""Configs for the benchmarks: the shipped ones as they ship, ``backend.optimize`` included.

The tests write their configs with ``tests.support.processes.write_config``,
which sets ``backend.optimize = "eager"`` so that a test not about optimised
execution does not pay for choosing a mode.  A benchmark measures what users
run, so :func:`shipped_config` removes that default again and the config's
own setting applies (the shipped ``auto``), unless the caller names one.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from tests.support.processes import config_source, write_config


def shipped_config(directory: Path, base: str | Path = "MOBILENETV2", name: str | None = None,
                   **overrides: Any) -> Path:
    """``write_config`` with the config's own ``backend.optimize`` unless ``backend={"optimize": ...}`` is given.

    A config without the key (an older checkout's, with ``--tree``) gets none
    either: the code that reads it applies its own default.
    """
    own = tomllib.loads(config_source(base).read_text()).get("backend", {}).get("optimize")
    overrides["backend"] = {"optimize": own, **(overrides.get("backend") or {})}
    return write_config(directory, base, name, **overrides)
