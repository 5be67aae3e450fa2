"""Where this copy of the service lives: its source root, and the data files installed beside it.

A checkout holds the code (``svc/``, ``models/``, ``twisted/plugins/``) and its
data (``ui/``, ``conf/``) in one folder.  An installed package (a wheel: a
virtual environment, ``pip install --user``, Debian's system pip under
``/usr/local``) puts the code in a site-packages folder and the data under
``<base>/share/inference-service/`` (setup.py ``data_files``), where ``<base>``
is that site-packages folder's ``<base>/lib/pythonX.Y/site-packages``, and not
always ``sys.prefix``: a ``--user`` install's base is ``site.USER_BASE``, and
Debian's pip installs under ``/usr/local`` while ``sys.prefix`` is ``/usr``.

The supervisor's children must import exactly the code the supervisor runs
(:func:`child_pythonpath`); the supervisor's web UI and the quick start's
default configs are found by :func:`data_dir`.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path

#: The folder under ``<base>/share`` that setup.py's ``data_files`` install into.
SHARE = Path("share") / "inference-service"


def source_root() -> Path:
    """The folder that holds this ``svc`` package: a checkout, or a site-packages folder."""
    return Path(__file__).resolve().parents[2]


def site_dirs() -> set[Path]:
    """The interpreter's own site-packages folders (the virtual environment's, the system's, the user's).

    A child started with this interpreter and ``-P`` finds what is in them without help.
    """
    found = [*site.getsitepackages(), site.getusersitepackages(),
             sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return {Path(p).resolve() for p in found if p}


def child_pythonpath(env: Mapping[str, str], root: Path | None = None) -> str:
    """The ``PYTHONPATH`` of a child that must run the code this process runs.

    A child runs ``python -P`` (no working directory on its ``sys.path``, where a
    user's own ``models/`` folder would shadow or extend the plugin package).
    When this code is not in a site-packages folder (a checkout run with
    ``PYTHONPATH`` or from its folder) its root goes first, so the child does
    not import another copy installed in the environment.  The environment's
    own ``PYTHONPATH`` follows, since third-party plugin folders are found
    through it; its empty entries are dropped (each one means the working
    directory).
    """
    root = source_root() if root is None else root
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root.resolve() in site_dirs():
        return os.pathsep.join(entries)
    return os.pathsep.join([str(root), *(p for p in entries if Path(p).resolve() != root.resolve())])


def share_candidates(name: str, root: Path | None = None, prefix: str | None = None) -> list[Path]:
    """Where ``share/inference-service/<name>`` may be, in order: beside the code, then under ``sys.prefix``.

    Beside the code: each folder above the source root (``<base>/lib/pythonX.Y/site-packages`` -> ``<base>``).
    """
    root = source_root() if root is None else root
    found = [ancestor / SHARE / name for ancestor in root.resolve().parents]
    found.append(Path(sys.prefix if prefix is None else prefix) / SHARE / name)
    return list(dict.fromkeys(found))


def data_dir(name: str, required: Iterable[str], root: Path | None = None, prefix: str | None = None) -> Path | None:
    """The first folder ``name`` of a checkout (``<root>/<name>``) or of an installation that holds every file of
    ``required`` (paths relative to it); None when none does.

    A folder missing one of them is skipped: a partial copy would fail later, file by file.
    """
    root = source_root() if root is None else root
    needed = list(required)
    for candidate in [root / name, *share_candidates(name, root, prefix)]:
        if all((candidate / path).is_file() for path in needed):
            return candidate
    return None
