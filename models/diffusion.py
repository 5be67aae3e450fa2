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

import os

from twisted.plugin import IPlugin
from zope.interface import implementer

from models.diffusion_sampler import DIT_GUIDANCE, SEED_MAX, DiffusionModel
from models.diffusion_weights import (
    LEGACY_CLASS_NAMES,
    check_pipeline,
    component_config,
    load_component,
    random_unet,
    random_vqvae,
    sample_size_problem,
    scheduler_config,
    weights_folder,
)
from svc.contract.schema import object_schema
from svc.model.api import IModelFactory
from svc.model.weights import WEIGHTS_PROPERTIES, WeightsError, path_of, version_of
from svc.weightstore.catalog import HubSource, Variant

UNET_PROPERTIES: dict[str, dict] = {
    "sample_size": {
        "type": "integer",
        "minimum": 8,
        "maximum": 1024,
        "default": 32,
        "description": "Side of the sampled square (pixels; latent cells for LDM): a multiple of 2^(levels - 1) "
        "of block_out_channels (each lower level halves it). Random init only.",
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


# -- pretrained variants ------------------------------------------------------------------------

#: What a diffusers repository snapshot needs: the configs and one weights file per component.
HUB_PATTERNS = ("*.json", "*.safetensors", "*.bin")
DDPM_CIFAR10 = HubSource("google/ddpm-cifar10-32", allow_patterns=HUB_PATTERNS, size=143_000_000)
DDPM_CELEBAHQ = HubSource("google/ddpm-celebahq-256", allow_patterns=HUB_PATTERNS, size=455_000_000)


def _ddpm_variants(sampler: str) -> tuple[Variant, ...]:
    return (
        Variant("cifar10-32", DDPM_CIFAR10, "Apache-2.0",
                f"Ho et al.'s DDPM on CIFAR-10, 32x32 ({sampler}); about 36M parameters, fine on a CPU.",
                default=True),
        Variant("celebahq-256", DDPM_CELEBAHQ, "Apache-2.0",
                f"Ho et al.'s DDPM on CelebA-HQ faces, 256x256 ({sampler}); about 114M parameters, "
                "minutes per sample on a CPU: for the gpu profile."),
    )


CLS_COND_VARIANTS = (
    Variant("dit-xl-2-256",
            HubSource("facebook/DiT-XL-2-256", allow_patterns=HUB_PATTERNS, size=3_050_000_000),
            "CC-BY-NC-4.0",
            "Facebook's DiT-XL/2 on ImageNet (1000 classes), 256x256, classifier-free guidance; a transformer "
            "denoiser with a KL autoencoder, about 760M parameters: for the gpu profile. Non-commercial licence.",
            default=True),
)

LDM_VARIANTS = (
    Variant("celebahq-256",
            HubSource("CompVis/ldm-celebahq-256", allow_patterns=HUB_PATTERNS, size=1_300_000_000),
            "Apache-2.0",
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
                and os.path.isfile(os.path.join(weights_folder(path), "transformer", "config.json")))

    def default_steps(self, config: dict) -> int:
        """The steps of a request without ``params.timesteps`` (docs/contract.md, Requests: "the configured schedule length").

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

    def config_problem(self, config: dict) -> tuple[str, str] | None:
        """The ``[model]`` keys that are fine alone but not together: a random-init ``sample_size`` that the
        levels of ``block_out_channels`` cannot halve (a weights folder's sizes are its own)."""
        problem = sample_size_problem(config) if path_of(config) is None else None
        return ("sample_size", problem) if problem else None

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
        if path is not None:
            kind = "dit" if self.is_dit(config) else "latent" if self.latent else "pixel"
            check_pipeline(weights_folder(path), kind, self.catalog_id)
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
            unet = load_component(UNet2DModel, weights_folder(path), "unet")
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
