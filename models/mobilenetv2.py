"""MOBILENETV2: ImageNet classification with torchvision's ``mobilenet_v2``.

Standard ImageNet preprocessing (resize the short side to ``resize``, center
crop 224, normalize: torchvision's presets), batched forward pass under
``torch.inference_mode()``, softmax, top-k.  ``resize`` follows the weights:
torchvision evaluates ``IMAGENET1K_V1`` at 256 and ``IMAGENET1K_V2`` at 232,
and each pretrained variant implies its value (``[model] resize``; 256 for
random init and local files).  Large JPEGs are decoded at a reduced DCT
scale that still covers ``resize`` px (Pillow ``draft``), which cuts decode
time by about a third.  The resize of the short side is checked before
decoding (``svc.model.images.check_resize``): an image whose long side would pass
65536 (aspect ratio above 256:1; an 8000x1 PNG would become a 2,048,000x256
intermediate of 1.5 GB) fails its item with status 5.

Pretrained variants (``svcctl weights pull MOBILENETV2``): torchvision's
``IMAGENET1K_V1`` and ``IMAGENET1K_V2`` state dicts (BSD-3-Clause), checked
by the hash prefix of their file names as torch.hub checks them.  V2 is the
default: 72.154 % top-1 against 71.878 % for V1 (torchvision's figures), at
the same size and cost.

``preprocess`` (a decode thread, or the worker with ``decode_in_worker``)
decodes with Pillow and resizes and crops as torchvision's ``Resize`` +
``CenterCrop`` (antialiased bilinear) do: in torch's vectorised uint8 kernel
where the CPU has it, in about a third of Pillow's time, else with Pillow on
the region that the crop keeps only (``svc.model.images.resize_center_crop``).
The pixels are torchvision's on the Pillow image up to one level of rounding
(``tests/unit/test_mobilenetv2_preprocess.py``).
An item is the crop as uint8 HWC (a numpy array, no copy into a tensor).

The float conversion and the normalisation are part of the module the model
runs (:func:`pixel_net`: uint8 NHWC pixels in, logits out), batched in the
worker thread, so that no thread but the worker starts OpenMP work (see
``IModel.preprocess``), and so that an optimised mode runs them in its own
graph: OpenVINO and ONNX Runtime convert them with the network (a uint8 input
tensor, the layout change, the conversion and the mean/std in the compiled
model), ``jit`` fuses them.  Eager runs the same torch operations as
torchvision's ``ConvertImageDtype`` + ``Normalize``.

Optimised execution (``backend.optimize``, ``svc.optimize``): the network with
its input normalisation is the one target; the accuracy gate compares its
logits on ``GATE_IMAGES`` seeded random uint8 images and the three
photographs of ``models/gate_photos.py`` (the classification gate: same
top-1, logits within tolerance), so a conversion that gets the
normalisation wrong is refused like one that gets the network wrong.  ``auto`` tries ``AUTO_CANDIDATES``, and ``TORCH_BF16`` on a CPU
where neither OpenVINO nor ONNX Runtime imports.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from svc.contract.schema import object_schema
from svc.model.api import IModel, IModelFactory, IOptimizable, OptimizationTarget
from svc.model.images import check_resize, resize_center_crop, short_side_size
from svc.model.weights import WEIGHTS_PROPERTIES, calibrate_batchnorm, load_into, path_of, read_state_dict, version_of
from svc.weightstore.catalog import FileSource, Variant

CATEGORIES_FILE = os.path.join(os.path.dirname(__file__), "data", "imagenet_classes.txt")
NUM_CLASSES = 1000
CROP = 224
#: torchvision's evaluation resize of its original weights, used for random init and local files.
DEFAULT_RESIZE = 256
LICENSE = "BSD-3-Clause (torchvision)"
#: The accuracy gate's inputs: this many seeded random 224x224 images.
GATE_IMAGES = 4
GATE_SEED = 1234
#: What ``backend.optimize = "auto"`` measures, per device (docs/optimize.md has the figures).
AUTO_CANDIDATES = {
    "cpu": ("jit", "onnxruntime", "openvino", "bf16+openvino"),
    "cuda": ("channels_last+fp16", "channels_last+fp16+cuda_graphs"),
}
#: torch's own bfloat16 mode, tried on a CPU only where neither runtime imports (OpenVINO's bf16 is faster).
TORCH_BF16 = ("channels_last+bf16+jit",)

#: torchvision's MobileNet_V2_Weights: the same URLs; the hex after the last '-' of each file name is the
#: prefix of its SHA-256 that torch.hub checks (tests compare these with torchvision's own source).
VARIANTS = (
    Variant(
        name="IMAGENET1K_V1",
        source=FileSource(url="https://download.pytorch.org/models/mobilenet_v2-b0353104.pth",
                          hash_prefix="b0353104", size=14_213_447),
        license=LICENSE,
        description="torchvision's original recipe: ImageNet-1K top-1 71.878 %, top-5 90.286 % at resize 256 / crop 224.",
        model={"resize": 256},
    ),
    Variant(
        name="IMAGENET1K_V2",
        source=FileSource(url="https://download.pytorch.org/models/mobilenet_v2-7ebf99e0.pth",
                          hash_prefix="7ebf99e0", size=14_258_539),
        license=LICENSE,
        description="torchvision's improved recipe: ImageNet-1K top-1 72.154 %, top-5 90.822 % at resize 232 / "
        "crop 224.",
        model={"resize": 232},
        default=True,
    ),
)


_PIXEL_NET: Any = None


def pixel_net(net: Any, mean: Any, std: Any) -> Any:
    """``net`` behind torchvision's ``ConvertImageDtype`` + ``Normalize``: uint8 (B, H, W, 3) pixels in, logits out.

    One module, so that what converts or traces the network (OpenVINO, ONNX
    Runtime, ``jit``) takes the normalisation into its graph with it, and
    the runtime reads the uint8 batch as the worker stacked it.  The layout
    change follows the network's weights: contiguous NCHW for eager (the
    tensor torchvision's transforms made before), channels-last under the
    ``channels_last`` modes (the memory order their convolutions want).
    """
    global _PIXEL_NET
    if _PIXEL_NET is None:
        import torch

        class PixelNet(torch.nn.Module):
            def __init__(self, net: Any, mean: Any, std: Any) -> None:
                super().__init__()
                self.net = net
                self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
                self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

            def forward(self, pixels: Any) -> Any:
                weight = next(self.net.parameters())
                nhwc = weight.dim() == 4 and not weight.is_contiguous() and weight.is_contiguous(
                    memory_format=torch.channels_last)
                x = pixels.permute(0, 3, 1, 2).contiguous(
                    memory_format=torch.channels_last if nhwc else torch.contiguous_format)
                x = x.float().div(255)  # ConvertImageDtype: uint8 to float in [0, 1]
                return self.net(x.sub(self.mean).div(self.std))  # Normalize

        _PIXEL_NET = PixelNet
    return _PIXEL_NET(net, mean, std)


def imagenet_categories() -> list[str]:
    """The 1000 ImageNet class names, by class id."""
    with open(CATEGORIES_FILE, encoding="utf-8") as f:
        names = [line.rstrip("\n") for line in f]
    if len(names) != NUM_CLASSES:
        raise RuntimeError(f"{CATEGORIES_FILE}: expected {NUM_CLASSES} names, found {len(names)}")
    return names


PARAMS_SCHEMA = object_schema(
    {
        "top_k": {
            "type": "integer",
            "minimum": 1,
            "maximum": NUM_CLASSES,
            "default": 5,
            "description": "How many classes to return, best first.",
        }
    },
    description="MOBILENETV2 parameters.",
)


@implementer(IModel, IOptimizable)
class MobileNetV2:
    """A built MobileNetV2 on its device."""

    def __init__(self, net: Any, device: str, version: str, resize: int = DEFAULT_RESIZE) -> None:
        from torchvision.models import MobileNet_V2_Weights

        from svc.optimize.transfer import HostStaging

        self.net = net
        self.staging = HostStaging(device)
        self.device = device
        self.version = version
        self.categories = imagenet_categories()
        # torchvision's preset (constructing it downloads nothing): its crop, interpolation, mean and std are
        # applied in two halves (preprocess, pixel_net); the resize is the configured one (232 for
        # IMAGENET1K_V2, else 256).
        self.preset = MobileNet_V2_Weights.IMAGENET1K_V1.transforms()
        self.resize = [resize]
        #: The network with its input normalisation: uint8 NHWC pixels in, logits out (the optimisation target).
        self.pixels = pixel_net(net, self.preset.mean, self.preset.std).to(device)
        self.run_net = self.pixels  # what predict calls: that module, or its optimised stand-in (svc.optimize)
        self._photos: Any = None  # the gate photographs as preprocess makes them, made at the first gate

    def preprocess(self, image: Any, params: dict) -> Any:
        side = self.resize[0]
        image.draft("RGB", (side, side))
        # The short side becomes `resize` whatever the long side: check that resize before decoding.
        check_resize(image.size, short_side_size(image.width, image.height, side))
        return resize_center_crop(image, side, CROP, self.preset.interpolation)  # uint8 HWC, as predict stacks it

    def batch_key(self, params: dict) -> Any:
        return None  # top_k only changes the postprocessing

    def predict(self, inputs: list, params: dict) -> list:
        import torch

        with torch.inference_mode():
            probabilities = torch.softmax(self.run_net(self.staging.stack(inputs)), dim=1).float().cpu()
        return list(probabilities)

    def postprocess(self, output: Any, params: dict, options: dict) -> dict:
        k = min(params["top_k"], options.get("max_results", NUM_CLASSES))
        scores, ids = output.topk(k)
        ids = ids.tolist()
        return {
            "class_id": ids[0],
            "category": self.categories[ids[0]],
            "scores": scores.tolist(),
            "class_ids": ids,
            "categories": [self.categories[i] for i in ids],
        }

    def warmup_input(self) -> Any:
        import numpy as np

        return np.zeros((CROP, CROP, 3), dtype=np.uint8)

    # -- optimised execution (svc.model.api.IOptimizable) ----------------------------------------

    def gate_images(self, n: int, seed: int = GATE_SEED) -> Any:
        """``n`` seeded random uint8 images (n, 224, 224, 3) on the device, as ``predict`` stacks its items."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        images = torch.randint(0, 256, (n, 3, CROP, CROP), generator=generator, dtype=torch.uint8)
        return images.permute(0, 2, 3, 1).contiguous().to(self.device)

    def optimization_targets(self) -> list:
        def install(fn: Any) -> None:
            self.run_net = fn

        return [OptimizationTarget("net", self.pixels, lambda batch: (self.gate_images(batch, 0),), install)]

    def gate_outputs(self) -> Any:
        """The logits of ``GATE_IMAGES`` seeded noise images, then of the photographs of ``models/gate_photos.py``
        as ``preprocess`` makes them: noise exercises every weight of the demo network, and a trained one gives
        its confident classes (a cat, a cup) only to photographs."""
        import numpy as np
        import torch

        from models.gate_photos import gate_photos

        if self._photos is None:
            self._photos = torch.from_numpy(np.stack([self.preprocess(photo, {}) for photo in gate_photos()]))
        with torch.inference_mode():
            return self.run_net(torch.cat([self.gate_images(GATE_IMAGES), self._photos.to(self.device)])).float().cpu()

    def optimize_candidates(self, device: str) -> tuple:
        from svc.optimize.support import without_runtimes

        return AUTO_CANDIDATES.get(device, ()) + (without_runtimes(TORCH_BF16) if device == "cpu" else ())


@implementer(IPlugin, IModelFactory)
class MobileNetV2Factory:
    catalog_id = "MOBILENETV2"
    category = "classification"
    task = "image-classification"
    needs_image = True
    options = ("max_results",)
    data_schema = {
        "type": "object",
        "description": "Best class first: `class_id`/`category` are the top class; `scores`, `class_ids` and "
        "`categories` list the top_k classes (capped by options.max_results) in descending probability.",
        "required": ["class_id", "category", "scores", "class_ids", "categories"],
        "properties": {
            "class_id": {"type": "integer", "minimum": 0, "maximum": NUM_CLASSES - 1},
            "category": {"type": "string", "description": "ImageNet class name."},
            "scores": {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1,
                       "description": "Softmax probabilities, descending."},
            "class_ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": NUM_CLASSES - 1}},
            "categories": {"type": "array", "items": {"type": "string"}},
        },
    }
    config_schema = object_schema(
        {
            **WEIGHTS_PROPERTIES,
            "resize": {
                "type": "integer",
                "minimum": CROP,
                "maximum": 1024,
                "default": DEFAULT_RESIZE,
                "description": "Short side of the image before the 224x224 center crop: the weights' evaluation "
                "preset (IMAGENET1K_V1: 256, IMAGENET1K_V2: 232; a pretrained variant implies its value).",
            },
        },
        description="[model] table of MOBILENETV2.",
    )
    variants = VARIANTS

    def params_schema(self, config: dict) -> dict:
        return PARAMS_SCHEMA

    def build(self, config: dict, device: str) -> MobileNetV2:
        import torch
        from torchvision.models import mobilenet_v2

        path = path_of(config)
        torch.manual_seed(config.get("seed", 0))
        net = mobilenet_v2(weights=None, num_classes=NUM_CLASSES)
        if path is not None:
            load_into(net, read_state_dict(path), path)
        else:
            calibrate_batchnorm(net, (8, 3, 224, 224), config.get("seed", 0))
        net.eval().to(device)
        return MobileNetV2(net, device, version_of(config, path), config.get("resize", DEFAULT_RESIZE))


mobilenetv2 = MobileNetV2Factory()
