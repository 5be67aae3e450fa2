"""SAM_AMG's mask generator: segment-anything's, with the predicted-IoU filter before the upsampling.

``SamAutomaticMaskGenerator`` runs each batch of point prompts through the
mask decoder, upsamples every low-resolution mask (3 per prompt) to the
image's size, and only then drops the masks whose predicted IoU is at or
below ``pred_iou_thresh``.  The predicted IoU comes from the decoder, so the
filter does not need the upsampled mask: :func:`generator_class`'s subclass applies it
first and upsamples only the masks it keeps.  The upsampling is one bilinear
interpolation per mask plane, so a kept mask is computed exactly as before
and the generator's output is the same, bit for bit
(``tests/unit/test_sam_amg_generator.py`` compares the two).

What it saves is most of the generator's time outside the networks: on a
640x480 image, upsampling one batch of 64 prompts (192 masks) writes 59 M
floats, about 0.2 s on two cores, and with the shipped threshold (0.88) a
trained SAM keeps a fraction of its masks (the demo weights keep none).
Everything after the filter (stability score, thresholding, boxes, crop
edges, RLE) is the library's own functions in the library's order.

The kept masks are upsampled in parts of at most :data:`UPSAMPLE_PIXELS`
pixels rather than a whole batch at once, so that the generator's memory does
not grow with ``points_per_batch`` times the image's pixels, and the kept
masks' run-length encodings hold their runs in numpy arrays (:func:`compact`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

#: At most this many mask pixels are upsampled at once: the logits of a batch of prompts (3 masks
#: each) at the image's size are float32, and the stability score and the threshold make more
#: copies of them.  One batch of 64 prompts on a 2048x2048 image would be 3.2 GB of logits alone;
#: in parts of 2^24 pixels (64 MB of logits) the peak stays near a few hundred MB whatever the
#: image's size, and each mask is computed as before.
UPSAMPLE_PIXELS = 1 << 24


def make_generator(sam: Any, **kwargs: Any) -> Any:
    """A :func:`generator_class` generator of ``sam`` with ``SamAutomaticMaskGenerator``'s keyword arguments."""
    return generator_class()(sam, **kwargs)


@functools.cache
def generator_class() -> type:
    """The generator class, made at first use.

    Plugin discovery imports every module of ``models/`` (in the gateway and
    the supervisor too), so torch and segment-anything are imported here,
    not at the top.
    """
    import numpy as np
    import torch
    from segment_anything import SamAutomaticMaskGenerator
    from segment_anything.utils.amg import (
        MaskData,
        batched_mask_to_box,
        calculate_stability_score,
        is_box_near_crop_edge,
        mask_to_rle_pytorch,
        uncrop_masks,
    )

    class MaskGenerator(SamAutomaticMaskGenerator):
        """``SamAutomaticMaskGenerator`` that upsamples only the masks that pass ``pred_iou_thresh``."""

        def _process_batch(self, points: np.ndarray, im_size: tuple[int, ...], crop_box: list[int],
                           orig_size: tuple[int, ...]) -> MaskData:
            low_res, iou_preds = self._decode(points, im_size)
            data = MaskData(
                masks=low_res.flatten(0, 1),
                iou_preds=iou_preds.flatten(0, 1),
                points=torch.as_tensor(points.repeat(low_res.shape[1], axis=0)),
            )
            if self.pred_iou_thresh > 0.0:
                data.filter(data["iou_preds"] > self.pred_iou_thresh)
            kept = MaskData()
            for part in self._parts(data, orig_size):
                part["masks"] = self._upsample(part["masks"])
                kept.cat(self._select(part, crop_box, orig_size))
            return kept

        def _parts(self, data: MaskData, orig_size: tuple[int, ...]) -> Iterator[MaskData]:
            """``data`` in parts of at most :data:`UPSAMPLE_PIXELS` pixels (one part if it is empty).

            Counted at the image's size (``orig_size``), which a crop's masks
            are padded to, and which is never smaller than the crop's.
            """
            height, width = orig_size
            step = max(1, UPSAMPLE_PIXELS // (height * width))
            count = len(data["masks"])
            for start in range(0, max(count, 1), step):
                yield MaskData(**{key: value[start:start + step] for key, value in data.items()})

        def _decode(self, points: np.ndarray, im_size: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
            """Low-resolution mask logits (prompts x 3 x h x w) and predicted IoUs of one batch of point prompts.

            The calls ``SamPredictor.predict_torch`` makes before its upsampling,
            with the same arguments (``svc.optimize`` may have put a stand-in in
            the decoder's place: it takes these calls).
            """
            predictor = self.predictor
            sam = predictor.model
            coords = torch.as_tensor(predictor.transform.apply_coords(points, im_size), device=predictor.device)
            labels = torch.ones(coords.shape[0], dtype=torch.int, device=predictor.device)
            sparse, dense = sam.prompt_encoder(points=(coords[:, None, :], labels[:, None]), boxes=None, masks=None)
            low_res, iou_preds = sam.mask_decoder(
                image_embeddings=predictor.features,
                image_pe=sam.prompt_encoder.get_dense_pe(),
                sparse_prompt_embeddings=sparse,
                dense_prompt_embeddings=dense,
                multimask_output=True,
            )
            return low_res, iou_preds

        def _upsample(self, masks: torch.Tensor) -> torch.Tensor:
            """Mask logits (n x h x w) at the image's size (n x H x W), as ``Sam.postprocess_masks`` makes them."""
            predictor = self.predictor
            if masks.shape[0] == 0:
                return masks.new_zeros((0, *predictor.original_size))
            return predictor.model.postprocess_masks(masks[:, None], predictor.input_size, predictor.original_size)[:, 0]

        def _select(self, data: MaskData, crop_box: list[int], orig_size: tuple[int, ...]) -> MaskData:
            """The library's steps after the IoU filter: stability, threshold, boxes, crop edges, RLE."""
            threshold = self.predictor.model.mask_threshold
            data["stability_score"] = calculate_stability_score(data["masks"], threshold, self.stability_score_offset)
            if self.stability_score_thresh > 0.0:
                data.filter(data["stability_score"] >= self.stability_score_thresh)
            data["masks"] = data["masks"] > threshold
            data["boxes"] = batched_mask_to_box(data["masks"])
            orig_h, orig_w = orig_size
            keep = ~is_box_near_crop_edge(data["boxes"], crop_box, [0, 0, orig_w, orig_h])
            if not torch.all(keep):
                data.filter(keep)
            data["masks"] = uncrop_masks(data["masks"], crop_box, orig_h, orig_w)
            data["rles"] = [compact(rle) for rle in mask_to_rle_pytorch(data["masks"])]
            del data["masks"]
            return data

    return MaskGenerator


def compact(rle: dict) -> dict:
    """A segment-anything uncompressed RLE with its counts in a numpy array instead of a list of ints.

    Every kept mask waits as its RLE until the generator's NMS and the
    plugin's postprocess: as a list, a run costs 36 bytes (an int object and
    its pointer), and the demo weights' ragged masks have a run every 20
    pixels or so, more than the mask's own bytes.  4 bytes a run (8 past 2^31
    pixels) is what the library's functions (``rle_to_mask``,
    ``area_from_rle``, ``coco_encode_rle``) read as well.
    """
    import numpy as np

    height, width = rle["size"]
    dtype = np.int32 if height * width < 2**31 else np.int64
    return {"size": rle["size"], "counts": np.asarray(rle["counts"], dtype=dtype)}


def mask_of(rle: dict) -> Any:
    """The H x W bool array of an uncompressed RLE, as ``rle_to_mask`` makes it, without a Python loop per run."""
    import numpy as np

    height, width = rle["size"]
    counts = np.asarray(rle["counts"])
    flat = np.repeat(np.arange(len(counts)) % 2 == 1, counts)  # runs alternate 0, 1, 0, ... from a 0-run
    return flat.reshape(width, height).T
