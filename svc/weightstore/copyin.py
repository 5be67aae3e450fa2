"""Copying a user's file (or folder) into the weights cache for an import, saying whose side failed.

Why not ``shutil.copyfile``: its ``OSError`` does not say whether reading
the user's file or writing the cache's copy failed (a full or read-only
cache read as "<your file>: No space left on device"), and an import's
message must name the user's file only when that file is what failed, else
the cache's path.  Every read here is of the user's side and every write
(and folder made) of the cache's.
"""

from __future__ import annotations

import os
from pathlib import Path

CHUNK = 1 << 20


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
    """Copy the user's file ``src`` to the cache's new file ``dst`` (CopyError names the side that failed)."""
    try:
        reader = os.open(src, os.O_RDONLY)
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
