"""Local weights for model plugins: random init with a seed, or a file.

Nothing is ever downloaded.  ``weights = "random"`` builds the architecture
from a seed (the model version says so); a path loads a ``.pth``/``.pt``
state dict (torch.load with ``weights_only``) or a ``.safetensors`` file.  A
missing file or the first tensor that does not fit the architecture stops the
model server with one line naming the file and the tensor.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

RANDOM = "random"

#: Config properties every plugin accepts in its [model] table.
WEIGHTS_PROPERTIES: dict[str, dict] = {
    "weights": {
        "type": "string",
        "minLength": 1,
        "default": RANDOM,
        "description": "'random' (seeded random init) or a local weights path.",
    },
    "seed": {"type": "integer", "minimum": 0, "default": 0, "description": "Seed of the random init."},
    "version": {
        "type": "string",
        "minLength": 1,
        "description": "Model version reported in replies; default: random-init-seed<N>, or the file name and "
        "the first 12 hex digits of its SHA-256.",
    },
}


class WeightsError(Exception):
    """Weights that cannot be used; ``str()`` is one line."""


def is_random(config: dict) -> bool:
    return config.get("weights", RANDOM) == RANDOM


def path_of(config: dict) -> str | None:
    """The weights path of a [model] table the server has resolved, or None for random init."""
    return None if is_random(config) else config["weights"]


def check_path(config: dict, config_path: str) -> str | None:
    """The weights path resolved next to the config file, checked to exist.

    Relative paths are taken from the current directory first, then from the
    directory of the config file.  Raises WeightsError when missing.
    """
    if is_random(config):
        return None
    path = os.path.expanduser(config["weights"])
    candidates = [path]
    if not os.path.isabs(path):
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(config_path)), path))
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    raise WeightsError(f"weights {config['weights']!r} (from {config_path}): no such file or directory")


def version_of(config: dict, path: str | None) -> str:
    """The version string of these weights (see ``WEIGHTS_PROPERTIES``)."""
    if config.get("version"):
        return config["version"]
    if path is None:
        return f"random-init-seed{config.get('seed', 0)}"
    digest = hashlib.sha256()
    if os.path.isdir(path):
        for root, dirs, files in sorted(os.walk(path)):
            dirs.sort()
            for name in sorted(files):
                digest.update(name.encode())
                _hash_file(os.path.join(root, name), digest)
    else:
        _hash_file(path, digest)
    return f"{os.path.basename(os.path.normpath(path))}@{digest.hexdigest()[:12]}"


def _hash_file(path: str, digest: Any) -> None:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def read_state_dict(path: str) -> dict:
    """A state dict from a ``.safetensors`` or torch file (tensors on the CPU)."""
    import torch

    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(path, device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reader error is a bad file
        raise WeightsError(f"weights file {path}: cannot be read as a state dict: {type(e).__name__}: {e}") from None
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
    the demo weights give input-dependent outputs.  Deterministic for a seed.
    """
    import torch

    norms = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average over the passes
    generator = torch.Generator().manual_seed(seed)
    module.train()
    with torch.no_grad():
        for _ in range(passes):
            module(torch.randn(*input_shape, generator=generator))
    module.eval()
