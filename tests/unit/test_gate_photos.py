"""The accuracy gates see photographs: MOBILENETV2 always, YOLOV8 and SAM_AMG on loaded weights.

A trained network finds little in seeded noise or blobs (a trained YOLOv8n
detected 0 and 1 objects on YOLOV8's blobs), so a gate on those alone would
pass a mode that breaks what users see. ``models/gate_photos.py`` holds
three photographs (public domain and CC0); the plugins run them through
their own ``preprocess``, as a request's images.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from models.gate_photos import PHOTOS, PHOTOS_DIR, gate_photos
from svc.model.api import find_factory, model_config


def test_the_gate_photographs_are_packaged_jpegs_with_their_licences_stated():
    images = gate_photos()
    assert [os.path.basename(image.filename) for image in images] == list(PHOTOS)
    assert [(image.format, image.mode, image.size) for image in images] == [
        ("JPEG", "RGB", (512, 512)), ("JPEG", "RGB", (451, 300)), ("JPEG", "RGB", (600, 400))]
    assert sorted(os.listdir(PHOTOS_DIR)) == sorted([*PHOTOS, "README.md"])
    readme = open(os.path.join(PHOTOS_DIR, "README.md"), encoding="utf-8").read()
    for name in PHOTOS:
        assert f"`{name}`" in readme
    assert "CC0" in readme and "public domain" in readme
    # setup.py packages them, so that an installed service gates on them too
    setup = open(os.path.join(PHOTOS_DIR, "..", "..", "..", "setup.py"), encoding="utf-8").read()
    assert '"data/photos/*.jpg"' in setup


def test_mobilenetv2_gates_its_noise_images_and_the_photographs_as_preprocess_makes_them():
    from models.mobilenetv2 import GATE_IMAGES

    factory = find_factory("MOBILENETV2")
    model = factory.build(model_config(factory, {"weights": "random"}, "test:MOBILENETV2"), "cpu")
    logits = model.gate_outputs()
    assert logits.shape == (GATE_IMAGES + len(PHOTOS), 1000)
    photos = torch.from_numpy(np.stack([model.preprocess(photo, {}) for photo in gate_photos()]))
    with torch.inference_mode():
        expected = model.run_net(photos).float()
    assert torch.equal(logits[GATE_IMAGES:], expected)
    with torch.inference_mode():
        assert torch.equal(logits[:GATE_IMAGES], model.run_net(model.gate_images(GATE_IMAGES)).float())


def yolov8(tmp_path, weights: str | None) -> object:
    factory = find_factory("YOLOV8")
    if weights is None:
        table = {"weights": "random", "imgsz": 64}
    else:
        table = {"weights": weights, "imgsz": 64}
    return factory.build(model_config(factory, table, str(tmp_path / "YOLOV8.toml")), "cpu")


def test_yolov8_gates_the_photographs_only_on_loaded_weights(tmp_path):
    """Demo weights: the blobs alone (on photographs they score hundreds of anchors 1.000, a list of ties);
    a weights file: the blobs, then the photographs letterboxed, their boxes in the photographs' own pixels."""
    from models.yolov8 import GATE_IMAGES, GATE_PARAMS, letterbox

    demo = yolov8(tmp_path, None)
    assert demo.trained is False
    assert len(demo.gate_outputs()["detections"]) == GATE_IMAGES

    path = tmp_path / "yolov8n.pth"
    torch.save(demo.net.state_dict(), path)  # the demo network as a file: loaded weights, as a user's would be
    loaded = yolov8(tmp_path, str(path))
    assert loaded.trained is True
    assert len(loaded.gate_outputs()["detections"]) == GATE_IMAGES + len(PHOTOS)
    ran: list = []
    predict = loaded.predict
    loaded.predict = lambda inputs, params: ran.append(inputs) or predict(inputs, params)
    gate = loaded.gate_outputs()
    [inputs] = ran
    for item, photo in zip(inputs[GATE_IMAGES:], gate_photos()):
        pixels, box = letterbox(photo, 64)
        assert np.array_equal(item.pixels, pixels) and item.box == box
    for (boxes, scores, _classes), photo in zip(gate["detections"][GATE_IMAGES:], gate_photos()):
        width, height = photo.size
        assert len(boxes) > 0 and bool((scores > GATE_PARAMS["score_threshold"]).all())
        assert float(boxes[:, 0::2].max()) <= width and float(boxes[:, 1::2].max()) <= height


def test_sam_amg_gates_the_cat_on_loaded_weights_and_its_seeded_image_on_demo_weights(tmp_path):
    """A photograph costs SAM's gate nothing more (the encoder takes any image at its input size): on loaded
    weights the prompts fall on the cat of the gate photographs, and the masks have the photograph's size."""
    from models.sam_amg_targets import GATE_PHOTO, GATE_SIDE

    factory = find_factory("SAM_AMG")
    table = {"points_per_side": 4, "points_per_batch": 8}
    demo = factory.build(model_config(factory, {"weights": "random", **table}, str(tmp_path / "SAM_AMG.toml")), "cpu")
    assert demo.trained is False
    assert tuple(demo.gate_outputs().shape) == (8 * 3, GATE_SIDE, GATE_SIDE)

    path = tmp_path / "sam_tiny.pth"
    torch.save(demo.sam.state_dict(), path)
    loaded = factory.build(model_config(factory, {"weights": str(path), **table}, str(tmp_path / "SAM_AMG.toml")),
                           "cpu")
    assert loaded.trained is True
    (photo,) = gate_photos((GATE_PHOTO,))
    width, height = photo.size
    masks = loaded.gate_outputs()
    assert tuple(masks.shape) == (8 * 3, height, width)
    from models.sam_amg_targets import gate_masks

    assert torch.equal(masks, gate_masks(loaded.sam, 8, np.asarray(photo.convert("RGB"))))
