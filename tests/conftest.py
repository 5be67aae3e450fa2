"""Shared fixtures: real model-server processes on free loopback ports.

Also the suite's one environment setting, made here before anything imports
torch so that the test processes and every process they start inherit it:
``OMP_WAIT_POLICY=PASSIVE``.  The suite runs several torch processes at once
on few cores (two pytest workers, each with its model servers), and OpenMP's
default lets every idle intra-op thread spin for a while after each parallel
region: on a 2-core machine that doubled the CPU time of a model server's
start (MOBILENETV2: 9.6 CPU-s spinning, 4.0 passive).  Passive threads sleep
instead; what the processes compute is the same.  An explicit
``OMP_WAIT_POLICY`` in the environment wins.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "tests" / "plugins"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from tests.support import run_guard  # noqa: E402
from tests.support.conformance import unique_operation_ids  # noqa: E402
from tests.support.processes import start_model_server, write_config  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # A run in which fewer tests ran than were collected fails (tests/support/run_guard.py).
    run_guard.pytest_configure(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unique_operation_ids(items)


@pytest.fixture(scope="session")
def conf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conf")


@pytest.fixture(scope="session")
def mobilenet(conf_dir: Path):
    """The shipped MOBILENETV2 config on a free port, with an auth token."""
    proc = start_model_server(write_config(conf_dir, "MOBILENETV2", max_body_bytes=256 * 1024, max_request_items=6))
    yield proc
    proc.stop(signal.SIGTERM)
