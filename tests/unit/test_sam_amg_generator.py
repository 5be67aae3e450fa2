"""SAM_AMG's mask generator filters by predicted IoU before upsampling and gives the library's masks, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from segment_anything import SamAutomaticMaskGenerator

from models.sam_amg import build_sam
from models.sam_amg_generator import make_generator
from tests.support.images import image_bytes

WIDTH, HEIGHT = 160, 120
#: A threshold that the random-init decoder's predicted IoUs (about -0.08 to 0.14) straddle, and a
#: stability offset of 0 (stability 1 for any mask with a positive pixel), so that both filters keep
#: some masks and drop others.
FILTERS = {"pred_iou_thresh": 0.05, "stability_score_offset": 0.0, "stability_score_thresh": 0.5}


@pytest.fixture(scope="module")
def sam():
    torch.manual_seed(5)
    return build_sam("tiny")


@pytest.fixture(scope="module")
def image():
    from io import BytesIO

    from PIL import Image

    return np.asarray(Image.open(BytesIO(image_bytes(width=WIDTH, height=HEIGHT, fmt="PNG", seed=3))).convert("RGB"))


def listed(rles: list) -> list:
    """Run-length encodings with their counts as lists of ints, as the library makes them."""
    return [{"size": rle["size"], "counts": rle["counts"].tolist()} for rle in rles]


def batch(generator, image) -> dict:
    """One full batch of the generator's point prompts over the whole image, as its crop loop runs it."""
    generator.predictor.set_image(image)
    points = generator.point_grids[0][: generator.points_per_batch] * np.array([[WIDTH, HEIGHT]])
    box = [0, 0, WIDTH, HEIGHT]
    with torch.inference_mode():
        return dict(generator._process_batch(points, (HEIGHT, WIDTH), box, (HEIGHT, WIDTH)).items())


def test_a_batch_keeps_the_same_masks_as_the_librarys(sam, image):
    settings = {"points_per_side": 8, "points_per_batch": 64, **FILTERS}
    expected = batch(SamAutomaticMaskGenerator(sam, **settings), image)
    ours = batch(make_generator(sam, **settings), image)
    assert 0 < len(ours["rles"]) < 64 * 3  # the filters kept some masks and dropped others
    assert set(ours) == set(expected) == {"iou_preds", "points", "stability_score", "boxes", "rles"}
    for key in ("iou_preds", "points", "stability_score", "boxes"):
        assert torch.equal(ours[key], expected[key]), key
    assert listed(ours["rles"]) == expected["rles"]


def test_the_iou_filter_alone_drops_masks_before_they_are_upsampled(sam, image):
    settings = {"points_per_side": 8, "points_per_batch": 64, "pred_iou_thresh": 0.05, "stability_score_thresh": 0.0}
    generator = make_generator(sam, **settings)
    upsampled = []
    upsample = generator._upsample
    generator._upsample = lambda masks: upsampled.append(masks.shape[0]) or upsample(masks)
    kept = batch(generator, image)
    assert upsampled == [len(kept["rles"])]
    assert 0 < upsampled[0] < 64 * 3
    assert listed(kept["rles"]) == batch(SamAutomaticMaskGenerator(sam, **settings), image)["rles"]


def test_an_iou_threshold_of_0_keeps_every_mask_negative_ious_included(sam, image):
    """docs/models.md: 0 turns the IoU filter off, as in segment-anything (a probe read "above this" and found masks
    of a negative predicted IoU kept at 0): the random-init decoder predicts some below 0, and every one is kept."""
    settings = {"points_per_side": 4, "points_per_batch": 16, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}
    kept = batch(make_generator(sam, **settings), image)
    assert len(kept["rles"]) == 16 * 3 and bool((kept["iou_preds"] < 0).any())
    assert listed(kept["rles"]) == batch(SamAutomaticMaskGenerator(sam, **settings), image)["rles"]
    from models.sam_amg import PARAMS_SCHEMA

    assert "0 keeps every mask" in PARAMS_SCHEMA["properties"]["pred_iou_thresh"]["description"]


def test_a_batch_whose_masks_all_fail_the_iou_filter_gives_nothing(sam, image):
    settings = {"points_per_side": 4, "points_per_batch": 16, "pred_iou_thresh": 0.99}
    ours = batch(make_generator(sam, **settings), image)
    assert listed(ours["rles"]) == [] and ours["boxes"].shape == (0, 4)
    assert batch(SamAutomaticMaskGenerator(sam, **settings), image)["rles"] == []


@pytest.mark.parametrize(("filters", "records"), [(FILTERS, 64), ({}, 0)],
                         ids=["filters-that-keep-some", "shipped-defaults-keep-none"])
def test_generate_returns_the_librarys_records(sam, image, filters, records):
    settings = {"points_per_side": 8, "points_per_batch": 32, "box_nms_thresh": 1.0, **filters}
    with torch.inference_mode():
        expected = SamAutomaticMaskGenerator(sam, **settings).generate(image)
        ours = make_generator(sam, **settings).generate(image)
    assert len(ours) == len(expected) == records
    for mine, theirs in zip(ours, expected):
        assert set(mine) == set(theirs)
        assert np.array_equal(mine["segmentation"], theirs["segmentation"])
        assert {k: v for k, v in mine.items() if k != "segmentation"} == \
            {k: v for k, v in theirs.items() if k != "segmentation"}


def test_a_batch_is_upsampled_in_parts_of_a_bounded_size_with_the_same_masks(sam, image, monkeypatch):
    import models.sam_amg_generator

    monkeypatch.setattr(models.sam_amg_generator, "UPSAMPLE_PIXELS", WIDTH * HEIGHT * 7 + 5)
    settings = {"points_per_side": 8, "points_per_batch": 64, **FILTERS}
    generator = make_generator(sam, **settings)
    upsampled = []
    upsample = generator._upsample
    generator._upsample = lambda masks: upsampled.append(masks.shape[0]) or upsample(masks)
    ours = batch(generator, image)
    expected = batch(SamAutomaticMaskGenerator(sam, **settings), image)
    assert len(upsampled) > 2 and max(upsampled) == 7  # parts of 7 masks (of this image's size) at most
    monkeypatch.undo()
    whole = []
    generator = make_generator(sam, **settings)
    upsample = generator._upsample
    generator._upsample = lambda masks: whole.append(masks.shape[0]) or upsample(masks)
    batch(generator, image)
    assert len(whole) == 1 and sum(upsampled) == whole[0]  # every mask that passed the IoU filter, once
    for key in ("iou_preds", "points", "stability_score", "boxes"):
        assert torch.equal(ours[key], expected[key]), key
    assert listed(ours["rles"]) == expected["rles"]


def test_the_plugin_keeps_masks_run_length_encoded_until_postprocess(sam, image):
    from models.sam_amg import SamAmgModel

    params = {"points_per_side": 8, "pred_iou_thresh": 0.05, "stability_score_thresh": 0.0, "box_nms_thresh": 1.0,
              "min_mask_region_area": 0}
    model = SamAmgModel(sam, "cpu", "test", points_per_batch=32)
    with torch.inference_mode():
        expected = SamAutomaticMaskGenerator(sam, points_per_batch=32, **params).generate(image)
    (records,) = model.predict([image], params)
    assert len(records) == len(expected) > 0
    assert all(r["segmentation"].keys() == {"size", "counts"} for r in records)  # not an image-sized array
    served = model.postprocess(records, params, {"mask_format": "rle"})

    for mine, theirs in zip(served, expected):
        rle = {"size": mine["segmentation"]["size"], "counts": mine["segmentation"]["counts"].encode()}
        assert np.array_equal(mask_utils.decode(rle).astype(bool), theirs["segmentation"])
        assert mine["area"] == theirs["area"] and mine["bbox"] == theirs["bbox"]


@pytest.mark.parametrize("counts", [[0, 12], [12], [3, 4, 5], [0, 1, 10, 1], [5, 7]], ids=str)
def test_a_compacted_rle_decodes_as_the_librarys(counts):
    from segment_anything.utils.amg import rle_to_mask

    from models.sam_amg_generator import compact, mask_of

    rle = {"size": [3, 4], "counts": counts}
    small = compact(rle)
    assert small["counts"].dtype == np.int32 and small["counts"].tolist() == counts
    assert np.array_equal(mask_of(small), rle_to_mask(rle)) and mask_of(small).shape == (3, 4)
