"""MOBILENETV2 resizes and crops in one step: torchvision's ``Resize`` + ``CenterCrop`` up to rounding.

``preprocess`` resizes only the region of the image that the centre crop
keeps (Pillow's ``Image.resize(box=)``), straight to 224x224, instead of
resizing the whole image and cutting it.  The sample points and the filter
are the same; the pixels may differ by rounding of the filter weights.  The
reference is torchvision's own two-step path on the same decoded image.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import functional as F

from models.mobilenetv2 import crop_box, mobilenetv2
from svc.optimize import gates
from tests.support.photos import photo_like


@pytest.fixture(scope="module")
def models() -> dict:
    return {resize: mobilenetv2.build({"weights": "random", "seed": 0, "resize": resize}, "cpu")
            for resize in (232, 256)}


def two_step(model: object, image: Image.Image) -> np.ndarray:
    """torchvision's evaluation transform up to the crop, as the plugin ran it before (uint8 HWC)."""
    preset = model.preset
    resized = F.resize(image, model.resize, interpolation=preset.interpolation, antialias=preset.antialias)
    return F.pil_to_tensor(F.center_crop(resized, preset.crop_size)).permute(1, 2, 0).numpy()


def test_the_box_is_the_region_that_the_resize_and_the_crop_keep():
    assert crop_box(224, 224, 256) == (14.0, 14.0, 210.0, 210.0)  # 256 -> crop at 16: 14 source pixels
    # 341x256 (torchvision's int() of the long side), the crop at (58, 16) (its round(): 58.5 -> 58)
    assert crop_box(640, 480, 256) == pytest.approx((58 * 640 / 341, 30.0, 282 * 640 / 341, 450.0))
    assert crop_box(300, 200, 232) == pytest.approx((62 * 300 / 348, 4 * 200 / 232, 286 * 300 / 348, 228 * 200 / 232))


@pytest.mark.parametrize("size", [(224, 224), (300, 200), (640, 480), (500, 333), (231, 800), (1024, 768)])
@pytest.mark.parametrize("resize", [232, 256])
def test_preprocess_equals_resize_then_crop_up_to_rounding(models, size, resize):
    model = models[resize]
    image = Image.fromarray(photo_like(*size, seed=sum(size)))
    got = model.preprocess(image.copy(), {"top_k": 5})
    expected = two_step(model, image)
    assert got.shape == (224, 224, 3) and got.dtype == np.uint8
    difference = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert difference.max() <= 2  # measured 0 to 2 of 255 levels
    assert (difference > 0).mean() < 0.3  # on a few per cent of the pixels (26 % for a 231x800 strip)
    if size == (224, 224) and resize == 256:  # whole source pixels: the same weights, the same pixels
        assert difference.max() == 0


def test_the_one_step_crop_classifies_as_the_two_step_one(models):
    model = models[232]
    images = [Image.fromarray(photo_like(500, 375, seed)) for seed in range(4)]
    one = [model.preprocess(image.copy(), {"top_k": 5}) for image in images]
    two = [two_step(model, image) for image in images]
    with torch.inference_mode():
        logits = [model.pixels(torch.from_numpy(np.stack(batch))) for batch in (two, one)]
    assert gates.classification(*logits).summary.startswith("top-1 4/4, top-5 4/4, ")
