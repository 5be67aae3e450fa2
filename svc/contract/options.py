"""The catalog of request ``options``: presentation choices, not model knobs.

``params`` change what the model computes; ``options`` change how results are
returned.  A model plugin names the options it honours; any other option is a
422 for that model.  Defaults apply when an option is absent.
"""

from __future__ import annotations

from svc.contract.schema import object_schema

CATALOG: dict[str, dict] = {
    "max_results": {
        "type": "integer",
        "minimum": 1,
        "maximum": 1000,
        "description": "Cap on the number of entries in list-shaped results "
        "(classes of a classification, detections, masks). Absent: no cap beyond the model's own params.",
    },
    "image_format": {
        "enum": ["png", "jpeg", "webp"],
        "default": "png",
        "description": "Encoding of images the model returns (base64 in the JSON). Lossy formats are smaller.",
    },
    "mask_format": {
        "enum": ["png", "rle"],
        "default": "png",
        "description": "Encoding of segmentation masks: a base64 1-bit PNG, or COCO run-length encoding "
        "({size: [h, w], counts: string}).",
    },
}


def options_schema(names: tuple[str, ...] | list[str]) -> dict:
    """The closed schema of the options a model honours."""
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        raise ValueError(f"unknown option names {unknown}; known: {sorted(CATALOG)}")
    return object_schema({n: CATALOG[n] for n in names}, description="Request options honoured by this model.")
