"""TESTFAULTS: a tiny real-torch model for tests, with injectable faults.

Found through the ``models`` plugin package when ``tests/plugins`` is on
``sys.path`` (never shipped).  It computes each image's mean colour with
torch and reports the batch size it ran in, so tests can see batching in a
real process.  Params inject the faults that cannot be caused otherwise:
a slow forward pass, an exception in ``predict``, a result list of the
wrong length, a postprocess that breaks the data schema for some items.
The ``[model]`` key ``load_delay_ms`` makes loading slow (a big checkpoint),
to test what happens to a process stopped while it loads.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.plugin import IPlugin
from zope.interface import implementer

from svc.modelapi import IModel, IModelFactory
from svc.schema import object_schema
from svc.weights import WEIGHTS_PROPERTIES
from svc.weightstore.catalog import FileSource, Variant

PARAMS_SCHEMA = object_schema(
    {
        "sleep_ms": {"type": "integer", "minimum": 0, "maximum": 60000, "default": 0},
        "fail": {"enum": ["none", "engine", "length", "item"], "default": "none"},
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

        return torch.from_numpy(numpy.asarray(image.convert("RGB").resize((8, 8)))).permute(2, 0, 1).contiguous()

    def batch_key(self, params: dict) -> Any:
        return (params["sleep_ms"], params["fail"])

    def predict(self, inputs: list, params: dict) -> list:
        import torch

        time.sleep(params["sleep_ms"] / 1000.0)  # the worker thread: a slow model
        if params["fail"] == "engine":
            raise RuntimeError("injected engine failure")
        means = torch.stack(inputs).float().mean(dim=(2, 3))
        outputs = [(row, len(inputs)) for row in means]
        return outputs[:-1] if params["fail"] == "length" else outputs

    def postprocess(self, output: Any, params: dict, options: dict) -> Any:
        mean, batch = output
        if params["fail"] == "item" and float(mean[0]) > 128:
            return {"mean": "not numbers", "batch_size": batch}  # breaks the data schema
        return {"mean": [round(float(v), 3) for v in mean], "batch_size": batch}

    def warmup_input(self) -> Any:
        import torch

        return torch.zeros(3, 8, 8, dtype=torch.uint8)


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
                license="test-only", description="test fixture (tests/integration/test_quickstart_run.py)",
                default=True),
    )
    config_schema = object_schema(
        {**WEIGHTS_PROPERTIES, "load_delay_ms": {"type": "integer", "minimum": 0, "maximum": 600000, "default": 0}}
    )

    def params_schema(self, config: dict) -> dict:
        return PARAMS_SCHEMA

    def build(self, config: dict, device: str) -> FaultModel:
        time.sleep(config.get("load_delay_ms", 0) / 1000.0)  # runs in the worker pool, like a real load
        model = FaultModel()
        model.version = config.get("version") or FaultModel.version  # a pretrained variant names itself
        return model


testfaults = FaultFactory()
