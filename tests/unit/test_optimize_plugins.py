"""Every zoo plugin runs optimised: its targets trace, its gate passes, and a wrong target fails the gate.

Real plugins in small configurations (random init, small inputs), on the
CPU: MOBILENETV2 (classification), YOLOV8 at 64 px (detection), DDIM and
LDM with small UNets (generation: the denoiser, and LDM's VQ decoder), SAM
``tiny`` (segmentation: image encoder and mask decoder).  The corrupted
target (its outputs negated) stands for a mode that computes something
else: the gate must catch it and the model must serve eager.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from svc.model.api import IOptimizable, find_factory, model_config
from svc.optimize.apply import apply_mode
from svc.optimize.select import Optimizer
from svc.optimize.tensors import map_tensors

SMALL_UNET = {"sample_size": 8, "block_out_channels": [8, 16], "num_train_timesteps": 20}
CONFIGS: dict[str, dict] = {
    "MOBILENETV2": {},
    "YOLOV8": {"imgsz": 64},
    "DDIM": SMALL_UNET,
    "LDM": {**SMALL_UNET, "vq_block_out_channels": [8, 16], "latent_channels": 2},
    "SAM_AMG": {"points_per_side": 4, "points_per_batch": 8},
}
#: A mode each model passes its gate in on any CPU (float32).
MODES = {"MOBILENETV2": "channels_last+jit", "YOLOV8": "channels_last+jit", "DDIM": "channels_last+jit",
         "LDM": "channels_last", "SAM_AMG": "jit"}


def build(model_id: str) -> tuple[Any, Any, dict]:
    factory = find_factory(model_id)
    table = model_config(factory, {"weights": "random", **CONFIGS[model_id]}, f"test:{model_id}")
    return factory, factory.build(table, "cpu"), table


def serve_once(factory: Any, model: Any, table: dict) -> list:
    """One warm-up batch through predict and postprocess, as the engine's load does."""
    from svc.contract.options import options_schema
    from svc.contract.schema import ObjectSchema

    params = ObjectSchema(factory.params_schema(table)).with_defaults({})
    options = ObjectSchema(options_schema(tuple(factory.options))).with_defaults({})
    if "timesteps" in params:
        params.update(timesteps=2, seed=3)
    outputs = model.predict([model.warmup_input()], params)
    return [model.postprocess(output, params, options) for output in outputs]


def negated(target: Any, mode: Any, device: str, batch: int) -> Any:
    fn = apply_mode(target, mode, device, batch)

    class Negated(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any) -> Any:
            return map_tensors(self.fn(*args), lambda t: -t if t.is_floating_point() else t)

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(target.module, name)

    return Negated()


@pytest.mark.parametrize("model_id", sorted(CONFIGS))
def test_the_plugin_passes_its_gate_optimised_serves_and_catches_a_wrong_target(model_id):
    from svc.optimize.gates import gate_for

    factory, model, table = build(model_id)
    assert IOptimizable.providedBy(model)
    eager = serve_once(factory, model, table)
    reference = model.gate_outputs()
    names = [t.name for t in model.optimization_targets()]
    report = Optimizer(model, factory.category, "cpu", MODES[model_id], 2, model_id).run()
    assert report.mode == MODES[model_id] and not report.fell_back, report.line
    assert report.line.startswith(f"{model_id}: optimize {MODES[model_id]}: gate passed [")
    served = serve_once(factory, model, table)
    assert type(served) is type(eager) and len(served) == len(eager)
    assert [t.name for t in model.optimization_targets()] == names

    report = Optimizer(model, factory.category, "cpu", "channels_last", 2, model_id, apply=negated).run()
    assert report.fell_back and report.mode == "eager", report.line
    assert report.line.startswith(f"{model_id}: optimize channels_last: gate failed: ")
    assert "running eager" in report.line
    assert gate_for(factory.category)(reference, model.gate_outputs()).passed  # eager again, as before
    serve_once(factory, model, table)


@pytest.mark.parametrize("mode", ["openvino", "onnxruntime"])
def test_a_runtime_converts_every_target_of_a_plugin_and_it_serves(mode, tmp_path, monkeypatch):
    """LDM's two targets (the UNet per step, the VQ decoder) converted; the other families are converted by
    tests/integration/test_optimize_auto.py."""
    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path))
    factory, model, table = build("LDM")
    eager = serve_once(factory, model, table)
    report = Optimizer(model, factory.category, "cpu", mode, 2, "LDM").run()
    assert report.mode == mode and not report.fell_back, report.line
    assert report.line.endswith("; converted models: 2 converted, 0 read from the cache)"), report.line
    assert type(model.denoise).__name__ == "StandIn" and type(model.decode).__name__ == "StandIn"
    served = serve_once(factory, model, table)
    assert [item["seed"] for item in served] == [item["seed"] for item in eager]


def test_yolov8s_gate_output_carries_the_cut_its_detections_were_made_with():
    """A detection one side kept and the other dropped passes the gate only at the cut (score threshold, top_k):
    YOLOV8's gate output names the cut its detections were selected with, or no drop at a cut would pass."""
    from models.yolov8 import GATE_IMAGES, GATE_PARAMS

    _, model, _ = build("YOLOV8")
    out = model.gate_outputs()
    assert set(out) == {"detections", "score_threshold", "top_k"}
    assert (out["score_threshold"], out["top_k"]) == (GATE_PARAMS["score_threshold"], GATE_PARAMS["top_k"])
    assert len(out["detections"]) == GATE_IMAGES
