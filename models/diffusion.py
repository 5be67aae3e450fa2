"""DDPM, DDIM, CLS_COND_DDIM and LDM: diffusion sampling with diffusers.

One module, four factories sharing one sampler:

- DDPM: ``UNet2DModel`` + ``DDPMScheduler`` (ancestral sampling);
- DDIM: ``UNet2DModel`` + ``DDIMScheduler`` (``eta`` 0 = deterministic DDIM, 1 = DDPM-like);
- CLS_COND_DDIM: a class-conditioned ``UNet2DModel`` (``num_class_embeds``) + ``DDIMScheduler``, or, from a
  DiT folder (``transformer/``, ``vae/``, ``scheduler/``), diffusers' ``DiTTransformer2DModel`` with
  classifier-free guidance, decoded by its ``AutoencoderKL`` (``DiTPipeline``'s sampling);
- LDM: a latent ``UNet2DModel`` + ``DDIMScheduler``, decoded by a ``VQModel``.

The sampling loop is the one of diffusers' ``DDPMPipeline``, ``DDIMPipeline``
and ``LDMPipeline`` (same noise draw, same scheduler calls, same conversion
to 8-bit pixels), so a served image equals the pipeline's for the same seed
and step count; it differs only in passing the seeded generator to every
scheduler step (``LDMPipeline`` does not, so its ``eta`` > 0 samples cannot
be reproduced) and in taking the class labels of CLS_COND_DDIM.

The input image is required by the envelope and ignored.  Params:
``timesteps`` (1..the schedule length; default the configured schedule length:
the ``[model]`` key ``timesteps``, else the whole schedule),
``seed`` (absent: one is drawn and reported), ``eta`` (DDIM-based models),
``class_id`` (CLS_COND_DDIM).  Each item is one sample; the items of a
request share its params, so with a ``seed`` they are the same image.
Noise is drawn on the CPU from ``torch.Generator(seed)``, so a seed gives the
same starting noise on any device.  Each scheduler step is reported as job
progress (``step`` of ``steps`` = the sampled timesteps; the VQ decoding of
LDM follows the last step).

Weights: ``"random"`` builds the architecture of the [model] table from its
seed; a path names a folder written by ``save_pretrained``: a pipeline's
(``unet/``, ``scheduler/``, and ``vqvae/`` for LDM) or the same subfolders
written by each component's ``save_pretrained``.  A hub snapshot loads as it
is: like diffusers' ``load_sub_model``, a component without its subfolder is
read from the folder's root (``google/ddpm-*`` keep the UNet's
``config.json`` and weights and ``scheduler_config.json`` there), and the
attention tensors of checkpoints written before diffusers renamed them
(``query``/``key``/``value``/``proj_attn``) are renamed as diffusers'
``from_pretrained`` does.  The folder's own configs then define the
architecture and the schedule.

Pretrained variants (``variants``, fetched by ``svcctl weights pull`` with
``svc.weightstore.hub``): the DDPM checkpoints of Ho et al. for DDPM and DDIM
(DDIM samples the same UNets with ``DDIMScheduler``, as diffusers' docs do),
CompVis' CelebA-HQ latent diffusion model for LDM, and for CLS_COND_DDIM
Facebook's DiT-XL/2 on ImageNet: no class-conditional ``UNet2DModel``
checkpoint is published for diffusers, so the class-conditional model is a
DiT, sampled as ``DiTPipeline`` does (with the same ``DDIMScheduler``).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from dataclasses import dataclass
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from svc.modelapi import IModel, IModelFactory, report_progress
from svc.schema import object_schema
from svc.weights import WEIGHTS_PROPERTIES, WeightsError, load_into, path_of, read_state_dict, version_of
from svc.weightstore.catalog import HubSource, Variant

SEED_MAX = 2**32 - 1
DIT_GUIDANCE = 4.0  # DiTPipeline's default classifier-free guidance
#: facebook/DiT-* were saved before diffusers split Transformer2DModel: the same model, the same tensor names.
LEGACY_CLASS_NAMES = ("Transformer2DModel",)
WEIGHTS_NAMES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")

UNET_PROPERTIES: dict[str, dict] = {
    "sample_size": {
        "type": "integer",
        "minimum": 8,
        "maximum": 1024,
        "default": 32,
        "description": "Side of the sampled square (pixels; latent cells for LDM). Random init only.",
    },
    "channels": {"enum": [1, 3], "default": 3, "description": "Image channels (1 grey, 3 RGB). Random init only."},
    "block_out_channels": {
        "type": "array",
        "items": {"type": "integer", "minimum": 8, "maximum": 2048},
        "minItems": 1,
        "maxItems": 6,
        "default": [32, 64, 64],
        "description": "UNet channels per resolution level. Random init only.",
    },
    "layers_per_block": {"type": "integer", "minimum": 1, "maximum": 4, "default": 1,
                         "description": "ResNet layers per UNet level. Random init only."},
    "attention": {"type": "boolean", "default": True,
                  "description": "Self-attention at the lowest resolution level. Random init only."},
}
SCHEDULE_PROPERTIES: dict[str, dict] = {
    "num_train_timesteps": {
        "type": "integer",
        "minimum": 1,
        "maximum": 10000,
        "default": 1000,
        "description": "Schedule length: the default and the maximum of params.timesteps. A weights folder "
        "with scheduler/scheduler_config.json sets it instead.",
    },
    "timesteps": {
        "type": "integer",
        "minimum": 1,
        "maximum": 10000,
        "description": "The configured schedule length: the sampling steps used when params.timesteps is absent "
        "(capped at num_train_timesteps). Absent: num_train_timesteps itself, the whole training schedule "
        "(DDPM's way); DDIM samplers are made for few steps (the shipped DDIM-based configs say 50).",
    },
    "beta_schedule": {
        "enum": ["linear", "scaled_linear", "squaredcos_cap_v2"],
        "default": "linear",
        "description": "Noise schedule (without a scheduler/ folder).",
    },
}
CLASS_PROPERTIES: dict[str, dict] = {
    "num_classes": {"type": "integer", "minimum": 1, "maximum": 100000, "default": 10,
                    "description": "Classes of the class-conditioned UNet. Random init only."},
}
LATENT_PROPERTIES: dict[str, dict] = {
    "sample_size": {**UNET_PROPERTIES["sample_size"], "default": 16},
    "latent_channels": {"type": "integer", "minimum": 1, "maximum": 16, "default": 3,
                        "description": "Channels of the latent space. Random init only."},
    "vq_block_out_channels": {
        "type": "array",
        "items": {"type": "integer", "minimum": 8, "maximum": 2048},
        "minItems": 1,
        "maxItems": 5,
        "default": [32, 64, 64],
        "description": "VQModel channels per level; the image side is sample_size * 2^(levels - 1). Random init only.",
    },
    "num_vq_embeddings": {"type": "integer", "minimum": 2, "maximum": 65536, "default": 256,
                          "description": "VQ codebook size. Random init only."},
}


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


def _folder(path: str) -> str:
    if not os.path.isdir(path):
        raise WeightsError(f"weights {path}: the diffusion models load a folder written by save_pretrained, not a file")
    return path


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
    for file in (os.path.join(_folder(path), "scheduler", "scheduler_config.json"),
                 os.path.join(path, "scheduler_config.json")):
        if os.path.exists(file):
            return _read_json(file, path)
    return None


def component_config(config: dict, sub: str) -> dict | None:
    """The ``config.json`` of a weights folder's component (``unet``, ``vqvae``), or None for random init."""
    path = path_of(config)
    if path is None:
        return None
    return _read_json(os.path.join(component_dir(_folder(path), sub), "config.json"), path)


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


def random_unet(config: dict, *, in_channels: int, num_classes: int | None = None) -> Any:
    """The UNet2DModel of a [model] table (random init from the current torch seed)."""
    from diffusers import UNet2DModel

    channels = list(config["block_out_channels"])
    n = len(channels)
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


# -- the sampler ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One item: its seed; the warm-up item runs a single step."""

    seed: int
    warmup: bool = False


def to_pixels(images: Any) -> Any:
    """Model-space images (B, C, H, W) in [-1, 1] to (B, H, W, C) uint8, as diffusers' pipelines do."""
    images = (images / 2 + 0.5).clamp(0, 1).cpu().permute(0, 2, 3, 1).float().numpy()
    return (images * 255).round().astype("uint8")


@implementer(IModel)
class DiffusionModel:
    """A built denoiser (a UNet, or CLS_COND_DDIM's DiT transformer) with its scheduler and latent decoder."""

    def __init__(self, *, unet: Any, scheduler: Any, vqvae: Any, device: str, version: str, uses_eta: bool,
                 conditional: bool, dit: bool = False) -> None:
        self.unet = unet  # a UNet2DModel, or a DiTTransformer2DModel when ``dit``
        self.dit = dit  # DiTPipeline's sampling: classifier-free guidance, learned sigma dropped, KL decoder
        self.scheduler = scheduler  # the template: every run uses a fresh copy (set_timesteps mutates it)
        self.vqvae = vqvae
        self.device = device
        self.version = version
        self.uses_eta = uses_eta
        self.conditional = conditional

    def preprocess(self, image: Any, params: dict) -> Sample:
        seed = params.get("seed")
        return Sample(secrets.randbelow(SEED_MAX + 1) if seed is None else seed)

    def batch_key(self, params: dict) -> Any:
        return (params["timesteps"], params.get("eta"), params.get("class_id"), params.get("seed"),
                params.get("guidance_scale"))

    def predict(self, inputs: list, params: dict) -> list:
        steps = 1 if all(i.warmup for i in inputs) else params["timesteps"]
        classes = [params["class_id"]] * len(inputs) if self.conditional else None
        pixels = self.sample([i.seed for i in inputs], steps, params.get("eta", 0.0), classes,
                             params.get("guidance_scale", DIT_GUIDANCE))
        return [(p, i.seed) for p, i in zip(pixels, inputs)]

    def sample(self, seeds: list[int], steps: int, eta: float = 0.0, classes: list[int] | None = None,
               guidance: float = DIT_GUIDANCE) -> Any:
        """Images (B, H, W, C) uint8 from one seed per image, ``steps`` scheduler steps."""
        import torch
        from diffusers.utils.torch_utils import randn_tensor

        if self.dit:
            return self.sample_dit(seeds, steps, eta, classes or [0] * len(seeds), guidance)
        unet = self.unet
        scheduler = type(self.scheduler).from_config(self.scheduler.config)
        generators = [torch.Generator("cpu").manual_seed(s) for s in seeds]
        generator = generators[0] if len(generators) == 1 else generators
        size = unet.config.sample_size
        shape = (len(seeds), unet.config.in_channels, *((size, size) if isinstance(size, int) else size))
        extra = {"eta": eta} if self.uses_eta else {}
        labels = None if classes is None else torch.tensor(classes, device=self.device, dtype=torch.long)
        with torch.inference_mode():
            x = randn_tensor(shape, generator=generator, device=torch.device(self.device), dtype=unet.dtype)
            x = x * scheduler.init_noise_sigma
            scheduler.set_timesteps(steps)
            total = len(scheduler.timesteps)
            for done, t in enumerate(scheduler.timesteps, start=1):
                model_input = scheduler.scale_model_input(x, t)
                if labels is None:
                    out = unet(model_input, t).sample
                else:
                    out = unet(model_input, t, class_labels=labels).sample
                x = scheduler.step(out, t, x, generator=generator, **extra).prev_sample
                report_progress(done, total)
            if self.vqvae is not None:
                x = self.vqvae.decode(x / self.vqvae.config.scaling_factor).sample
            return to_pixels(x)

    def sample_dit(self, seeds: list[int], steps: int, eta: float, classes: list[int], guidance: float) -> Any:
        """DiTPipeline's loop: the conditional and the null-class halves of one batch, mixed by ``guidance``.

        The same noise draw, calls and arithmetic as diffusers' ``DiTPipeline``
        (so the image is the pipeline's for a seed, a class and a step count),
        plus the seeded generators in every scheduler step for ``eta`` > 0.
        """
        import torch
        from diffusers.utils.torch_utils import randn_tensor

        net = self.unet
        scheduler = type(self.scheduler).from_config(self.scheduler.config)
        n = len(seeds)
        generators = [torch.Generator("cpu").manual_seed(s) for s in seeds]
        generator = generators[0] if n == 1 else generators
        channels, size = net.config.in_channels, net.config.sample_size
        device = torch.device(self.device)
        guided = guidance > 1
        # The doubled batch draws step noise (eta > 0) from the same seeded generators.
        step_generator = generator if n == 1 or not guided else generators + generators
        extra = {"eta": eta} if eta else {}
        with torch.inference_mode():
            latents = randn_tensor((n, channels, size, size), generator=generator, device=device, dtype=net.dtype)
            x = torch.cat([latents] * 2) if guided else latents
            labels = torch.tensor(classes, device=device).reshape(-1)
            if guided:
                labels = torch.cat([labels, torch.tensor([net.config.num_embeds_ada_norm] * n, device=device)], 0)
            scheduler.set_timesteps(steps)
            for t in scheduler.timesteps:
                if guided:
                    half = x[: len(x) // 2]
                    x = torch.cat([half, half], dim=0)
                x = scheduler.scale_model_input(x, t)
                timesteps = t[None].to(device) if len(t.shape) == 0 else t
                out = net(x, timestep=timesteps.expand(x.shape[0]), class_labels=labels).sample
                if guided:
                    eps, rest = out[:, :channels], out[:, channels:]
                    cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
                    half_eps = uncond_eps + guidance * (cond_eps - uncond_eps)
                    eps = torch.cat([half_eps, half_eps], dim=0)
                    out = torch.cat([eps, rest], dim=1)
                if net.config.out_channels // 2 == channels:  # a learned variance: only eps drives the step
                    out, _ = torch.split(out, channels, dim=1)
                x = scheduler.step(out, t, x, generator=step_generator, **extra).prev_sample
            latents = x.chunk(2, dim=0)[0] if guided else x
            latents = 1 / self.vqvae.config.scaling_factor * latents
            return to_pixels(self.vqvae.decode(latents).sample)

    def postprocess(self, output: Any, params: dict, options: dict) -> dict:
        from PIL import Image

        from svc.imagecodec import encode_image

        pixels, seed = output
        image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
        data = {
            "image": encode_image(image, options.get("image_format", "png")),
            "width": image.width,
            "height": image.height,
            "seed": seed,
        }
        if self.conditional:
            data["class_id"] = params["class_id"]
        return data

    def warmup_input(self) -> Sample:
        return Sample(0, warmup=True)


# -- pretrained variants ------------------------------------------------------------------------

#: What a diffusers repository snapshot needs: the configs and one weights file per component.
HUB_PATTERNS = ("*.json", "*.safetensors", "*.bin")
DDPM_CIFAR10 = HubSource("google/ddpm-cifar10-32", allow_patterns=HUB_PATTERNS, size=143_000_000)
DDPM_CELEBAHQ = HubSource("google/ddpm-celebahq-256", allow_patterns=HUB_PATTERNS, size=455_000_000)


def _ddpm_variants(sampler: str) -> tuple[Variant, ...]:
    return (
        Variant("cifar10-32", DDPM_CIFAR10, "apache-2.0",
                f"Ho et al.'s DDPM on CIFAR-10, 32x32 ({sampler}); about 36M parameters, fine on a CPU.",
                default=True),
        Variant("celebahq-256", DDPM_CELEBAHQ, "apache-2.0",
                f"Ho et al.'s DDPM on CelebA-HQ faces, 256x256 ({sampler}); about 114M parameters, "
                "minutes per sample on a CPU: for the gpu profile."),
    )


CLS_COND_VARIANTS = (
    Variant("dit-xl-2-256",
            HubSource("facebook/DiT-XL-2-256", allow_patterns=HUB_PATTERNS, size=3_050_000_000),
            "cc-by-nc-4.0",
            "Facebook's DiT-XL/2 on ImageNet (1000 classes), 256x256, classifier-free guidance; a transformer "
            "denoiser with a KL autoencoder, about 760M parameters: for the gpu profile. Non-commercial licence.",
            default=True),
)

LDM_VARIANTS = (
    Variant("celebahq-256",
            HubSource("CompVis/ldm-celebahq-256", allow_patterns=HUB_PATTERNS, size=1_300_000_000),
            "apache-2.0",
            "CompVis' latent diffusion on CelebA-HQ faces: 64x64x3 latents decoded to 256x256 by its VQModel; "
            "about 330M parameters, for the gpu profile.",
            default=True),
)


# -- the factories -------------------------------------------------------------------------------


class _DiffusionFactory:
    """What the four diffusion factories share; subclasses set the class attributes."""

    catalog_id = ""
    task = ""
    scheduler = "ddim"  # or "ddpm"
    conditional = False
    latent = False
    category = "generation"
    needs_image = False
    options = ("image_format",)
    variants: tuple[Variant, ...] = ()  # see "Pretrained variants" in the module docstring

    @property
    def config_schema(self) -> dict:
        props = {**WEIGHTS_PROPERTIES, **UNET_PROPERTIES, **SCHEDULE_PROPERTIES}
        if self.conditional:
            props.update(CLASS_PROPERTIES)
        if self.latent:
            del props["channels"]
            props.update(LATENT_PROPERTIES)
        return object_schema(props, description=f"[model] table of {self.catalog_id}.")

    @property
    def data_schema(self) -> dict:
        props = {
            "image": {"type": "string", "description": "The sample, base64 in options.image_format (PNG by default)."},
            "width": {"type": "integer", "minimum": 1},
            "height": {"type": "integer", "minimum": 1},
            "seed": {"type": "integer", "minimum": 0, "maximum": SEED_MAX,
                     "description": "The seed of this sample: send it as params.seed to get the same image again."},
        }
        if self.conditional:
            props["class_id"] = {"type": "integer", "minimum": 0, "description": "The class sampled."}
        return {"type": "object", "description": "One generated image.", "required": list(props), "properties": props}

    def schedule_length(self, config: dict) -> int:
        folder = scheduler_config(config)
        if folder is not None and isinstance(folder.get("num_train_timesteps"), int):
            return folder["num_train_timesteps"]
        return config["num_train_timesteps"]

    def is_dit(self, config: dict) -> bool:
        """CLS_COND_DDIM on a DiT folder (``transformer/``, ``vae/``, ``scheduler/``: DiTPipeline's layout)."""
        path = path_of(config)
        return (self.conditional and path is not None
                and os.path.isfile(os.path.join(_folder(path), "transformer", "config.json")))

    def default_steps(self, config: dict) -> int:
        """The steps of a request without ``params.timesteps`` (SPEC: "the configured schedule length").

        The ``[model]`` key ``timesteps`` when set, capped at the schedule
        length (a weights folder may bring a shorter schedule); else the whole
        schedule.  A DDIM sampler runs a 50-step subsequence of a 1000-step
        schedule in seconds on a CPU, where the whole schedule takes minutes.
        """
        n = self.schedule_length(config)
        configured = config.get("timesteps")
        return n if configured is None else min(configured, n)

    def num_classes(self, config: dict) -> int:
        if self.is_dit(config):
            dit = component_config(config, "transformer") or {}
            n = dit.get("num_embeds_ada_norm")
            if not isinstance(n, int) or n < 1:
                raise WeightsError(f"weights folder {path_of(config)}: transformer/config.json has no "
                                   "num_embeds_ada_norm (CLS_COND_DDIM needs a class-conditioned DiT)")
            return n
        unet = component_config(config, "unet")
        if unet is None:
            return config["num_classes"]
        n = unet.get("num_class_embeds")
        if not isinstance(n, int) or n < 1:
            raise WeightsError(f"weights folder {path_of(config)}: unet/config.json has no num_class_embeds "
                               f"(CLS_COND_DDIM needs a class-conditioned UNet)")
        return n

    def params_schema(self, config: dict) -> dict:
        n = self.schedule_length(config)
        steps = self.default_steps(config)
        props: dict[str, dict] = {
            "timesteps": {
                "type": "integer",
                "minimum": 1,
                "maximum": n,
                "default": steps,
                "description": f"Sampling steps, 1..{n} (the schedule length); default {steps}, the configured "
                "schedule length.",
            },
            "seed": {
                "type": "integer",
                "minimum": 0,
                "maximum": SEED_MAX,
                "description": "Seed of the noise. Absent: one is drawn and reported in data.seed.",
            },
        }
        if self.scheduler == "ddim":
            props["eta"] = {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "default": 0.0,
                "description": "DDIM noise: 0 deterministic DDIM, 1 DDPM-like ancestral sampling.",
            }
        if self.conditional:
            k = self.num_classes(config)
            props["class_id"] = {"type": "integer", "minimum": 0, "maximum": k - 1, "default": 0,
                                 "description": f"The class to sample, 0..{k - 1}."}
            if self.is_dit(config):
                props["guidance_scale"] = {
                    "type": "number", "minimum": 1, "maximum": 20, "default": DIT_GUIDANCE,
                    "description": "Classifier-free guidance of the DiT weights (1: none; DiTPipeline's default 4).",
                }
        return object_schema(props, description=f"{self.catalog_id} parameters.")

    def build(self, config: dict, device: str) -> DiffusionModel:
        import torch
        from diffusers import DDIMScheduler, DDPMScheduler, UNet2DModel, VQModel

        scheduler_cls = DDPMScheduler if self.scheduler == "ddpm" else DDIMScheduler
        path = path_of(config)
        vqvae = None
        if path is None:
            torch.manual_seed(config.get("seed", 0))
            if self.latent:
                vqvae = random_vqvae(config)
                unet = random_unet(config, in_channels=config["latent_channels"])
            else:
                classes = config["num_classes"] if self.conditional else None
                unet = random_unet(config, in_channels=config["channels"], num_classes=classes)
        elif self.is_dit(config):
            from diffusers import AutoencoderKL, DiTTransformer2DModel

            self.num_classes(config)
            unet = load_component(DiTTransformer2DModel, path, "transformer", LEGACY_CLASS_NAMES)
            vqvae = load_component(AutoencoderKL, path, "vae")
        else:
            unet = load_component(UNet2DModel, _folder(path), "unet")
            if self.latent:
                vqvae = load_component(VQModel, path, "vqvae")
            if self.conditional:
                self.num_classes(config)  # a UNet without class embeddings is refused here
        folder_schedule = scheduler_config(config)
        if folder_schedule is not None:
            scheduler = scheduler_cls.from_config(folder_schedule)
        else:
            scheduler = scheduler_cls(num_train_timesteps=config["num_train_timesteps"],
                                      beta_schedule=config["beta_schedule"])
        unet.eval().to(device)
        if vqvae is not None:
            vqvae.eval().to(device)
        return DiffusionModel(unet=unet, scheduler=scheduler, vqvae=vqvae, device=device,
                              version=version_of(config, path), uses_eta=self.scheduler == "ddim",
                              conditional=self.conditional, dit=self.is_dit(config))


@implementer(IPlugin, IModelFactory)
class DDPMFactory(_DiffusionFactory):
    catalog_id = "DDPM"
    task = "unconditional-image-generation (DDPM)"
    scheduler = "ddpm"
    variants = _ddpm_variants("ancestral DDPM sampling")


@implementer(IPlugin, IModelFactory)
class DDIMFactory(_DiffusionFactory):
    catalog_id = "DDIM"
    task = "unconditional-image-generation (DDIM)"
    variants = _ddpm_variants("the same UNet sampled with DDIMScheduler")


@implementer(IPlugin, IModelFactory)
class ClassConditionalDDIMFactory(_DiffusionFactory):
    catalog_id = "CLS_COND_DDIM"
    task = "class-conditional-image-generation (DDIM)"
    conditional = True
    variants = CLS_COND_VARIANTS


@implementer(IPlugin, IModelFactory)
class LDMFactory(_DiffusionFactory):
    catalog_id = "LDM"
    task = "unconditional-image-generation (latent diffusion, DDIM)"
    latent = True
    variants = LDM_VARIANTS


ddpm = DDPMFactory()
ddim = DDIMFactory()
cls_cond_ddim = ClassConditionalDDIMFactory()
ldm = LDMFactory()
