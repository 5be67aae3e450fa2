"""What the wheel and the sdist ship, read from setup.py's own arguments (no build: a build takes a minute)."""

from __future__ import annotations

import runpy

import pytest
import setuptools

from tests.support.processes import REPO


@pytest.fixture
def setup_args(monkeypatch) -> dict:
    """The keyword arguments setup.py gives ``setuptools.setup``, as it runs from the repository's root."""
    seen: dict = {}
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: seen.update(kwargs))
    runpy.run_path(str(REPO / "setup.py"))
    return seen


def test_the_licence_setup_py_names_is_in_the_repository_and_shipped(setup_args):
    """setup.py said Apache-2.0 and the repository had no LICENSE file for a wheel or an sdist to carry."""
    assert setup_args["license"] == "Apache-2.0"
    assert setup_args["license_files"] == ["LICENSE"]
    lines = (REPO / "LICENSE").read_text().splitlines()
    assert [line.strip() for line in lines[:3]] == ["Apache License", "Version 2.0, January 2004",
                                                    "http://www.apache.org/licenses/"]
    assert "END OF TERMS AND CONDITIONS" in [line.strip() for line in lines]


# -- where an installed copy finds its code and data (svc.infra.install) ------------------------------


def test_a_checkout_goes_first_on_a_childs_path_and_an_installed_copy_adds_nothing(tmp_path, monkeypatch):
    from svc.infra import install

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    assert install.source_root() == REPO
    assert install.child_pythonpath({}, checkout) == str(checkout)
    assert install.child_pythonpath({"PYTHONPATH": f":/x:{checkout}"}, checkout) == f"{checkout}:/x"
    monkeypatch.setattr(install, "site_dirs", lambda: {checkout.resolve()})  # the same folder, installed
    assert install.child_pythonpath({"PYTHONPATH": "/x::/y"}, checkout) == "/x:/y"
    assert install.child_pythonpath({}, checkout) == ""
