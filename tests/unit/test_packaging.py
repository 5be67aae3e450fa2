"""What the wheel and the sdist ship, read from setup.py's own arguments (no build: a build takes a minute)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import setuptools
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

from svc import __version__
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


def ui_files() -> list[str]:
    from svc.supervisor.api import UI_FILES

    return sorted({name for name, _ in UI_FILES.values()})


def install_tree(base: Path, *, ui: list[str] | None = None, version: str | None = __version__,
                 code: Path | None = None) -> Path:
    """``<base>/lib/python3.11/site-packages`` (returned; ``code`` instead when given), with
    ``<base>/share/inference-service/ui`` holding ``ui`` (the UI's file names; None: no folder) and the ``VERSION``
    file that setup.py's install_data writes (None: none)."""
    site_packages = base / "lib" / "python3.11" / "site-packages" if code is None else code
    site_packages.mkdir(parents=True, exist_ok=True)
    if ui is not None:
        shared = base / "share" / "inference-service" / "ui"
        shared.mkdir(parents=True)
        for name in ui:
            (shared / name).write_text(name)
        if version is not None:
            (shared.parent / "VERSION").write_text(version + "\n")
    return site_packages


def test_the_ui_of_a_user_or_debian_install_is_found_beside_the_code_not_in_the_working_directory(
        tmp_path, monkeypatch):
    """``pip install --user`` (under site.USER_BASE) and Debian's pip (``/usr/local``, sys.prefix ``/usr``) put the
    UI where ``sys.prefix/share`` is not; and a ``ui/`` folder in the working directory won over the installed UI."""
    from svc.infra import install
    from svc.supervisor.tap import ui_dir

    assert ui_dir() == str(REPO / "ui")  # a checkout serves its own
    user_base = tmp_path / "home" / ".local"
    site_packages = install_tree(user_base, ui=ui_files())
    install_tree(tmp_path / "usr", ui=ui_files())  # sys.prefix: holds a UI too, found after the code's own
    (tmp_path / "work" / "ui").mkdir(parents=True)
    for name in ui_files():
        (tmp_path / "work" / "ui" / name).write_text("the user's")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr(install, "source_root", lambda: site_packages)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "usr"))
    assert ui_dir() == str(user_base / "share" / "inference-service" / "ui")


def test_a_ui_folder_missing_one_served_file_is_passed_over(tmp_path, monkeypatch):
    from svc.infra import install
    from svc.supervisor.tap import ui_dir

    partial = [name for name in ui_files() if name != "try-it.js"]
    site_packages = install_tree(tmp_path / "venv", ui=partial)
    monkeypatch.setattr(install, "source_root", lambda: site_packages)
    install_tree(tmp_path / "prefix", ui=ui_files())
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    assert ui_dir() == str(tmp_path / "prefix" / "share" / "inference-service" / "ui")
    (tmp_path / "prefix" / "share" / "inference-service" / "ui" / "index.html").unlink()
    assert ui_dir() is None


def test_a_target_install_finds_its_data_in_its_own_folder_before_another_versions_under_sys_prefix(
        tmp_path, monkeypatch, capsys):
    """``pip install --target DIR`` puts the code in ``DIR/svc`` and the data in ``DIR/share``: that folder was
    never looked in, and a 0.13.0 copy under ``sys.prefix`` was served to a 0.16 supervisor without a word."""
    from svc.infra import install
    from svc.supervisor.tap import ui_dir

    target = tmp_path / "target"
    install_tree(target, ui=ui_files(), code=target)
    install_tree(tmp_path / "usr", ui=ui_files(), version="0.13.0")
    monkeypatch.setattr(install, "source_root", lambda: target)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "usr"))
    assert ui_dir() == str(target / "share" / "inference-service" / "ui")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("version, said", [("0.13.0", "version 0.13.0"),
                                           (None, "an unknown version (no VERSION file)")])
def test_another_versions_copy_is_passed_over_with_one_line(tmp_path, monkeypatch, capsys, version, said):
    """The copy found under ``sys.prefix`` was another version's (an older install): its UI and default
    configuration were used as this version's."""
    from svc.infra import install
    from svc.supervisor.tap import ui_dir

    site_packages = install_tree(tmp_path / "venv")
    install_tree(tmp_path / "usr", ui=ui_files(), version=version)
    monkeypatch.setattr(install, "source_root", lambda: site_packages)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "usr"))
    assert ui_dir() is None
    stale = tmp_path / "usr" / "share" / "inference-service" / "ui"
    assert capsys.readouterr().err == (f"inference-service {__version__}: passing over {stale}, installed by {said}; "
                                       "reinstall the service to replace it\n")


def test_the_installed_data_files_carry_the_version_that_installed_them(setup_args, tmp_path):
    """What svc.infra.install.data_dir compares: ``share/inference-service/VERSION``, written by install_data."""
    command = setup_args["cmdclass"]["install_data"](Distribution({"data_files": []}))
    command.install_dir = str(tmp_path / "data")  # what finalize_options would take from a whole install's
    command.run()
    marker = tmp_path / "data" / "share" / "inference-service" / "VERSION"
    assert marker.read_text() == f"{__version__}\n"
    assert command.get_outputs() == [str(marker)]


def test_a_build_copies_no_module_an_earlier_build_left_in_build_lib(setup_args, tmp_path, monkeypatch):
    """A module removed from the checkout stayed in every later wheel (and ``pip install /path/to/checkout``): the
    build copied the sources over the ``build/lib`` of the build before, whose removed ``svc/x.py`` and
    ``models/plugin.py`` went into the wheel as they were."""
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "pkg" / "kept.py").write_text("")
    for left in ("pkg/removed.py", "models/plugin.py"):
        (tmp_path / "build" / "lib" / left).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "build" / "lib" / left).write_text("")
    monkeypatch.chdir(tmp_path / "src")
    command_class = setup_args.get("cmdclass", {}).get("build_py", build_py)  # setuptools' own: the build before
    command = command_class(Distribution({"packages": ["pkg"], "script_name": "setup.py"}))
    command.build_lib = str(tmp_path / "build" / "lib")
    command.compile = 0
    command.ensure_finalized()
    command.run()
    built = sorted(str(p.relative_to(tmp_path / "build" / "lib")) for p in (tmp_path / "build" / "lib").rglob("*"))
    assert built == ["pkg", "pkg/__init__.py", "pkg/kept.py"]


def test_the_working_directory_leaves_the_path_unless_it_holds_this_code_or_python_ran_with_p(tmp_path, monkeypatch):
    """svc.infra.install.drop_working_directory: ``python -m`` puts the working directory first on the path, and
    a ``models/`` folder there was imported as plugins; a checkout run from its root keeps it (the code is there),
    and ``python -P`` put none there to take."""
    from types import SimpleNamespace

    from svc.infra.install import drop_working_directory, source_root

    monkeypatch.chdir(tmp_path)
    path = [str(tmp_path), "/lib/site-packages"]
    drop_working_directory(path)
    assert path == ["/lib/site-packages"]
    monkeypatch.chdir(source_root())
    path = [str(source_root()), "/lib/site-packages"]
    drop_working_directory(path)
    assert path == [str(source_root()), "/lib/site-packages"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.flags", SimpleNamespace(safe_path=True))
    path = [str(tmp_path), "/lib/site-packages"]  # with -P this first entry is the script's, not the working one
    drop_working_directory(path)
    assert path == [str(tmp_path), "/lib/site-packages"]


def test_the_default_configuration_is_shipped_without_the_key_file(setup_args):
    """The wheel shipped no conf/: an installed user could not run the quick start ("not a checkout")."""
    shipped = {f"{folder}/{path.rsplit('/', 1)[1]}": path for folder, paths in setup_args["data_files"]
               for path in paths}
    conf = {name: path for name, path in shipped.items() if name.startswith("share/inference-service/conf/")}
    expected = sorted(str(p.relative_to(REPO)) for p in (REPO / "conf").rglob("*.toml") if p.name != "api_keys.toml")
    assert sorted(conf.values()) == expected
    assert all(name == f"share/inference-service/{path}" for name, path in conf.items())
    assert {"conf/service.toml", "conf/api_keys.example.toml", "conf/profiles/cpu.toml",
            "conf/server/MOBILENETV2.toml"} <= set(conf.values())
