"""The local weights cache: where pulled variants live and the record of each.

Layout, under ``$SERVICE_WEIGHTS_DIR`` (default
``$XDG_CACHE_HOME/inference-service/weights``, else
``~/.cache/inference-service/weights``)::

    <MODEL_ID>/<VARIANT>/record.json   what was fetched, from where, its digests
    <MODEL_ID>/<VARIANT>/<files>       the file or folder ``build`` loads
    <MODEL_ID>/<VARIANT>/<file>.part   a download under way or cut (resumed by the next pull)
    <MODEL_ID>/<VARIANT>/hub/<REPO>/   a hub repository's files, pulled or imported (``hub.part/`` while fetched)
    <MODEL_ID>/<VARIANT>/new.part/     a new file converted, or an import load-checked, before it is moved into place

A variant is cached when its ``record.json`` exists: the record is written
last, atomically, after every file was checked, so a pull that failed or
was cut never leaves a variant that looks complete.  ``record.json``::

    {"model": "MOBILENETV2", "variant": "IMAGENET1K_V2",
     "source": "https://download.pytorch.org/models/mobilenet_v2-7ebf99e0.pth",
     "weights": "mobilenet_v2-7ebf99e0.pth",
     "files": {"mobilenet_v2-7ebf99e0.pth": {"sha256": "7ebf99e0...", "size": 14258539}},
     "pulled_at": "2026-11-23T19:40:00Z", "how": "pull"}

``source`` is the official URL (not the mirror's) or hub ``repo_id@revision``;
``files`` lists every file the variant keeps (a download and what a
converter made of it), which ``svcctl weights verify`` rechecks; ``how`` is
``pull`` or ``import``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from svc.infra.userdirs import configured_dir

WEIGHTS_DIR_ENV = "SERVICE_WEIGHTS_DIR"
RECORD_NAME = "record.json"
#: Where a hub variant's repository lives inside its variant directory.
HUB_DIR = "hub"


def weights_dir(env: dict[str, str] | None = None) -> Path:
    """The cache root (see the module docstring)."""
    return configured_dir(WEIGHTS_DIR_ENV, "cache", env, "weights")


def variant_dir(model_id: str, variant: str, env: dict[str, str] | None = None) -> Path:
    return weights_dir(env) / model_id / variant


@dataclass
class Record:
    """What ``record.json`` says of one cached variant."""

    model: str
    variant: str
    source: str  # the URL fetched, or hub ``repo_id@revision``
    weights: str  # path of what ``build`` loads, relative to the variant's directory
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # relative path -> {sha256, size}
    pulled_at: str = ""
    how: str = "pull"  # pull or import

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class RecordError(ValueError):
    """A ``record.json`` that cannot be read as a record; ``str()`` is one line naming it."""


def read_record(model_id: str, variant: str, env: dict[str, str] | None = None) -> Record | None:
    """The record of a cached variant, or None when it is not cached.

    Raises :class:`RecordError` for a record that is not one (edited by
    hand, or a disk fault), so that nothing serves or verifies against it.
    """
    path = variant_dir(model_id, variant, env) / RECORD_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = Record(**data)
        if not isinstance(record.files, dict) or not isinstance(record.weights, str):
            raise TypeError("files must be an object and weights a string")
        if (record.model, record.variant) != (model_id, variant):
            # A folder copied or renamed by hand: its files would be looked for in another folder.
            raise ValueError(f"it names {record.model} {record.variant}, not its folder's {model_id} {variant}")
        return record
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        raise RecordError(f"{path}: not a weights record ({type(e).__name__}: {e})") from None


def stage_record(record: Record, env: dict[str, str] | None = None) -> Path:
    """Write ``record.json`` under a temporary name (``record.json.tmp``) and return that path.

    The caller renames it into place once the files it lists are there; a write that fails (a full disk)
    removes its temporary file and raises the ``OSError``, naming the file when the error did not.
    """
    directory = variant_dir(record.model, record.variant, env)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = (directory / RECORD_NAME).with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), e.filename or str(tmp)) from None
    return tmp


def write_record(record: Record, env: dict[str, str] | None = None) -> Path:
    """Write ``record.json`` atomically (a temporary file renamed into place)."""
    path = variant_dir(record.model, record.variant, env) / RECORD_NAME
    os.replace(stage_record(record, env), path)
    return path


def cached_weights(model_id: str, variant: str, env: dict[str, str] | None = None) -> Path | None:
    """The path ``build`` loads for a cached variant, or None when the variant is not cached.

    Raises :class:`RecordError` when its record cannot be read.
    """
    record = read_record(model_id, variant, env)
    if record is None:
        return None
    path = variant_dir(model_id, variant, env) / record.weights
    return path if path.exists() else None
