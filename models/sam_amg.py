"""SAM_AMG: automatic mask generation with Segment Anything (``segment-anything``).

The model is ``segment_anything``'s ``Sam``: ``vit_b``, ``vit_l`` and
``vit_h`` are built by ``sam_model_registry`` (the official
``sam_vit_*.pth`` checkpoints load into them as they are; ``VARIANTS``
declares them as the pretrained variants ``sam_vit_b``, the default,
``sam_vit_l`` and ``sam_vit_h``), and ``tiny`` is
our small random-init default for CPUs: the same classes with a 2-layer,
64-wide ViT encoder on 256-pixel inputs and the standard prompt encoder and
mask decoder.  ``SamAutomaticMaskGenerator`` prompts a grid of points,
filters by predicted IoU and stability, and removes duplicates with NMS; its
parameters are the request's params.  The plugin runs the subclass in
``models/sam_amg_generator.py``, which applies the IoU filter before the
masks are upsampled to the image's size (the same masks, less work).

Per item: the image as an RGB uint8 array (Pillow, decode pool), after
checking that the generator's resize of its longest side to the encoder's
input keeps a pixel along the short side (an 8000x1 image fails its item
with status 5); the generator runs in the worker (one image at a time: the library has no
batch API).  ``data`` is the list of masks in the generator's order:
``segmentation`` (a base64 1-bit PNG of the image's size, or COCO RLE with
``options.mask_format = "rle"``), ``area`` (pixels), ``bbox`` (``[x, y, w,
h]`` in pixels, the COCO and SAM convention), ``predicted_iou`` and
``stability_score``.  ``options.max_results`` keeps the first N.  Job
progress counts the batches of ``points_per_batch`` point prompts done, of
those of every image of the batch.

Optimised execution (``backend.optimize``): the image encoder and the mask
decoder are the targets, the gate compares the masks of fixed point prompts
(``models/sam_amg_targets.py``).
"""

from __future__ import annotations

import copy
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from models.sam_amg_targets import AUTO_CANDIDATES, GATE_PHOTO, gate_masks, sam_targets
from svc.contract.schema import object_schema
from svc.model.api import IModel, IModelFactory, IOptimizable, report_progress
from svc.model.images import check_resize
from svc.model.weights import WEIGHTS_PROPERTIES, load_into, path_of, read_state_dict, version_of
from svc.weightstore.catalog import FileSource, Variant

ARCHS = ("tiny", "vit_b", "vit_l", "vit_h")
#: The tiny encoder: (embed dim, depth, heads, global attention layers, input side, window)
TINY: dict[str, Any] = {"embed_dim": 64, "depth": 2, "num_heads": 2, "global_attn_indexes": (1,), "img_size": 256,
                        "window_size": 8}

#: The official checkpoints (segment-anything's README): plain state dicts, loaded with
#: torch.load(weights_only=True).  The hex in each file name is the start of the file's MD5
#: (01ec64d2..., 0b319550..., 4b8939a8...), not of its SHA-256, so there is no hash_prefix: the
#: SHA-256 is recorded at the first pull and checked from then on.
SAM_RELEASE = "https://dl.fbaipublicfiles.com/segment_anything"
_OFFICIAL = (
    ("vit_b", "sam_vit_b_01ec64.pth", 375042383, "ViT-B image encoder, 91M parameters"),
    ("vit_l", "sam_vit_l_0b3195.pth", 1249524607, "ViT-L image encoder, 308M parameters"),
    ("vit_h", "sam_vit_h_4b8939.pth", 2564550879, "ViT-H image encoder, 636M parameters (needs a GPU)"),
)
VARIANTS = tuple(
    Variant(
        name=f"sam_{arch}",
        source=FileSource(url=f"{SAM_RELEASE}/{filename}", size=size),
        license="Apache-2.0",
        description=f"Segment Anything (Meta AI), {text}; the weights are Apache-2.0.",
        model={"arch": arch},
        default=arch == "vit_b",
    )
    for arch, filename, size, text in _OFFICIAL
)

PARAMS_SCHEMA = object_schema(
    {
        "points_per_side": {
            "type": "integer",
            "minimum": 1,
            "maximum": 64,
            "default": 32,
            "description": "Point prompts per image side (points_per_side^2 prompts).",
        },
        "pred_iou_thresh": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "default": 0.88,
            "description": "Keep masks whose predicted IoU is above this; 0 keeps every mask, negative IoUs "
                           "included (no filter, as in segment-anything).",
        },
        "stability_score_thresh": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "default": 0.95,
            "description": "Keep masks whose stability score is at least this.",
        },
        "box_nms_thresh": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "default": 0.7,
            "description": "Box IoU above which NMS drops the duplicate mask.",
        },
        "min_mask_region_area": {
            "type": "integer",
            "minimum": 0,
            "maximum": 1000000,
            "default": 0,
            "description": "Above 0: remove holes and islands smaller than this many pixels (OpenCV).",
        },
    },
    description="SAM_AMG parameters (those of SamAutomaticMaskGenerator).",
)


def build_sam(arch: str) -> Any:
    """A random-init ``Sam`` of ``arch`` (eval mode)."""
    from segment_anything import sam_model_registry

    if arch != "tiny":
        return sam_model_registry[arch](checkpoint=None)
    from functools import partial

    import torch
    from segment_anything.modeling import ImageEncoderViT, MaskDecoder, PromptEncoder, Sam, TwoWayTransformer

    prompt_dim, size, patch = 256, TINY["img_size"], 16
    sam = Sam(
        image_encoder=ImageEncoderViT(
            depth=TINY["depth"],
            embed_dim=TINY["embed_dim"],
            img_size=size,
            mlp_ratio=4,
            norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
            num_heads=TINY["num_heads"],
            patch_size=patch,
            qkv_bias=True,
            use_rel_pos=True,
            global_attn_indexes=TINY["global_attn_indexes"],
            window_size=TINY["window_size"],
            out_chans=prompt_dim,
        ),
        prompt_encoder=PromptEncoder(
            embed_dim=prompt_dim,
            image_embedding_size=(size // patch, size // patch),
            input_image_size=(size, size),
            mask_in_chans=16,
        ),
        mask_decoder=MaskDecoder(
            num_multimask_outputs=3,
            transformer=TwoWayTransformer(depth=2, embedding_dim=prompt_dim, mlp_dim=2048, num_heads=8),
            transformer_dim=prompt_dim,
            iou_head_depth=3,
            iou_head_hidden_dim=256,
        ),
        pixel_mean=[123.675, 116.28, 103.53],
        pixel_std=[58.395, 57.12, 57.375],
    )
    return sam.eval()


def generator_args(params: dict) -> dict:
    """SamAutomaticMaskGenerator keyword arguments from request params."""
    return {name: params[name] for name in PARAMS_SCHEMA["properties"]}


def prompt_batches(generator: Any, size: tuple[int, int]) -> int:
    """How many batches of point prompts ``generator`` runs on an image of ``size`` (rows, columns).

    The library's own loop: every crop box of every crop layer, each crop
    prompting its layer's point grid ``points_per_batch`` points at a time.
    """
    from segment_anything.utils.amg import generate_crop_boxes

    _, layers = generate_crop_boxes(size, generator.crop_n_layers, generator.crop_overlap_ratio)
    return sum(-(-len(generator.point_grids[layer]) // generator.points_per_batch) for layer in layers)


def count_prompt_batches(generator: Any, sizes: list[tuple[int, int]]) -> None:
    """Make ``generator`` report job progress: batches of point prompts done of those of all the images.

    The generator has no progress callback, so its per-batch method is
    wrapped on this instance; the total is counted up front (by
    :func:`prompt_batches`) so that ``steps`` is right from the first report.
    """
    total = sum(prompt_batches(generator, size) for size in sizes)
    run_batch = generator._process_batch
    done = 0

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal done
        data = run_batch(*args, **kwargs)
        done += 1
        report_progress(done, total)
        return data

    generator._process_batch = counted


@implementer(IModel, IOptimizable)
class SamAmgModel:
    """A built SAM on its device."""

    def __init__(self, sam: Any, device: str, version: str, points_per_batch: int, trained: bool = False) -> None:
        self.sam = sam
        self.encoder, self.decoder = sam.image_encoder, sam.mask_decoder  # as built (svc.optimize installs others)
        self.device = device
        self.version = version
        self.points_per_batch = points_per_batch
        #: Loaded weights (a file or a pretrained variant), not the random-init demo: the gate runs on a photograph.
        self.trained = trained
        self._photo: Any = None  # the gate's photograph as preprocess makes it, made at the first gate

    def preprocess(self, image: Any, params: dict) -> Any:
        import numpy as np
        from segment_anything.utils.transforms import ResizeLongestSide

        # The generator resizes the longest side to the encoder's input: a side that rounds to 0 would
        # fail the whole batch in predict (ENGINE_ERROR); here it fails this item, before decoding.
        height, width = ResizeLongestSide.get_preprocess_shape(image.height, image.width, self.sam.image_encoder.img_size)
        check_resize(image.size, (width, height))
        return np.asarray(image.convert("RGB"))  # H x W x 3 uint8, what the generator takes

    def batch_key(self, params: dict) -> Any:
        return tuple(sorted(generator_args(params).items()))

    def predict(self, inputs: list, params: dict) -> list:
        import torch

        from models.sam_amg_generator import make_generator

        # Masks stay run-length encoded until postprocess decodes them one at a time: as the library's
        # binary masks, every kept mask of an image would be held at the image's size at once.
        generator = make_generator(self.sam, points_per_batch=self.points_per_batch, output_mode="uncompressed_rle",
                                   **generator_args(params))
        count_prompt_batches(generator, [image.shape[:2] for image in inputs])
        with torch.inference_mode():  # as every plugin's forward pass (and what optimised targets were made under)
            return [generator.generate(image) for image in inputs]

    def postprocess(self, output: Any, params: dict, options: dict) -> list:
        from models.sam_amg_generator import mask_of
        from svc.model.imagecodec import encode_mask

        records = output[: options.get("max_results", len(output))]
        mask_format = options.get("mask_format", "png")
        return [
            {
                "segmentation": encode_mask(mask_of(r["segmentation"]), mask_format),
                "area": int(r["area"]),
                "bbox": [float(v) for v in r["bbox"]],
                "predicted_iou": float(r["predicted_iou"]),
                "stability_score": float(r["stability_score"]),
            }
            for r in records
        ]

    def warmup_input(self) -> Any:
        import numpy as np

        return np.full((64, 64, 3), 128, dtype=np.uint8)

    def optimization_targets(self) -> list:
        return sam_targets(self.sam, self.encoder, self.decoder, self.points_per_batch)

    def gate_outputs(self) -> Any:
        if self.trained and self._photo is None:
            from models.gate_photos import gate_photos

            (photo,) = gate_photos((GATE_PHOTO,))
            self._photo = self.preprocess(photo, {})
        return gate_masks(self.sam, self.points_per_batch, self._photo)

    def optimize_candidates(self, device: str) -> tuple:
        from svc.optimize.support import without_runtimes

        return AUTO_CANDIDATES.get(device, ()) + (without_runtimes(("compile",)) if device == "cpu" else ())


@implementer(IPlugin, IModelFactory)
class SamAmgFactory:
    catalog_id = "SAM_AMG"
    category = "segmentation"
    task = "automatic-mask-generation"
    needs_image = True
    options = ("max_results", "mask_format")
    data_schema = {
        "type": "array",
        "description": "Masks in the generator's order (at most options.max_results).",
        "items": {
            "type": "object",
            "required": ["segmentation", "area", "bbox", "predicted_iou", "stability_score"],
            "properties": {
                "segmentation": {
                    "oneOf": [
                        {"type": "string", "description": "Base64 1-bit PNG of the image's size (mask_format png)."},
                        {
                            "type": "object",
                            "description": "COCO run-length encoding (mask_format rle; pycocotools.mask.decode).",
                            "required": ["size", "counts"],
                            "properties": {
                                "size": {"type": "array", "items": {"type": "integer", "minimum": 1},
                                         "minItems": 2, "maxItems": 2, "description": "[height, width]"},
                                "counts": {"type": "string"},
                            },
                        },
                    ]
                },
                "area": {"type": "integer", "minimum": 0, "description": "Pixels inside the mask."},
                "bbox": {
                    "type": "array",
                    "items": {"type": "number", "minimum": 0},
                    "minItems": 4,
                    "maxItems": 4,
                    "description": "[x, y, width, height] of the mask's box in image pixels, as segment-anything "
                    "gives it: width and height are the last column and row minus the first (0 for one pixel).",
                },
                "predicted_iou": {"type": "number", "description": "The model's estimate of the mask's quality."},
                "stability_score": {"type": "number", "description": "IoU of the mask under threshold changes."},
            },
        },
    }
    config_schema = object_schema(
        {
            **WEIGHTS_PROPERTIES,
            "arch": {
                "enum": list(ARCHS),
                "default": "tiny",
                "description": "tiny (small random-init CPU default) or the official vit_b, vit_l, vit_h "
                "(sam_vit_*.pth checkpoints load as they are).",
            },
            "points_per_side": {
                "type": "integer",
                "minimum": 1,
                "maximum": 64,
                "default": 32,
                "description": "Default of params.points_per_side (the library's is 32; fewer prompts are faster "
                "on a CPU).",
            },
            "points_per_batch": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1024,
                "default": 64,
                "description": "Point prompts run through the mask decoder at once (memory versus speed).",
            },
        },
        description="[model] table of SAM_AMG.",
    )

    variants = VARIANTS

    def params_schema(self, config: dict) -> dict:
        schema = copy.deepcopy(PARAMS_SCHEMA)
        schema["properties"]["points_per_side"]["default"] = config["points_per_side"]
        return schema

    def build(self, config: dict, device: str) -> SamAmgModel:
        import torch

        path = path_of(config)
        torch.manual_seed(config.get("seed", 0))
        sam = build_sam(config["arch"])
        if path is not None:
            load_into(sam, read_state_dict(path), path)
        sam.eval().to(device)
        return SamAmgModel(sam, device, version_of(config, path), config["points_per_batch"], trained=path is not None)


sam_amg = SamAmgFactory()
