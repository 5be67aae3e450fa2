"""Three photographs for the accuracy gates: what a trained network sees in a user's image.

A gate compares a mode's outputs with eager's on the plugin's gate inputs.
Seeded noise or blobs exercise every weight of a random-init network, but a
trained one finds little in them: a trained YOLOv8n detected 0 and 1
objects on YOLOV8's two blob images, and MobileNetV2 trained on ImageNet
gives no confident class to noise. These photographs (a person, a cat, a
cup of coffee: public domain and CC0, ``models/data/photos/README.md``) give
the gates real content. Each call opens them afresh, since ``preprocess``
may decode a lazily opened image at a reduced scale in place; the plugins
keep what their ``preprocess`` made of them for the gate's later runs.
"""

from __future__ import annotations

import os
from typing import Any

PHOTOS_DIR = os.path.join(os.path.dirname(__file__), "data", "photos")
PHOTOS = ("astronaut.jpg", "chelsea.jpg", "coffee.jpg")


def gate_photos(names: tuple[str, ...] = PHOTOS) -> list[Any]:
    """The photographs (``names``, of ``PHOTOS``) as lazily opened PIL images, as a request's images reach
    ``preprocess``."""
    from PIL import Image

    return [Image.open(os.path.join(PHOTOS_DIR, name)) for name in names]
