"""Whether a file another user could have written may be trusted: the rule of the compiled cache and the key file.

A file (or folder) is trusted when its owner is this process's user or root
and neither its group nor others may write it, as OpenSSH's ``StrictModes``
judges ``authorized_keys``: otherwise another local user could have put
there what the service then trusts (a compiled package it loads as code, an
API key the gateway accepts).  A symbolic link is judged by its own owner
and by its target's owner and mode (a link's own mode says nothing).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def untrusted(info: os.stat_result, uid: int | None = None) -> str | None:
    """Why a folder or file with ``info`` is not trusted: another owner than this user (``uid`` when given) or
    root, or others' or the group's write permission (a link's own mode says nothing); None when it is.

    ``uid`` judges for a process of another user: ``svcctl keys list`` run by root checks the key file as
    the gateway, which runs as the service's user, will (svc/cli/keyfile.py)."""
    if info.st_uid not in (os.getuid() if uid is None else uid, 0):
        return f"is owned by another user (uid {info.st_uid})"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022 and not stat.S_ISLNK(info.st_mode):
        return f"is writable by other users (mode {mode:o})"
    return None


def file_problem(path: Path | str, uid: int | None = None) -> str | None:
    """Why the file ``path`` must not be trusted by this user, or ``uid`` (:func:`untrusted` of the file, and
    of a link and its target); None when it may be, or is not there."""
    try:
        infos = [os.lstat(path)]
        if stat.S_ISLNK(infos[0].st_mode):
            infos.append(os.stat(path))
    except OSError:
        return None
    return next(filter(None, (untrusted(info, uid) for info in infos)), None)
