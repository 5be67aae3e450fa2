"""``auto``'s choice, recorded in the state directory so that a restart does not measure again.

Measuring (gating and timing every candidate, :mod:`svc.optimize.select`)
is most of what ``auto`` costs at start-up: YOLOV8's candidates took 18 to
27 s of a 2-core machine on every start, with every converted model already
cached.  The outcome is decided by what a :func:`choice_key` covers, so a
start with the same key applies the recorded mode at once:

- the model: its catalog id, gate category, the plugin's source file and
  each target's :func:`svc.optimize.aot.package_key` (its weights and
  buffers, the source files of its module classes, its example inputs'
  shapes, torch's version, the device and the CPU capability);
- the measurement: the candidate list, the warm-up batch, the intra-op
  threads and the inference workers, the source of ``svc/optimize/`` (the
  gates and their bounds, ``MIN_GAIN``, how modes are applied);
- the machine: the CPU's model name, flags and usable cores, and the
  versions of torch, OpenVINO and ONNX Runtime.

Anything else changed makes another key, and that start measures afresh.
Records are ``<state dir>/compiled/choices/<model id>-<key>.json``, written
atomically; delete the folder (or one file) to make ``auto`` measure again.
A record that cannot be read is ignored (the start measures and replaces it),
and so is one another user could have written: in a folder that user can
change, nothing is read or written (:func:`svc.optimize.cache.trust_problem`).

Torch is imported inside the functions, as in the rest of the package.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from svc.optimize.cache import file_problem, make_private_dirs, trust_problem, write_atomically

#: The folder of records under ``<state dir>/compiled``.
CHOICES = "choices"
#: The records' format: another one is not read.
FORMAT = 1
#: The packages whose version is part of the key.
VERSIONED = ("torch", "openvino", "onnxruntime")


class RecordError(ValueError):
    """A record that cannot be used; ``str()`` says why in a few words."""


@dataclass(frozen=True)
class Recorded:
    """A choice read back: the mode's name, when it was measured, its speed-up over eager then."""

    mode: str
    chosen_at: float  # seconds since the epoch
    speedup: float | None
    path: Path

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.chosen_at))


def choices_dir(env: dict[str, str] | None = None) -> Path:
    """Where the records live: ``<state dir>/compiled/choices``."""
    from svc.optimize.cache import compiled_dir

    return compiled_dir(env) / CHOICES


def cpu_identity(path: str = "/proc/cpuinfo") -> list[str]:
    """The CPU's model name, its sorted flags and the cores this process may use (what a timing depends on)."""
    from svc.optimize.support import cpu_flags

    name = ""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [name, " ".join(sorted(cpu_flags(path))), str(cores)]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _sources(model: Any) -> list[Path]:
    """The plugin's source file and those of ``svc/optimize/`` (gates, bounds, how a mode is applied)."""
    files = sorted(Path(__file__).parent.glob("*.py"))
    plugin = inspect.getsourcefile(type(model))
    return ([Path(plugin)] if plugin and os.path.isfile(plugin) else []) + files


def choice_key(model: Any, model_id: str, category: str, targets: list, candidates: list[str], device: str,
               batch: int, workers: int) -> str:
    """The hex SHA-256 of everything that decides what ``auto`` chooses for ``model`` (module docstring)."""
    import torch

    from svc.optimize.aot import package_key
    from svc.optimize.apply import inference_context

    h = hashlib.sha256()

    def line(*parts: Any) -> None:
        h.update(("|".join(str(p) for p in parts) + "\n").encode())

    line("format", FORMAT)
    line("model", model_id, category, device, f"batch {batch}", f"workers {workers}",
         f"threads {torch.get_num_threads()}")
    line("candidates", *candidates)
    line("versions", *(f"{p} {_version(p)}" for p in VERSIONED))
    line("cpu", *cpu_identity())
    for source in _sources(model):
        line("source", source.name)
        h.update(source.read_bytes())
    for target in targets:
        with inference_context():
            example = target.example_inputs(batch)
        line("target", target.name, target.batched, package_key(target.module, example, device, "auto"))
    return h.hexdigest()


def record_path(directory: Path, model_id: str, key: str) -> Path:
    return directory / f"{model_id}-{key[:32]}.json"


def read(directory: Path, model_id: str, key: str, allowed: list[str]) -> Recorded | None:
    """The record of ``key`` (None: there is none); raises :class:`RecordError` when it cannot be used.

    ``allowed``: the mode names it may hold (the candidates and eager).  A
    folder another user can change is read as if it held none
    (:func:`svc.optimize.cache.trust_problem` warns); a record not made by
    this user or root, or writable by others, cannot be used: its mode would
    be applied without a gate.
    """
    if trust_problem(directory) is not None:
        return None
    path = record_path(directory, model_id, key)
    problem = file_problem(path)
    if problem is not None:
        raise RecordError(f"not trusted: it {problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"unreadable ({type(e).__name__}: {e})") from e
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RecordError(f"not JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        raise RecordError(f"not a record of format {FORMAT} for this key")
    mode, chosen_at, speedup = data.get("mode"), data.get("chosen_at"), data.get("speedup")
    if mode not in allowed:
        raise RecordError(f"its mode {mode!r} is not among the candidates")
    if not isinstance(chosen_at, (int, float)) or not _finite(chosen_at) or not (
            speedup is None or (isinstance(speedup, (int, float)) and _finite(speedup) and speedup > 0)):
        raise RecordError("its time or speed-up is not a finite number")
    try:
        time.gmtime(chosen_at)  # what the line and /ready show
    except (OverflowError, OSError, ValueError):
        raise RecordError(f"its time {chosen_at} is not a date") from None
    return Recorded(mode, float(chosen_at), None if speedup is None else float(speedup), path)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def write(directory: Path, model_id: str, key: str, mode: str, speedup: float | None, line: str) -> Path:
    """Record ``mode`` under ``key``: the file complete or absent (two servers of one model may write at once)."""
    make_private_dirs(directory)
    path = record_path(directory, model_id, key)
    record = {"format": FORMAT, "model": model_id, "key": key, "mode": mode, "chosen_at": time.time(),
              "speedup": speedup, "line": line}
    write_atomically(path, json.dumps(record, indent=1))
    return path
