"""Filling and checking the weights cache: pull, import, verify.

Why one module for the three: a pulled variant and an imported one must end
up byte-for-byte the same (the same file names, the same conversion, the
same ``record.json`` but for ``how``), and ``verify`` must check exactly what
those two recorded.  The rules they share:

* Checked before installed: a download or a copy goes into ``<name>.part``
  (a hub snapshot into ``hub.part/``) and is renamed into place only after
  its digest was checked; ``record.json`` is written last.  A failed or cut
  pull leaves at most a ``.part``, which never looks complete and which the
  next pull resumes.
* Which digest: the full SHA-256 a source publishes; else the torch.hub hash
  prefix of the file name (the SHA-256 must start with it, as torch.hub
  checks); else the digest recorded at the first pull of the same URL (printed
  then), which every later pull, import and verify must match.
* Re-pulling a cached variant whose files still match its record does
  nothing; one that no longer matches is fetched again (its old record is
  removed first, so that no record ever describes other files).  An import
  that fails its check leaves the cached variant as it was.
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

from svc.weightstore.cache import (
    HUB_DIR,
    RECORD_NAME,
    Record,
    RecordError,
    read_record,
    variant_dir,
    weights_dir,
    write_record,
)
from svc.weightstore.catalog import FileSource, HubSource, Variant
from svc.weightstore.fetch import FetchError, Progress, download, mirrored, sha256_file

PART = ".part"


class StoreError(Exception):
    """A pull, import or verify that failed; ``str()`` is one line (the URL or file, and the cause)."""


@dataclass(frozen=True)
class Stored:
    """What a pull or import did: the record now in the cache, and what to tell the user."""

    record: Record
    notes: tuple[str, ...] = ()
    fetched: bool = True  # False: it was already cached and verified


def source_text(variant: Variant) -> str:
    """The source as ``list`` shows it and a record keeps it: the URL, or hub ``repo_id@revision``."""
    source = variant.source
    if isinstance(source, HubSource):
        return f"{source.repo_id}@{source.revision}"
    return source.url


def published_check(source: FileSource | HubSource) -> str:
    """What the source publishes to check against, in words ('' when nothing)."""
    if isinstance(source, FileSource):
        if source.sha256:
            return f"sha256 {source.sha256}"
        if source.hash_prefix:
            return f"sha256 prefix {source.hash_prefix}"
    return ""


def check_digest(source: FileSource, digest: str, known: str | None) -> str | None:
    """Why ``digest`` (of the file ``source`` names) is wrong, or None when it is right (or first seen)."""
    if source.sha256:
        if digest != source.sha256.lower():
            return f"sha256 mismatch: got {digest}, the source publishes {source.sha256}"
    elif source.hash_prefix:
        if digest[: len(source.hash_prefix)] != source.hash_prefix.lower():
            return f'invalid hash value (expected prefix "{source.hash_prefix}", got "{digest}")'
    elif known and digest != known:
        return f"sha256 mismatch: got {digest}, the first pull recorded {known}"
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


def record_problems(record: Record, env: Mapping[str, str] | None = None) -> list[str]:
    """Every file of ``record`` that is missing or differs from it, as lines (empty: all match)."""
    directory = variant_dir(record.model, record.variant, dict(env) if env is not None else None)
    problems = []
    if not record.files:
        problems.append(f"{record.model} {record.variant}: the record lists no files")
    for rel, expected in sorted(record.files.items()):
        path = directory / rel
        if not path.is_file():
            problems.append(f"{record.model} {record.variant}: {path}: missing")
            continue
        size = path.stat().st_size
        if expected.get("size") is not None and size != expected["size"]:
            problems.append(f"{record.model} {record.variant}: {path}: {size} bytes, the record says {expected['size']}")
            continue
        digest = sha256_file(path)
        if digest != expected.get("sha256"):
            problems.append(f"{record.model} {record.variant}: {path}: sha256 {digest}, "
                            f"the record says {expected.get('sha256')}")
    if record.weights not in record.files and not (directory / record.weights).exists():
        problems.append(f"{record.model} {record.variant}: {directory / record.weights}: missing")
    return problems


def cached_records(env: Mapping[str, str] | None = None) -> Iterator[Record | RecordError]:
    """Every record in the cache, by model and variant (a :class:`RecordError` for one that is unreadable)."""
    root = weights_dir(dict(env) if env is not None else None)
    if not root.is_dir():
        return
    for path in sorted(root.glob(f"*/*/{RECORD_NAME}")):
        try:
            yield read_record(path.parent.parent.name, path.parent.name, dict(env) if env is not None else None)
        except RecordError as e:
            yield e


def _readable_record(model_id: str, name: str, env: dict[str, str] | None) -> Record | None:
    """The record of a variant about to be (re)stored; an unreadable one counts as none (it is replaced)."""
    try:
        return read_record(model_id, name, env)
    except RecordError:
        return None


@contextmanager
def _locked(directory: Path, what: str) -> Iterator[None]:
    """Hold the variant's directory lock: two pulls or imports of one variant would mix their ``.part``."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"{what}: another pull or import of this variant is running ({directory})") from None
        yield
    finally:
        os.close(fd)


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _known(record: Record | None, variant: Variant, rel: str) -> str | None:
    """The digest an earlier pull of the same source recorded for ``rel``."""
    if record is None or record.source != source_text(variant):
        return None
    return record.files.get(rel, {}).get("sha256")


def _drop_record(model_id: str, name: str, env: dict[str, str] | None) -> None:
    try:
        (variant_dir(model_id, name, env) / RECORD_NAME).unlink()
    except FileNotFoundError:
        pass


def _install_file(factory: Any, variant: Variant, part: Path, how: str, old: Record | None,
                  env: dict[str, str] | None, where: str) -> Stored:
    """Check the complete ``part``, rename it into place, convert it, write the record."""
    source = variant.source
    assert isinstance(source, FileSource)
    model_id = factory.catalog_id
    directory = variant_dir(model_id, variant.name, env)
    digest = sha256_file(part)
    known = _known(old, variant, source.filename)
    problem = check_digest(source, digest, known)
    if problem:
        part.unlink()
        raise StoreError(f"{where}: {problem} (nothing kept)")
    _drop_record(model_id, variant.name, env)  # checked: from here the files change
    notes = []
    if not source.sha256 and not source.hash_prefix and not known:
        notes.append(f"{model_id} {variant.name}: {source.url} publishes no checksum: recorded sha256 {digest} "
                     "(later pulls, imports and verify check against it)")
    final = directory / source.filename
    os.replace(part, final)
    weights = source.filename
    files = {source.filename: file_entry(final, digest)}
    if source.convert:
        try:
            weights = factory.convert(source.convert, str(final), str(directory))
        except Exception as e:  # noqa: BLE001 - any converter failure is reported in one line
            raise StoreError(f"{where}: converter {source.convert!r} failed: {type(e).__name__}: {e}") from None
        files.update(_tree_entries(directory / weights, weights))
    record = Record(model=model_id, variant=variant.name, source=source.url, weights=weights, files=files,
                    pulled_at=_now(), how=how)
    write_record(record, env)
    return Stored(record, tuple(notes))


def _install_tree(factory: Any, variant: Variant, stage: Path, how: str, old: Record | None,
                  env: dict[str, str] | None, where: str, loads: str = ".") -> Stored:
    """Check a complete hub snapshot in ``stage`` against an earlier record, move it into place, record it.

    ``loads`` is the folder ``build`` loads, relative to the snapshot (the hub
    fetcher puts the repository in a folder named after it, so that the name
    shows in a version computed from the folder).
    """
    model_id = factory.catalog_id
    directory = variant_dir(model_id, variant.name, env)
    files = _tree_entries(stage, HUB_DIR)
    if not files:
        raise StoreError(f"{where}: no files")
    notes = []
    if old is not None and old.source == source_text(variant):
        for rel, entry in sorted(old.files.items()):
            if rel in files and files[rel]["sha256"] != entry.get("sha256"):
                shutil.rmtree(stage)
                raise StoreError(f"{where}: {rel}: sha256 mismatch: got {files[rel]['sha256']}, "
                                 f"the first pull recorded {entry.get('sha256')}")
    else:
        notes.append(f"{model_id} {variant.name}: {source_text(variant)}: recorded the sha256 of {len(files)} "
                     "files (later pulls, imports and verify check against them)")
    _drop_record(model_id, variant.name, env)  # checked: from here the files change
    final = directory / HUB_DIR
    if final.exists():
        shutil.rmtree(final)
    os.replace(stage, final)
    weights = HUB_DIR if loads in ("", ".") else f"{HUB_DIR}/{loads}"
    record = Record(model=model_id, variant=variant.name, source=source_text(variant), weights=weights,
                    files=files, pulled_at=_now(), how=how)
    write_record(record, env)
    return Stored(record, tuple(notes))


def _already(model_id: str, variant: Variant, env: dict[str, str] | None) -> tuple[Record | None, bool]:
    """The existing record, and whether it is of this source and all its files still match."""
    old = _readable_record(model_id, variant.name, env)
    if old is None:
        return None, False
    return old, old.source == source_text(variant) and not record_problems(old, env)


def pull(factory: Any, variant: Variant, *, env: Mapping[str, str] | None = None,
         progress_stream: IO[str] | None = None) -> Stored:
    """Make ``variant`` of ``factory`` cached and verified, downloading what is missing.

    Raises :class:`StoreError` (one line naming the URL and the cause); a cut
    download keeps its ``.part`` for the next pull.
    """
    env = dict(os.environ if env is None else env)
    with _locked(variant_dir(factory.catalog_id, variant.name, env), source_text(variant)):
        return _pull(factory, variant, env, progress_stream)


def _pull(factory: Any, variant: Variant, env: dict[str, str], progress_stream: IO[str] | None) -> Stored:
    model_id = factory.catalog_id
    old, ok = _already(model_id, variant, env)
    if ok:
        return Stored(old, fetched=False)
    directory = variant_dir(model_id, variant.name, env)
    _drop_record(model_id, variant.name, env)
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
    return _install_file(factory, variant, part, "pull", old, env, mirrored(source.url, env))


def import_path(factory: Any, variant: Variant, path: str, *, env: Mapping[str, str] | None = None) -> Stored:
    """Store a file (or, for a hub variant, a folder) a user copied in, exactly as a pull would.

    The copy is checked like a download (published digest, hash prefix or
    the digest of an earlier pull) before it is renamed into place;
    ``how`` is ``import`` in the record.
    """
    env = dict(os.environ if env is None else env)
    given = Path(path).expanduser()
    if not given.exists():
        raise StoreError(f"{given}: no such file or directory")
    with _locked(variant_dir(factory.catalog_id, variant.name, env), str(given)):
        return _import(factory, variant, given, env)


def _import(factory: Any, variant: Variant, given: Path, env: dict[str, str]) -> Stored:
    model_id = factory.catalog_id
    source = variant.source
    old = _readable_record(model_id, variant.name, env)
    directory = variant_dir(model_id, variant.name, env)
    if isinstance(source, HubSource):
        if not given.is_dir():
            raise StoreError(f"{given}: {model_id} {variant.name} is a hub repository ({source_text(variant)}): "
                             "import its folder, not a file")
        stage = directory / (HUB_DIR + PART)
        if stage.exists():
            shutil.rmtree(stage)
        shutil.copytree(given, stage, ignore=shutil.ignore_patterns(".*"))
        return _install_tree(factory, variant, stage, "import", old, env, str(given))
    if not given.is_file():
        raise StoreError(f"{given}: {model_id} {variant.name} is one file ({source.filename}), not a folder")
    part = directory / (source.filename + PART)
    shutil.copyfile(given, part)
    return _install_file(factory, variant, part, "import", old, env, str(given))


def verify(env: Mapping[str, str] | None = None) -> tuple[list[Record], list[str]]:
    """Recheck every cached variant against its record: the records seen and one line per mismatch."""
    records: list[Record] = []
    problems: list[str] = []
    for record in cached_records(env):
        if isinstance(record, RecordError):
            problems.append(str(record))
            continue
        records.append(record)
        problems.extend(record_problems(record, env))
    return records, problems
