"""The sampling loop of the diffusion models (``DiffusionModel``), shared by the four factories.

The loop is the one of diffusers' ``DDPMPipeline``, ``DDIMPipeline``,
``LDMPipeline`` and ``DiTPipeline``; see ``models/diffusion.py`` for what it
serves and how it differs from them.

Optimised execution (``backend.optimize``, ``svc.optimize``): the targets are
the denoiser (called as ``denoise(x, t[, labels])``, returning the noise
prediction) and, for LDM and the DiT weights, the latent decoder (``decode(z)``).
The accuracy gate samples one seeded image in ``GATE_STEPS`` steps and
compares every step's noise prediction and the final image (the generation
gate).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from zope.interface import implementer

from svc.model.api import IModel, IOptimizable, OptimizationTarget, report_progress

SEED_MAX = 2**32 - 1
DIT_GUIDANCE = 4.0  # DiTPipeline's default classifier-free guidance
#: The accuracy gate: one image of this seed, sampled in this many steps.
GATE_SEED = 1234
GATE_STEPS = 3
#: What ``backend.optimize = "auto"`` measures, per device (docs/optimize.md has the figures).
AUTO_CANDIDATES = {
    "cpu": ("jit", "onnxruntime", "openvino", "bf16+openvino"),
    "cuda": ("fp16", "fp16+cuda_graphs"),
}


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


def _call_unet(unet: Any, x: Any, t: Any, labels: Any = None) -> Any:
    return unet(x, t, class_labels=labels, return_dict=False)[0]


def _call_dit(net: Any, x: Any, timesteps: Any, labels: Any) -> Any:
    return net(x, timestep=timesteps, class_labels=labels, return_dict=False)[0]


def _call_decoder(autoencoder: Any, z: Any) -> Any:
    return autoencoder.decode(z, return_dict=False)[0]


@implementer(IModel, IOptimizable)
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
        from svc.optimize.apply import adapter

        # What the loops call: adapters with positional tensors in and out, or their optimised stand-ins.
        self.denoiser = adapter(unet, _call_dit if dit else _call_unet)
        self.denoise = self.denoiser
        self.decoder = adapter(vqvae, _call_decoder) if vqvae is not None else None
        self.decode = self.decoder

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
               guidance: float = DIT_GUIDANCE, record: list | None = None) -> Any:
        """Images (B, H, W, C) uint8 from one seed per image, ``steps`` scheduler steps.

        ``record``: a list that receives every step's noise prediction (the accuracy gate).
        """
        import torch
        from diffusers.utils.torch_utils import randn_tensor

        if self.dit:
            return self.sample_dit(seeds, steps, eta, classes or [0] * len(seeds), guidance, record)
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
                out = self.denoise(model_input, t) if labels is None else self.denoise(model_input, t, labels)
                if record is not None:
                    record.append(out.float().cpu())
                x = scheduler.step(out, t, x, generator=generator, **extra).prev_sample
                report_progress(done, total)
            if self.decode is not None:
                x = self.decode(x / self.vqvae.config.scaling_factor)
            return to_pixels(x)

    def sample_dit(self, seeds: list[int], steps: int, eta: float, classes: list[int], guidance: float,
                   record: list | None = None) -> Any:
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
            total = len(scheduler.timesteps)
            for done, t in enumerate(scheduler.timesteps, start=1):
                if guided:
                    half = x[: len(x) // 2]
                    x = torch.cat([half, half], dim=0)
                x = scheduler.scale_model_input(x, t)
                timesteps = t[None].to(device) if len(t.shape) == 0 else t
                out = self.denoise(x, timesteps.expand(x.shape[0]), labels)
                if record is not None:
                    record.append(out.float().cpu())
                if guided:
                    eps, rest = out[:, :channels], out[:, channels:]
                    cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
                    half_eps = uncond_eps + guidance * (cond_eps - uncond_eps)
                    eps = torch.cat([half_eps, half_eps], dim=0)
                    out = torch.cat([eps, rest], dim=1)
                if net.config.out_channels // 2 == channels:  # a learned variance: only eps drives the step
                    out, _ = torch.split(out, channels, dim=1)
                x = scheduler.step(out, t, x, generator=step_generator, **extra).prev_sample
                report_progress(done, total)  # the job's progress, and where abandoned work stops
            latents = x.chunk(2, dim=0)[0] if guided else x
            latents = 1 / self.vqvae.config.scaling_factor * latents
            assert self.decode is not None  # a latent model has its decoder
            return to_pixels(self.decode(latents))

    def postprocess(self, output: Any, params: dict, options: dict) -> dict:
        from PIL import Image

        from svc.model.imagecodec import encode_image

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

    # -- optimised execution (svc.model.api.IOptimizable) ----------------------------------------

    def optimization_targets(self) -> list:
        import torch

        net, device = self.unet, torch.device(self.device)
        channels, size = net.config.in_channels, net.config.sample_size
        size = (size, size) if isinstance(size, int) else tuple(size)

        def noisy(batch: int) -> Any:
            generator = torch.Generator().manual_seed(0)
            return torch.randn((batch, channels, *size), generator=generator).to(device, net.dtype)

        def denoiser_inputs(batch: int) -> tuple:
            t = torch.tensor(self.scheduler.config.num_train_timesteps // 2, device=device)
            labels = torch.zeros(batch, dtype=torch.long, device=device)
            if self.dit:
                return noisy(batch), t.expand(batch), labels
            return (noisy(batch), t, labels) if self.conditional else (noisy(batch), t)

        def install_denoiser(fn: Any) -> None:
            self.denoise = fn

        targets = [OptimizationTarget("denoiser", self.denoiser, denoiser_inputs, install_denoiser)]
        if self.decoder is not None:
            def latents(batch: int) -> tuple:
                return (noisy(batch),)

            def install_decoder(fn: Any) -> None:
                self.decode = fn

            targets.append(OptimizationTarget("decoder", self.decoder, latents, install_decoder))
        return targets

    def gate_outputs(self) -> dict:
        noise: list = []
        image = self.sample([GATE_SEED], GATE_STEPS, 0.0, [0] if self.conditional else None, DIT_GUIDANCE, noise)
        return {"noise": noise, "image": image}

    def optimize_candidates(self, device: str) -> tuple:
        from svc.optimize.support import without_runtimes

        return AUTO_CANDIDATES.get(device, ()) + (without_runtimes(("compile",)) if device == "cpu" else ())
