"""Local weights for model plugins: random init with a seed, a file, or a cached pretrained variant.

Nothing is ever downloaded.  ``weights = "random"`` builds the architecture
from a seed (the model version says so); a path loads a ``.pth``/``.pt``
state dict (torch.load with ``weights_only``) or a ``.safetensors`` file;
``"pretrained"`` (the plugin's default variant) or ``"pretrained:<VARIANT>"``
loads what ``svcctl weights pull`` or ``import`` put in the weights cache
(``svc.weightstore``), applies the ``[model]`` keys the variant implies and
reports the variant's name as the version.  A missing file, a variant not in
the cache, or the first tensor that does not fit the architecture stops the
model server with one line naming the file and the tensor (or the command
that fills the cache).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import warnings
from typing import Any

from svc.model.pickled import REFUSED_GLOBAL, TORCH_ADVICE, first_code_global, plain_pickle, runs_code

RANDOM = "random"
PRETRAINED = "pretrained"
#: Stands for the catalog id in a WeightsError's advice; the model server puts its own id there.
MODEL_PLACEHOLDER = "<MODEL>"

#: Config properties every plugin accepts in its [model] table.
WEIGHTS_PROPERTIES: dict[str, dict] = {
    "weights": {
        "type": "string",
        "minLength": 1,
        "default": RANDOM,
        "description": "'random' (seeded random init), 'pretrained' (the model's default pretrained variant) or "
        "'pretrained:<VARIANT>' from the weights cache (svcctl weights pull), or a local weights path.",
    },
    # Bounded as a request's seed is: a larger one passed the check and failed in torch after the port listened.
    "seed": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1, "default": 0,
             "description": "Seed of the random init."},
    "version": {
        "type": "string",
        "minLength": 1,
        "allOf": [
            # no "/": it names the model in /v2/models/{id}/versions/{version}, which a "/" could not address
            {"pattern": "^[^/]+$",
             "x-pattern-says": "has a '/', which no /v2/models/{id}/versions/{version} path could name"},
            # no control character (C0, DEL, C1): a newline split the model server's "ready" line, and every log
            # line naming the version, in two.  (?![\s\S]) is the string's end: "$" also matches before a final
            # newline (Python's re, which jsonschema uses).
            {"pattern": "^[^\\x00-\\x1f\\x7f-\\x9f\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u2064\\ufeff]+(?![\\s\\S])",
             "x-pattern-says": "has a control character (a newline, a tab, an escape, a Unicode line break, an invisible "
                               "or direction mark), which would break or hide the log lines that name the version"},
            {"pattern": "\\S", "x-pattern-says": "is blank: a version names what is served"},
        ],
        "description": "Model version reported in replies; default: random-init-seed<N>, the pretrained variant's "
        "name, or the file name and the first 12 hex digits of its SHA-256.",
    },
}


class WeightsError(Exception):
    """Weights that cannot be used; ``str()`` is one line."""


def weights_kind(value: Any) -> str:
    """What a ``[model] weights`` value (before resolution) serves: ``demo`` (random init), ``pretrained`` (a
    cached variant) or ``file`` (a local path); the ``X-Service-Weights`` header and the status API say it."""
    value = value if isinstance(value, str) else RANDOM
    if value == RANDOM:
        return "demo"
    return PRETRAINED if value == PRETRAINED or value.startswith(PRETRAINED + ":") else "file"


def is_random(config: dict) -> bool:
    return config.get("weights", RANDOM) == RANDOM


def pretrained_variant(config: dict) -> tuple[bool, str | None]:
    """Whether ``weights`` names a pretrained variant, and which (None: the plugin's default)."""
    value = config.get("weights", RANDOM)
    if value == PRETRAINED:
        return True, None
    if value.startswith(PRETRAINED + ":"):
        return True, value[len(PRETRAINED) + 1:]
    return False, None


def resolve_pretrained(factory: Any, table: dict, config_path: str, env: dict[str, str] | None = None, *,
                       files: bool = True, weights_from: str | None = None) -> dict:
    """The [model] table with ``weights = "pretrained[:VARIANT]"`` resolved from the weights cache.

    The variant's implied keys (its ``model`` mapping, e.g. a preprocessing
    size) are added where the table does not set them; an explicit key with
    another value is refused (``svc.config.ConfigError``), since the weights
    were trained for the variant's value.  ``version`` defaults to the
    variant's name.  ``weights`` becomes the cached path; a variant not in
    the cache raises WeightsError naming the file, the variant and the
    ``svcctl weights pull`` command (startup never downloads).  Any other
    table is returned unchanged.  ``files`` False: the cache is not looked
    at, and ``weights`` is left out (for what needs the variant's keys only).
    ``weights_from``: what chose these weights when not the file (``--weights pretrained``), for the messages:
    they named the config file, which said ``random``.
    """
    wanted, name = pretrained_variant(table)
    origin = weights_from or config_path
    if not wanted:
        return table
    from svc.config import ConfigError
    from svc.weightstore.cache import (
        HUB_DIR,
        RECORD_NAME,
        WEIGHTS_DIR_ENV,
        RecordError,
        cached_weights,
        read_record,
        variant_dir,
        weights_dir,
    )
    from svc.weightstore.catalog import FileSource, find_variant

    try:
        variant = find_variant(factory, name or None)
    except KeyError as e:
        if weights_from:
            raise WeightsError(f"{weights_from}: {e.args[0]}") from None
        raise ConfigError(config_path, "model.weights", e.args[0]) from None
    config = dict(table)
    for key, value in variant.model.items():
        if key in table and table[key] != value:
            raise ConfigError(config_path, f"model.{key}", f"{table[key]!r} conflicts with weights = "
                              f"{table['weights']!r}: the variant {variant.name} implies {key} = {value!r}")
        config[key] = value
    config.setdefault("version", variant.name)
    if not files:
        del config["weights"]
        return config
    model_id = factory.catalog_id
    directory = variant_dir(model_id, variant.name, env)
    command = f"svcctl weights pull {model_id}" + ("" if variant.default or name is None else f" --variant {variant.name}")
    root = weights_dir(env)
    if root.exists() and not root.is_dir():  # it said "not a weights record (NotADirectoryError)": pull again
        raise WeightsError(f"{weights_named(table['weights'], origin)}: the weights cache {root} is not a folder: "
                           f"point {WEIGHTS_DIR_ENV} at one, or unset it for the default")
    try:
        path = cached_weights(model_id, variant.name, env)
        record = read_record(model_id, variant.name, env)
    except RecordError as e:
        raise WeightsError(f"{weights_named(table['weights'], origin)}: {e}: run `{command}` again") from None
    if path is None or record is None:
        expected = directory / (variant.source.filename if isinstance(variant.source, FileSource) else HUB_DIR)
        raise WeightsError(f"{weights_named(table['weights'], origin)}: {expected} is missing: {model_id} "
                           f"variant {variant.name} is not in the weights cache; run `{command}` first")
    for rel, entry in sorted(record.files.items()):
        file = directory / rel
        size = file.stat().st_size if file.is_file() else None
        if size != entry.get("size"):
            state = "missing" if size is None else f"{size} bytes, {RECORD_NAME} says {entry.get('size')}"
            raise WeightsError(f"{weights_named(table['weights'], origin)}: {file}: {state}: {model_id} "
                               f"variant {variant.name} is damaged; run `{command}` again")
    config["weights"] = str(path)
    return config


def path_of(config: dict) -> str | None:
    """The weights path of a [model] table the server has resolved, or None for random init."""
    return None if is_random(config) else config["weights"]


def weights_named(value: Any, origin: str) -> str:
    """The start of every refusal of a model's weights: the value of ``[model] weights`` and what set it (the
    config file, or ``--weights ...``), so that the line says which setting to change."""
    return f"weights {value!r} (from {origin})"


def check_path(config: dict, config_path: str) -> str | None:
    """The weights path resolved next to the config file, checked to exist.

    Relative paths are taken from the current directory first, then from the
    directory of the config file.  Raises WeightsError when missing, or when
    this process may not read it (found only by the load, after the server
    listened: under a supervisor a crash loop instead of a refused config).
    """
    if is_random(config):
        return None
    if pretrained_variant(config)[0]:
        raise WeightsError(f"{weights_named(config['weights'], config_path)}: a pretrained variant is resolved "
                           "by svc.model.api.model_config")
    path = os.path.expanduser(config["weights"])
    candidates = [path]
    if not os.path.isabs(path):
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(config_path)), path))
    for candidate in candidates:
        if os.path.exists(candidate):
            if not os.access(candidate, os.R_OK | (os.X_OK if os.path.isdir(candidate) else 0)):
                raise WeightsError(f"{weights_named(config['weights'], config_path)}: this process may not read "
                                   f"{candidate} (permission denied)")
            return candidate
    raise WeightsError(f"{weights_named(config['weights'], config_path)}: no such file or directory")


def version_of(config: dict, path: str | None) -> str:
    """The version string of these weights (see ``WEIGHTS_PROPERTIES``)."""
    if config.get("version"):
        return config["version"]
    if path is None:
        return f"random-init-seed{config.get('seed', 0)}"
    digest = hashlib.sha256()
    if os.path.isdir(path):
        check_folder_files(path)
        for root, dirs, files in sorted(os.walk(path)):
            dirs.sort()
            for name in sorted(files):
                digest.update(name.encode())
                _hash_file(os.path.join(root, name), digest)
    else:
        _hash_file(path, digest)
    return f"{os.path.basename(os.path.normpath(path))}@{digest.hexdigest()[:12]}"


def not_regular(path: str) -> str | None:
    """Why ``path`` is no file to read (a folder, a FIFO, a socket, a device, a dangling link), or None.  Opening
    a FIFO waits for a writer for good: a model server named one as its weights hung, deaf to SIGTERM (a
    regression probe).  A folder, given where a model takes one file (``weights = "/tmp"`` for MOBILENETV2), was
    called "not a regular file (a FIFO, a socket or a device)"."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return e.strerror or str(e)
    if stat.S_ISDIR(mode):
        return "is a directory"
    return None if stat.S_ISREG(mode) else "not a regular file (a FIFO, a socket or a device)"


def check_folder_files(folder: str) -> None:
    """WeightsError for a file of ``folder`` (at any depth, through linked folders, which diffusers reads through:
    a regression probe's ``unet/`` linked elsewhere hid its FIFO) that is not a regular one, before any is read: a
    FIFO as a diffusers folder's ``config.json`` hung the model server at its first read, or at the version hash,
    which reads every file."""
    seen: set[str] = set()
    for root, dirs, files in os.walk(folder, followlinks=True):  # a linked component folder is read through too
        real = os.path.realpath(root)
        if real in seen:  # a link back up the tree: walked once
            dirs[:] = []
            continue
        seen.add(real)
        dirs.sort()
        for name in sorted(files):
            problem = not_regular(os.path.join(root, name))
            if problem is not None:
                shown = os.path.relpath(os.path.join(root, name), folder)
                raise WeightsError(f"weights folder {folder}: {shown}: {problem}")


def _hash_file(path: str, digest: Any) -> None:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def read_state_dict(path: str) -> dict:
    """A state dict from a ``.safetensors`` or torch file (tensors on the CPU).  Only a regular file is read
    (:func:`not_regular`)."""
    import torch

    problem = not_regular(path)
    if problem is not None:
        raise WeightsError(f"weights file {path}: {problem}")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state: Any = load_file(path, device="cpu")  # a state dict, checked below
        else:
            with warnings.catch_warnings():  # its note of a pickle protocol put two lines before the one line
                warnings.simplefilter("ignore", UserWarning)
                state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reader error is a bad file
        named = REFUSED_GLOBAL.search(str(e))
        called = named.group(1) if named else first_code_global(path) if "Unsupported operand" in str(e) else None
        if called is not None and runs_code(called):
            raise WeightsError(f"weights file {path}: not a state dict: its pickle calls {called}, which would run "
                               "code (refused, never run)") from None
        if plain_pickle(path, str(e), named.group(1) if named else None):
            raise WeightsError(f"weights file {path}: a plain pickle (pickle.dump), not a torch or safetensors state "
                               "dict: save the state dict with torch.save or as safetensors") from None
        if named:  # a pickle naming classes: a whole model, or an upstream checkpoint, not a state dict
            raise WeightsError(f"weights file {path}: a pickled model object ({named.group(1)}), not a state dict: "
                               "save the model's state_dict() with torch.save or as safetensors; an upstream checkpoint "
                               "that the import converts (an ultralytics .pt for YOLOV8) goes into the weights cache "
                               f"with `svcctl weights import {MODEL_PLACEHOLDER} {path}`, then weights = "
                               "\"pretrained\"") from None
        # torch's unpickler says why after its advice to turn weights_only off, which is not ours to give (of a
        # pickle that would run code least of all): "WeightsUnpickler error: ...", or a paragraph of its own
        said = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))
        own = [p.strip() for p in str(e).split("\n\n") if p.strip() and not p.strip().startswith(TORCH_ADVICE)]
        first = said.group(1).strip() if said else own[0].splitlines()[0] if own else ""
        raise WeightsError(f"weights file {path}: not a torch or safetensors state dict ({type(e).__name__}: "
                           f"{first})") from None
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and set(state) == {wrapper} and isinstance(state[wrapper], dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"weights file {path}: not a state dict of tensors")
    return state


def load_into(module: Any, state: dict, path: str) -> None:
    """Load ``state`` into ``module`` after checking every tensor name and shape."""
    expected = module.state_dict()
    for name, tensor in expected.items():
        if name not in state:
            raise WeightsError(f"weights file {path}: missing tensor {name!r} (shape {list(tensor.shape)})")
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise WeightsError(
                f"weights file {path}: tensor {name!r} has shape {list(state[name].shape)}, "
                f"the architecture expects {list(tensor.shape)}"
            )
    for name in state:
        if name not in expected:
            raise WeightsError(f"weights file {path}: unexpected tensor {name!r} (not in the architecture)")
    module.load_state_dict(state, strict=True)


def calibrate_batchnorm(module: Any, input_shape: tuple[int, ...], seed: int, passes: int = 2) -> None:
    """Give a randomly initialised network sane BatchNorm statistics.

    Freshly initialised BatchNorm layers assume unit variance, and in deep
    networks the activations then vanish (random-init MobileNetV2 gives
    logits of 1e-9 and the same class for every image).  A few forward
    passes in training mode on seeded noise set the running statistics, so
    the demo weights give input-dependent outputs.  Deterministic for a seed,
    on any machine and with any number of workers: the passes run on one
    thread, since a sum split over several threads rounds differently (the
    statistics moved by 1e-8 with ``backend.workers``, enough to change the
    weights' identity and convert every optimised mode again).
    """
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average over the passes
    generator = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    module.train()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            for _ in range(passes):
                module(torch.randn(*input_shape, generator=generator))
    finally:
        torch.set_num_threads(threads)
    module.eval()
