"""Seeded images with the statistics of photographs, for checks where noise would mislead.

White noise has all its energy at the finest scale: a JPEG of it is large,
a reduced-scale decode of it is far from a full decode, and a classifier
sees nothing in it.  Photographs have most of their energy at coarse scales
(a power spectrum falling as 1/f^2 or faster), smooth regions and edges; so does
:func:`photo_like`: 1/f^1.5 noise per channel, correlated across channels (a
colour cast, as in real scenes), plus a few flat-coloured discs with sharp
edges.
"""

from __future__ import annotations

from typing import Any


def photo_like(width: int, height: int, seed: int = 0) -> Any:
    """A (height, width, 3) uint8 array that looks like a blurry photograph of a few objects."""
    import numpy as np

    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    falloff = np.maximum(np.hypot(fx, fy), 1.0 / max(width, height)) ** -1.5  # smoother than 1/f: fewer edges
    shared = rng.standard_normal((height, fx.shape[1])) + 1j * rng.standard_normal((height, fx.shape[1]))
    channels = []
    for _ in range(3):
        own = rng.standard_normal((height, fx.shape[1])) + 1j * rng.standard_normal((height, fx.shape[1]))
        field = np.fft.irfft2((0.7 * shared + 0.3 * own) * falloff, s=(height, width))
        channels.append((field - field.mean()) / (field.std() or 1.0))
    image = np.stack(channels, axis=-1) * 40.0 + rng.uniform(80, 170, 3)
    y, x = np.mgrid[:height, :width]
    for _ in range(3):
        cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(0.08, 0.25) * min(width, height)
        image[(y - cy) ** 2 + (x - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return image.clip(0, 255).astype(np.uint8)
