"""bin/quickstart itself, on a stub tree: `pip install .` only when .venv does not hold this version already."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path):
    """A checkout with bin/quickstart, its version, and a .venv whose python and pip only say what they were asked."""
    (tmp_path / "bin").mkdir()
    shutil.copy(REPO / "bin" / "quickstart", tmp_path / "bin" / "quickstart")
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "__init__.py").write_text('"""x"""\n\n__version__ = "9.9.9"\n')
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text('#!/bin/sh\nif [ "$1" = "-I" ]; then [ -n "$INSTALLED" ] || exit 1; '
                                 'echo "$INSTALLED"; exit 0; fi\necho "python $*"\n')
    (venv / "pip").write_text('#!/bin/sh\necho "pip $*"\n')
    for stub in ("python", "pip"):
        os.chmod(venv / stub, 0o755)
    return tmp_path


def quickstart(tree: Path, installed: str) -> list[str]:
    env = {**os.environ, "INSTALLED": installed}
    done = subprocess.run(["sh", str(tree / "bin" / "quickstart"), "--weights", "demo"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_installed_version_is_not_installed_again(tree):
    assert quickstart(tree, "9.9.9") == [
        "==> [2/3] inference-service 9.9.9 is installed in .venv: nothing to install",
        "==> [3/3] Starting the service",
        "python -m svc.cli.quickstart --weights demo"]


@pytest.mark.parametrize("installed", ["0.9.0", ""])
def test_another_version_or_none_is_installed(tree, installed):
    out = quickstart(tree, installed)
    assert out[1] == "pip install --disable-pip-version-check ."
    assert out[0].startswith("==> [2/3] Installing the service") and out[-1] == "python -m svc.cli.quickstart --weights demo"
