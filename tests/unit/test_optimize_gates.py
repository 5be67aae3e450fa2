"""The accuracy gates (svc/optimize/gates.py) and every CPU mode applied to a small real net (svc/optimize/apply.py).

The ``compile`` mode, which runs the C++ compiler, is tested in tests/integration/test_optimize_compile.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.testfaults import NetFaultModel
from svc.optimize import aot, gates
from svc.optimize.apply import apply_mode
from svc.optimize.modes import mode
from svc.optimize.select import optimize_model
from tests.support.images import uint8_tensors

# -- one comparison per category -------------------------------------------------------------------


def test_classification_needs_the_same_top1_and_close_logits():
    ref = torch.tensor([[1.0, 5.0, 2.0], [4.0, 0.0, 1.0]])
    assert gates.classification(ref, ref + 0.2).passed  # 0.2 of max |logit| 5: 4 %
    result = gates.classification(ref, ref + 0.3)
    assert not result.passed and result.summary == "top-1 2/2, max |d logit| 6.0e-02 of max |logit|"
    swapped = ref.clone()
    swapped[0, 2] = 5.1
    assert gates.classification(ref, swapped).summary.startswith("top-1 1/2")
    assert not gates.classification(ref, swapped).passed
    assert gates.classification(ref, ref[:1]).summary == "shape (1, 3) instead of (2, 3)"
    assert gates.classification(ref, ref * float("nan")).summary == "outputs not finite"
    assert gates.classification(ref, ref.bfloat16()).passed  # a bf16 output is compared as float


def _detections(*boxes):
    b = torch.tensor([box[:4] for box in boxes], dtype=torch.float).reshape(-1, 4)
    return b, torch.ones(len(boxes)), torch.tensor([box[4] for box in boxes])


def test_detection_matches_boxes_of_the_same_class_within_pixels():
    ref = [_detections((10, 10, 50, 50, 1), (12, 12, 48, 52, 1), (0, 0, 5, 5, 3)), _detections()]
    near = [_detections((11.5, 9, 50, 51, 1), (0, 0, 5, 5, 3), (12, 12, 48, 52, 1)), _detections()]  # another order
    result = gates.detection(ref, near)
    assert result.passed and result.summary == "3 boxes matched, max 1.50 px"
    far = [_detections((10, 10, 53, 50, 1), (12, 12, 48, 52, 1), (0, 0, 5, 5, 3)), _detections()]
    # greedy: the first reference box takes the 2 px match, the second is left with 5 px
    assert gates.detection(ref, far).summary == "a box of class 1 has no match within 2 px (nearest: 5.0 px)"
    other_class = [_detections((10, 10, 50, 50, 2), (12, 12, 48, 52, 1), (0, 0, 5, 5, 3)), _detections()]
    assert not gates.detection(ref, other_class).passed
    fewer = [_detections((10, 10, 50, 50, 1), (0, 0, 5, 5, 3)), _detections()]
    assert gates.detection(ref, fewer).summary == "2 detections instead of 3"
    assert gates.detection(ref, ref[:1]).summary == "1 images instead of 2"
    assert gates.detection([_detections()], [_detections()]).passed


def test_generation_compares_every_step_and_the_image():
    rng = np.random.default_rng(0)
    noise = [torch.from_numpy(rng.standard_normal((1, 3, 8, 8))) for _ in range(3)]
    image = rng.integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
    ref = {"noise": noise, "image": image}
    close = {"noise": [n * 1.01 for n in noise], "image": image}
    assert gates.generation(ref, close).summary == "noise max rel. L2 1.0e-02 over 3 steps, image PSNR inf dB"
    assert gates.generation(ref, close).passed
    drift = {"noise": noise[:2] + [noise[2] * 1.05], "image": image}
    assert not gates.generation(ref, drift).passed
    blurred = image.astype(np.int16) + rng.integers(-8, 9, image.shape)
    low = gates.generation(ref, {"noise": noise, "image": blurred.clip(0, 255)})
    assert not low.passed and 25 < gates.psnr(image, blurred.clip(0, 255)) < gates.IMAGE_PSNR_DB
    assert gates.generation(ref, {"noise": noise[:2], "image": image}).summary == "2 steps instead of 3"
    assert gates.psnr(image, image) == float("inf")


def test_segmentation_needs_every_mask_iou_above_the_bound():
    masks = np.zeros((2, 10, 10), dtype=bool)
    masks[0, :5] = True
    masks[1, 2:8, 2:8] = True
    assert gates.segmentation(masks, masks).summary == "2 masks, min IoU 1.000"
    shifted = masks.copy()
    shifted[1, 8, 2:8] = True  # 6 more pixels: 36 / 42
    result = gates.segmentation(masks, shifted)
    assert not result.passed and result.summary == "2 masks, min IoU 0.857"
    assert gates.mask_iou(np.zeros((3, 3)), np.zeros((3, 3))) == 1.0  # two empty masks agree
    assert not gates.segmentation(masks, masks[:1]).passed


def test_each_category_has_its_gate():
    assert set(gates.GATES) == {"classification", "detection", "generation", "segmentation"}
    with pytest.raises(ValueError, match="no accuracy gate for category 'poetry'"):
        gates.gate_for("poetry")


# -- every CPU mode on a small real net ------------------------------------------------------------

FP32_MODES = ["channels_last", "jit", "channels_last+jit"]


@pytest.mark.parametrize("name", FP32_MODES)
def test_float32_modes_pass_the_gate_and_serve_the_same_results(name):
    model = NetFaultModel()
    eager = model.means(uint8_tensors(5))
    report = optimize_model(model, "classification", "cpu", name, 4, "TESTFAULTS")
    assert report.mode == name and not report.fell_back, report.line
    assert report.line.startswith(f"TESTFAULTS: optimize {name}: gate passed [top-1 4/4, max |d logit| ")
    assert model.run_net is not model.net
    for n in (1, 3, 4, 5):  # batch sizes other than the traced one
        assert torch.allclose(model.means(uint8_tensors(n)), eager[:n], atol=1e-3)


@pytest.mark.parametrize("name", ["bf16", "channels_last+bf16+jit"])
def test_bf16_modes_run_in_bfloat16_and_return_float32(name):
    model = NetFaultModel()
    target = model.optimization_targets()[0]
    fn = apply_mode(target, mode(name), "cpu", 4)
    x = torch.stack(uint8_tensors(4)).float()
    with torch.inference_mode():
        out, eager = fn(x), model.net(x)
    assert out.dtype == torch.float32
    assert torch.allclose(out, eager, rtol=2e-2) and not torch.equal(out, eager)  # bfloat16 arithmetic


def test_a_package_key_follows_the_weights_the_mode_and_the_input_shapes():
    net = NetFaultModel().net
    x = (torch.zeros(2, 3, 8, 8),)
    key = aot.package_key(net, x, "cpu", "compile")
    assert key == aot.package_key(NetFaultModel().net, (torch.ones(4, 3, 8, 8),), "cpu", "compile")  # not the batch
    assert key != aot.package_key(net, x, "cpu", "channels_last+compile")
    assert key != aot.package_key(net, (torch.zeros(2, 3, 16, 16),), "cpu", "compile")
    assert key != aot.package_key(net, (x[0].contiguous(memory_format=torch.channels_last),), "cpu", "compile")
    with torch.no_grad():
        net[0].bias.add_(1e-6)
    assert key != aot.package_key(net, x, "cpu", "compile")
