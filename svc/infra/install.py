"""Where this copy of the service lives: its source root, and the data files installed beside it.

A checkout holds the code (``svc/``, ``models/``, ``twisted/plugins/``) and its
data (``ui/``, ``conf/``) in one folder.  An installed package (a wheel: a
virtual environment, ``pip install --user``, Debian's system pip under
``/usr/local``) puts the code in a site-packages folder and the data under
``<base>/share/inference-service/`` (setup.py ``data_files``), where ``<base>``
is that site-packages folder's ``<base>/lib/pythonX.Y/site-packages``, and not
always ``sys.prefix``: a ``--user`` install's base is ``site.USER_BASE``, and
Debian's pip installs under ``/usr/local`` while ``sys.prefix`` is ``/usr``;
``pip install --target DIR`` puts both in ``DIR`` (``DIR/svc``, ``DIR/share``).
An installed copy carries a ``VERSION`` file (setup.py's ``install_data``): one
of another version (an older install under ``sys.prefix``, say) is passed over
with one line, never served as this version's UI or default configuration.

The supervisor's children must import exactly the code the supervisor runs
(:func:`child_pythonpath`); the supervisor's web UI and the quick start's
default configs are found by :func:`data_dir`.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

#: The folder under ``<base>/share`` that setup.py's ``data_files`` install into.
SHARE = Path("share") / "inference-service"
#: The file in ``share/inference-service`` naming the version that installed it (setup.py's ``install_data``).
VERSION_FILE = "VERSION"


def source_root() -> Path:
    """The folder that holds this ``svc`` package: a checkout, or a site-packages folder."""
    return Path(__file__).resolve().parents[2]


def drop_working_directory(path: list[str] | None = None) -> None:
    """Take the working directory off the front of ``path`` (``sys.path``), where ``python -m`` put it, unless it
    is the folder that holds this code (a checkout run from its root).

    ``models`` takes in every ``models/`` folder on the path as a plugin folder (``twisted.plugin``): a user's own
    ``models/`` in the working directory was imported by ``python -m svc.cli`` as model plugins.  The servers run
    with ``python -P`` for the same reason; the ``svcctl`` script has its own folder there, not the working one.
    """
    path = sys.path if path is None else path
    if (not sys.flags.safe_path and path and os.path.realpath(path[0] or os.curdir) == os.path.realpath(os.curdir)
            and Path(os.curdir).resolve() != source_root()):
        del path[0]


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

    Beside the code: the source root itself (``pip install --target DIR``: ``DIR/svc`` and ``DIR/share``), then
    each folder above it (``<base>/lib/pythonX.Y/site-packages`` -> ``<base>``).
    """
    root = source_root() if root is None else root
    found = [folder / SHARE / name for folder in (root.resolve(), *root.resolve().parents)]
    found.append(Path(sys.prefix if prefix is None else prefix) / SHARE / name)
    return list(dict.fromkeys(found))


def installed_version(share: Path) -> str | None:
    """The version that installed ``share`` (``share/inference-service``): its ``VERSION`` file, None without one."""
    try:
        return (share / VERSION_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def data_dir(name: str, required: Iterable[str], root: Path | None = None, prefix: str | None = None,
             warn: Callable[[str], None] | None = None) -> Path | None:
    """The first folder ``name`` of a checkout (``<root>/<name>``) or of an installation that holds every file of
    ``required`` (paths relative to it); None when none does.

    A folder missing one of them is skipped: a partial copy would fail later, file by file.  So is an installed
    copy of another version (or of none: installed before its ``VERSION`` file was), with one line to ``warn``
    (default: standard error): 0.13.0's UI and configuration were served by a 0.16.0 supervisor without a word.
    """
    from svc import __version__

    root = source_root() if root is None else root
    needed = list(required)
    for candidate in [root / name, *share_candidates(name, root, prefix)]:
        if not all((candidate / path).is_file() for path in needed):
            continue
        if candidate != root / name and (version := installed_version(candidate.parent)) != __version__:
            said = f"version {version}" if version else f"an unknown version (no {VERSION_FILE} file)"
            (warn or _stderr)(f"inference-service {__version__}: passing over {candidate}, installed by {said}; "
                              "reinstall the service to replace it")
            continue
        return candidate
    return None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
