"""Where the weights cache and the state directory live: the override, the XDG base, the home default."""

from __future__ import annotations

import os
from pathlib import Path

from svc.optimize.cache import state_dir
from svc.weightstore.cache import weights_dir


def test_the_weights_cache_follows_its_variable_then_xdg_cache_home_then_home():
    assert weights_dir({"SERVICE_WEIGHTS_DIR": "~/w", "XDG_CACHE_HOME": "/x"}) == Path(os.path.expanduser("~/w"))
    assert weights_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/inference-service/weights")
    assert weights_dir({"XDG_CACHE_HOME": ""}) == Path(os.path.expanduser("~/.cache/inference-service/weights"))


def test_the_state_directory_follows_its_variable_then_xdg_state_home_then_home():
    assert state_dir({"SERVICE_STATE_DIR": "~/s", "XDG_STATE_HOME": "/x"}) == Path(os.path.expanduser("~/s"))
    assert state_dir({"XDG_STATE_HOME": "/x"}) == Path("/x/inference-service")
    assert state_dir({}) == Path(os.path.expanduser("~/.local/state/inference-service"))
