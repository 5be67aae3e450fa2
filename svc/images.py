"""Per-item input decoding: base64 text to bytes to a lazily opened image.

Runs in the decode thread pool.  A bad item raises :class:`ItemInputError`
with its own status (3 for an empty image, 5 for anything undecodable) and
never affects the other items of the request.
"""

from __future__ import annotations

import base64
import binascii
import warnings
from io import BytesIO
from typing import Any

from svc import status as st
from svc.status import Status


class ItemInputError(Exception):
    """One input item cannot be used; carries the item status."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def decode_base64(text: str) -> bytes:
    """Standard base64 (padding optional), or a ``data:...;base64,`` URL."""
    if text.startswith("data:"):
        head, sep, text = text.partition(",")
        if not sep or not head.endswith(";base64"):
            raise ItemInputError(st.INVALID_IMAGE, "a data URL must be base64-encoded (data:<type>;base64,<data>)")
    text = text.strip()
    missing = -len(text) % 4
    if missing == 3:
        raise ItemInputError(st.INVALID_IMAGE, "not valid base64: wrong length")
    try:
        return base64.b64decode(text + "=" * missing, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ItemInputError(st.INVALID_IMAGE, f"not valid base64: {e}") from None


def open_image(data: bytes, max_pixels: int) -> Any:
    """A lazily opened PIL image (header read, pixels not yet decoded)."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ItemInputError(st.IMAGE_EMPTY, "input image is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(BytesIO(data))
    except (UnidentifiedImageError, Image.DecompressionBombError):
        raise ItemInputError(st.INVALID_IMAGE, "not a decodable image (JPEG, PNG, WebP, BMP, GIF or TIFF)") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise ItemInputError(st.INVALID_IMAGE, f"image cannot be read: {e}") from None
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ItemInputError(st.INVALID_IMAGE, f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ItemInputError(
            st.INVALID_IMAGE,
            f"image is {width}x{height} = {width * height} pixels; at most {max_pixels} are accepted (max_image_pixels)",
        )
    return image
