"""The chaos suite: faults done to real processes (kill -9, SIGSTOP, SIGTERM
under load, hostile inputs), each test naming the promise it checks.

Every test under ``tests/chaos/`` carries the ``chaos`` marker, so the suite
runs alone with ``tox -- -m chaos`` (tox runs it with everything else by
default).  The promises are listed in docs/operations.md, "What survives what".
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/chaos/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.chaos)
