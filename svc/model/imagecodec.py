"""Images and masks a model returns, encoded for the JSON reply.

Generative models return pictures and segmentation models return masks; both
travel in ``results[].data``.  The encoding is the request's choice
(``svc.contract.options.CATALOG``): ``options.image_format`` is ``png`` (lossless,
the default), ``jpeg`` or ``webp`` (lossy, smaller), as base64 text;
``options.mask_format`` is ``png`` (a base64 1-bit PNG, the default) or
``rle`` (COCO run-length encoding, pycocotools).  Pillow and pycocotools do
the encoding; this module only fixes the settings, so that every plugin
encodes the same way and a given image always gives the same bytes.

Runs in the worker thread (``IModel.postprocess``); imports nothing heavy.
"""

from __future__ import annotations

import base64
import io
from typing import Any

#: options.image_format value -> (Pillow format name, save arguments)
FORMATS: dict[str, tuple[str, dict]] = {
    "png": ("PNG", {"compress_level": 6}),
    "jpeg": ("JPEG", {"quality": 90}),
    "webp": ("WEBP", {"quality": 90, "method": 4}),
}
DEFAULT_FORMAT = "png"


def encode_image(image: Any, image_format: str = DEFAULT_FORMAT) -> str:
    """A PIL image as base64 text in ``image_format`` (png, jpeg or webp).

    JPEG has no alpha channel and no 1-bit mode: such images are converted
    to RGB (or L) first.  Raises ValueError for an unknown format.
    """
    try:
        name, kwargs = FORMATS[image_format]
    except KeyError:
        raise ValueError(f"unknown image format {image_format!r}; known: {', '.join(FORMATS)}") from None
    if name == "JPEG" and image.mode not in ("RGB", "L"):
        image = image.convert("L" if image.mode in ("1", "I", "F") else "RGB")
    buf = io.BytesIO()
    image.save(buf, name, **kwargs)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def encode_mask_png(mask: Any) -> str:
    """A boolean HxW array as base64 of a 1-bit PNG (white = inside the mask)."""
    from PIL import Image

    return encode_image(Image.fromarray(mask.astype(bool, copy=False)), "png")


def encode_mask_rle(mask: Any) -> dict:
    """A boolean HxW array as COCO run-length encoding ``{size: [h, w], counts: str}``.

    pycocotools' compressed RLE (column-major runs, the COCO format), which
    ``pycocotools.mask.decode`` turns back into the same array.
    """
    import numpy as np
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8, copy=False)))
    return {"size": [int(rle["size"][0]), int(rle["size"][1])], "counts": rle["counts"].decode("ascii")}


def encode_mask(mask: Any, mask_format: str = "png") -> Any:
    """A boolean HxW mask per ``options.mask_format``: base64 PNG text, or a COCO RLE object."""
    if mask_format == "rle":
        return encode_mask_rle(mask)
    if mask_format == "png":
        return encode_mask_png(mask)
    raise ValueError(f"unknown mask format {mask_format!r}; known: png, rle")
