"""TorchServe handler serving our MOBILENETV2 model, so the peer does exactly our work per image.

The model comes from ``models/mobilenetv2.py`` (random init, seed 0), so
the per-image preprocessing (Pillow decode, resize, crop), the batched
normalisation and forward pass and the top-5 postprocessing are the very
code the model server runs; what differs is only the serving around it.
Threads and allocator as the model server sets them: ``torch.set_num_threads``
from ``BENCH_TORCH_THREADS`` (default 2) and glibc's mallopt tuning.
"""

from __future__ import annotations

import io
import os


class MobileNetV2Handler:
    def __init__(self) -> None:
        self.model = None
        self.params = {"top_k": 5}

    def initialize(self, context) -> None:  # noqa: ANN001 - TorchServe's Context
        from svc.model import torchenv

        torchenv.tune_malloc()
        import torch

        torch.set_num_threads(int(os.environ.get("BENCH_TORCH_THREADS", "2")))
        from models.mobilenetv2 import mobilenetv2

        self.model = mobilenetv2.build({"weights": "random", "seed": 0}, "cpu")
        from PIL import Image

        warm = [self.model.preprocess(Image.new("RGB", (320, 240), (128, 128, 128)), self.params)] * 8
        self.model.predict(warm, self.params)

    def handle(self, data, context):  # noqa: ANN001, ANN201 - TorchServe's signature
        from PIL import Image

        inputs = []
        for row in data:
            raw = row.get("data") or row.get("body")
            inputs.append(self.model.preprocess(Image.open(io.BytesIO(bytes(raw))), self.params))
        outputs = self.model.predict(inputs, self.params)
        return [self.model.postprocess(output, self.params, {}) for output in outputs]


_service = MobileNetV2Handler()


def handle(data, context):  # noqa: ANN001, ANN201 - TorchServe's module-level entry point
    if _service.model is None:
        _service.initialize(context)
    if data is None:
        return None
    return _service.handle(data, context)
