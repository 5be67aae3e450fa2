"""YOLOV8 without a server: upstream parameter names, letterbox geometry, and
box decoding + NMS on crafted head outputs, for several aspect ratios."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from models.yolov8 import letterbox, letterbox_geometry, select
from models.yolov8_net import REG_MAX, STRIDES, build_network, decode_head
from tests.support.processes import REPO

NC = 80
SIZE = 320
BIG = 60.0  # a logit that makes softmax one-hot and sigmoid 1 (to float precision)


@pytest.mark.parametrize("scale", ["n", "s", "m"])
def test_state_dict_names_and_shapes_are_upstreams(scale):
    """tests/data/yolov8<scale>_state_dict.txt: the state dict of ultralytics 8.4.190
    DetectionModel("yolov8<scale>.yaml", nc=80), one 'name shape' per line, in order."""
    expected = []
    for line in (REPO / "tests" / "data" / f"yolov8{scale}_state_dict.txt").read_text().splitlines():
        name, _, shape = line.partition(" ")
        expected.append((name, tuple(int(d) for d in shape.split(",") if d)))
    got = [(name, tuple(t.shape)) for name, t in build_network(scale).state_dict().items()]
    assert got == expected
    assert ("model.0.conv.weight", (16 if scale == "n" else 32 if scale == "s" else 48, 3, 3, 3)) in got
    assert ("model.22.dfl.conv.weight", (1, 16, 1, 1)) in got


@pytest.mark.parametrize(
    "width, height, gain, left, top, resized",
    [
        (640, 480, 0.5, 0, 40, (320, 240)),
        (480, 640, 0.5, 40, 0, (240, 320)),
        (1000, 250, 0.32, 0, 120, (320, 80)),
        (320, 320, 1.0, 0, 0, (320, 320)),
        (641, 480, 320 / 641, 0, 40, (320, 240)),
        (100, 49, 3.2, 0, 81, (320, 157)),  # scaled up; odd border: the extra pixel goes to the bottom
    ],
)
def test_letterbox_geometry(width, height, gain, left, top, resized):
    box, size = letterbox_geometry(width, height, SIZE)
    assert (box.width, box.height, box.left, box.top, size) == (width, height, left, top, resized)
    assert box.gain == pytest.approx(gain)


def test_letterbox_pixels_are_the_resized_image_on_grey():
    image = Image.new("RGB", (64, 32), (10, 200, 30))
    pixels, box = letterbox(image, 64)
    assert pixels.shape == (64, 64, 3) and pixels.dtype.name == "uint8"
    assert (box.gain, box.left, box.top) == (1.0, 0, 16)
    assert (pixels[:16] == 114).all() and (pixels[48:] == 114).all()
    assert (pixels[16:48] == (10, 200, 30)).all()


def crafted_head(boxes: list[tuple[int, int, int, tuple[int, int, int, int], int, float]]) -> list:
    """Head outputs (batch 1) that encode the given boxes exactly.

    Each box: (level, grid x, grid y, DFL bins (left, top, right, bottom), class id, class logit).
    Every other anchor scores sigmoid(-60) = 0.
    """
    feats = []
    for stride in STRIDES:
        n = SIZE // stride
        f = torch.full((1, 4 * REG_MAX + NC, n, n), -BIG)
        feats.append(f)
    for level, gx, gy, bins, cls, logit in boxes:
        f = feats[level]
        for side, b in enumerate(bins):
            f[0, side * REG_MAX + b, gy, gx] = BIG
        f[0, 4 * REG_MAX + cls, gy, gx] = logit
    return feats


def network_box(level: int, gx: int, gy: int, bins: tuple[int, int, int, int]) -> list[float]:
    stride = STRIDES[level]
    cx, cy = (gx + 0.5) * stride, (gy + 0.5) * stride
    left, top, right, bottom = (b * stride for b in bins)
    return [cx - left, cy - top, cx + right, cy + bottom]


def test_decode_head_gives_the_encoded_boxes_and_scores():
    feats = crafted_head([(0, 10, 12, (2, 3, 4, 5), 7, 2.0), (2, 4, 6, (1, 1, 2, 3), 0, 0.0)])
    pred = decode_head(feats)
    anchors = sum((SIZE // s) ** 2 for s in STRIDES)
    assert pred.shape == (1, anchors, 4 + NC)
    first = 12 * (SIZE // 8) + 10
    third = (SIZE // 8) ** 2 + (SIZE // 16) ** 2 + 6 * (SIZE // 32) + 4
    assert pred[0, first, :4].tolist() == pytest.approx(network_box(0, 10, 12, (2, 3, 4, 5)), abs=1e-4)
    assert pred[0, first, 4 + 7].item() == pytest.approx(torch.sigmoid(torch.tensor(2.0)).item())
    assert pred[0, third, :4].tolist() == pytest.approx(network_box(2, 4, 6, (1, 1, 2, 3)), abs=1e-4)
    assert pred[0, third, 4].item() == pytest.approx(0.5)


@pytest.mark.parametrize("width, height", [(640, 480), (480, 640), (1000, 250), (320, 320), (333, 517)])
def test_crafted_outputs_give_exactly_the_expected_boxes_in_original_pixels(width, height):
    box, _ = letterbox_geometry(width, height, SIZE)
    # Cells near the middle of the network input: inside the image for every aspect ratio here.
    dog_a = (0, 19, 19, (2, 2, 3, 3), 16, 3.0)  # class 16, score sigmoid(3) = 0.953
    dog_b = (0, 20, 19, (2, 2, 2, 3), 16, 1.0)  # same class, overlaps dog_a: suppressed by NMS
    cat_c = (0, 20, 20, (2, 2, 2, 2), 15, 2.0)  # other class, overlaps: kept (NMS is per class)
    far_d = (1, 6, 9, (1, 1, 1, 1), 0, 0.5)  # person, score 0.622, apart from the others
    weak = (2, 5, 5, (1, 1, 1, 1), 2, -2.0)  # score 0.119: under the threshold
    feats = crafted_head([dog_a, dog_b, cat_c, far_d, weak])
    pred = decode_head(feats)[0]
    boxes, scores, classes = select(pred, box, score_threshold=0.25, nms_threshold=0.5, top_k=10)

    def original(spec):
        x1, y1, x2, y2 = network_box(*spec[:4])
        x1, x2 = ((v - box.left) / box.gain for v in (x1, x2))
        y1, y2 = ((v - box.top) / box.gain for v in (y1, y2))
        return [min(max(x1, 0), width), min(max(y1, 0), height), min(max(x2, 0), width), min(max(y2, 0), height)]

    sigmoid = torch.sigmoid
    assert classes.tolist() == [16, 15, 0]
    assert scores.tolist() == pytest.approx([sigmoid(torch.tensor(v)).item() for v in (3.0, 2.0, 0.5)], abs=1e-6)
    expected = [original(dog_a), original(cat_c), original(far_d)]
    assert boxes.shape == (3, 4)
    assert boxes.flatten().tolist() == pytest.approx([v for b in expected for v in b], abs=1e-3)
    # top_k keeps the best; a higher threshold drops the person.
    assert select(pred, box, 0.25, 0.5, 2)[2].tolist() == [16, 15]
    assert select(pred, box, 0.7, 0.5, 10)[2].tolist() == [16, 15]
    # With an IoU threshold above the overlap, the second dog survives NMS.
    assert sorted(select(pred, box, 0.25, 0.95, 10)[2].tolist()) == [0, 15, 16, 16]


def test_boxes_reaching_into_the_border_are_clipped_to_the_image():
    width, height = 1000, 250  # network rows 120..200 hold the image
    box, _ = letterbox_geometry(width, height, SIZE)
    feats = crafted_head([(2, 0, 3, (1, 5, 4, 5), 3, 4.0)])  # cell centre (16, 112): far above the image top
    boxes, _, classes = select(decode_head(feats)[0], box, 0.25, 0.5, 10)
    assert classes.tolist() == [3]
    x2 = (16 + 4 * 32 - box.left) / box.gain
    assert (112 + 160 - box.top) / box.gain > height  # the bottom too is past the image
    assert boxes.tolist()[0] == pytest.approx([0.0, 0.0, x2, height], abs=1e-3)


def test_a_box_wholly_in_the_letterbox_padding_is_dropped_and_takes_no_top_k_slot():
    """A 640x100 image sits in rows 270..370 of the network input: a box in the grey border above it was clipped to
    a line on the image's top edge (``[268, 0, 380, 0]``), scored, and counted in ``top_k`` (image-input probe: 141
    of 300 detections of such an image had no area)."""
    from models.yolov8 import Letterbox

    box = Letterbox(640, 100, 1.0, 0, 270)
    pred = torch.zeros(3, 4 + 80)
    pred[:, :4] = torch.tensor([[268.0, 10.0, 380.0, 60.0],  # wholly in the padding above: no area once clipped
                                [100.0, 280.0, 200.0, 350.0],  # inside the image
                                [300.0, 200.0, 400.0, 300.0]])  # reaching into the image: clipped, kept
    pred[:, 4 + 5] = torch.tensor([0.9, 0.8, 0.7])
    boxes, scores, classes = select(pred, box, 0.25, 0.5, 2)
    assert boxes.tolist() == [[100.0, 10.0, 200.0, 80.0], [300.0, 0.0, 400.0, 30.0]]
    assert scores.tolist() == pytest.approx([0.8, 0.7]) and classes.tolist() == [5, 5]


def test_a_score_a_converted_sigmoid_rounds_past_1_is_1():
    """ONNX Runtime's fused sigmoid gave 1.0000001 for a saturated anchor: the item broke its schema's maximum of 1
    and was answered 500 CONTRACT_FAILURE. Scores are probabilities: within 0..1."""
    from models.yolov8 import Letterbox

    pred = torch.zeros(2, 4 + 80)
    pred[:, :4] = torch.tensor([[0.0, 0.0, 50.0, 50.0], [100.0, 0.0, 150.0, 50.0]])
    pred[0, 4 + 7] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    pred[1, 4 + 3] = 0.5
    _, scores, classes = select(pred, Letterbox(640, 640, 1.0, 0, 0), 0.25, 0.5, 10)
    assert classes.tolist() == [7, 3] and scores.tolist() == [1.0, 0.5]


def test_an_anchor_whose_best_classes_tie_is_detected_as_the_first_of_them():
    """The demo weights score many anchors 1.000 in several classes at once (11,474 anchors in 8 images): the
    class of such a detection is the lowest tied class id, as torch's max over the classes gives it."""
    from models.yolov8 import Letterbox

    pred = torch.zeros(6, 4 + 80)
    pred[:, :4] = torch.tensor([[100.0 * i, 0.0, 100.0 * i + 50, 50.0] for i in range(6)])  # apart: NMS keeps all
    tied = [(3, 7), (0, 79), (12, 12), (5, 6, 40), (2, 9), (1, 2)]
    for row, classes in enumerate(tied):
        pred[row, [4 + c for c in classes]] = 1.0 if row % 2 == 0 else 0.6
    pred[5, 4 + 2] = 0.1  # below the threshold in its best class too: not detected
    pred[5, 4 + 1] = 0.2
    box = Letterbox(640, 640, 1.0, 0, 0)
    boxes, scores, classes = select(pred, box, score_threshold=0.25, nms_threshold=0.5, top_k=10)
    assert sorted(zip(boxes[:, 0].tolist(), classes.tolist())) == [(0.0, 3), (100.0, 0), (200.0, 12), (300.0, 5),
                                                                   (400.0, 2)]
    expected_scores, expected_classes = pred[:5, 4:].max(1)
    order = boxes[:, 0].argsort()
    assert torch.equal(classes[order], expected_classes) and torch.equal(scores[order], expected_scores)


def test_demo_weights_start_with_upstreams_head_biases_and_give_spread_scores():
    import math

    from models.yolov8 import GATE_PARAMS, yolov8

    model = yolov8.build({"scale": "n", "imgsz": 320, "weights": "random", "seed": 0}, "cpu")
    head = model.net.model[-1]
    for box, cls, stride in zip(head.cv2, head.cv3, STRIDES):
        assert torch.equal(box[-1].bias, torch.ones(4 * REG_MAX))
        assert torch.allclose(cls[-1].bias, torch.full((80,), math.log(5 / 80 / (320 / stride) ** 2)))
    # the gate's images give a list of spread scores under top_k, not the 300 ties at 1.000 of a bare random init
    with torch.inference_mode():
        gate = model.gate_outputs()
    for _boxes, scores, _classes in gate["detections"]:
        assert 0 < len(scores) < GATE_PARAMS["top_k"]
        assert float(scores.max()) - float(scores.min()) > 0.3
    bare = build_network("n").eval()  # the network alone keeps torch's init: a trained state dict replaces it
    assert not torch.equal(bare.model[-1].cv2[0][-1].bias, torch.ones(4 * REG_MAX))


def test_the_optimisation_target_is_the_network_with_its_input_conversion_and_box_decoding():
    """What backend.optimize converts takes the uint8 pixels as the worker stacks them and decodes the boxes
    too (a runtime runs both in its graph), with the DFL weights of a state dict loaded later, and predict calls
    that same module in eager."""
    from models.yolov8 import yolov8

    model = yolov8.build({"scale": "n", "imgsz": 320, "weights": "random", "seed": 0}, "cpu")
    (target,) = model.optimization_targets()
    assert target.name == "net" and model.run_net is target.module
    (pixels,) = target.example_inputs(2)
    assert pixels.dtype == torch.uint8 and pixels.shape == (2, 320, 320, 3)
    x = pixels.permute(0, 3, 1, 2).float() / 255  # the network's own input: float NCHW in [0, 1]
    with torch.inference_mode():
        model.net.model[-1].dfl.conv.weight.mul_(0.5)  # as a loaded checkpoint's own DFL weights would be
        decoded = target.module(pixels)
        expected = decode_head(model.net(x), model.net.model[-1].dfl.conv.weight)
    assert decoded.shape == (2, (320 // 8) ** 2 + (320 // 16) ** 2 + (320 // 32) ** 2, 4 + NC)
    assert torch.equal(decoded, expected)
    assert not torch.equal(decoded, decode_head(model.net(x)))  # not the default 0..15 bins
    assert not target.module.training and not model.net.training


def test_demo_weights_are_the_same_whatever_the_number_of_threads():
    """The demo BatchNorm statistics moved by 1e-8 with torch's thread count (a sum split over threads rounds
    differently): another `backend.workers` or CPU share changed the weights' identity, and every optimised
    mode was converted again. The calibration runs on one thread, and the caller's thread count comes back."""
    import hashlib

    from svc.model.weights import calibrate_batchnorm

    def digest(threads: int) -> str:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        net = build_network("n", 80)
        calibrate_batchnorm(net, (2, 3, 64, 64), 0)
        assert torch.get_num_threads() == threads
        h = hashlib.sha256()
        for tensor in net.state_dict().values():
            h.update(tensor.numpy().tobytes())
        return h.hexdigest()

    before = torch.get_num_threads()
    try:
        assert digest(1) == digest(2)
    finally:
        torch.set_num_threads(before)
