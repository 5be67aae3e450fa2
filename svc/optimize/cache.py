"""Where compiled artefacts live: the service's state directory and the inductor cache under it.

``$SERVICE_STATE_DIR``, default ``$XDG_STATE_HOME/inference-service``, else
``~/.local/state/inference-service``: what the service writes for itself and
keeps across restarts (unlike the weights cache, ``$SERVICE_WEIGHTS_DIR``,
nothing in it is downloaded).  ``compile`` keeps its compiled packages in
``<state>/compiled`` (:mod:`svc.optimize.aot`), so a restart loads what the
first start compiled, and inductor its kernel cache in ``<state>/inductor``
(``TORCHINDUCTOR_CACHE_DIR``; one already in the environment is kept).

Every file of the cache is written whole or not at all (:func:`write_atomically`): two replicas of a model
may convert the same key at once, and a full disk must not leave a cut file that looks cached.  Each artefact's
``.json`` holds the SHA-256 of its files (:func:`file_digests`): an artefact that is there but is not what was
made (cut short, overwritten, bit rot) is made again, never served unchecked (``svc.optimize.runtimes``,
``svc.optimize.aot``) -- it passed the accuracy gate as it was made, and ``auto``'s recorded choice is
applied without gating again.

Nothing is read from a folder another user can change, nor from a file another user made
(:func:`trust_problem`, :func:`file_problem`), and this user's folders lose others' write permission before
anything is read from them: a model server loads the packages as code, and applies a recorded mode without its
gate.  An untrusted folder is replaced by a private one for the process (:func:`usable_dir`).

Torch-free; :func:`use_inductor_cache` must run before torch compiles
anything (``svc.model.torchenv.configure_compile_cache`` calls it at startup).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import TypeVar

from svc.infra.process import pid_running
from svc.infra.trust import file_problem, untrusted
from svc.infra.userdirs import configured_dir

T = TypeVar("T")

STATE_DIR_ENV = "SERVICE_STATE_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: The model this process makes artefacts for (a model server serves one; set by ``svc.optimize.select``): its
#: records say so, for ``svcctl cache list`` (artefact names say only the target, ``net-openvino-...``).  Not part
#: of any key: two models of the same network and weights share an artefact, named for the one that made it.
MADE_FOR = ""
#: What of this process's model decides its targets besides their weights, buffers and code: a digest of its
#: ``[model]`` table (set by ``svc.optimize.select`` for its run; part of every artefact's key, aot.package_key).
#: A plugin may keep a config value as a plain attribute that its forward reads: a restart with another value
#: read the artefact converted with the old one, and served its results (a plugin author's probe).
KEY_CONTEXT = ""


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """The service's state directory (not created here)."""
    return configured_dir(STATE_DIR_ENV, "state", env)


def inductor_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where inductor caches compiled graphs and kernels: ``TORCHINDUCTOR_CACHE_DIR``, else ``<state>/inductor``."""
    env = os.environ if env is None else env
    if env.get(INDUCTOR_CACHE_ENV):
        return Path(env[INDUCTOR_CACHE_ENV]).expanduser()
    return state_dir(env) / "inductor"


class UntrustedCache(OSError):
    """A folder of the state directory that another user can change (:func:`trust_problem`): nothing is read
    from it or written to it."""


def make_private_dirs(path: Path, env: Mapping[str, str] | None = None) -> Path:
    """``path`` and the folders above it that are missing, each made mode 0700 whatever the umask.

    The state directory holds code the model servers load (compiled packages,
    inductor's kernels): under ``umask 000`` its folders were 0777, and any
    local user could replace a package.  A folder that exists keeps its mode,
    but for the write permission of others on those of the state directory
    that this user owns (:func:`trust_problem`): an install of 0.12.0 or
    earlier made under such a umask kept them.  Raises :class:`UntrustedCache`,
    before making anything, when another user can change a folder on the way.
    """
    problem = trust_problem(path, env)
    if problem is not None:
        raise UntrustedCache(problem)
    missing = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask, which may take more
    return path


#: The folders and files of the cache this process has warned about: one warning each, however often read.
_WARNED: set[str] = set()
_lock = threading.Lock()  # guards _WARNED and _scratch


def trust_problem(path: Path, env: Mapping[str, str] | None = None) -> str | None:
    """Why nothing may be read from the cache folder ``path`` or written to it; None when both may be.

    Checked before anything is read (a recorded choice is applied without its
    gate, and a package is code): each folder from the state directory down
    to ``path`` that exists (``path`` alone when it lies elsewhere).  One of
    this user's loses the group's and others' write permission, with one
    warning (:func:`_no_write_by_others`); one owned by another user but
    root, or writable by others and not this user's, makes all below it
    untrusted, with one warning: its owner or any local user could swap what
    a model server loads, with files whose records match.  A few ``stat``
    calls per start.
    """
    root = state_dir(env)
    chain = [folder for folder in (path, *path.parents) if folder == root or root in folder.parents] or [path]
    for folder in reversed(chain):
        try:
            info = folder.stat()
        except OSError:
            continue  # not there (yet): nothing in it to read
        if info.st_uid == os.getuid():
            _no_write_by_others(folder, info)
            continue
        problem = untrusted(info)
        if problem is not None:
            problem = f"{folder} {problem}"
            _warn_once(str(folder), "{problem}: another user could replace what the model servers load from it, "
                       "so nothing is read from it or written to it (converted and compiled in a private "
                       "temporary folder at each start, no choice recorded)", problem=problem)
            return problem
    return None


def _warn_once(what: str, text: str, **fields: object) -> None:
    with _lock:
        if what in _WARNED:
            return
        _WARNED.add(what)
    from twisted.logger import Logger

    Logger().warn(text, **fields)


def _no_write_by_others(folder: Path, info: os.stat_result) -> None:
    """Take the group's and others' write permission off ``folder``, which this user owns (one warning line)."""
    from twisted.logger import Logger

    mode = info.st_mode & 0o7777
    if not mode & 0o022:
        return
    try:
        os.chmod(folder, mode & ~0o022)
    except OSError:
        return  # gone, or a read-only file system: the load that needs it says so
    Logger().warn("{folder} was writable by other users (mode {old:o}), and it holds code the model servers load: "
                  "made mode {new:o}", folder=str(folder), old=mode, new=mode & ~0o022)


#: This process's private folders for what an untrusted cache folder would hold (:func:`usable_dir`):
#: ``svc-untrusted-<pid>-XXXXXXXX`` in the temporary folder.
SCRATCH_PREFIX = "svc-untrusted-"
_scratch: Path | None = None


def usable_dir(directory: Path, env: Mapping[str, str] | None = None) -> Path:
    """``directory`` when it may be read and written (:func:`trust_problem`), else a folder of the same name in
    this process's private scratch folder: what is converted or compiled there serves this process only."""
    if trust_problem(directory, env) is None:
        return directory
    return scratch_dir() / directory.name


def scratch_dir() -> Path:
    """This process's private folder (0700) in the temporary folder, made once, removed when the process exits;
    those of processes that no longer run (killed) are removed first."""
    global _scratch
    with _lock:
        if _scratch is None:
            sweep_dead_folders(SCRATCH_PREFIX)
            _scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
            atexit.register(shutil.rmtree, _scratch, True)
        return _scratch


def sweep_dead_folders(prefix: str) -> None:
    """Remove the folders ``<prefix><pid>-*`` of the temporary folder whose process no longer runs."""
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = folder.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not pid_running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def use_inductor_cache(env: MutableMapping[str, str] | None = None) -> Path | None:
    """Point inductor at :func:`inductor_cache_dir` (sets the variable in ``env``); the directory, or None when
    it cannot be made (a read-only state directory): torch then keeps its own default under the temporary
    directory, since importing torchvision makes inductor's directory and would fail the load, eager included.
    One that another user can change (:func:`trust_problem`) is replaced by this process's private folder."""
    env = os.environ if env is None else env
    if env.get(INDUCTOR_CACHE_ENV):
        return inductor_cache_dir(env)
    path = inductor_cache_dir(env)
    try:
        make_private_dirs(path, env)
    except UntrustedCache:
        path = make_private_dirs(scratch_dir() / path.name)  # not another user's kernels (trust_problem warned)
    except OSError:
        return None
    env[INDUCTOR_CACHE_ENV] = str(path)
    return path


def compiled_dir(env: dict[str, str] | None = None) -> Path:
    """Where ``compile`` keeps its packages (``svc.optimize.aot``): ``<state>/compiled``."""
    return state_dir(env) / "compiled"


#: A temporary file of the cache: ``.<what>-<pid>-XXXXXXXX<suffix>`` (:func:`temporary_file`); earlier versions
#: named no pid.
_TEMPORARY = re.compile(r"^\.(building|writing|converting|exporting)-(?:(\d+)-)?")
#: A temporary file that names no pid is a leftover once it is this old (no build takes an hour).
UNNAMED_LEFTOVER_S = 3600.0


def is_temporary(name: str) -> bool:
    """Whether a file of the cache named ``name`` is a temporary one (:func:`temporary_file`), not an artefact."""
    return _TEMPORARY.match(name) is not None


def temporary_file(path: Path, what: str, suffix: str) -> str:
    """A new empty file (0600) beside ``path`` to make it in, named by this process's pid.

    A process killed while it made an artefact (a restart or a stop during
    a model's first ``compile``) left its temporary file for good; each new
    one first removes those of processes that no longer run
    (:func:`sweep_leftovers`).
    """
    sweep_leftovers(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{what}-{os.getpid()}-", suffix=suffix)
    os.close(fd)
    return tmp


def sweep_leftovers(directory: Path) -> None:
    """Remove the temporary files in ``directory`` that a process which no longer runs left."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        found = _TEMPORARY.match(entry.name)
        if found is None:
            continue
        try:
            if (not pid_running(int(found.group(2))) if found.group(2)
                    else time.time() - entry.stat().st_mtime > UNNAMED_LEFTOVER_S):
                os.unlink(entry.path)
        except OSError:
            pass  # gone meanwhile, or not ours to remove


def write_atomically(path: Path, text: str) -> None:
    """``path`` complete or absent, never cut short: written beside it under a temporary name, then renamed."""
    tmp = temporary_file(path, "writing", path.suffix)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def file_digests(paths: list[Path]) -> dict[str, str]:
    """The SHA-256 of each file, by name: written beside a cached artefact when it is made, checked when it is
    read, so that a file changed since (overwritten, bit rot) is made again instead of served unchecked."""
    found = {}
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        found[path.name] = digest.hexdigest()
    return found


def check_digests(record: dict, paths: list[Path]) -> None:
    """Raise ValueError unless ``paths`` are the files ``record`` (the artefact's ``.json``) was written with."""
    if record.get("sha256") != file_digests(paths):
        raise ValueError("not the files that were made (their SHA-256 differs from the record)")


def read_cached(meta: Path, files: list[Path], load: Callable[[dict], T], stats: Counter | None = None) -> T | None:
    """``load(record)`` of an artefact whose ``.json`` (``meta``) and ``files`` are in the cache and match; None
    when they are not there, or are there but cannot be used (cut short, overwritten: counted in ``stats`` as
    ``unusable``, and the ``.json`` removed, so that the artefact never looks cached while it is made again)."""
    if trust_problem(meta.parent) is not None:
        return None  # not to be read, nor changed: the caller makes it elsewhere (usable_dir)
    if meta.is_file() and all(f.is_file() for f in files) and not _untrusted_files([meta, *files], stats):
        try:
            record = json.loads(meta.read_text())
            check_digests(record, files)
            found = load(record)
            if stats is not None:
                stats["loaded"] += 1
            _mark_used(meta)
            return found
        except MemoryError:
            raise
        except Exception:  # noqa: BLE001 - made again by the caller, not failed on every start
            if stats is not None:
                stats["unusable"] += 1  # the optimisation line says so (svc.optimize.report.describe_cache)
    meta.unlink(missing_ok=True)
    return None


def _untrusted_files(paths: list[Path], stats: Counter | None) -> bool:
    """Whether a file of an artefact is not trusted (:func:`file_problem`; one warning, counted ``unusable``):
    another user may have made it while its folder was open to others, with a record that matches."""
    for path in paths:
        problem = file_problem(path)
        if problem is not None:
            _warn_once(str(path), "{path} {problem}: not read, made again", path=str(path), problem=problem)
            if stats is not None:
                stats["unusable"] += 1
            return True
    return False


def _mark_used(meta: Path) -> None:
    """Set the record's modification time to now: the time a start last used its artefact, which ``svcctl cache
    prune`` goes by (:mod:`svc.optimize.prune`); a read-only cache keeps the time it was made."""
    try:
        os.utime(meta)
    except OSError:
        pass


def write_record(meta: Path, files: list[Path], fields: dict) -> None:
    """The ``.json`` of an artefact just made: ``fields``, the model it was made for and its files' digests,
    written last and whole."""
    made_for = {"made_for": MADE_FOR} if MADE_FOR else {}
    write_atomically(meta, json.dumps({**fields, **made_for, "sha256": file_digests(files)}))
