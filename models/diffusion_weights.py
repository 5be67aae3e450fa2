"""The weights folders of the diffusion models, and their random-init architectures.

A path names a folder written by ``save_pretrained`` (a pipeline's
subfolders, or each component's) or a hub snapshot, read as diffusers'
``load_sub_model`` would (a component without its subfolder comes from the
folder's root; pre-rename attention tensors are renamed).  ``random_unet`` and
``random_vqvae`` build the architecture of a ``[model]`` table instead.
The plugin is ``models/diffusion.py``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from svc.model.weights import WeightsError, check_folder_files, load_into, path_of, read_state_dict

#: facebook/DiT-* were saved before diffusers split Transformer2DModel: the same model, the same tensor names.
LEGACY_CLASS_NAMES = ("Transformer2DModel",)
WEIGHTS_NAMES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")


# -- weights folders ---------------------------------------------------------------------------


def _read_json(path: str, folder: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise WeightsError(
            f"weights folder {folder}: missing {os.path.relpath(path, folder)} (expected a folder written by "
            "save_pretrained)"
        ) from None
    except (OSError, ValueError) as e:
        raise WeightsError(f"weights folder {folder}: {os.path.relpath(path, folder)} cannot be read: {e}") from None
    if not isinstance(doc, dict):
        raise WeightsError(f"weights folder {folder}: {os.path.relpath(path, folder)} is not a JSON object")
    return doc


def weights_folder(path: str) -> str:
    """``path`` itself, once it is a folder (the diffusion models load no single file) whose files are all regular
    ones (``check_folder_files``: a FIFO as a config would hang the first read)."""
    if not os.path.isdir(path):
        raise WeightsError(f"weights {path}: the diffusion models load a folder written by save_pretrained, not a file")
    check_folder_files(path)
    return path


#: The diffusers pipelines whose folders each kind of model loads (``model_index.json``'s ``_class_name``).
PIPELINES = {"pixel": ("DDPMPipeline", "DDIMPipeline"), "latent": ("LDMPipeline",), "dit": ("DiTPipeline",)}


def check_pipeline(folder: str, kind: str, model_id: str) -> None:
    """WeightsError for another kind of model's folder: its ``model_index.json`` names another pipeline, or (a
    model that samples pixels) it holds a latent model's decoder.  A weights probe: a CompVis LDM folder imported
    as DDPM built (its latent UNet has three channels, as an image's) and would have sampled latents as pixels."""
    index = os.path.join(folder, "model_index.json")
    name = _read_json(index, folder).get("_class_name") if os.path.isfile(index) else None
    if isinstance(name, str) and name not in PIPELINES[kind]:
        raise WeightsError(f"weights folder {folder}: model_index.json is a {name}, expected a "
                           f"{' or '.join(PIPELINES[kind])}: the folder is another model's, not {model_id}'s")
    for sub in ("vqvae", "vae") if kind == "pixel" else ():
        if os.path.isfile(os.path.join(folder, sub, "config.json")):
            raise WeightsError(f"weights folder {folder}: {sub}/ is a latent model's decoder and {model_id} samples "
                               "pixels: the folder is a latent diffusion model's")


def component_dir(folder: str, sub: str) -> str:
    """Where a component lives: ``folder/sub``, else the folder's root when it holds a ``config.json`` (the
    flat layout of single-model hub repositories, which diffusers' ``load_sub_model`` also accepts)."""
    directory = os.path.join(folder, sub)
    if not os.path.isdir(directory) and os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    return directory


def _shown(path: str, folder: str) -> str:
    return os.path.relpath(path, folder)


def scheduler_config(config: dict) -> dict | None:
    """The weights folder's scheduler config, or None (random init, or a folder without one)."""
    path = path_of(config)
    if path is None:
        return None
    for file in (os.path.join(weights_folder(path), "scheduler", "scheduler_config.json"),
                 os.path.join(path, "scheduler_config.json")):
        if os.path.exists(file):
            return _read_json(file, path)
    return None


def component_config(config: dict, sub: str) -> dict | None:
    """The ``config.json`` of a weights folder's component (``unet``, ``vqvae``), or None for random init."""
    path = path_of(config)
    if path is None:
        return None
    return _read_json(os.path.join(component_dir(weights_folder(path), sub), "config.json"), path)


def load_component(cls: Any, folder: str, sub: str, aliases: tuple[str, ...] = ()) -> Any:
    """A diffusers model of ``cls`` from ``folder/sub`` (or the root, see :func:`component_dir`): its config,
    then its weights checked tensor by tensor.  ``aliases``: older class names of the same model."""
    directory = component_dir(folder, sub)
    config_file = os.path.join(directory, "config.json")
    config = _read_json(config_file, folder)
    if config.get("_class_name", cls.__name__) not in (cls.__name__, *aliases):
        raise WeightsError(
            f"weights folder {folder}: {_shown(config_file, folder)} is a {config['_class_name']}, "
            f"expected a {cls.__name__}"
        )
    model = cls.from_config(config)
    for name in WEIGHTS_NAMES:
        file = os.path.join(directory, name)
        if os.path.exists(file):
            state = read_state_dict(file)
            # Checkpoints from before diffusers renamed its attention tensors (the hub's DDPM and LDM ones):
            # the same renaming diffusers' from_pretrained applies; a no-op on current names.
            fix = getattr(model, "_fix_state_dict_keys_on_load", None)
            if fix is not None:
                state = fix(dict(state)) or state
            load_into(model, state, file)
            return model
    shown = _shown(os.path.join(directory, WEIGHTS_NAMES[0]), folder)
    raise WeightsError(f"weights folder {folder}: missing {shown} (or {WEIGHTS_NAMES[1]} next to it)")


def _groups(channels: list[int]) -> int:
    return math.gcd(32, *channels)


def sample_size_problem(config: dict) -> str | None:
    """Why a random-init UNet cannot have ``sample_size`` (None: it can): each level below the first halves the
    side, so it must be a multiple of 2^(levels - 1).  Torch said "Sizes of tensors must match except in dimension
    1" at the warm-up; the plugin's ``config_problem`` says this at every start's config check."""
    side, levels = config["sample_size"], len(config["block_out_channels"])
    if side % 2 ** (levels - 1):
        return (f"{side} is not a multiple of {2 ** (levels - 1)}: each of the {levels - 1} levels below the first "
                "of block_out_channels halves the side")
    return None


def random_unet(config: dict, *, in_channels: int, num_classes: int | None = None) -> Any:
    """The UNet2DModel of a [model] table (random init from the current torch seed)."""
    from diffusers import UNet2DModel

    channels = list(config["block_out_channels"])
    n = len(channels)
    if problem := sample_size_problem(config):
        raise ValueError(f"[model] sample_size {problem}")
    attention = config["attention"]
    down = ["DownBlock2D"] * (n - 1) + ["AttnDownBlock2D" if attention else "DownBlock2D"]
    up = ["AttnUpBlock2D" if attention else "UpBlock2D"] + ["UpBlock2D"] * (n - 1)
    return UNet2DModel(
        sample_size=config["sample_size"],
        in_channels=in_channels,
        out_channels=in_channels,
        block_out_channels=tuple(channels),
        layers_per_block=config["layers_per_block"],
        down_block_types=tuple(down),
        up_block_types=tuple(up),
        norm_num_groups=_groups(channels),
        attention_head_dim=8,
        num_class_embeds=num_classes,
    )


def random_vqvae(config: dict) -> Any:
    """The VQModel of an LDM [model] table (random init from the current torch seed)."""
    from diffusers import VQModel

    channels = list(config["vq_block_out_channels"])
    n = len(channels)
    return VQModel(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=tuple(channels),
        layers_per_block=1,
        latent_channels=config["latent_channels"],
        num_vq_embeddings=config["num_vq_embeddings"],
        norm_num_groups=_groups(channels),
        sample_size=config["sample_size"] * 2 ** (n - 1),
    )
