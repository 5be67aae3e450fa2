"""The accuracy gates: an optimised model's outputs against eager's, one comparison per task category.

A plugin's ``gate_outputs()`` (``svc.modelapi.IOptimizable``) runs the model
on its fixed seeded gate inputs and returns what its category compares; the
engine calls it once with every target eager (the reference) and once per
candidate mode.  The gates run on the weights actually loaded (random init
or pretrained), so a mode is checked on the model it will serve.

Tolerances are the named constants below; docs/optimize.md states them.

- classification: ``(N, classes)`` logits.  The same top-1 class for every
  input, and ``max |logit - reference| <= LOGIT_RTOL * max |reference|``.
- detection: per image ``(boxes (K, 4) in pixels, scores (K,), classes (K,))``
  after NMS.  The same number of detections; each reference box matches a
  distinct box of the same class with every coordinate within ``BOX_TOLERANCE_PX``.
- generation: ``{"noise": [per-step noise predictions], "image": uint8 (N, H, W, C)}``.
  Every step's ``||noise - reference|| <= NOISE_RTOL * ||reference||`` (L2),
  and the final image's PSNR against the reference ``>= IMAGE_PSNR_DB``.
- segmentation: masks ``(M, H, W)`` (bool) of fixed prompts.  Every mask's
  IoU with its reference ``>= MASK_IOU_MIN`` (two empty masks agree).

Every gate also refuses outputs that are not finite or not of the reference's shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: classification: logits may differ by this fraction of the largest reference logit (and top-1 must agree).
LOGIT_RTOL = 0.05
#: detection: every box coordinate within this many pixels of the original image.
BOX_TOLERANCE_PX = 2.0
#: generation: per-step noise prediction, relative L2 error.
NOISE_RTOL = 0.02
#: generation: the final image's PSNR against eager's, in dB (8-bit pixels).
IMAGE_PSNR_DB = 35.0
#: segmentation: IoU of every mask with eager's.
MASK_IOU_MIN = 0.9


@dataclass(frozen=True)
class GateResult:
    """Whether a candidate passed, and the figure the log line shows."""

    passed: bool
    summary: str

    def __bool__(self) -> bool:
        return self.passed


def _np(value: Any) -> Any:
    """A numpy float64 array of a tensor or array (a bf16 tensor included)."""
    import numpy as np

    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def _bad_shape_or_values(ref: Any, out: Any) -> str | None:
    import numpy as np

    if ref.shape != out.shape:
        return f"shape {tuple(out.shape)} instead of {tuple(ref.shape)}"
    if not np.isfinite(out).all():
        return "outputs not finite"
    return None


def classification(reference: Any, candidate: Any) -> GateResult:
    """Same top-1 for every input; logits within ``LOGIT_RTOL`` of the largest reference logit."""
    ref, out = _np(reference), _np(candidate)
    bad = _bad_shape_or_values(ref, out)
    if bad:
        return GateResult(False, bad)
    same = int((ref.argmax(axis=-1) == out.argmax(axis=-1)).sum())
    n = ref.reshape(-1, ref.shape[-1]).shape[0]
    scale = float(abs(ref).max()) or 1.0
    worst = float(abs(out - ref).max()) if ref.size else 0.0
    summary = f"top-1 {same}/{n}, max |d logit| {worst / scale:.1e} of max |logit|"
    return GateResult(same == n and worst <= LOGIT_RTOL * scale, summary)


def detection(reference: list, candidate: list) -> GateResult:
    """The same detections after NMS: counts, classes, and every box coordinate within ``BOX_TOLERANCE_PX``."""
    import numpy as np

    if len(reference) != len(candidate):
        return GateResult(False, f"{len(candidate)} images instead of {len(reference)}")
    worst = 0.0
    total = 0
    for (ref_boxes, _, ref_classes), (boxes, scores, classes) in zip(reference, candidate):
        ref_boxes, boxes = _np(ref_boxes).reshape(-1, 4), _np(boxes).reshape(-1, 4)
        ref_classes, classes = _np(ref_classes).reshape(-1), _np(classes).reshape(-1)
        if len(boxes) != len(ref_boxes):
            return GateResult(False, f"{len(boxes)} detections instead of {len(ref_boxes)}")
        if not (np.isfinite(boxes).all() and np.isfinite(_np(scores)).all()):
            return GateResult(False, "outputs not finite")
        free = np.ones(len(boxes), dtype=bool)
        for box, cls in zip(ref_boxes, ref_classes):
            distance = np.where(free & (classes == cls), abs(boxes - box).max(axis=1) if len(boxes) else 0, np.inf)
            best = int(distance.argmin()) if len(distance) else -1
            if best < 0 or distance[best] > BOX_TOLERANCE_PX:
                near = "none of its class" if best < 0 or not np.isfinite(distance[best]) else f"{distance[best]:.1f} px"
                return GateResult(False, f"a box of class {int(cls)} has no match within "
                                         f"{BOX_TOLERANCE_PX:g} px (nearest: {near})")
            free[best] = False
            worst = max(worst, float(distance[best]))
        total += len(ref_boxes)
    return GateResult(True, f"{total} boxes matched, max {worst:.2f} px")


def psnr(reference: Any, candidate: Any, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB of 8-bit images (inf when equal)."""
    ref, out = _np(reference), _np(candidate)
    mse = float(((ref - out) ** 2).mean()) if ref.size else 0.0
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def generation(reference: dict, candidate: dict) -> GateResult:
    """Per-step noise predictions within ``NOISE_RTOL`` (L2), the final image within ``IMAGE_PSNR_DB``."""
    import numpy as np

    steps_ref, steps = reference["noise"], candidate["noise"]
    if len(steps) != len(steps_ref):
        return GateResult(False, f"{len(steps)} steps instead of {len(steps_ref)}")
    worst = 0.0
    for ref, out in zip(steps_ref, steps):
        ref, out = _np(ref), _np(out)
        bad = _bad_shape_or_values(ref, out)
        if bad:
            return GateResult(False, f"noise prediction: {bad}")
        worst = max(worst, float(np.linalg.norm(out - ref) / (np.linalg.norm(ref) or 1.0)))
    image_ref, image = _np(reference["image"]), _np(candidate["image"])
    bad = _bad_shape_or_values(image_ref, image)
    if bad:
        return GateResult(False, f"image: {bad}")
    db = psnr(image_ref, image)
    summary = f"noise max rel. L2 {worst:.1e} over {len(steps)} steps, image PSNR {db:.1f} dB"
    return GateResult(worst <= NOISE_RTOL and db >= IMAGE_PSNR_DB, summary)


def mask_iou(a: Any, b: Any) -> float:
    """IoU of two boolean masks; 1.0 when both are empty."""
    import numpy as np

    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


def segmentation(reference: Any, candidate: Any) -> GateResult:
    """Every mask's IoU with eager's mask of the same prompt at least ``MASK_IOU_MIN``."""
    import numpy as np

    ref, out = np.asarray(_np(reference)) > 0.5, np.asarray(_np(candidate)) > 0.5
    if ref.shape != out.shape:
        return GateResult(False, f"masks of shape {out.shape} instead of {ref.shape}")
    if ref.ndim < 3:
        ref, out = ref[None], out[None]
    ious = [mask_iou(r, o) for r, o in zip(ref.reshape(-1, *ref.shape[-2:]), out.reshape(-1, *out.shape[-2:]))]
    lowest = min(ious) if ious else 1.0
    return GateResult(lowest >= MASK_IOU_MIN, f"{len(ious)} masks, min IoU {lowest:.3f}")


#: The gate of each task category (``IModelFactory.category``).
GATES: dict[str, Callable[[Any, Any], GateResult]] = {
    "classification": classification,
    "detection": detection,
    "generation": generation,
    "segmentation": segmentation,
}


def gate_for(category: str) -> Callable[[Any, Any], GateResult]:
    """The comparison for a task category; a ValueError names the known ones."""
    try:
        return GATES[category]
    except KeyError:
        raise ValueError(f"no accuracy gate for category {category!r}; known: {', '.join(GATES)}") from None
