"""A real small file system for the tests of a full disk: a tmpfs mounted on a test's temporary folder.

Why not a faked ``OSError``: a full disk fails at whichever write comes
first (a copy, a conversion, the record), and the cache must come out of it
as it was; only a real file system shows which write that is.  Mounting
needs root, as CI runs the tests; elsewhere a test fails, saying so, rather
than skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

BLOCK = 4096


@contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted on ``path`` (created) for the duration."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.fail("this test mounts a small tmpfs to fill it, which needs root (CI runs the tests as root)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs on {path} (this test needs one): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def read_only(disk: Path) -> None:
    """Remount the tmpfs ``disk`` read-only (every write then fails with EROFS, root's too)."""
    done = subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True)
    assert done.returncode == 0, f"cannot remount {disk} read-only: {done.stderr.strip()}"


def blocks(*sizes: int) -> int:
    """The bytes that files of ``sizes`` bytes take on the disk (whole blocks)."""
    return sum(-(-size // BLOCK) * BLOCK for size in sizes)


def fill_leaving(disk: Path, free: int) -> None:
    """Write a filler file on ``disk`` so that exactly ``free`` bytes (whole blocks) stay free."""
    stats = os.statvfs(disk)
    available = stats.f_bavail * stats.f_frsize
    assert available >= free, f"{disk} has {available} bytes free, the test needs {free}"
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * (available - free))
    stats = os.statvfs(disk)
    assert stats.f_bavail * stats.f_frsize == free, (stats.f_bavail * stats.f_frsize, free)
