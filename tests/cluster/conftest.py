"""The multi-host tests: one cluster of three hosts per module (tests/support/cluster.py).

Every test under tests/cluster/ gets the ``cluster`` marker (``tox -- -m cluster`` runs them alone).
They need root for network namespaces and Debian's redis-server and haproxy (bin/ensure-scaleout, which
tox runs first); without them they fail with one line saying what is missing.
"""

from __future__ import annotations

import pytest

from tests.support.cluster import running_cluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/cluster/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with running_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running
