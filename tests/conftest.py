"""Shared fixtures: real model-server processes on free loopback ports."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "tests" / "plugins"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from tests.support.processes import start_model_server, write_config  # noqa: E402


@pytest.fixture(scope="session")
def conf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conf")


@pytest.fixture(scope="session")
def mobilenet(conf_dir: Path):
    """The shipped MOBILENETV2 config on a free port, with an auth token."""
    proc = start_model_server(write_config(conf_dir, "MOBILENETV2", max_body_bytes=256 * 1024, max_request_items=6))
    yield proc
    proc.stop(signal.SIGTERM)
