"""TESTFAULTS: a tiny real-torch model for tests, with injectable faults.

Found through the ``models`` plugin package when ``tests/plugins`` is on
``sys.path`` (never shipped).  It computes each image's mean colour with
torch and reports the batch size it ran in, so tests can see batching in a
real process.  Params inject the faults that cannot be caused otherwise:
a slow forward pass, an exception in ``predict``, a result list of the
wrong length, a postprocess that breaks the data schema for some items.
The ``[model]`` key ``load_delay_ms`` makes loading slow (a big checkpoint),
to test what happens to a process stopped while it loads.  With ``[model]
optimizable = true`` the mean colour comes from a tiny conv net (an 8x8
depthwise averaging kernel after a 1x1 conv and a ReLU that change nothing on
pixels) that ``backend.optimize`` can trace and compile in seconds
(``svc.model.api.IOptimizable``; tests of the compile cache).
"""

from __future__ import annotations

import time
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from svc.contract.schema import object_schema
from svc.model.api import IModel, IModelFactory, IOptimizable, OptimizationTarget
from svc.model.weights import WEIGHTS_PROPERTIES
from svc.weightstore.catalog import FileSource, Variant

PARAMS_SCHEMA = object_schema(
    {
        "sleep_ms": {"type": "integer", "minimum": 0, "maximum": 60000, "default": 0},
        "fail": {"enum": ["none", "engine", "length", "item", "nan"], "default": "none"},
    }
)


@implementer(IModel)
class FaultModel:
    version = "test-faults"

    def preprocess(self, image: Any, params: dict) -> Any:
        # What torchvision's pil_to_tensor gives (uint8, C x H x W), without importing
        # torchvision: its import costs this test model's processes about 2.5 s of CPU.
        import numpy
        import torch

        return torch.from_numpy(numpy.array(image.convert("RGB").resize((8, 8)))).permute(2, 0, 1).contiguous()  # writable

    def batch_key(self, params: dict) -> Any:
        return (params["sleep_ms"], params["fail"])

    def predict(self, inputs: list, params: dict) -> list:
        time.sleep(params["sleep_ms"] / 1000.0)  # the worker thread: a slow model
        if params["fail"] == "engine":
            raise RuntimeError("injected engine failure")
        means = self.means(inputs)
        outputs = [(row, len(inputs)) for row in means]
        return outputs[:-1] if params["fail"] == "length" else outputs

    def means(self, inputs: list) -> Any:
        """Each image's mean colour (B, 3)."""
        import torch

        return torch.stack(inputs).float().mean(dim=(2, 3))

    def postprocess(self, output: Any, params: dict, options: dict) -> Any:
        mean, batch = output
        if params["fail"] == "item" and float(mean[0]) > 128:
            return {"mean": "not numbers", "batch_size": batch}  # breaks the data schema
        if params["fail"] == "nan" and float(mean[0]) > 128:
            return {"mean": [float("nan")] * 3, "batch_size": batch}  # numbers, but not JSON
        return {"mean": [round(float(v), 3) for v in mean], "batch_size": batch}

    def warmup_input(self) -> Any:
        import torch

        return torch.zeros(3, 8, 8, dtype=torch.uint8)


def mean_net() -> Any:
    """A tiny conv net whose output is the per-channel mean of an 8x8 image (B, 3)."""
    import torch
    from torch import nn

    identity = nn.Conv2d(3, 3, 1)
    average = nn.Conv2d(3, 3, 8, groups=3, bias=False)
    with torch.no_grad():
        identity.weight.copy_(torch.eye(3).view(3, 3, 1, 1))
        identity.bias.zero_()
        average.weight.fill_(1 / 64)
    return nn.Sequential(identity, nn.ReLU(), average, nn.Flatten()).eval().requires_grad_(False)


@implementer(IModel, IOptimizable)
class NetFaultModel(FaultModel):
    """TESTFAULTS computing its means with :func:`mean_net`, which ``backend.optimize`` may optimise."""

    def __init__(self) -> None:
        self.net = mean_net()
        self.run_net = self.net

    def means(self, inputs: list) -> Any:
        import torch

        with torch.inference_mode():
            return self.run_net(torch.stack(inputs).float())

    def optimization_targets(self) -> list:
        import torch

        def example(batch: int) -> tuple:
            return (torch.rand((batch, 3, 8, 8), generator=torch.Generator().manual_seed(0)) * 255,)

        def install(fn: Any) -> None:
            self.run_net = fn

        return [OptimizationTarget("net", self.net, example, install)]

    def gate_outputs(self) -> Any:
        import torch

        images = torch.randint(0, 256, (4, 3, 8, 8), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
        return self.means(list(images))

    def optimize_candidates(self, device: str) -> tuple:
        return ("jit", "compile")


@implementer(IPlugin, IModelFactory)
class FaultFactory:
    catalog_id = "TESTFAULTS"
    category = "classification"
    task = "test-faults"
    needs_image = True
    options = ("max_results",)
    data_schema = {
        "type": "object",
        "required": ["mean", "batch_size"],
        "properties": {
            "mean": {"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 3},
            "batch_size": {"type": "integer", "minimum": 1},
        },
    }
    #: One pretrained variant, so that the pull-then-serve path (svcctl weights pull, profiles with
    #: weights = "pretrained", the quick start) runs end to end in tests with a cheap model: its file is
    #: served by the tests' fake source through SERVICE_WEIGHTS_MIRROR; build ignores its contents.
    variants = (
        Variant("tiny", FileSource(url="https://weights.example.org/testfaults/tiny.bin", size=64),
                license="MIT", description="test fixture (tests/integration/test_quickstart_run.py)",
                default=True),
    )
    config_schema = object_schema(
        {**WEIGHTS_PROPERTIES, "load_delay_ms": {"type": "integer", "minimum": 0, "maximum": 600000, "default": 0},
         "optimizable": {"type": "boolean", "default": False}}
    )

    def params_schema(self, config: dict) -> dict:
        return PARAMS_SCHEMA

    def build(self, config: dict, device: str) -> FaultModel:
        time.sleep(config.get("load_delay_ms", 0) / 1000.0)  # runs in the worker pool, like a real load
        model = NetFaultModel() if config.get("optimizable") else FaultModel()
        model.version = config.get("version") or FaultModel.version  # a pretrained variant names itself
        return model


testfaults = FaultFactory()
