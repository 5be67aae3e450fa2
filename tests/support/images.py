"""Test images made on the fly with Pillow."""

from __future__ import annotations

import base64
import io

from PIL import Image


def image_bytes(width: int = 64, height: int = 48, fmt: str = "PNG", color: tuple = (200, 40, 30), seed: int | None = None) -> bytes:
    """An image file; with ``seed``, noise instead of a flat colour."""
    if seed is None:
        image = Image.new("RGB", (width, height), color)
    else:
        import random

        rng = random.Random(seed)
        image = Image.frombytes("RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3)))
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def image_b64(**kw: object) -> str:
    return b64(image_bytes(**kw))


def jpeg_with_orientation(image: Image.Image, orientation: int | None) -> bytes:
    """``image`` as a JPEG whose EXIF Orientation tag is ``orientation`` (None: no tag)."""
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation  # ExifTags.Base.Orientation
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, exif=exif.tobytes())
    return buf.getvalue()


def stored_pixels(data: bytes) -> Image.Image:
    """The pixels of an image file as stored, any orientation tag ignored (loaded)."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def undecodable_avif() -> bytes:
    """An AVIF file that Pillow opens and cannot decode: its ``pixi`` box says 9 bits per channel. Pillow's AVIF
    plugin raises RuntimeError, which no other format's does (it was a 500 item)."""
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (90, 160, 30)).save(out, "AVIF")
    data = bytearray(out.getvalue())
    depth = data.index(b"pixi") + 9  # "pixi", version and flags (4 bytes), the channel count, then each depth
    assert data[depth - 1:depth + 2] == b"\x03\x08\x08", bytes(data[depth - 5:depth + 3])
    data[depth] = 9
    return bytes(data)


def uint8_tensors(n: int, seed: int = 5, side: int = 8) -> list:
    """``n`` seeded random uint8 images as C x H x W tensors (what TESTFAULTS' preprocess gives)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return list(torch.randint(0, 256, (n, 3, side, side), generator=generator, dtype=torch.uint8))
