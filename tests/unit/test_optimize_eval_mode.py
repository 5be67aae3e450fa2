"""Converting a target leaves the eager module in evaluation mode, with its weights and buffers as they were.

``torch.onnx.export`` evaluates the module and afterwards gives every
submodule the module's own training flag back. A plugin's target is often a
small wrapper built at load (MOBILENETV2's pixel normalisation, the
diffusion denoisers, SAM's mask decoder adapter), and a fresh ``nn.Module``
is in training mode: after the first start's export, MobileNetV2's
BatchNorm and Dropout ran in training mode, so eager outputs changed from
call to call (a relative logit error of 0.77) wherever the torch module
still served: a runtime mode that failed its gate, or a torch mode measured
after the conversion.
"""

from __future__ import annotations

import pytest
import torch

from svc.model.api import find_factory, model_config
from svc.optimize.apply import apply_mode
from svc.optimize.modes import mode
from svc.optimize.support import missing_runtime


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVICE_STATE_DIR", str(tmp_path))  # an empty cache: the conversion exports now


@pytest.mark.parametrize("name", ["onnxruntime", "openvino"])
def test_a_fresh_conversion_leaves_mobilenetv2_eager_as_it_was(name):
    if missing_runtime(mode(name)):
        pytest.fail(f"{name} is a pinned dependency of the cpu profile and must import here")
    factory = find_factory("MOBILENETV2")
    model = factory.build(model_config(factory, {"weights": "random"}, "test:MOBILENETV2"), "cpu")
    (target,) = model.optimization_targets()
    state = {k: v.clone() for k, v in target.module.state_dict().items()}
    pixels = model.gate_images(4)
    with torch.inference_mode():
        before = target.module(pixels)
    converted = apply_mode(target, mode(name), "cpu", 4)
    assert [n for n, m in target.module.named_modules() if m.training] == []
    with torch.inference_mode():
        assert torch.equal(target.module(pixels), before)
        assert torch.allclose(converted(pixels), before, atol=1e-4)
    after = target.module.state_dict()
    assert all(torch.equal(after[k], v) for k, v in state.items())
