"""SAM_AMG on a real model server with a weights file: the served masks are
those of segment-anything's SamAutomaticMaskGenerator on the same image,
PNG and RLE encodings agree, and every params rule."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from segment_anything import SamAutomaticMaskGenerator

from models.sam_amg import build_sam
from tests.support.images import b64, image_bytes
from tests.support.processes import (
    start_model_server,
    write_config,
)
from tests.support.zoo import assert_invalid, assert_ok, decode_image, infer, load_error, run_job

URI = "/sam_amg/predict"
#: Few prompts and no filtering (random-init masks are speckles whose boxes all span the image: NMS
#: at any IoU below 1 keeps one): 16 prompts x 3 masks.
PARAMS = {"points_per_side": 4, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0, "box_nms_thresh": 1.0}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(21)
    sam = build_sam("tiny")
    path = tmp_path_factory.mktemp("sam") / "sam_tiny.pth"
    torch.save(sam.state_dict(), path)
    return sam, path


@pytest.fixture(scope="module")
def sam_server(weights, tmp_path_factory):
    _, path = weights
    config = write_config(tmp_path_factory.mktemp("sam-conf"), "SAM_AMG", model={"weights": str(path)})
    server = start_model_server(config)
    yield server
    server.stop()


def direct(sam, raw: bytes, params: dict) -> list[dict]:
    image = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    return SamAutomaticMaskGenerator(sam, **params).generate(image)


def png_mask(text: str) -> np.ndarray:
    image = decode_image(text)
    assert image.format == "PNG" and image.mode == "1"
    return np.asarray(image)


def assert_same_masks(served: list[dict], expected: list[dict]) -> None:
    assert len(served) == len(expected) > 1
    for s, e in zip(served, expected):
        assert set(s) == {"segmentation", "area", "bbox", "predicted_iou", "stability_score"}
        assert np.array_equal(png_mask(s["segmentation"]), e["segmentation"])
        assert s["area"] == e["area"]
        assert s["bbox"] == pytest.approx(e["bbox"])
        assert s["predicted_iou"] == pytest.approx(e["predicted_iou"], abs=1e-6)
        assert s["stability_score"] == pytest.approx(e["stability_score"], abs=1e-6)


@pytest.mark.parametrize("size", [(96, 64), (50, 120)])
def test_served_masks_equal_the_generators(sam_server, weights, size):
    sam, _ = weights
    raw = image_bytes(width=size[0], height=size[1], seed=sum(size))
    served = assert_ok(infer(sam_server, URI, {"images": [b64(raw)], "params": PARAMS}))[0]
    assert_same_masks(served, direct(sam, raw, PARAMS))
    for record in served:
        mask = png_mask(record["segmentation"])
        assert mask.shape == (size[1], size[0])  # the image's size
        assert record["area"] == int(mask.sum())  # area = the mask's pixel count
        x, y, w, h = record["bbox"]
        assert 0 <= x and 0 <= y and x + w <= size[0] and y + h <= size[1]
        rows, columns = np.nonzero(mask)  # as docs/models.md says: last column and row minus the first
        assert [x, y, w, h] == [columns.min(), rows.min(), columns.max() - columns.min(), rows.max() - rows.min()]


def test_images_past_the_shipped_pixel_limit_fail_their_item(sam_server):
    """The shipped config caps SAM_AMG at 2048x2048 pixels (its masks are at
    the image's size): a few-kilobyte PNG of 2049x2048 fails its own item
    with status 5, before decoding, and the other item is served."""
    big = b64(image_bytes(width=2049, height=2048))
    reply = infer(sam_server, URI, {"images": [big, b64(image_bytes(width=32, height=24))], "params": PARAMS})
    assert reply.status == 200 and reply.json["status"] == 0
    first, second = reply.json["results"]
    assert (first["status"], first["data"]) == (5, None)
    assert first["error"] == "image is 2049x2048 = 4196352 pixels; at most 4194304 are accepted (max_image_pixels)"
    assert second["status"] == 0


def test_rle_masks_round_trip_to_the_png_masks(sam_server):
    raw = b64(image_bytes(width=80, height=60, seed=4))
    png = assert_ok(infer(sam_server, URI, {"images": [raw], "params": PARAMS}))[0]
    rle = assert_ok(infer(sam_server, URI, {"images": [raw], "params": PARAMS, "options": {"mask_format": "rle"}}))[0]
    assert len(png) == len(rle) > 1
    for p, r in zip(png, rle):
        assert r["segmentation"]["size"] == [60, 80]
        decoded = mask_utils.decode({"size": r["segmentation"]["size"], "counts": r["segmentation"]["counts"].encode()})
        assert np.array_equal(decoded.astype(bool), png_mask(p["segmentation"]))
        assert r["area"] == int(decoded.sum()) == p["area"]
        assert int(mask_utils.area({"size": r["segmentation"]["size"], "counts": r["segmentation"]["counts"].encode()})) == r["area"]
        assert {k: v for k, v in r.items() if k != "segmentation"} == {k: v for k, v in p.items() if k != "segmentation"}


def test_small_regions_are_removed_as_the_library_does(sam_server, weights):
    sam, _ = weights
    raw = image_bytes(width=72, height=48, seed=9)
    params = {**PARAMS, "min_mask_region_area": 40}
    served = assert_ok(infer(sam_server, URI, {"images": [b64(raw)], "params": params}))[0]
    assert_same_masks(served, direct(sam, raw, params))


def test_a_job_gives_the_same_masks_and_max_results_caps_them(sam_server):
    raw = b64(image_bytes(width=64, height=64, seed=2))
    sync = assert_ok(infer(sam_server, URI, {"images": [raw], "params": PARAMS}))[0]
    job = run_job(sam_server, {"images": [raw], "params": PARAMS})
    assert job["status"] == 0 and job["results"][0]["data"] == sync
    capped = assert_ok(infer(sam_server, URI, {"images": [raw], "params": PARAMS, "options": {"max_results": 2}}))[0]
    assert capped == sync[:2]


def test_default_thresholds_filter_random_masks(sam_server, weights):
    """Random-init SAM predicts low IoUs: the library's default thresholds keep (almost) nothing.

    Without thresholds the same image gives masks below them, so the defaults had something to remove;
    with them the served masks are the library's own (possibly none).  An 8x8 grid of prompts keeps it quick.
    """
    sam, _ = weights
    raw = image_bytes(width=64, height=48, seed=1)
    grid = {"points_per_side": 8}
    unfiltered = assert_ok(infer(sam_server, URI, {"images": [b64(raw)], "params": {
        **grid, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}}))[0]
    below = [d for d in unfiltered if not (d["predicted_iou"] > 0.88 and d["stability_score"] >= 0.95)]
    assert below, "no mask below the default thresholds: the test would not show that they filter"
    data = assert_ok(infer(sam_server, URI, {"images": [b64(raw)], "params": grid}))[0]
    expected = direct(sam, raw, grid)
    assert len(data) == len(expected) < len(unfiltered)
    for served, library in zip(data, expected):
        assert np.array_equal(png_mask(served["segmentation"]), library["segmentation"])
        assert served["predicted_iou"] == pytest.approx(library["predicted_iou"], abs=1e-6)
    assert all(d["predicted_iou"] > 0.88 and d["stability_score"] >= 0.95 for d in data)


@pytest.mark.parametrize(
    "params, pointer",
    [
        ({"points": 4}, "/params/points"),
        ({"points_per_side": 0}, "/params/points_per_side"),
        ({"points_per_side": 65}, "/params/points_per_side"),
        ({"points_per_side": "8"}, "/params/points_per_side"),
        ({"pred_iou_thresh": 1.01}, "/params/pred_iou_thresh"),
        ({"stability_score_thresh": -0.5}, "/params/stability_score_thresh"),
        ({"box_nms_thresh": None}, "/params/box_nms_thresh"),
        ({"min_mask_region_area": -1}, "/params/min_mask_region_area"),
        ({"min_mask_region_area": 2.5}, "/params/min_mask_region_area"),
    ],
)
def test_params_rules(sam_server, params, pointer):
    assert_invalid(infer(sam_server, URI, {"images": [b64(image_bytes())], "params": params}), pointer)


def test_options_rules(sam_server):
    image = b64(image_bytes())
    assert_invalid(infer(sam_server, URI, {"images": [image], "options": {"mask_format": "bitmap"}}), "/options/mask_format")
    assert_invalid(infer(sam_server, URI, {"images": [image], "options": {"image_format": "png"}}), "/options/image_format")


def test_mismatched_weights_stop_the_server_naming_the_tensor(tmp_path, weights):
    sam, _ = weights
    state = dict(sam.state_dict())
    name = "mask_decoder.iou_prediction_head.layers.2.weight"
    state[name] = state[name][:2]
    path = tmp_path / "broken.pth"
    torch.save(state, path)
    error = load_error(tmp_path, "SAM_AMG", weights=str(path))
    assert error == f"weights file {path}: tensor '{name}' has shape [2, 256], the architecture expects [4, 256]"
