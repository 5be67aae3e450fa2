"""YOLOV8 on a real model server with a weights file: served detections equal a
direct forward pass of the same network, and every params rule."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from torchvision.ops import batched_nms

from models.yolov8 import coco_categories
from models.yolov8_net import build_network, decode_head
from svc.model.weights import calibrate_batchnorm
from tests.support.images import b64, image_bytes
from tests.support.processes import (
    start_model_server,
    write_config,
)
from tests.support.zoo import assert_invalid, assert_ok, infer, load_error

URI = "/yolov8/predict"
IMGSZ = 256


def seeded_network(seed: int, scale: str = "n") -> torch.nn.Module:
    torch.manual_seed(seed)
    net = build_network(scale)
    calibrate_batchnorm(net, (2, 3, IMGSZ, IMGSZ), seed)
    return net.eval()


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    from safetensors.torch import save_file

    directory = tmp_path_factory.mktemp("yolo")
    net = seeded_network(11)
    path = directory / "yolov8n.safetensors"
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return net, path


@pytest.fixture(scope="module")
def yolo(weights, tmp_path_factory):
    _, path = weights
    config = write_config(tmp_path_factory.mktemp("yolo-conf"), "YOLOV8", max_queue_depth=0,
                          model={"weights": str(path), "imgsz": IMGSZ})
    server = start_model_server(config)
    yield server
    server.stop()


def direct(net, raw: bytes, score_threshold: float, nms_threshold: float, top_k: int) -> list[dict]:
    """Letterbox, forward, decode, class-aware NMS, map back: written out here, not the plugin's code."""
    image = Image.open(io.BytesIO(raw)).convert("RGB")
    w, h = image.size
    gain = min(IMGSZ / w, IMGSZ / h)
    nw, nh = round(w * gain), round(h * gain)
    left, top = round((IMGSZ - nw) / 2 - 0.1), round((IMGSZ - nh) / 2 - 0.1)
    canvas = Image.new("RGB", (IMGSZ, IMGSZ), (114, 114, 114))
    canvas.paste(image.resize((nw, nh), Image.BILINEAR), (left, top))
    x = torch.frombuffer(bytearray(canvas.tobytes()), dtype=torch.uint8).view(1, IMGSZ, IMGSZ, 3)
    x = x.permute(0, 3, 1, 2).float() / 255
    with torch.inference_mode():
        pred = decode_head(net(x), net.model[22].dfl.conv.weight)[0]
    scores, classes = pred[:, 4:].max(1)
    keep = scores > score_threshold
    boxes, scores, classes = pred[keep, :4], scores[keep], classes[keep]
    kept = batched_nms(boxes, scores, classes, nms_threshold)[:top_k]
    names = coco_categories()
    out = []
    for b, s, c in zip(boxes[kept].tolist(), scores[kept].tolist(), classes[kept].tolist()):
        x1, y1, x2, y2 = (b[0] - left) / gain, (b[1] - top) / gain, (b[2] - left) / gain, (b[3] - top) / gain
        bbox = [min(max(x1, 0), w), min(max(y1, 0), h), min(max(x2, 0), w), min(max(y2, 0), h)]
        out.append({"class_id": c, "category": names[c], "score": s, "bbox": bbox})
    return out


def assert_same_detections(served: list[dict], expected: list[dict]) -> None:
    assert len(served) == len(expected) > 0
    assert [d["class_id"] for d in served] == [d["class_id"] for d in expected]
    assert [d["category"] for d in served] == [d["category"] for d in expected]
    assert [d["score"] for d in served] == pytest.approx([d["score"] for d in expected], abs=1e-5)
    for s, e in zip(served, expected):
        assert s["bbox"] == pytest.approx(e["bbox"], abs=1e-2)


@pytest.mark.parametrize("size", [(320, 240), (200, 400), (513, 97)])
def test_served_detections_equal_a_direct_forward_pass(yolo, weights, size):
    net, _ = weights
    raw = image_bytes(width=size[0], height=size[1], seed=sum(size))
    params = {"score_threshold": 0.3, "nms_threshold": 0.5, "top_k": 25}
    served = assert_ok(infer(yolo, URI, {"images": [b64(raw)], "params": params}))[0]
    assert_same_detections(served, direct(net, raw, 0.3, 0.5, 25))
    for d in served:
        x1, y1, x2, y2 = d["bbox"]
        assert 0 <= x1 <= x2 <= size[0] and 0 <= y1 <= y2 <= size[1]
        assert set(d) == {"class_id", "category", "score", "bbox"}


def test_a_batch_of_images_answers_each_in_order(yolo, weights):
    net, _ = weights
    raws = [image_bytes(width=300, height=200, seed=s) for s in (1, 2, 3)]
    body = {"images": [b64(r) for r in raws], "params": {"score_threshold": 0.3, "top_k": 10}}
    reply = infer(yolo, URI, body)
    assert reply.json["model"]["name"] == "YOLOV8"
    assert reply.json["model"]["version"].startswith("yolov8n.safetensors@")
    for served, raw in zip(assert_ok(reply, 3), raws):
        assert_same_detections(served, direct(net, raw, 0.3, 0.7, 10))


def test_top_k_and_max_results_cap_the_list(yolo):
    image = b64(image_bytes(width=320, height=240, seed=5))
    assert len(assert_ok(infer(yolo, URI, {"images": [image], "params": {"score_threshold": 0.0, "top_k": 7}}))[0]) == 7
    capped = infer(yolo, URI, {"images": [image], "params": {"score_threshold": 0.0}, "options": {"max_results": 3}})
    assert len(assert_ok(capped)[0]) == 3
    assert assert_ok(infer(yolo, URI, {"images": [image], "params": {"score_threshold": 1.0}}))[0] == []


@pytest.mark.parametrize(
    "params, pointer",
    [
        ({"iou": 0.5}, "/params/iou"),
        ({"score_threshold": "0.5"}, "/params/score_threshold"),
        ({"score_threshold": 1.5}, "/params/score_threshold"),
        ({"nms_threshold": -0.1}, "/params/nms_threshold"),
        ({"nms_threshold": True}, "/params/nms_threshold"),
        ({"top_k": 0}, "/params/top_k"),
        ({"top_k": 1001}, "/params/top_k"),
        ({"top_k": 2.5}, "/params/top_k"),
    ],
)
def test_params_rules(yolo, params, pointer):
    assert_invalid(infer(yolo, URI, {"images": [b64(image_bytes())], "params": params}), pointer)


def test_options_it_does_not_honour_are_422(yolo):
    reply = infer(yolo, URI, {"images": [b64(image_bytes())], "options": {"mask_format": "rle"}})
    assert_invalid(reply, "/options/mask_format")


def test_jobs_are_off(yolo):
    from tests.support.http import post

    assert post(yolo.url + "/jobs", {"images": [b64(image_bytes())]}, headers=yolo.auth).status == 404


def test_mismatched_weights_stop_the_server_naming_the_tensor(tmp_path):
    path = tmp_path / "yolov8s.pth"
    torch.save(build_network("s").state_dict(), path)  # an s checkpoint for the n architecture
    error = load_error(tmp_path, "YOLOV8", weights=str(path), imgsz=IMGSZ)
    assert error == (f"weights file {path}: tensor 'model.0.conv.weight' has shape [32, 3, 3, 3], "
                     "the architecture expects [16, 3, 3, 3]")
