"""Two tiny models as a third party writes them, for tests of what follows from a plugin's declarations.

Found through the ``models`` plugin package when ``tests/plugins`` is on
``sys.path`` (never shipped), as ``testfaults.py`` is.  Neither imports
torch, nor computes more than a few numbers per image, so their model servers
are ready in seconds:

- ``TESTCLASSES``: a classifier over four colour classes, whose ``top_k``
  maximum is its ``[model] max_top_k`` (the Open Inference Protocol's
  ``PROBABILITIES`` needs it to reach the class count, docs/oip.md);
- ``TESTIMAGE``: an image-to-image model (category ``generation``,
  ``needs_image`` true) that returns the photo's negative: the web UI's
  "Try it" must ask for a photo for it.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from svc.contract.schema import object_schema
from svc.model.api import IModel, IModelFactory
from svc.model.images import check_resize
from svc.model.weights import WEIGHTS_PROPERTIES

CLASSES = ["red", "green", "blue", "grey"]
SIDE = 8


def small(image: Any) -> Any:
    """The image as SIDE x SIDE RGB pixels (numpy)."""
    import numpy

    check_resize(image.size, (SIDE, SIDE))
    return numpy.asarray(image.convert("RGB").resize((SIDE, SIDE)), dtype=numpy.float32)


@implementer(IModel)
class ColourClasses:
    version = "test-classes"

    def preprocess(self, image: Any, params: dict) -> Any:
        return small(image).mean(axis=(0, 1))

    def batch_key(self, params: dict) -> Any:
        return None

    def predict(self, inputs: list, params: dict) -> list:
        outputs = []
        for red, green, blue in inputs:
            raw = [float(red), float(green), float(blue), 255.0 - abs(float(red) - float(blue))]
            total = sum(raw) or 1.0
            outputs.append([v / total for v in raw])
        return outputs

    def postprocess(self, output: Any, params: dict, options: dict) -> dict:
        ids = sorted(range(len(CLASSES)), key=lambda i: -output[i])[: params["top_k"]]
        return {"class_id": ids[0], "category": CLASSES[ids[0]], "scores": [output[i] for i in ids],
                "class_ids": ids, "categories": [CLASSES[i] for i in ids]}

    def warmup_input(self) -> Any:
        return (0.0, 0.0, 0.0)


@implementer(IPlugin, IModelFactory)
class ColourClassesFactory:
    catalog_id = "TESTCLASSES"
    category = "classification"
    task = "image-classification"
    needs_image = True
    options = ()
    data_schema = {
        "type": "object",
        "required": ["class_id", "category", "scores", "class_ids", "categories"],
        "properties": {
            "class_id": {"type": "integer", "minimum": 0, "maximum": len(CLASSES) - 1},
            "category": {"enum": CLASSES},
            "scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
            "class_ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": len(CLASSES) - 1}},
            "categories": {"type": "array", "items": {"enum": CLASSES}},
        },
    }
    config_schema = object_schema({**WEIGHTS_PROPERTIES, "max_top_k": {
        "type": "integer", "minimum": 1, "maximum": len(CLASSES), "default": len(CLASSES)}})

    def params_schema(self, config: dict) -> dict:
        return object_schema({"top_k": {"type": "integer", "minimum": 1, "maximum": config["max_top_k"],
                                        "default": 1}})

    def build(self, config: dict, device: str) -> ColourClasses:
        return ColourClasses()


@implementer(IModel)
class Negative:
    version = "test-image"

    def preprocess(self, image: Any, params: dict) -> Any:
        return small(image)

    def batch_key(self, params: dict) -> Any:
        return None

    def predict(self, inputs: list, params: dict) -> list:
        return [255 - pixels for pixels in inputs]

    def postprocess(self, output: Any, params: dict, options: dict) -> dict:
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(output.astype("uint8"), "RGB").save(buffer, format="PNG")
        return {"image": base64.b64encode(buffer.getvalue()).decode(), "width": SIDE, "height": SIDE}

    def warmup_input(self) -> Any:
        import numpy

        return numpy.zeros((SIDE, SIDE, 3), dtype=numpy.float32)


@implementer(IPlugin, IModelFactory)
class NegativeFactory:
    catalog_id = "TESTIMAGE"
    category = "generation"
    task = "image-to-image"
    needs_image = True
    options = ()
    data_schema = {
        "type": "object",
        "required": ["image", "width", "height"],
        "properties": {"image": {"type": "string"}, "width": {"type": "integer", "minimum": 1},
                       "height": {"type": "integer", "minimum": 1}},
    }
    config_schema = object_schema({**WEIGHTS_PROPERTIES})

    def params_schema(self, config: dict) -> dict:
        return object_schema({})

    def build(self, config: dict, device: str) -> Negative:
        return Negative()


testclasses = ColourClassesFactory()
testimage = NegativeFactory()
