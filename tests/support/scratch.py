"""Folders for the logs of the processes a test run starts, removed when the run ends.

Every model server, gateway, supervisor and redis-server a test starts writes
its output to a file that the test reads while it runs (and quotes when it
fails).  Each test process keeps those files under one root of its own,
removed at its exit, so that a suite run leaves nothing in ``/tmp``: before,
each run left about 300 ``svc-test-*`` folders behind.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

_root: Path | None = None


def scratch_dir(prefix: str) -> Path:
    """A new folder under this process's root (made at the first call and removed at exit)."""
    global _root
    if _root is None or not _root.is_dir():
        _root = Path(tempfile.mkdtemp(prefix=f"svc-test-run-{os.getpid()}-"))
        atexit.register(shutil.rmtree, _root, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_root))
