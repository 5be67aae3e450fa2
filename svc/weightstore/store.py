"""Filling and checking the weights cache: pull, import, verify.

Why one module for the three: a pulled variant and an imported one must end
up byte-for-byte the same (the same file names, the same conversion, the
same ``record.json`` but for ``how``), and ``verify`` must check exactly what
those two recorded.  The rules they share:

* Checked before installed: a download or a copy goes into ``<name>.part``
  (a hub snapshot into ``hub.part/``) and is renamed into place only after
  its digest was checked, with ``record.json`` renamed last
  (``svc.weightstore.commit``: all or nothing, so a full disk at the end
  keeps the cached variant as it was).  A failed or cut pull leaves at most
  a ``.part``, which never looks complete and which the next pull resumes.
* A pull or an import is load-checked before it is recorded: the model is
  built on the download or copy (``svc.model.api.model_config`` and the
  factory's ``build``, as a model server does at start), so every tensor name
  and shape is checked against the architecture.  A refused one leaves
  nothing behind (its file, conversion and any folder it created are removed)
  and the rest of the cache as it was; its messages name the URL or the
  user's file.  Content that differs from a cached variant's record replaces
  it only with ``replace=True`` (``svcctl weights import --replace``).
* Which digest: the full SHA-256 a source publishes; else the torch.hub hash
  prefix of the file name (the SHA-256 must start with it, as torch.hub
  checks); else the digest recorded at the first pull of the same URL (printed
  then), which every later pull, import and verify must match.
* Re-pulling a cached variant whose files still match its record does
  nothing; one that no longer matches is fetched again, and its old record
  stays until the new files passed its check (a failed pull keeps the
  digests it pinned).
* ``verify`` (``svc.weightstore.check``) also reports stray files.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from svc.weightstore.cache import HUB_DIR, Record, RecordError, read_record, variant_dir
from svc.weightstore.catalog import FileSource, HubSource, Variant
from svc.weightstore.check import cached_records, in_words, load_problem, record_problems, stray_files, verify  # noqa: F401
from svc.weightstore.commit import cache_failure, cache_trouble, install
from svc.weightstore.copyin import NOT_REGULAR, CopyError, copy_file, copy_tree, make_folder, user_files
from svc.weightstore.fetch import FetchError, Progress, download, mirrored, sha256_file, without_credentials
from svc.weightstore.hub import folder_name, select_files

PART = ".part"
#: The folder a new file is converted (and an import load-checked) in before it is moved into place.
STAGE = "new" + PART


class StoreError(Exception):
    """A pull, import or verify that failed; ``str()`` is one line (the URL or file, and the cause)."""


class CacheFailure(StoreError):
    """The cache, not the file, failed (full, read-only): the line names the cache's path, not the URL or file."""


@dataclass(frozen=True)
class Stored:
    """What a pull or import did: the record now in the cache, and what to tell the user."""

    record: Record
    notes: tuple[str, ...] = ()
    fetched: bool = True  # False: it was already cached and verified


def source_text(variant: Variant) -> str:
    """The source as ``list`` shows it and a record keeps it: the URL, or hub ``repo_id@revision``."""
    source = variant.source
    return f"{source.repo_id}@{source.revision}" if isinstance(source, HubSource) else source.url


def check_digest(source: FileSource, digest: str, known: str | None, how: str = "pull") -> str | None:
    """Why ``digest`` (of the file ``source`` names) is wrong, or None when it is right (or first seen).

    ``known`` is the digest the first ``how`` (pull or import) of the variant recorded.
    """
    if source.sha256:
        if digest != source.sha256.lower():
            return f"sha256 mismatch: got {digest}, the source publishes {source.sha256}"
    elif source.hash_prefix:
        if digest[: len(source.hash_prefix)] != source.hash_prefix.lower():
            return f'invalid hash value (expected prefix "{source.hash_prefix}", got "{digest}")'
    elif known and digest != known:
        return f"sha256 mismatch: got {digest}, the first {how} recorded {known}"
    return None


def file_entry(path: Path, digest: str | None = None) -> dict[str, Any]:
    return {"sha256": digest or sha256_file(path), "size": path.stat().st_size}


def _tree_entries(root: Path, prefix: str) -> dict[str, dict[str, Any]]:
    """Digests of every file under ``root`` (hidden folders, such as a downloader's cache, left out)."""
    found: dict[str, dict[str, Any]] = {}
    if root.is_file():
        found[prefix] = file_entry(root)
        return found
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(directory) / name
            found[f"{prefix}/{path.relative_to(root).as_posix()}"] = file_entry(path)
    return found


def _readable_record(model_id: str, name: str, env: dict[str, str] | None) -> Record | None:
    """The record of a variant about to be (re)stored; an unreadable one counts as none (it is replaced)."""
    try:
        return read_record(model_id, name, env)
    except RecordError:
        return None


@contextmanager
def _locked(directory: Path, what: str) -> Iterator[None]:
    """Hold the variant's directory lock: two pulls or imports of one variant would mix their ``.part``.

    A pull or import that fails removes the variant's folder and its model's where they are empty,
    whoever made them (a cut download's ``.part``, kept to resume, keeps its folder; so does whatever
    another process put there): a resumed pull that fails its check leaves no empty folder behind.  So
    are the folders above them that it made (the cache's own, ``SERVICE_WEIGHTS_DIR``, at a first import).
    """
    made = [d for d in (directory, *directory.parents) if not d.exists()]  # the cache root too, the first time
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY)
    except OSError as e:  # the cache itself (SERVICE_WEIGHTS_DIR), not the user's file: one line that says so
        raise StoreError(cache_trouble(e, directory)) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"{what}: another pull or import of this variant is running ({directory})") from None
        yield
    except BaseException:
        for folder in sorted({directory, directory.parent, *made}, key=lambda d: len(d.parts), reverse=True):
            try:
                folder.rmdir()  # only when empty
            except OSError:
                pass
        raise
    finally:
        os.close(fd)


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _known(record: Record | None, variant: Variant, rel: str) -> str | None:
    """The digest an earlier pull of the same source recorded for ``rel``."""
    if record is None or record.source != source_text(variant):
        return None
    return record.files.get(rel, {}).get("sha256")


def _commit(stage: Path, entries: dict[str, Path], record: Record, old: Record | None,
            env: dict[str, str] | None) -> None:
    """Install the checked ``entries`` and ``record`` (``svc.weightstore.commit``); on a failure of the cache
    (a full disk, a read-only folder), one line naming the cache's path, and ``stage`` removed."""
    try:
        install(entries, record, old, env)
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise StoreError(f"{cache_trouble(e, stage.parent)} (nothing kept)") from None
    shutil.rmtree(stage, ignore_errors=True)  # a file install's emptied stage folder


def _install_file(factory: Any, variant: Variant, copy: Path, how: str, old: Record | None,
                  env: dict[str, str] | None, where: str, *, replace: bool = False) -> Stored:
    """Check the complete file ``copy`` (a download's ``.part`` or an import's copy), convert it in the stage
    folder and load-check it, move the result into place, write the record.

    ``where`` (the URL or the user's file) is what messages name; a refusal leaves nothing of it behind.
    """
    source = variant.source
    assert isinstance(source, FileSource)
    model_id = factory.catalog_id
    directory = variant_dir(model_id, variant.name, env)
    stage = directory / STAGE
    digest = sha256_file(copy)
    known = _known(old, variant, source.filename)
    problem = check_digest(source, digest, None if replace else known, old.how if old is not None else "pull")
    if problem:
        if copy.parent == stage:
            shutil.rmtree(stage)
        else:
            copy.unlink()
        if how == "import" and known and not source.sha256 and not source.hash_prefix:
            problem += ": pass --replace to replace the cached variant"
        raise StoreError(f"{where}: {problem} (nothing kept)")
    if copy.parent != stage:
        if stage.exists():
            shutil.rmtree(stage)
        stage.mkdir()
        os.replace(copy, stage / source.filename)
        copy = stage / source.filename
    staged = {str(copy): where}
    try:
        weights = source.filename
        if source.convert:
            try:
                weights = factory.convert(source.convert, str(copy), str(stage))
            except Exception as e:  # noqa: BLE001 - any converter failure is reported in one line
                failed = cache_failure(e)
                if failed is not None:  # the cache is full or read-only: not the file's fault
                    raise CacheFailure(f"{cache_trouble(failed, stage)} (nothing kept)") from None
                raise StoreError(f"converter {source.convert!r} failed: {in_words(e, staged)}") from None
            staged[str(stage / weights)] = where
        if copy.name != source.filename:
            os.replace(copy, stage / source.filename)
            staged[str(stage / source.filename)] = where
        problem = load_problem(factory, variant, stage / weights, staged)
        if problem:
            raise StoreError(problem)
    except StoreError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise e if isinstance(e, CacheFailure) else StoreError(f"{where}: {e} (nothing kept)") from None
    notes = []
    if not source.sha256 and not source.hash_prefix and (replace or not known):
        notes.append(f"{model_id} {variant.name}: {source.url} publishes no checksum: recorded sha256 {digest} "
                     "(later pulls, imports and verify check against it)")
    files = {source.filename: file_entry(stage / source.filename, digest)}
    if weights != source.filename:
        files.update(_tree_entries(stage / weights, weights))
    record = Record(model=model_id, variant=variant.name, source=source.url, weights=weights, files=files,
                    pulled_at=_now(), how=how)
    _commit(stage, {entry.name: entry for entry in stage.iterdir()}, record, old, env)
    return Stored(record, tuple(notes))


def _install_tree(factory: Any, variant: Variant, stage: Path, how: str, old: Record | None,
                  env: dict[str, str] | None, where: str, loads: str = ".", *, replace: bool = False) -> Stored:
    """Check a complete hub snapshot in ``stage`` against an earlier record and load-check it, move it
    into place, record it.  A refusal removes ``stage``.

    ``loads`` is the folder ``build`` loads, relative to the snapshot (the hub
    fetcher puts the repository in a folder named after it, so that the name
    shows in a version computed from the folder).  Without ``replace``, files
    that differ from an earlier record of the same source are refused, and so
    is, for an import, a different set of files.
    """
    model_id = factory.catalog_id
    files = _tree_entries(stage, HUB_DIR)
    try:
        if not files:
            raise StoreError(f"{where}: no files")
        notes = []
        weights = HUB_DIR if loads in ("", ".") else f"{HUB_DIR}/{loads}"
        if old is not None and old.source == source_text(variant) and not replace:
            mine, theirs = _inside(files, weights), _inside(old.files, old.weights)
            for rel, entry in sorted(theirs.items()):
                if rel in mine and mine[rel]["sha256"] != entry.get("sha256"):
                    raise StoreError(f"{where}: {rel}: sha256 mismatch: got {mine[rel]['sha256']}, the first "
                                     f"{old.how} recorded {entry.get('sha256')}: pass --replace to replace the "
                                     "cached variant")
            if how == "import" and set(mine) != set(theirs):
                differ = sorted(set(mine) ^ set(theirs))
                raise StoreError(f"{where}: other files than the cached {model_id} {variant.name} "
                                 f"({len(differ)} differ, first {differ[0]}): pass --replace to replace it")
        else:
            notes.append(f"{model_id} {variant.name}: {source_text(variant)}: recorded the sha256 of {len(files)} "
                         "files (later pulls, imports and verify check against them)")
        loaded = stage if loads in ("", ".") else stage / loads
        problem = load_problem(factory, variant, loaded, {str(loaded): where, str(stage): where})
        if problem:
            raise StoreError(problem)
    except StoreError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise StoreError(f"{e} (nothing kept)" if str(e).startswith(where) else f"{where}: {e} (nothing kept)") \
            from None
    record = Record(model=model_id, variant=variant.name, source=source_text(variant), weights=weights,
                    files=files, pulled_at=_now(), how=how)
    _commit(stage, {HUB_DIR: stage}, record, old, env)
    return Stored(record, tuple(notes))


def _inside(files: Mapping[str, Any], weights: str) -> dict[str, Any]:
    """A hub record's ``files`` by their path in the repository (inside ``weights``), so that a pull's record
    (``hub/<repo>/...``) and one of an import made before imports were stored so (``hub/...``) compare."""
    prefix = weights.rstrip("/") + "/"
    return {rel[len(prefix):] if rel.startswith(prefix) else rel: entry for rel, entry in files.items()}


def already(model_id: str, variant: Variant, env: dict[str, str] | None) -> tuple[Record | None, bool]:
    """The existing record, and whether it is of this source and all its files match (every file is read)."""
    old = _readable_record(model_id, variant.name, env)
    if old is None:
        return None, False
    return old, old.source == source_text(variant) and not record_problems(old, env)


def pull(factory: Any, variant: Variant, *, env: Mapping[str, str] | None = None,
         progress_stream: IO[str] | None = None) -> Stored:
    """Make ``variant`` of ``factory`` cached and verified, downloading what is missing.

    The download is load-checked (the model built on it) before it is recorded.  Raises
    :class:`StoreError` (one line naming the URL and the cause); a cut download keeps its ``.part``
    for the next pull, a refused one leaves nothing.
    """
    env = dict(os.environ if env is None else env)
    with _locked(variant_dir(factory.catalog_id, variant.name, env), source_text(variant)):
        return _pull(factory, variant, env, progress_stream)


def _pull(factory: Any, variant: Variant, env: dict[str, str], progress_stream: IO[str] | None) -> Stored:
    model_id = factory.catalog_id
    old, ok = already(model_id, variant, env)
    if ok:
        assert old is not None  # ok: it is there and matches
        return Stored(old, fetched=False)
    # The old record stays until new files pass its check: a failed pull keeps the sha256 it recorded.
    directory = variant_dir(model_id, variant.name, env)
    progress = Progress(f"{model_id} {variant.name}", progress_stream)
    source = variant.source
    if isinstance(source, HubSource):
        from svc.weightstore.hub import fetch_hub

        stage = directory / (HUB_DIR + PART)
        try:
            loads = fetch_hub(variant, stage, progress)  # the folder build loads, relative to the snapshot
        except Exception as e:  # noqa: BLE001 - one line per failure, whatever the hub client raised
            raise StoreError(f"{source_text(variant)}: {type(e).__name__}: {e}") from None
        return _install_tree(factory, variant, stage, "pull", old, env, source_text(variant), loads=loads)
    part = directory / (source.filename + PART)
    try:
        download(source.url, part, progress, env=env)
    except FetchError as e:
        raise StoreError(str(e)) from None
    return _install_file(factory, variant, part, "pull", old, env, without_credentials(mirrored(source.url, env)))


def import_path(factory: Any, variant: Variant, path: str, *, env: Mapping[str, str] | None = None,
                replace: bool = False) -> Stored:
    """Store a file (or, for a hub variant, a folder) a user copied in, exactly as a pull would.

    The copy is checked like a download (published digest, hash prefix or
    the digest of an earlier pull; ``replace`` lets content other than the
    cached record's replace it), converted, and load-checked (the model is
    built on it) before it is moved into place; ``how`` is ``import`` in the
    record.  A refusal leaves nothing behind: the copy and any folder the
    import created are removed, the cached variant stays as it was.
    """
    env = dict(os.environ if env is None else env)
    given = Path(path).expanduser()
    if not given.exists():
        raise StoreError(f"{given}: no such file or directory")
    directory = variant_dir(factory.catalog_id, variant.name, env)
    with _locked(directory, str(given)):
        try:
            return _import(factory, variant, given, env, replace)
        except BaseException:  # a copy cut short (disk full, Ctrl-C) leaves nothing either
            shutil.rmtree(directory / STAGE, ignore_errors=True)
            raise


def _import(factory: Any, variant: Variant, given: Path, env: dict[str, str], replace: bool) -> Stored:
    model_id = factory.catalog_id
    source = variant.source
    old = _readable_record(model_id, variant.name, env)
    directory = variant_dir(model_id, variant.name, env)
    stage = directory / STAGE
    if isinstance(source, HubSource) and not given.is_dir():
        raise StoreError(f"{given}: {model_id} {variant.name} is a hub repository ({source_text(variant)}): "
                         "import its folder, not a file")
    if not isinstance(source, HubSource) and given.is_dir():
        raise StoreError(f"{given}: {model_id} {variant.name} is one file ({source.filename}), not a folder")
    if not isinstance(source, HubSource) and not given.is_file():
        raise StoreError(f"{given}: {NOT_REGULAR}")
    copy = stage / given.name  # the user's name: a converter that checks a file name sees theirs
    try:
        shutil.rmtree(stage, ignore_errors=True)  # a killed import's (what stays fails the copy, named)
        make_folder(stage)
        if isinstance(source, HubSource):  # the files a pull fetches, where it puts them
            chosen = sorted(select_files(dict.fromkeys(user_files(given)), source.allow_patterns))
            if not chosen:
                raise StoreError(f"{given}: no file matches {', '.join(source.allow_patterns)} (what a pull of "
                                 f"{source_text(variant)} fetches) (nothing kept)")
            copy_tree(given, chosen, stage / folder_name(source))
        else:
            copy_file(given, copy)
    except CopyError as e:  # a failed read names the user's file; a failed write or folder, the cache's path
        if e.cache:
            raise CacheFailure(f"{cache_trouble(e.error, e.path)} (nothing kept)") from None
        raise StoreError(f"{e.path}: {e.error.strerror or e.error} (nothing kept)") from None
    if isinstance(source, HubSource):
        return _install_tree(factory, variant, stage, "import", old, env, str(given), folder_name(source),
                             replace=replace)
    return _install_file(factory, variant, copy, "import", old, env, str(given), replace=replace)


