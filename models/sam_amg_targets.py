"""SAM_AMG's optimised execution (``backend.optimize``): its targets and its accuracy gate.

Two targets of a ``Sam``:

- ``image_encoder``: the ViT, one image at a time (a fixed shape);
- ``mask_decoder``: the two-way transformer and mask heads, called once per
  batch of point prompts.  ``SamPredictor`` calls it with keyword arguments
  and a ``multimask_output`` flag, so the target is an adapter with
  positional tensors (multimask on, as the generator asks), and what is
  installed is :func:`decoder_shim`, which sends the generator's calls to
  the optimised callable and any other call to the original.

Both are fixed-shape targets (one image; ``points_per_batch`` prompts, the
generator's full batches): a call of another shape, such as the last,
smaller batch of an image's prompts, runs the original module.

The gate (segmentation): ``SamPredictor`` on one seeded ``GATE_SIDE``-pixel
image (on loaded weights, the cat of ``models/gate_photos.py`` instead: a
trained SAM's masks of a photograph are what users see) with one full batch
of seeded point prompts (``points_per_batch``, the shape the decoder runs
optimised), multimask; the masks are compared by IoU.
The plugin is ``models/sam_amg.py``.
"""

from __future__ import annotations

import functools
from typing import Any

from svc.model.api import OptimizationTarget

GATE_SEED = 1234
#: The photograph of ``models/gate_photos.py`` a SAM on loaded weights is gated on: the encoder's cost is the same
#: for any image, so one photograph costs no more than the seeded image it replaces.
GATE_PHOTO = "chelsea.jpg"
#: Side of the gate's image in pixels (the predictor resizes it to the encoder's input).
GATE_SIDE = 256
#: What ``backend.optimize = "auto"`` measures, per device (docs/optimize.md has the figures).
AUTO_CANDIDATES = {
    "cpu": ("bf16", "onnxruntime", "openvino", "bf16+openvino"),
    "cuda": ("fp16", "bf16"),
}


@functools.cache
def _shim_class() -> Any:
    from torch import nn

    class DecoderShim(nn.Module):
        """Stands in for ``Sam.mask_decoder``: multimask calls go to ``fast``, the others to the original."""

        def __init__(self, original: Any, fast: Any) -> None:
            super().__init__()
            self.original = original
            self.fast = fast

        def forward(self, image_embeddings: Any, image_pe: Any, sparse_prompt_embeddings: Any,
                    dense_prompt_embeddings: Any, multimask_output: bool) -> Any:
            if not multimask_output:
                return self.original(image_embeddings, image_pe, sparse_prompt_embeddings, dense_prompt_embeddings,
                                     multimask_output)
            return self.fast(image_embeddings, image_pe, sparse_prompt_embeddings, dense_prompt_embeddings)

    return DecoderShim


def _multimask(decoder: Any, embeddings: Any, pe: Any, sparse: Any, dense: Any) -> Any:
    return decoder(embeddings, pe, sparse, dense, True)


def sam_targets(sam: Any, encoder: Any, decoder: Any, points_per_batch: int) -> list:
    """The image encoder and the mask decoder of ``sam`` as optimisation targets.

    ``encoder`` and ``decoder`` are the modules ``sam`` was built with: what
    is installed in their place (an optimised stand-in, the shim) is never
    a target itself.
    """
    import torch

    from svc.optimize.apply import adapter

    device = sam.device
    side = encoder.img_size
    embedding_side = side // 16  # the ViT's patch size
    dim = sam.prompt_encoder.embed_dim

    def seeded(*shape: int) -> Any:
        return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device)

    def image(batch: int) -> tuple:
        return (seeded(1, 3, side, side),)

    def install_encoder(fn: Any) -> None:
        sam.image_encoder = fn

    decoder_call = adapter(decoder, _multimask)

    def prompts(batch: int) -> tuple:
        points = max(batch, points_per_batch)  # the generator's batches of point prompts
        return (seeded(1, dim, embedding_side, embedding_side), seeded(1, dim, embedding_side, embedding_side),
                seeded(points, 2, dim), seeded(points, dim, embedding_side, embedding_side))

    def install_decoder(fn: Any) -> None:
        sam.mask_decoder = decoder if fn is decoder_call else _shim_class()(decoder, fn)

    return [OptimizationTarget("image_encoder", encoder, image, install_encoder, batched=False),
            OptimizationTarget("mask_decoder", decoder_call, prompts, install_decoder, batched=False)]


def gate_image(side: int, seed: int = GATE_SEED) -> Any:
    """A seeded side x side x 3 uint8 image of smooth blobs (something to segment)."""
    import torch

    coarse = torch.randint(0, 256, (1, 3, 8, 8), generator=torch.Generator().manual_seed(seed)).float()
    smooth = torch.nn.functional.interpolate(coarse, size=(side, side), mode="bilinear")
    return smooth[0].round().to(torch.uint8).permute(1, 2, 0).numpy()


def gate_masks(sam: Any, points: int, image: Any = None) -> Any:
    """Masks (points x 3, H, W) of ``points`` seeded point prompts on ``image`` (H x W x 3 uint8; the seeded
    ``GATE_SIDE`` image when None), as installed."""
    import torch
    from segment_anything import SamPredictor

    image = gate_image(GATE_SIDE) if image is None else image
    height, width = image.shape[:2]
    predictor = SamPredictor(sam)
    generator = torch.Generator().manual_seed(GATE_SEED)
    with torch.inference_mode():
        predictor.set_image(image)
        coords = torch.rand(points, 1, 2, generator=generator) * torch.tensor([width, height])
        coords = predictor.transform.apply_coords_torch(coords.to(predictor.device), (height, width))
        labels = torch.ones(coords.shape[:2], dtype=torch.int, device=predictor.device)
        masks, _, _ = predictor.predict_torch(coords, labels, multimask_output=True)
    return masks.reshape(-1, *masks.shape[-2:]).cpu()
