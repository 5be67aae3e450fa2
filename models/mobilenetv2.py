"""MOBILENETV2: ImageNet classification with torchvision's ``mobilenet_v2``.

Standard ImageNet preprocessing (resize 256, center crop 224, normalize:
torchvision's preset for these weights), batched forward pass under
``torch.inference_mode()``, softmax, top-k.  Large JPEGs are decoded at a
reduced DCT scale that still covers 256 px (Pillow ``draft``), which cuts
decode time by about a third.  The resize of the short side to 256 is
checked before decoding (``svc.images.check_resize``): an image whose long
side would pass 65536 (aspect ratio above 256:1; an 8000x1 PNG would become
a 2,048,000x256 intermediate of 1.5 GB) fails its item with status 5.

The decode threads only resize and crop with Pillow; the float conversion and
normalisation run batched in the worker thread with the forward pass, so that
no thread but the worker starts OpenMP work (see ``IModel.preprocess``).
"""

from __future__ import annotations

import os
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from svc.images import check_resize, short_side_size
from svc.modelapi import IModel, IModelFactory
from svc.schema import object_schema
from svc.weights import WEIGHTS_PROPERTIES, calibrate_batchnorm, load_into, path_of, read_state_dict, version_of

CATEGORIES_FILE = os.path.join(os.path.dirname(__file__), "data", "imagenet_classes.txt")
NUM_CLASSES = 1000


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


@implementer(IModel)
class MobileNetV2:
    """A built MobileNetV2 on its device."""

    def __init__(self, net: Any, device: str, version: str) -> None:
        from torchvision.models import MobileNet_V2_Weights

        self.net = net
        self.device = device
        self.version = version
        self.categories = imagenet_categories()
        # The torchvision preset of these weights (constructing it downloads nothing):
        # its sizes, interpolation, mean and std are applied in two halves below.
        self.preset = MobileNet_V2_Weights.IMAGENET1K_V1.transforms()

    def preprocess(self, image: Any, params: dict) -> Any:
        from torchvision.transforms import functional as F

        p = self.preset
        side = p.resize_size[0]
        image.draft("RGB", (side, side))
        # The short side becomes 256 whatever the long side: check that resize before decoding.
        check_resize(image.size, short_side_size(image.width, image.height, side))
        image = F.resize(image.convert("RGB"), p.resize_size, interpolation=p.interpolation, antialias=p.antialias)
        return F.pil_to_tensor(F.center_crop(image, p.crop_size))  # uint8 CHW, a view of the pixels

    def batch_key(self, params: dict) -> Any:
        return None  # top_k only changes the postprocessing

    def predict(self, inputs: list, params: dict) -> list:
        import torch
        from torchvision.transforms import functional as F

        with torch.inference_mode():
            batch = torch.stack(inputs).to(self.device, non_blocking=True)
            batch = F.normalize(F.convert_image_dtype(batch, torch.float), self.preset.mean, self.preset.std)
            probabilities = torch.softmax(self.net(batch), dim=1).float().cpu()
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
        import torch

        return torch.zeros(3, 224, 224, dtype=torch.uint8)


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
    config_schema = object_schema(dict(WEIGHTS_PROPERTIES), description="[model] table of MOBILENETV2.")

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
        return MobileNetV2(net, device, version_of(config, path))


mobilenetv2 = MobileNetV2Factory()
