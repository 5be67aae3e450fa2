"""The quick start's folder and its configuration: the folder checked, the installed defaults copied into it.

Split from ``svc.cli.quickstart`` (which imports these names).  An installed package has no checkout to run in: in
a folder without ``conf/`` the installed default configuration (``share/inference-service/conf``,
``svc.infra.install.data_dir``: a checkout's own ``conf/`` when this code runs from one) is copied there first,
with one line saying so.  A ``conf/`` without ``service.toml`` (one that holds only the key file an earlier
``svcctl keys add`` made) gets the default files it lacks, none of its own replaced: it failed later with
"conf/profiles/cpu.toml does not exist".  A ``conf/`` with its ``service.toml`` is a configuration, whatever it
left out (the catalog's models a user removed), and is never completed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

#: What setup.py installs as ``share/inference-service/conf`` (the folders' ``*.toml`` files), and what a copy of
#: the defaults takes: never ``conf/api_keys.toml``, a checkout's own keys.
DEFAULT_CONF = ("service.toml", "api_keys.example.toml", "profiles/*.toml", "server/*.toml")
#: Without these, a folder is no set of defaults, and a ``conf/`` no configuration to run.
REQUIRED_CONF = ("service.toml", "profiles/cpu.toml", "profiles/gpu.toml")


def default_conf() -> Path | None:
    """The default configuration to copy: the checkout's ``conf/`` or the installed one; None when there is none."""
    from svc.infra.install import data_dir

    return data_dir("conf", REQUIRED_CONF)


def copy_defaults(source: Path, target: str) -> list[str]:
    """Copy the default files of ``source`` that ``target`` lacks (none of its own replaced): their relative paths."""
    from glob import escape, glob

    copied = []
    for pattern in DEFAULT_CONF:
        for path in sorted(glob(os.path.join(escape(str(source)), pattern))):
            name = os.path.relpath(path, source)
            dest = os.path.join(target, name)
            if not os.path.lexists(dest):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(path, dest)
                copied.append(name)
    return copied


def copy_default_conf(root: str, out: Any = None) -> bool:
    """Copy the installed default configuration into ``<root>/conf`` (a folder without one): True when done; False
    when there is none, or ``root`` is no folder: nothing is made."""
    source = default_conf()
    if source is None or not os.path.isdir(root):
        return False
    copy_defaults(source, os.path.join(root, "conf"))
    print(f"quickstart: no conf/ folder in {os.path.abspath(root)}: copied the default configuration from {source}",
          file=out or sys.stdout, flush=True)
    return True


def conf_problem(root: str, out: Any = None) -> str | None:
    """Why the quick start cannot run in ``root`` (one line; None when it can), once the defaults its ``conf/``
    lacked are copied there (one line to ``out`` saying so)."""
    where = os.path.abspath(root)
    if not os.path.lexists(root):  # it said "not a checkout of the service (no conf/ folder) ... or give --root"
        return f"{where} does not exist: make the folder first, or give --root an existing one"
    if not os.path.isdir(root):
        return f"{where} is not a folder: give --root a folder"
    conf = os.path.join(where, "conf")
    if not os.path.isdir(conf):
        if copy_default_conf(root, out):
            return None
        return (f"{where} has no conf/ folder, and no installed default configuration of this version was found to "
                "copy there: run it in a checkout of the service (or give --root one), or reinstall the service")
    missing = [name for name in REQUIRED_CONF if not os.path.isfile(os.path.join(conf, name))]
    if "service.toml" not in missing:  # a configuration, if a partial one (a profile or a model left out on
        return None  # purpose): never completed, its own read names what it lacks

    source = default_conf()
    if source is None:
        return (f"{conf} lacks {', '.join(missing)}, and no installed default configuration was found to copy them "
                "from: copy them from the service's conf/ (a checkout's), or reinstall the service")
    copied = copy_defaults(source, conf)
    print(f"quickstart: {conf} lacked {', '.join(missing)}: copied the {len(copied)} default files it did not have "
          f"from {source}, none of its own replaced", file=out or sys.stdout, flush=True)
    return None
