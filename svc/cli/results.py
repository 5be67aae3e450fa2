"""``svcctl jobs run --out DIR``: the files of a result envelope, written under DIR.

Why a module of its own: what a result holds (images, masks, RLE) and how it
is written (a temporary name, then a rename) is apart from the run itself
(:mod:`svc.cli.jobs`: the requests, the progress bar, the exit status).
"""

from __future__ import annotations

import base64
import json
import os
import re

from svc.cli.http import CliError

#: Magic numbers of the image formats that ``options.image_format`` can ask for, and their suffixes.
IMAGE_SUFFIXES = ((b"\x89PNG\r\n\x1a\n", ".png"), (b"\xff\xd8\xff", ".jpg"), (b"RIFF", ".webp"))


def safe_name(text: str) -> str:
    """``text`` usable as a file name prefix: anything but letters, digits, '.', '_' and '-' becomes '_'."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100].lstrip(".")
    return name or "job"


def image_suffix(data: bytes) -> str:
    """The file suffix of encoded image bytes by their magic number (``.bin`` when unknown)."""
    for magic, suffix in IMAGE_SUFFIXES:
        if data.startswith(magic):
            return suffix
    return ".bin"


def result_files(envelope: dict) -> list[tuple[str, bytes]]:
    """The files of a result envelope: ``(name, content)``, the envelope itself last.

    Per successful result ``i`` (0-based): ``data.image`` (a base64 image) is
    ``<task>_<i>.png`` (or ``.jpg``/``.webp`` for those formats); each mask
    ``j`` of a ``data`` list of objects with ``segmentation`` is
    ``<task>_<i>_mask<j>.png`` (base64 PNG) or ``<task>_<i>_mask<j>.json``
    (RLE object).  The envelope is ``<task>.json``.  Found by the shape of
    ``data``, so any model that returns images or masks gets its files.
    """
    task = safe_name(str(envelope.get("task_id") or "job"))
    files: list[tuple[str, bytes]] = []
    for i, result in enumerate(envelope.get("results") or []):
        data = result.get("data") if isinstance(result, dict) else None
        if isinstance(data, dict) and isinstance(data.get("image"), str):
            raw = _decode(data["image"])
            if raw is not None:
                files.append((f"{task}_{i}{image_suffix(raw)}", raw))
        if isinstance(data, list):
            for j, entry in enumerate(data):
                mask = entry.get("segmentation") if isinstance(entry, dict) else None
                if isinstance(mask, str) and (raw := _decode(mask)) is not None:
                    files.append((f"{task}_{i}_mask{j}{image_suffix(raw)}", raw))
                elif isinstance(mask, dict):
                    files.append((f"{task}_{i}_mask{j}.json", (json.dumps(mask) + "\n").encode("utf-8")))
    files.append((f"{task}.json", (json.dumps(envelope, indent=2) + "\n").encode("utf-8")))
    return files


def _decode(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return None


def write_files(directory: str, files: list[tuple[str, bytes]]) -> list[str]:
    """Write ``files`` under ``directory`` (created if needed); the paths written.

    Each file is written to a temporary name and renamed, so an interrupted
    run leaves no half-written image under its final name.
    """
    try:
        os.makedirs(directory, exist_ok=True)
        written = []
        for name, content in files:
            path = os.path.join(directory, name)
            temporary = f"{path}.tmp-{os.getpid()}"
            with open(temporary, "wb") as f:
                f.write(content)
            os.replace(temporary, path)
            written.append(path)
        return written
    except OSError as e:
        raise CliError(f"cannot write under {directory}: {e.strerror or e}") from None
