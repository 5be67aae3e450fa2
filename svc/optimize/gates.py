"""The accuracy gates: an optimised model's outputs against eager's, one comparison per task category.

A plugin's ``gate_outputs()`` (``svc.model.api.IOptimizable``) runs the model
on its fixed seeded gate inputs and returns what its category compares; the
engine calls it once with every target eager (the reference) and once per
candidate mode.  The gates run on the weights actually loaded (random init
or pretrained), so a mode is checked on the model it will serve.

Each gate bounds what a user of the task would notice, not the arithmetic:
bfloat16 keeps 8 bits of mantissa, so a box corner near 640 px moves by
about 2.5 px and a logit by a few per cent from rounding alone, and neither
changes what anyone sees.  Tolerances are the named constants below; the
docs/optimize.md ("Accuracy gates") states them with what bf16 measured against each.

- classification: ``(N, classes)`` logits.  For every input the same top-1
  class, or one whose reference logit is within ``TOP1_TIE_LOGIT`` of it (a
  near-tie: scores within 11 % of each other), and the same top-5 set up to
  classes within ``TOPK_TIE_LOGIT`` of the reference's 5th; and the logits' relative
  error (the RMS of the difference over the RMS of the reference, both
  centred per input, since softmax ignores a shift) at most ``LOGIT_RTOL``.
- detection: per image ``(boxes (K, 4) in pixels, scores (K,), classes (K,))``
  after NMS, or ``{"detections": [those], "score_threshold": t, "top_k": k}``
  with the params they ran with.  Reference detections, best score first,
  are matched greedily to the unmatched candidate detection of the same
  class with the highest IoU, at least ``DETECTION_IOU_MIN``; matched scores
  differ by at most ``SCORE_ATOL``.  A detection left unmatched on either
  side is tolerated only at a cut, where a tiny change of score decides
  (its score within ``SCORE_ATOL`` of ``score_threshold``, or of the lowest
  score of the other side's list when that list holds ``top_k``), and only
  ``UNMATCHED_FRACTION`` of an image's reference detections (at least one;
  a box exchanged for another counts once), or more where that many of
  both lists are tied with the cut, as long as one box matches (saturated
  scores: random-init YOLOV8 gives every box 1.000, and rounding reorders
  which of thousands fill ``top_k``);
  without the params, every detection must match.
- generation: ``{"image": uint8 (N, H, W, C), "noise": [per-step noise
  predictions]}`` of one seeded sampling run.  The final image: every pixel
  within ``IMAGE_PIXEL_ATOL`` and the mean absolute difference at most
  ``IMAGE_MEAN_ATOL`` (both on the [0, 1] scale; x 255 for uint8 levels).
  The per-step noise's relative L2 error is reported, not gated: the image
  is what the user gets.
- segmentation: masks ``(M, H, W)`` (bool) of fixed prompts.  Every mask's
  IoU with its reference ``>= MASK_IOU_MIN`` (two empty masks agree).

Every gate also refuses outputs that are not finite or not of the reference's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: classification: the candidate's top-1 may be another class only if its reference logit is within this of the
#: reference's top-1 (a near-tie: scores within exp(0.1) = 1.105 of each other, which no user can rank).
TOP1_TIE_LOGIT = 0.1
#: classification: a class may cross the top-5 cut only if its reference logit is within this of the reference's
#: 5th (scores within exp(0.5) = 1.65 of each other; a 5 % logit error swaps ties this wide at the cut of 1000 classes).
TOPK_TIE_LOGIT = 0.5
#: classification: how many classes the user sees ranked (``top_k``'s default).
TOP_K = 5
#: classification: relative error of the logits, RMS of the difference over RMS of the reference (centred per input).
#: bf16 measured 5.6 % on the demo weights' gate inputs and 8.9 % on photo-like images (docs/optimize.md, "Accuracy gates").
LOGIT_RTOL = 0.15
#: detection: a reference detection is matched by a candidate of the same class with at least this IoU.
DETECTION_IOU_MIN = 0.9
#: detection: matched scores within this (absolute, scores in [0, 1]); also the width of a cut.
SCORE_ATOL = 0.05
#: detection: at most this fraction of an image's reference detections (at least one) may change at a cut.
UNMATCHED_FRACTION = 0.1
#: generation: every pixel of the final image within this, on the [0, 1] scale (32 of 255 levels).
IMAGE_PIXEL_ATOL = 32 / 255
#: generation: the mean absolute difference of the final image at most this, on the [0, 1] scale (4 of 255 levels).
IMAGE_MEAN_ATOL = 4 / 255
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
    """The same top-1 and top-5 for every input up to near-ties; logits within ``LOGIT_RTOL`` (relative RMS)."""
    import numpy as np

    ref, out = _np(reference), _np(candidate)
    bad = _bad_shape_or_values(ref, out)
    if bad:
        return GateResult(False, bad)
    ref, out = ref.reshape(-1, ref.shape[-1] if ref.ndim else 1), out.reshape(-1, out.shape[-1] if out.ndim else 1)
    k = min(TOP_K, ref.shape[-1])
    top1 = topk = 0
    worst = 0.0
    for r, o in zip(ref, out):
        ranked = np.sort(r)[::-1]
        top1 += bool(r[o.argmax()] >= ranked[0] - TOP1_TIE_LOGIT)  # the reference's top-1, or one tied with it
        kth = ranked[k - 1]
        swapped = set(np.argsort(-r, kind="stable")[:k].tolist()) ^ set(np.argsort(-o, kind="stable")[:k].tolist())
        topk += all(abs(r[c] - kth) <= TOPK_TIE_LOGIT for c in swapped)  # only near-ties cross the cut
        centred = r - r.mean()
        error = (o - o.mean()) - centred
        worst = max(worst, float(np.sqrt((error**2).mean()) / (np.sqrt((centred**2).mean()) or 1.0)))
    n = len(ref)
    summary = f"top-1 {top1}/{n}, top-{k} {topk}/{n}, logit error {worst:.1e}"
    return GateResult(top1 == n and topk == n and worst <= LOGIT_RTOL, summary)


def box_iou(a: Any, b: Any) -> Any:
    """IoU of every box of ``a`` (K, 4) with every box of ``b`` (L, 4), (x1, y1, x2, y2): a (K, L) array."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    area_a = (a[:, 2] - a[:, 0]).clip(0) * (a[:, 3] - a[:, 1]).clip(0)
    area_b = (b[:, 2] - b[:, 0]).clip(0) * (b[:, 3] - b[:, 1]).clip(0)
    width = (np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])).clip(0)
    height = (np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])).clip(0)
    inter = width * height
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _detections(value: Any) -> tuple[list, float | None, int | None]:
    """(per-image detections, score threshold, top_k) of a detection gate output, list or dict form."""
    if isinstance(value, dict):
        return list(value["detections"]), value.get("score_threshold"), value.get("top_k")
    return list(value), None, None


def _at_a_cut(score: float, threshold: float | None, top_k: int | None, other_scores: Any) -> bool:
    """Whether a detection of ``score`` may be missing from the other side's list by a tiny change of score."""
    if threshold is not None and score - threshold <= SCORE_ATOL:
        return True
    return top_k is not None and len(other_scores) >= top_k and score <= float(other_scores.min()) + SCORE_ATOL


def _tied(ref_scores: Any, threshold: float | None, top_k: int | None, scores: Any) -> int:
    """How many detections of each side are tied with a cut (the fewer of the two): any of them may change places.

    Saturated scores (random-init demo weights give YOLOV8 300 boxes of score 1.000 at ``top_k`` 300) make a
    whole list one tie, which rounding reorders: such exchanges are allowed, the matched boxes are still held.
    """
    ref_tied = sum(_at_a_cut(float(s), threshold, top_k, scores) for s in ref_scores)
    tied = sum(_at_a_cut(float(s), threshold, top_k, ref_scores) for s in scores)
    return min(ref_tied, tied)


def detection(reference: Any, candidate: Any) -> GateResult:
    """The same detections: matched by class at IoU ``DETECTION_IOU_MIN``, scores within ``SCORE_ATOL``."""
    import numpy as np

    ref_images, threshold, top_k = _detections(reference)
    images = _detections(candidate)[0]
    if len(images) != len(ref_images):
        return GateResult(False, f"{len(images)} images instead of {len(ref_images)}")
    matched = at_cut = 0
    lowest_iou, worst_score = 1.0, 0.0
    for (ref_boxes, ref_scores, ref_classes), (boxes, scores, classes) in zip(ref_images, images):
        ref_boxes, boxes = _np(ref_boxes).reshape(-1, 4), _np(boxes).reshape(-1, 4)
        ref_scores, scores = _np(ref_scores).reshape(-1), _np(scores).reshape(-1)
        ref_classes, classes = _np(ref_classes).reshape(-1), _np(classes).reshape(-1)
        if not (np.isfinite(boxes).all() and np.isfinite(scores).all()):
            return GateResult(False, "outputs not finite")
        iou = np.where(ref_classes[:, None] == classes[None, :], box_iou(ref_boxes, boxes), -1.0)
        free = np.ones(len(boxes), dtype=bool)
        missing: list[tuple[str, int, float, float]] = []  # (side, class, score, best IoU)
        for i in np.argsort(-ref_scores, kind="stable"):
            row = np.where(free, iou[i], -1.0)
            j = int(row.argmax()) if len(row) else -1
            if j < 0 or row[j] < DETECTION_IOU_MIN:
                missing.append(("reference", int(ref_classes[i]), float(ref_scores[i]), max(0.0, row[j] if j >= 0 else 0)))
                continue
            free[j] = False
            matched += 1
            lowest_iou = min(lowest_iou, float(row[j]))
            worst_score = max(worst_score, abs(float(scores[j] - ref_scores[i])))
            if abs(scores[j] - ref_scores[i]) > SCORE_ATOL:
                return GateResult(False, f"a detection of class {int(ref_classes[i])} scores {scores[j]:.3f} "
                                         f"instead of {ref_scores[i]:.3f}")
        missing += [("candidate", int(classes[j]), float(scores[j]), 0.0) for j in np.flatnonzero(free)]
        allowed = max(1, int(UNMATCHED_FRACTION * len(ref_boxes)))
        for side, cls, score, best in missing:
            other = scores if side == "reference" else ref_scores
            if not _at_a_cut(score, threshold, top_k, other):
                what = "has no match" if side == "reference" else "is not in the reference"
                near = f" (best IoU {best:.2f})" if side == "reference" else ""
                return GateResult(False, f"a detection of class {cls} (score {score:.3f}) {what} of IoU >= "
                                         f"{DETECTION_IOU_MIN:g}{near}")
        new = sum(side == "candidate" for side, *_ in missing)
        changed = max(new, len(missing) - new)  # a box exchanged for another at a full list is one change
        if allowed < changed <= _tied(ref_scores, threshold, top_k, scores):
            if free.all():  # a tie may reorder a list, not replace it
                return GateResult(False, f"no detection matched: {len(ref_boxes)} in the reference, all changed")
        elif changed > allowed:
            return GateResult(False, f"{changed} detections changed at a cut ({len(missing) - new} missing, {new} "
                                     f"new), more than {allowed} of {len(ref_boxes)}")
        at_cut += changed
    cut = f", {at_cut} changed at a cut" if at_cut else ""
    return GateResult(True, f"{matched} detections matched, min IoU {lowest_iou:.3f}, "
                            f"max |d score| {worst_score:.3f}{cut}")


def generation(reference: dict, candidate: dict) -> GateResult:
    """The seeded run's final image: every pixel within ``IMAGE_PIXEL_ATOL``, the mean within ``IMAGE_MEAN_ATOL``."""
    import numpy as np

    image_ref, image = _np(reference["image"]), _np(candidate["image"])
    bad = _bad_shape_or_values(image_ref, image)
    if bad:
        return GateResult(False, f"image: {bad}")
    scale = 255.0 if np.asarray(reference["image"]).dtype == np.uint8 else 1.0
    difference = abs(image - image_ref) / scale
    largest = float(difference.max()) if difference.size else 0.0
    mean = float(difference.mean()) if difference.size else 0.0
    summary = f"image max |d| {largest * 255:.0f}/255, mean {mean * 255:.2f}/255"
    steps_ref, steps = reference.get("noise") or [], candidate.get("noise") or []
    if steps_ref and len(steps) == len(steps_ref):
        noise = max((float(np.linalg.norm(_np(o) - _np(r)) / (np.linalg.norm(_np(r)) or 1.0))
                     for r, o in zip(steps_ref, steps)), default=0.0)
        summary += f" (noise rel. L2 {noise:.1e} over {len(steps)} steps)"
    return GateResult(largest <= IMAGE_PIXEL_ATOL + 1e-9 and mean <= IMAGE_MEAN_ATOL + 1e-9, summary)


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


class NoGate(ValueError):
    """A model of a category no gate compares (a plugin's own): served eager, said in its words alone (it read
    ``ValueError: no accuracy gate ...``, like a crash, for a documented case)."""

    said_whole = True


def gate_for(category: str) -> Callable[[Any, Any], GateResult]:
    """The comparison for a task category; a ValueError names the known ones."""
    try:
        return GATES[category]
    except KeyError:
        raise NoGate(f"no accuracy gate for category {category!r}; known: {', '.join(GATES)}") from None
