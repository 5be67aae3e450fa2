"""bin/quickstart itself, on a stub tree: `pip install .` only when .venv does not hold this version already."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path):
    """A checkout with bin/quickstart, its version and a few sources, and a .venv whose pip only says what it was
    asked and whose python says $INSTALLED as the installed version (and runs anything else for real)."""
    (tmp_path / "bin").mkdir()
    shutil.copy(REPO / "bin" / "quickstart", tmp_path / "bin" / "quickstart")
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "__init__.py").write_text('"""x"""\n\n__version__ = "9.9.9"\n')
    (tmp_path / "setup.py").write_text("setup()\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text("[gateway]\n")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text('#!/bin/sh\ncase "$*" in *importlib.metadata*) [ -n "$INSTALLED" ] || exit 1; '
                                 f'echo "$INSTALLED"; exit 0;; esac\ncase "$1" in -I) exec {sys.executable} "$@";; '
                                 'esac\necho "python $*"\n')
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


INSTALLS = ["==> [2/3] Installing the service and its dependencies into .venv (the first time: PyTorch, about 6 GB, "
            "several minutes)", "pip install --disable-pip-version-check .", "==> [3/3] Starting the service",
            "python -m svc.cli.quickstart --weights demo"]
SKIPS = ["==> [2/3] inference-service 9.9.9 is installed in .venv from these sources: nothing to install",
         "==> [3/3] Starting the service", "python -m svc.cli.quickstart --weights demo"]


def test_the_installed_version_of_these_sources_is_not_installed_again(tree):
    assert quickstart(tree, "") == INSTALLS
    assert quickstart(tree, "9.9.9") == SKIPS
    # what runs there is no source: bytecode, twisted's plugin cache; nor the checkout's conf/, edited in place
    (tree / "svc" / "__pycache__").mkdir()
    (tree / "svc" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0")
    (tree / "twisted" / "plugins").mkdir(parents=True)
    (tree / "twisted" / "plugins" / "dropin.cache").write_bytes(b"\0")
    (tree / "conf" / "api_keys.toml").write_text("[keys.local]\n")
    with open(tree / "conf" / "service.toml", "a") as f:
        f.write("# edited\n")
    assert quickstart(tree, "9.9.9") == SKIPS


@pytest.mark.parametrize("change", ["svc/__init__.py", "svc/new.py", "setup.py"])
def test_changed_sources_of_the_same_version_are_installed_again(tree, change):
    """A `git pull` that kept the version left .venv on the old code: only the version was compared."""
    assert quickstart(tree, "") == INSTALLS
    with open(tree / change, "a") as f:
        f.write("# changed\n")
    assert quickstart(tree, "9.9.9") == INSTALLS
    assert quickstart(tree, "9.9.9") == SKIPS


def test_an_install_builds_afresh_so_a_removed_module_is_not_packaged_again(tree):
    """A fresh-install probe: a module removed from the checkout stayed installed after the next install, packaged
    again from the build/lib setuptools had kept (pip install . builds in the tree)."""
    stale = tree / "build" / "lib" / "svc" / "removed.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("STALE = True\n")
    assert quickstart(tree, "") == INSTALLS
    assert not (tree / "build").exists()
    (tree / "build" / "lib").mkdir(parents=True)  # nothing is removed when nothing is installed
    assert quickstart(tree, "9.9.9") == SKIPS and (tree / "build" / "lib").exists()


@pytest.mark.parametrize("installed", ["0.9.0", ""])
def test_another_version_or_none_is_installed(tree, installed):
    assert quickstart(tree, "9.9.9") == INSTALLS  # no record of these sources yet
    assert quickstart(tree, installed) == INSTALLS
