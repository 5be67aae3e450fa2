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
"""

from __future__ import annotations

import functools
from typing import Any


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
            data["masks"] = self._upsample(data["masks"])
            return self._select(data, crop_box, orig_size)

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
            data["rles"] = mask_to_rle_pytorch(data["masks"])
            del data["masks"]
            return data

    return MaskGenerator
