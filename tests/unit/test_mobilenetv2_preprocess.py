"""MOBILENETV2 resizes and crops as torchvision's ``Resize`` + ``CenterCrop`` do on Pillow's image, up to rounding.

``preprocess`` decodes with Pillow, then (``svc.model.images.resize_center_crop``)
runs torchvision's transforms on the uint8 tensor of the decoded pixels
where torch has its vectorised kernel (this CPU: AVX2 or AVX-512), or
resizes with Pillow only the region of the image that the centre crop keeps
(``box``).  The filter and the sample points are the same; the pixels may
differ by rounding of the filter weights.  The reference is torchvision's
two-step path on the same decoded Pillow image, what the preset does to a
photo.  Neither path starts OpenMP threads from the thread that calls it: a
decode thread must not (``IModel.preprocess``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from models.mobilenetv2 import mobilenetv2
from svc.model.images import crop_box, resize_center_crop, vectorised_resize
from svc.optimize import gates
from tests.support.photos import photo_like

SIZES = [(224, 224), (300, 200), (640, 480), (500, 333), (231, 800), (1024, 768)]


@pytest.fixture(scope="module")
def models() -> dict:
    return {resize: mobilenetv2.build({"weights": "random", "seed": 0, "resize": resize}, "cpu")
            for resize in (232, 256)}


def two_step(model: object, image: Image.Image) -> np.ndarray:
    """torchvision's evaluation transform up to the crop on a Pillow image, as the preset runs it (uint8 HWC)."""
    preset = model.preset
    resized = F.resize(image, model.resize, interpolation=preset.interpolation, antialias=preset.antialias)
    return F.pil_to_tensor(F.center_crop(resized, preset.crop_size)).permute(1, 2, 0).numpy()


def test_the_box_is_the_region_that_the_resize_and_the_crop_keep():
    assert crop_box(224, 224, 256, 224) == (14.0, 14.0, 210.0, 210.0)  # 256 -> crop at 16: 14 source pixels
    # 341x256 (torchvision's int() of the long side), the crop at (58, 16) (its round(): 58.5 -> 58)
    assert crop_box(640, 480, 256, 224) == pytest.approx((58 * 640 / 341, 30.0, 282 * 640 / 341, 450.0))
    assert crop_box(300, 200, 232, 224) == pytest.approx(
        (62 * 300 / 348, 4 * 200 / 232, 286 * 300 / 348, 228 * 200 / 232))


def test_this_cpu_has_the_vectorised_kernel():
    """The CI machines and the development machine are x86 with AVX2 at least, so the suite runs the served path."""
    assert torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and vectorised_resize()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("resize", [232, 256])
def test_preprocess_equals_resize_then_crop_up_to_rounding(models, size, resize):
    model = models[resize]
    image = Image.fromarray(photo_like(*size, seed=sum(size)))
    got = model.preprocess(image.copy(), {"top_k": 5})
    expected = two_step(model, image)
    assert got.shape == (224, 224, 3) and got.dtype == np.uint8
    difference = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert difference.max() <= 1  # measured 0 or 1 of 255 levels
    assert (difference > 0).mean() < 0.01  # on at most half a per cent of the pixels (measured 0 to 0.5 %)
    if size == (224, 224) and resize == 256:  # whole source pixels: the same weights, the same pixels
        assert difference.max() == 0


@pytest.mark.parametrize("size", SIZES)
def test_pillows_path_equals_resize_then_crop_up_to_rounding(models, size):
    """Where torch has no vectorised kernel (or the filter is not bilinear), Pillow resizes the crop's region."""
    model = models[256]
    image = Image.fromarray(photo_like(*size, seed=sum(size)))
    got = resize_center_crop(image.copy(), 256, 224, InterpolationMode.BILINEAR, vectorised=False)
    difference = np.abs(got.astype(np.int16) - two_step(model, image).astype(np.int16))
    assert got.shape == (224, 224, 3) and got.dtype == np.uint8
    assert difference.max() <= 2  # measured 0 to 2 of 255 levels
    assert (difference > 0).mean() < 0.3  # on a few per cent of the pixels (26 % for a 231x800 strip)


@pytest.mark.parametrize("mode", ["L", "RGBA", "CMYK", "P"])
def test_other_modes_are_made_rgb_first(models, mode):
    model = models[256]
    rgb = Image.fromarray(photo_like(300, 200, seed=5))
    image = rgb.convert(mode)
    assert np.array_equal(model.preprocess(image.copy(), {}), model.preprocess(image.convert("RGB"), {}))


#: Run in a fresh interpreter: in the suite's own process another test's threads may start or end between two counts.
THREADS_DURING = """
import os, threading, sys
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from svc.model.images import resize_center_crop
from tests.support.photos import photo_like

torch.set_num_threads(2)
image = Image.fromarray(photo_like(640, 480, seed=1))

def threads_during(work):
    counted, done = [], threading.Event()
    def run():
        work()
        counted.append(len(os.listdir("/proc/self/task")))
        done.wait()
    thread = threading.Thread(target=run)
    thread.start()
    while not counted and thread.is_alive():
        thread.join(0.01)
    done.set()
    thread.join()
    return counted[0]

base = threads_during(lambda: None)
torch_path = threads_during(lambda: resize_center_crop(image.copy(), 256, 224, InterpolationMode.BILINEAR, vectorised=True))
pillow_path = threads_during(lambda: resize_center_crop(image.copy(), 256, 224, InterpolationMode.BILINEAR, vectorised=False))
control = threads_during(lambda: torch.rand(4_000_000).sum())
print(base, torch_path, pillow_path, control)
"""


def test_a_resize_in_a_second_thread_starts_no_openmp_threads():
    """With two torch threads, a resize on a thread of its own runs on that thread alone, on either path (a torch op
    that does start OpenMP work there, the control, adds a thread)."""
    import subprocess
    import sys

    from tests.support.processes import REPO

    done = subprocess.run([sys.executable, "-c", THREADS_DURING], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    base, torch_path, pillow_path, control = map(int, done.stdout.split())
    assert (torch_path, pillow_path) == (base, base) and control > base, done.stdout


def test_the_preprocessed_crop_classifies_as_the_two_step_one(models):
    model = models[232]
    images = [Image.fromarray(photo_like(500, 375, seed)) for seed in range(4)]
    one = [model.preprocess(image.copy(), {"top_k": 5}) for image in images]
    two = [two_step(model, image) for image in images]
    with torch.inference_mode():
        logits = [model.pixels(torch.from_numpy(np.stack(batch))) for batch in (two, one)]
    assert gates.classification(*logits).summary.startswith("top-1 4/4, top-5 4/4, ")
