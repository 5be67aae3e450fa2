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
#
# Each gate passes a bfloat16-like perturbation that no user would notice and refuses one that a user would.


def _logits() -> torch.Tensor:
    """Two inputs' logits over 1000 classes, each with a clear top-1 (6 above a spread of 2)."""
    ref = 2.0 * torch.randn(2, 1000, generator=torch.Generator().manual_seed(7))
    ref[0, 10] += 6.0
    ref[1, 20] += 6.0
    return ref


def _swapped(logits: torch.Tensor, row: int, a: int, b: int) -> torch.Tensor:
    out = logits.clone()
    out[row, a], out[row, b] = logits[row, b].item(), logits[row, a].item()
    return out


def test_classification_passes_bf16_rounding_and_refuses_what_a_user_sees():
    ref = _logits()
    noise = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    bf16 = (ref * (1 + 0.03 * noise)).bfloat16()  # 3 % per logit, then bfloat16's 8-bit mantissa
    assert gates.classification(ref, bf16) == gates.GateResult(True, "top-1 2/2, top-5 2/2, logit error 3.1e-02")
    ranked = ref[1].argsort(descending=True).tolist()
    # the top-1 swapped with the second, 0.44 below it (scores 1.55 x apart): another answer
    assert gates.classification(ref, _swapped(ref, 1, ranked[0], ranked[1])) == gates.GateResult(
        False, "top-1 1/2, top-5 2/2, logit error 9.7e-03")
    # the same swap where the two are within TOP1_TIE_LOGIT (0.05 apart): a near-tie nobody can rank
    tied = ref.clone()
    tied[1, ranked[1]] = ref[1, ranked[0]] - 0.05
    assert gates.classification(tied, _swapped(tied, 1, ranked[0], ranked[1])).passed
    # 5th and 6th swapped, 0.15 apart: passes; the 5th swapped with the 31st, 1.6 below: a new class in the top-5
    assert gates.classification(ref, _swapped(ref, 1, ranked[4], ranked[5])).passed
    assert gates.classification(ref, _swapped(ref, 1, ranked[4], ranked[30])) == gates.GateResult(
        False, "top-1 2/2, top-5 1/2, logit error 3.5e-02")
    # the same ranking, but every score flatter (logits x 0.8): a confident 0.9 shown as 0.75
    assert gates.classification(ref, ref * 0.8) == gates.GateResult(False, "top-1 2/2, top-5 2/2, logit error 2.0e-01")
    assert gates.classification(ref, ref + 3.0).passed  # a shift of every logit changes no score


def test_classification_refuses_wrong_shapes_and_non_finite_outputs():
    ref = _logits()
    assert gates.classification(ref, ref[:1]) == gates.GateResult(False, "shape (1, 1000) instead of (2, 1000)")
    assert gates.classification(ref, ref * float("nan")) == gates.GateResult(False, "outputs not finite")
    few = torch.tensor([[1.0, 5.0, 2.0], [4.0, 0.0, 1.0]])  # fewer classes than the top-5: the top-3 is compared
    assert gates.classification(few, few).summary == "top-1 2/2, top-3 2/2, logit error 0.0e+00"


def _detections(*rows: tuple) -> tuple:
    """One image's detections from (x1, y1, x2, y2, score, class) rows."""
    boxes = torch.tensor([row[:4] for row in rows], dtype=torch.float).reshape(-1, 4)
    return boxes, torch.tensor([row[4] for row in rows], dtype=torch.float), torch.tensor([row[5] for row in rows])


#: Three objects on a 640 x 480 photo and, on a second image, one at the score threshold.
REFERENCE = [_detections((100, 80, 300, 400, 0.91, 0), (320, 200, 420, 260, 0.62, 2), (500, 10, 560, 90, 0.40, 0)),
             _detections((10, 10, 110, 90, 0.27, 5))]


def _params(images: list, top_k: int = 300) -> dict:
    return {"detections": images, "score_threshold": 0.25, "top_k": top_k}


def test_detection_passes_boxes_moved_by_bf16_rounding():
    # every corner up to 2.5 px off (bf16 near 640 px), every score up to 0.004 off, another order
    moved = [_detections((320, 202.5, 418, 260, 0.618, 2), (102.5, 80, 300, 397.5, 0.914, 0),
                         (500, 10, 562.5, 88, 0.404, 0)),
             _detections((10, 12, 110, 90, 0.268, 5))]
    assert gates.detection(_params(REFERENCE), _params(moved)) == gates.GateResult(
        True, "4 detections matched, min IoU 0.937, max |d score| 0.004")
    assert gates.detection(REFERENCE, moved).passed  # the list form, without the params, alike


def test_detection_refuses_a_missing_a_moved_a_new_or_a_relabelled_box():
    missing = [_detections(*[(*b.tolist(), s.item(), c.item()) for b, s, c in zip(*REFERENCE[0])][1:]), REFERENCE[1]]
    assert gates.detection(_params(REFERENCE), _params(missing)) == gates.GateResult(
        False, "a detection of class 0 (score 0.910) has no match of IoU >= 0.9 (best IoU 0.00)")
    moved = [_detections((100, 80, 300, 400, 0.91, 0), (330, 200, 430, 260, 0.62, 2), (500, 10, 560, 90, 0.40, 0)),
             REFERENCE[1]]  # 10 px to the right: a visibly different box
    assert gates.detection(_params(REFERENCE), _params(moved)) == gates.GateResult(
        False, "a detection of class 2 (score 0.620) has no match of IoU >= 0.9 (best IoU 0.82)")
    new = [REFERENCE[0], _detections((10, 10, 110, 90, 0.27, 5), (200, 200, 300, 300, 0.80, 7))]
    assert gates.detection(_params(REFERENCE), _params(new)) == gates.GateResult(
        False, "a detection of class 7 (score 0.800) is not in the reference of IoU >= 0.9")
    relabelled = [_detections((100, 80, 300, 400, 0.91, 1), (320, 200, 420, 260, 0.62, 2),
                              (500, 10, 560, 90, 0.40, 0)), REFERENCE[1]]
    assert not gates.detection(_params(REFERENCE), _params(relabelled)).passed
    rescored = [_detections((100, 80, 300, 400, 0.81, 0), (320, 200, 420, 260, 0.62, 2),
                            (500, 10, 560, 90, 0.40, 0)), REFERENCE[1]]
    assert gates.detection(_params(REFERENCE), _params(rescored)) == gates.GateResult(
        False, "a detection of class 0 scores 0.810 instead of 0.910")
    assert gates.detection(REFERENCE, REFERENCE[:1]) == gates.GateResult(False, "1 images instead of 2")
    assert gates.detection([_detections()], [_detections()]).passed


def test_detection_tolerates_a_box_crossing_a_cut_where_the_params_say_so():
    # the 0.27 box fell under the 0.25 threshold: at the cut, so tolerated with the params, refused without
    under = [REFERENCE[0], _detections()]
    assert gates.detection(_params(REFERENCE), _params(under)) == gates.GateResult(
        True, "3 detections matched, min IoU 1.000, max |d score| 0.000, 1 changed at a cut")
    assert gates.detection(REFERENCE, under) == gates.GateResult(
        False, "a detection of class 5 (score 0.270) has no match of IoU >= 0.9 (best IoU 0.00)")
    # top_k 3: the list is full and its last box (0.40) was exchanged for another of nearly its score
    full = [_detections((100, 80, 300, 400, 0.91, 0), (320, 200, 420, 260, 0.62, 2), (40, 300, 90, 350, 0.41, 3)),
            REFERENCE[1]]
    assert gates.detection(_params(REFERENCE, top_k=3), _params(full, top_k=3)).summary == (
        "3 detections matched, min IoU 1.000, max |d score| 0.000, 1 changed at a cut")
    assert not gates.detection(_params(REFERENCE), _params(full)).passed  # not at a cut with top_k 300
    # more changes at a cut than UNMATCHED_FRACTION of the image's detections (at least one)
    crowd = [REFERENCE[0], _detections((200, 10, 300, 90, 0.26, 5), (400, 10, 500, 90, 0.27, 5))]
    assert gates.detection(_params(REFERENCE), _params(crowd)) == gates.GateResult(
        False, "2 detections changed at a cut (1 missing, 2 new), more than 1 of 1")


def test_detection_lets_a_list_tied_at_its_cut_reorder_but_holds_the_matched_boxes():
    # random-init YOLOV8: top_k boxes all of score 1.000, a tie that rounding reorders (which 10 of the
    # thousands at 1.000 are kept); 6 of 10 exchanged is more than UNMATCHED_FRACTION, yet every one is tied
    def box(i: int) -> tuple:
        return (40 * i, 10, 40 * i + 30, 60, 1.0, i % 3)

    tied = [_detections(*(box(i) for i in range(10)))]
    reordered = [_detections(*(box(i) for i in (0, 1, 2, 3, 10, 11, 12, 13, 14, 15)))]
    assert gates.detection(_params(tied, top_k=10), _params(reordered, top_k=10)) == gates.GateResult(
        True, "4 detections matched, min IoU 1.000, max |d score| 0.000, 6 changed at a cut")
    # the same exchange where the list is not full (no top_k cut) is refused as before
    assert not gates.detection(_params(tied), _params(reordered)).passed
    # a tie still holds every matched box: one of the four kept moved 10 px is a visible change
    moved = [_detections((10, 10, 40, 60, 1.0, 0), *(box(i) for i in (1, 2, 3, 10, 11, 12, 13, 14, 15)))]
    assert gates.detection(_params(tied, top_k=10), _params(moved, top_k=10)) == gates.GateResult(
        True, "3 detections matched, min IoU 1.000, max |d score| 0.000, 7 changed at a cut")
    # and a candidate whose boxes all differ is refused, however tied its scores
    elsewhere = [_detections(*(box(i) for i in range(20, 30)))]
    assert gates.detection(_params(tied, top_k=10), _params(elsewhere, top_k=10)) == gates.GateResult(
        False, "no detection matched: 10 in the reference, all changed")


def test_generation_compares_the_final_image_per_pixel_and_on_average():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    noise = [torch.from_numpy(rng.standard_normal((1, 3, 32, 32))) for _ in range(3)]
    ref = {"noise": noise, "image": image}
    # what bf16 did to the demo DDPM: most pixels within 1-2 levels, a few up to 20
    close = image.astype(np.int16) + rng.integers(-1, 2, image.shape)
    close[0, 5, 5] += 20
    bf16 = {"noise": [n * 1.03 for n in noise], "image": close.clip(0, 255).astype(np.uint8)}
    assert gates.generation(ref, bf16) == gates.GateResult(
        True, "image max |d| 21/255, mean 0.67/255 (noise rel. L2 3.0e-02 over 3 steps)")
    blotch = image.astype(np.int16)
    blotch[0, 8:12, 8:12] += np.where(blotch[0, 8:12, 8:12] < 128, 64, -64)  # a visible 4 x 4 spot
    assert gates.generation(ref, {"image": blotch.astype(np.uint8)}) == gates.GateResult(
        False, "image max |d| 64/255, mean 1.00/255")
    brighter = np.where(image < 250, image + 5, image - 5).astype(np.uint8)  # the whole image 5 levels off
    assert gates.generation(ref, {"image": brighter}) == gates.GateResult(False, "image max |d| 5/255, mean 5.00/255")
    assert gates.generation(ref, {"image": image[:, :16]}).summary == (
        "image: shape (1, 16, 32, 3) instead of (1, 32, 32, 3)")
    assert gates.generation(ref, {"image": image}).summary == "image max |d| 0/255, mean 0.00/255"


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


def test_segmentation_passes_an_edge_moved_by_rounding_and_refuses_another_mask():
    y, x = np.mgrid[:64, :64]
    disk = (y - 32) ** 2 + (x - 32) ** 2 < 20**2  # 1264 pixels
    grown = (y - 32) ** 2 + (x - 32) ** 2 < 20.5**2  # one more ring of edge pixels, as bf16 moves a boundary
    assert gates.segmentation(disk[None], grown[None]) == gates.GateResult(True, "1 masks, min IoU 0.948")
    moved = np.roll(disk, 4, axis=1)  # the same shape 4 px to the right: another outline
    assert gates.segmentation(disk[None], moved[None]) == gates.GateResult(False, "1 masks, min IoU 0.777")


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
    assert report.line.startswith(f"TESTFAULTS: optimize {name}: gate passed [top-1 4/4, top-")
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


RELOCATED_NET = """import torch


class RelocNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x)
"""


def test_a_package_key_is_the_same_for_the_same_code_in_another_folder(tmp_path, monkeypatch):
    """An upgrade probe: the key held each source file's path, so the same release installed into a new folder
    (a virtual environment per release) converted and measured everything again, and chose differently.  The
    module's name and its file's content count, not where it lies; changed content still changes the key."""
    import importlib.util
    import sys

    def key_of(folder: str, text: str) -> str:
        path = tmp_path / folder / "relocnet.py"
        path.parent.mkdir()
        path.write_text(text)
        spec = importlib.util.spec_from_file_location("relocnet", path)
        loaded = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "relocnet", loaded)
        spec.loader.exec_module(loaded)
        torch.manual_seed(0)
        return aot.package_key(loaded.RelocNet(), (torch.zeros(1, 3, 8, 8),), "cpu", "compile")

    first = key_of("release-1", RELOCATED_NET)
    assert key_of("release-1-moved", RELOCATED_NET) == first
    assert key_of("release-2", RELOCATED_NET + "# changed\n") != first


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


class _Scaled(torch.nn.Module):
    """A plugin's network whose forward reads a plain attribute set from its ``[model]`` table."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3)
        self.scale = scale

    def forward(self, x):
        return self.conv(x) * self.scale


class _Noisy(_Scaled):
    """Another class of the same file with the same weights' shapes (another model of one plugin module)."""

    def forward(self, x):
        return self.conv(x) + 1.0


def test_a_package_key_follows_the_model_table_and_each_class_not_only_its_file(monkeypatch):
    """A plugin author's probe: a [model] value kept as a plain attribute (not a buffer) changed, and a restart
    served the artefact converted with the old one; and a second model whose class sits in the same file as the
    first's, with the same weights, read the first's artefact."""
    from svc.optimize import cache

    torch.manual_seed(0)
    scaled = _Scaled()
    noisy = _Noisy()
    noisy.load_state_dict(scaled.state_dict())
    x = (torch.zeros(2, 3, 8, 8),)
    key = aot.package_key(scaled, x, "cpu", "onnxruntime")
    assert key != aot.package_key(noisy, x, "cpu", "onnxruntime")
    monkeypatch.setattr(cache, "KEY_CONTEXT", "another [model] table's digest")
    assert key != aot.package_key(scaled, x, "cpu", "onnxruntime")

