"""Checking weights: a pull or an import built as a model server builds it, and ``svcctl weights verify``.

Every file a record lists must be there with its size and SHA-256, and
every file in a variant's folder must be listed by its record: a file no
record lists (left by an import or a pull that failed before nothing-left
was the rule, or put there by hand) is reported as stray, since a model
server would never load it and ``verify`` saying ok would hide it.  A
``.part`` (a download kept to resume) is not stray.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from svc.weightstore.cache import RECORD_NAME, Record, RecordError, read_record, variant_dir, weights_dir
from svc.weightstore.fetch import sha256_file

PART = ".part"


def in_words(error: BaseException, staged: dict[str, str]) -> str:
    """``error`` in one line, with the paths of staged copies replaced by what the user knows them as."""
    text = str(error) if type(error).__name__ == "StoreError" else f"{type(error).__name__}: {error}"
    for path, shown in sorted(staged.items(), key=lambda item: -len(item[0])):
        text = text.replace(path, shown)
    return " ".join(text.split())


def load_problem(factory: Any, variant: Any, path: Path, staged: dict[str, str]) -> str | None:
    """Why the model does not build on ``path`` as a model server does at start (one line), or None.

    ``svc.model.api.model_config`` completes ``[model]`` with the variant's
    keys, and the factory's ``build`` loads the weights, checking every
    tensor's name and shape against the architecture (``svc.model.weights.load_into``).
    ``staged`` maps staged paths to the names the message should say instead.
    """
    from svc.model.api import model_config

    where = staged.get(str(path), str(path))
    try:
        config = model_config(factory, {**variant.model, "weights": str(path)}, where)
        factory.build(config, "cpu")
    except Exception as e:  # noqa: BLE001 - whatever the plugin raised, the weights do not load
        from svc.model.weights import MODEL_PLACEHOLDER

        words = in_words(e, staged).replace(MODEL_PLACEHOLDER, factory.catalog_id)
        return f"does not load as {factory.catalog_id} {variant.name}: {words}"
    return None


def record_problems(record: Record, env: Mapping[str, str] | None = None, *, digests: bool = True) -> list[str]:
    """Every file of ``record`` that is missing or differs from it, as lines (empty: all match).

    ``digests=False`` compares the sizes only, as a model server does at start.
    """
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
        if not digests:
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
            record = read_record(path.parent.parent.name, path.parent.name, dict(env) if env is not None else None)
        except RecordError as e:
            yield e
            continue
        assert record is not None  # its file was just listed
        yield record


def _files_under(root: Path) -> list[str]:
    """The relative paths of the files under ``root`` (hidden folders left out, as records leave them out)."""
    found: list[str] = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend((Path(directory) / name).relative_to(root).as_posix() for name in sorted(files))
    return found


def stray_files(env: Mapping[str, str] | None = None) -> list[str]:
    """One line per file in the cache that no record lists (``.part`` downloads, kept to resume, aside)."""
    root = weights_dir(dict(env) if env is not None else None)
    lines: list[str] = []
    if not root.is_dir():
        return lines
    for directory in sorted(p for p in root.glob("*/*") if p.is_dir()):
        try:
            record = read_record(directory.parent.name, directory.name, dict(env) if env is not None else None)
        except RecordError:
            continue  # verify reports the record itself
        listed = set(record.files) | {RECORD_NAME} if record is not None else set()
        for rel in _files_under(directory):
            if rel in listed or any(part.endswith(PART) for part in rel.split("/")):
                continue
            what = "not in its record" if record is not None else "no record.json: not a cached variant"
            lines.append(f"{directory.parent.name} {directory.name}: {directory / rel}: stray file ({what})")
    return lines


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
    problems.extend(stray_files(env))
    return records, problems
