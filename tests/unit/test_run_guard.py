"""The suite's run guard (tests/support/run_guard.py) and the conformance tests' node ids, in real pytest runs.

Each test runs pytest in a subprocess under xdist, as tox does, on a tiny
schemathesis file: three API operations of one test, which pytest 9 gives
one node id.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO

PLUGINS = ["-p", "no:cacheprovider", "-p", "xdist.plugin", "-p", "_hypothesis_pytestplugin",
           "-p", "schemathesis.pytest.plugin"]

TINY = '''
import schemathesis
from hypothesis import settings

OPERATION = {"responses": {"200": {"description": "ok"}}}
schema = schemathesis.openapi.from_dict({
    "openapi": "3.0.3", "info": {"title": "t", "version": "1"},
    "paths": {"/a": {"get": OPERATION}, "/b": {"get": OPERATION}, "/c": {"get": OPERATION}},
})


@schema.parametrize()
@settings(max_examples=1)
def test_operation(case):
    print("RAN", case.path)
'''


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", *PLUGINS, "-n", "2", "--dist", "loadfile",
                           "-p", "tests.support.run_guard", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_run_that_drops_tests_sharing_a_node_id_fails(tmp_path):
    (tmp_path / "test_tiny.py").write_text(TINY)
    result = run_pytest(tmp_path, "-q")
    output = result.stdout + result.stderr
    # What the guard is for: xdist ran one of the three operations, and pytest alone would report a pass.
    assert "1 passed" in output, output
    assert "run guard: 3 tests collected but 1 ran" in output, output
    assert result.returncode == 1, output


def test_the_same_run_with_unique_ids_passes(tmp_path):
    """The suite's fix (tests/support/conformance.py) gives each operation its id: all three run, exit 0."""
    (tmp_path / "test_tiny.py").write_text(TINY)
    (tmp_path / "conftest.py").write_text(
        "from tests.support.conformance import unique_operation_ids\n\n\n"
        "def pytest_collection_modifyitems(items):\n    unique_operation_ids(items)\n")
    result = run_pytest(tmp_path, "-v")
    output = result.stdout + result.stderr
    for path in ("/a", "/b", "/c"):
        assert f"PASSED test_tiny.py::test_operation[GET {path}]" in output, output
    assert "3 passed" in output and "run guard" not in output, output
    assert result.returncode == 0, output


def test_the_conformance_tests_have_one_node_id_per_operation():
    """Every per-operation item of the suite's schemathesis tests is collected under its own id."""
    files = ["tests/integration/test_gateway_schemathesis.py", "tests/integration/test_modelserver_schemathesis.py"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", *PLUGINS, "--collect-only", "-q", *files], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(ids) == 41 and len(set(ids)) == len(ids), ids  # 16 + 4 gateway operations, 9 + 11 + 1 model server
    assert "tests/integration/test_modelserver_schemathesis.py::test_model_server_conforms_to_its_openapi_document" \
           "[POST /v2/models/MOBILENETV2/infer]" in ids
    assert "tests/integration/test_gateway_schemathesis.py::test_gateway_conforms_to_its_openapi_document" \
           "[POST /v2/models/MOBILENETV2/infer]" in ids
    assert "tests/integration/test_gateway_schemathesis.py::test_gateway_conforms_to_its_openapi_document" \
           "[POST /v1/models/MOBILENETV2/infer]" in ids
    assert "tests/integration/test_modelserver_schemathesis.py::test_job_routes_conform_to_the_served_document" \
           "[GET /jobs/{job_id}/result]" in ids
