"""Standing promises of the repository: README, docs, CI, pins, contract, light imports."""

from __future__ import annotations

import re
import subprocess
import sys

from svc import __version__
from svc.config import BACKEND_KEYS, MODEL_SERVER_KEYS
from svc.contract import status as st
from svc.openapi.committed import check
from tests.support.processes import REPO, child_env

README = (REPO / "README.md").read_text()
#: The pages whose tables the code's keys and statuses must appear in (docs/, built by `tox -e docs`).
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()
API = (REPO / "docs" / "api.md").read_text()
CONTRACT = (REPO / "docs" / "contract.md").read_text()


def readme_block_after(heading: str) -> str:
    after = README.split(heading, 1)[1]
    return re.search(r"```sh\n(.*?)\n```", after, re.S).group(1).strip()


def test_ci_runs_the_readme_test_command_and_nothing_else():
    command = readme_block_after("Test it")
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci == ["set -eu", 'cd "$(dirname "$0")/.."', command]


def test_readme_opens_with_the_two_commands():
    first_blocks = re.findall(r"```sh\n(.*?)\n```", README, re.S)[:2]
    assert first_blocks == ["./bin/quickstart", readme_block_after("Test it")]


def test_docs_document_every_config_key_and_status():
    for key in MODEL_SERVER_KEYS:
        assert f"| `{key.name}` |" in CONFIGURATION, key.name
    for key in BACKEND_KEYS:
        assert f"| `backend.{key.name}` |" in CONFIGURATION, key.name
    for status in st.ALL:
        assert f"| {status.code} | {status.text} | {status.http} |" in API, status
        assert f"| {status.code} | {status.text} | {status.http} |" in CONTRACT, status


def test_readme_stays_short_and_points_into_docs():
    assert len(README.splitlines()) <= 400
    for page in re.findall(r"\]\((docs/[^)#]+)\)", README):
        assert (REPO / page).is_file(), page


def test_every_module_of_the_ui_has_at_most_400_lines():
    for path in (REPO / "ui").glob("*.js"):
        assert len(path.read_text().splitlines()) <= 400, path.name


def test_every_python_module_of_the_service_has_at_most_400_lines():
    paths = [*(REPO / "svc").rglob("*.py"), *(REPO / "models").glob("*.py"), *(REPO / "twisted").rglob("*.py")]
    assert len(paths) > 100
    too_long = {str(p.relative_to(REPO)): n for p in paths if (n := len(p.read_text().splitlines())) > 400}
    assert too_long == {}


def test_the_top_of_svc_holds_at_most_ten_modules():
    assert len(list((REPO / "svc").glob("*.py"))) <= 10


def test_the_module_map_lists_every_module():
    """docs/ARCHITECTURE.md's module map: a row per module, or its name in its package's row."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    rows = [line for line in text.split("## Module map", 1)[1].split("\n## ", 1)[0].splitlines()
            if line.startswith("| `")]
    listed = {line.split("`")[1] for line in rows}
    for path in sorted([*(REPO / "svc").rglob("*.py"), *(REPO / "models").glob("*.py")]):
        name = str(path.relative_to(REPO))
        if path.name == "__init__.py" and name != "svc/__init__.py":
            continue  # a package's docstring; the package has its rows
        folder = path.parent.relative_to(REPO)
        package = [line for line in rows if line.split("`")[1] in (f"{folder}/", f"{folder}/*.py")]
        in_package_row = any(f"`{path.name}`" in line or f"`{path.stem}`" in line for line in package)
        assert name in listed or in_package_row, name


def test_changelog_has_the_current_version():
    assert f"## [{__version__}]" in (REPO / "CHANGELOG.md").read_text()


def test_every_runtime_dependency_is_pinned():
    text = (REPO / "setup.py").read_text()
    block = re.search(r"RUNTIME = \[(.*?)\]", text, re.S).group(1)
    pins = re.findall(r'"([^"]+)"', block)
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins
    assert all("==" in p for p in pins), pins


def test_committed_openapi_documents_are_current():
    assert check(str(REPO / "openapi"), str(REPO / "conf" / "server")) == []


def test_plugin_files_import_no_torch():
    code = (
        "import sys; import twisted.plugins.service_plugins, svc.modelserver.tap, svc.model.api, svc.openapi.committed;"
        "from svc.model.api import factories; factories();"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_docs_document_every_service_config_key():
    from svc.cluster_config import CLUSTER_KEYS
    from svc.gateway.config import GATEWAY_KEYS
    from svc.supervisor.config import PROFILE_KEYS, SERVER_KEYS, SUPERVISOR_KEYS

    for key in GATEWAY_KEYS:
        assert f"| `gateway.{key.name}` |" in CONFIGURATION, key.name
    for key in SUPERVISOR_KEYS:
        assert f"| `supervisor.{key.name}` |" in CONFIGURATION, key.name
    for key in CLUSTER_KEYS:
        assert f"| `cluster.{key.name}` |" in CONFIGURATION, key.name
    for key in SERVER_KEYS:
        assert f"| `servers.<ID>.{key.name}` |" in CONFIGURATION, key.name
    for key in PROFILE_KEYS:
        assert f"| `{key.name}` |" in CONFIGURATION.split("## Profiles", 1)[1].split("\n## ", 1)[0], key.name


def test_the_docs_give_the_range_of_every_key_the_code_bounds_above():
    """A config probe: bounds such as max_request_items <= 4096 or workers <= 64 were refused at start with a clear
    line but stated nowhere in the reference."""
    from svc.cluster_config import CLUSTER_KEYS
    from svc.gateway.config import GATEWAY_KEYS
    from svc.supervisor.config import SERVER_KEYS, SUPERVISOR_KEYS

    rows = CONFIGURATION.splitlines()
    for prefix, keys in (("", MODEL_SERVER_KEYS), ("backend.", BACKEND_KEYS), ("gateway.", GATEWAY_KEYS),
                         ("supervisor.", SUPERVISOR_KEYS), ("cluster.", CLUSTER_KEYS), ("servers.<ID>.", SERVER_KEYS)):
        for key in keys:
            if key.maximum is None:
                continue
            low, high = (f"{v:g}" for v in (key.minimum, key.maximum))
            row = next(r for r in rows if r.startswith(f"| `{prefix}{key.name}` |"))
            assert f"{low}..{high}" in row or f"{low} to {high}" in row, (prefix + key.name, low, high)


def test_shipped_service_config_loads():
    from svc.gateway.config import load_gateway_config
    from svc.supervisor.config import load_supervisor_config

    path = str(REPO / "conf" / "service.toml")
    gateway, supervisor = load_gateway_config(path), load_supervisor_config(path)
    assert (gateway.host, gateway.port, gateway.upstream_recv_timeout_ms) == ("127.0.0.1", 8080, 180000)
    assert gateway.cors_origins == ("http://127.0.0.1:8787", "http://localhost:8787")
    assert (supervisor.host, supervisor.port, supervisor.gateway_port) == ("127.0.0.1", 8787, 8080)


def test_gateway_and_supervisor_import_no_torch():
    code = (
        "import sys; import svc.gateway.tap, svc.gateway.service, svc.supervisor.tap, svc.supervisor.service, svc.cli.commands;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
