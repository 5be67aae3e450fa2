"""Copying a user's file (or folder) into the weights cache for an import, saying whose side failed.

Why not ``shutil.copyfile`` and ``copytree``: the first's ``OSError`` does
not say whether reading the user's file or writing the cache's copy failed
(a full or read-only cache read as "<your file>: No space left on device"),
and the second gathers its failures into one ``shutil.Error`` whose text is
a list of (source, copy, reason) tuples naming the cache's staging copy.
An import's message must be one line naming the user's file only when that
file is what failed, else the cache's path.  Every read here (a file, a
folder listed) is of the user's side and every write (and folder made) of
the cache's.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

CHUNK = 1 << 20
#: Why a file that is not a regular one (a FIFO, a socket, a device) is not copied: read, it blocks or never ends.
NOT_REGULAR = "not a regular file (a FIFO, a socket or a device)"


class CopyError(Exception):
    """A copy that failed: ``error`` at ``path``; ``cache`` is True when the cache's side failed."""

    def __init__(self, error: OSError, path: Path, *, cache: bool) -> None:
        super().__init__(f"{path}: {error.strerror or error}")
        self.error, self.path, self.cache = error, path, cache


def make_folder(path: Path) -> None:
    """Create the cache's folder ``path`` (and its parents); CopyError (the cache's) when it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CopyError(e, Path(e.filename or path), cache=True) from None


def copy_file(src: Path, dst: Path) -> None:
    """Copy the user's file ``src`` to the cache's new file ``dst`` (CopyError names the side that failed).

    Refused unless it is a regular file: a FIFO in an imported folder blocked the import for ever, waiting for a
    writer (a weights probe); a device would be read without end.  Opened without blocking all the same, so that
    a file swapped for a FIFO after the check reads as empty (and fails the import's checks) instead of hanging."""
    try:
        if not stat.S_ISREG(os.stat(src).st_mode):  # a socket's open failed "No such device or address"
            raise OSError(errno.EINVAL, NOT_REGULAR)
        reader = os.open(src, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise CopyError(e, src, cache=False) from None
    try:
        try:
            writer = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise CopyError(e, dst, cache=True) from None
        try:
            while True:
                try:
                    block = os.read(reader, CHUNK)
                except OSError as e:
                    raise CopyError(e, src, cache=False) from None
                if not block:
                    break
                view = memoryview(block)
                while view:
                    try:
                        view = view[os.write(writer, view):]
                    except OSError as e:
                        raise CopyError(e, dst, cache=True) from None
        finally:
            try:
                os.close(writer)
            except OSError as e:  # a file system that reports a failed write at close
                raise CopyError(e, dst, cache=True) from None
    finally:
        os.close(reader)


def user_files(root: Path) -> list[str]:
    """The relative paths of the files under the user's folder ``root``, hidden folders (``.git``, a
    downloader's ``.cache``) left out as a pull's record leaves them out, symlinks followed (a hub cache's
    snapshot links to its blobs), each folder once; CopyError (the user's) for a folder that cannot be listed."""

    def unreadable(error: OSError) -> None:
        raise CopyError(error, Path(error.filename or root), cache=False)

    found: list[str] = []
    seen: set[str] = set()
    for directory, dirs, files in os.walk(root, onerror=unreadable, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:  # a link back up the tree
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend((Path(directory) / name).relative_to(root).as_posix()
                     for name in sorted(files))
    return found


def copy_tree(root: Path, files: list[str], dst: Path) -> None:
    """Copy ``files`` (relative to the user's folder ``root``) into the cache's folder ``dst``."""
    for rel in files:
        make_folder((dst / rel).parent)
        copy_file(root / rel, dst / rel)
