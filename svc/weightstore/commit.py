"""Installing checked files into a variant's folder, all or nothing.

Why a step of its own: a pull or an import that passed every check can
still fail while it changes the cache (a full disk when the record is
written, a folder that became read-only), and such a failure must leave the
cache as it was before the command: the cached variant's files and record
intact, nothing new.  So the new ``record.json`` is written first, under a
temporary name (the one write here that needs space); the entries it
replaces, the old record among them, are then renamed aside into
``old.part/`` and the new ones renamed in; the record's rename comes last.
Renames within one file system need no space; if one fails anyway, what was
renamed is renamed back.  A process killed midway leaves no record (the
variant is not cached, as before this module) and an ``old.part/``, which
``verify`` does not call stray and the next install removes.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from svc.weightstore.cache import RECORD_NAME, Record, stage_record, variant_dir

#: Where the entries an install replaces wait until the new record is in place.
ASIDE = "old.part"
#: Errors that say the cache cannot take more (not that a user's file is bad).
_CACHE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def cache_trouble(error: OSError, where: Path | str) -> str:
    """One line saying that the weights cache failed, naming the path (``where`` when the error names none)."""
    return f"the weights cache cannot hold it: {error.filename or where}: {error.strerror or error}"


def cache_failure(error: BaseException) -> OSError | None:
    """``error`` as an ``OSError`` when it says the cache is full or read-only, else None.

    A converter may wrap the ``OSError`` (safetensors says ``... (os error 28)``), so its text is read too.
    """
    if isinstance(error, OSError) and error.errno in _CACHE_ERRNOS:
        return error
    found = re.search(r"\(os error (\d+)\)", str(error))
    number = int(found.group(1)) if found else None
    return OSError(number, os.strerror(number)) if number in _CACHE_ERRNOS else None


def _named(error: OSError, path: Path) -> OSError:
    return error if error.filename else OSError(error.errno, error.strerror or str(error), str(path))


def install(entries: Mapping[str, Path], record: Record, old: Record | None, env: dict[str, str] | None) -> None:
    """Put ``entries`` (name in the variant's folder -> the checked file or folder to rename there) and
    ``record`` in place of the old ones, and drop what ``old`` listed that ``record`` does not.

    All or nothing: on an ``OSError`` the folder is as it was (the entries stay where they were, the
    temporary record is removed) and the error is raised, naming the path that failed.
    """
    directory = variant_dir(record.model, record.variant, env)
    aside = directory / ASIDE
    if aside.exists():  # a killed install's
        shutil.rmtree(aside)
    tmp = stage_record(record, env)
    replaced = {RECORD_NAME, *entries, *(rel.split("/", 1)[0] for rel in (old.files if old is not None else ()))}
    moved: list[str] = []
    placed: list[str] = []
    path = aside
    try:
        aside.mkdir()
        for name in sorted(replaced):
            path = directory / name
            if path.exists() or path.is_symlink():
                os.replace(path, aside / name)
                moved.append(name)
        for name, source in sorted(entries.items()):
            path = directory / name
            os.replace(source, path)
            placed.append(name)
        path = directory / RECORD_NAME
        os.replace(tmp, path)
    except OSError as e:
        for name in reversed(placed):
            _quietly(os.replace, directory / name, entries[name])
        for name in reversed(moved):
            _quietly(os.replace, aside / name, directory / name)
        _quietly(os.unlink, tmp)
        _quietly(os.rmdir, aside)
        raise _named(e, path) from None
    shutil.rmtree(aside, ignore_errors=True)


def _quietly(step: Callable[..., object], *paths: Path) -> None:
    """A step of putting things back: it does what it can, the first error is what gets reported."""
    try:
        step(*paths)
    except OSError:
        pass
