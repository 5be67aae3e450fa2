"""MOBILENETV2's decode, resize and crop of one JPEG: with Pillow's reduced-scale decode (``draft``) and without; torch's
vectorised resize against Pillow's.

    python -m bench.jpeg_decode [--seconds 3] [--rounds 3]

``models/mobilenetv2.py``'s ``preprocess`` asks libjpeg for a DCT-scaled
decode (1/2, 1/4 or 1/8) that still covers the resize (``Image.draft``).
"without" decodes the file at full scale first (``Image.load``, after which
``draft`` does nothing), then runs the same ``preprocess``: what it cost
before the draft.  Images: photo-like JPEGs (``tests/support/photos.py``,
quality 90) of 1024x768 and 224x224, and the 224x224 JPEG of noise that
``bench.modelserver`` sends.  Per image: thread CPU ms (``time.thread_time``,
one thread, interleaved rounds, the median), the decoded size, and the
largest and mean difference of the 224x224 crop against the full decode.
"Pillow resize" runs ``preprocess`` with the draft but with Pillow's resize
of the crop's region, where the CPU lacks torch's vectorised uint8 kernel
(``svc.model.images.resize_center_crop``): what the resize cost before that
kernel.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from typing import Any


def jpeg(pixels: Any) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def pillow_preprocess(model: Any, image: Any, params: dict) -> Any:
    """MOBILENETV2's ``preprocess`` with Pillow's resize, as it runs where torch has no vectorised kernel."""
    from svc.model.images import resize_center_crop

    side = model.resize[0]
    image.draft("RGB", (side, side))
    return resize_center_crop(image, side, 224, model.preset.interpolation, vectorised=False)


def cost_ms(model: Any, data: bytes, draft: bool, seconds: float, pillow: bool = False) -> tuple[float, tuple[int, int]]:
    """Thread CPU ms per image of open + (full decode) + preprocess, and the size decoded."""
    from PIL import Image

    preprocess = (lambda image, params: pillow_preprocess(model, image, params)) if pillow else model.preprocess

    n, size = 0, (0, 0)
    cpu = time.thread_time()
    started = time.perf_counter()
    while n < 5 or time.perf_counter() - started < seconds:
        image = Image.open(io.BytesIO(data))
        if not draft:
            image.load()
        preprocess(image, {"top_k": 5})
        size = image.size
        n += 1
    return (time.thread_time() - cpu) * 1000.0 / n, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from svc.model import torchenv

    torchenv.configure_threads(1, 1)
    import numpy as np
    from PIL import Image

    from models.mobilenetv2 import mobilenetv2
    from tests.support.images import image_bytes
    from tests.support.photos import photo_like

    model = mobilenetv2.build({"weights": "random", "seed": 0}, "cpu")
    images = {"photo-like 1024x768": jpeg(photo_like(1024, 768, 1)),
              "photo-like 224x224": jpeg(photo_like(224, 224, 1)),
              "noise 224x224": image_bytes(width=224, height=224, fmt="JPEG", seed=3)}
    print(f"MOBILENETV2 preprocess (resize {model.resize[0]}, crop 224), thread CPU ms per image, median of "
          f"{args.rounds} interleaved rounds of {args.seconds:g} s")
    print(f"  {'image':<22} {'bytes':>7} {'full decode':>11} {'draft':>7} {'ratio':>6} {'decoded at':>10} "
          f"{'max |d|':>7} {'mean |d|':>8} {'Pillow resize':>13} {'ratio':>6}")
    for name, data in images.items():
        runs: dict[bool, list[float]] = {False: [], True: []}
        pillow: list[float] = []
        sizes = {}
        for _ in range(args.rounds):
            for draft in (False, True):
                ms, sizes[draft] = cost_ms(model, data, draft, args.seconds)
                runs[draft].append(ms)
            pillow.append(cost_ms(model, data, True, args.seconds, pillow=True)[0])
        full = Image.open(io.BytesIO(data))
        full.load()
        a = np.asarray(model.preprocess(full, {"top_k": 5}), dtype=np.int32)  # uint8 HWC crops
        b = np.asarray(model.preprocess(Image.open(io.BytesIO(data)), {"top_k": 5}), dtype=np.int32)
        diff = np.abs(a - b)
        before, after = statistics.median(runs[False]), statistics.median(runs[True])
        resized_by_pillow = statistics.median(pillow)
        print(f"  {name:<22} {len(data):7d} {before:11.3f} {after:7.3f} {after / before:6.2f} "
              f"{'x'.join(map(str, sizes[True])):>10} {int(diff.max()):7d} {float(diff.mean()):8.3f} "
              f"{resized_by_pillow:13.3f} {after / resized_by_pillow:6.2f}", flush=True)


if __name__ == "__main__":
    main()
