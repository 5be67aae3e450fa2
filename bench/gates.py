"""Each zoo model's accuracy gate between eager float32 and torch's own bfloat16, on the loaded weights.

    python -m bench.gates [--models MOBILENETV2 YOLOV8 ...] [--modes bf16 channels_last+bf16+jit bf16-weights]
                          [--weights YOLOV8=PATH]

Builds each model from its shipped config (random init: the demo weights;
a config whose ``[model] weights`` names a file runs on that file), takes
its ``gate_outputs()`` with every target eager (the reference), then again
with every target in each mode, and prints the gate's verdict and figure
(``svc/optimize/gates.py``).  Modes: any ``backend.optimize`` step
combination (``bf16`` is ``torch.autocast`` to bfloat16), and
``bf16-weights``: the target's weights and float inputs cast to bfloat16
(every op in bfloat16, closer to what OpenVINO's bf16 inference precision
does).  YOLOV8's detections are gated with the params they ran with
(``GATE_PARAMS``), the form the detection gate reads for its cuts.

MOBILENETV2 is also gated on ``--photos`` (default 4) images that look like
photographs rather than noise (``tests/support/photos.py``), beside its own seeded
noise gate inputs.  ``--weights MODEL=PATH`` gates that model on a weights
file instead of its demo weights (trained YOLOv8 weights from a package on
the registry: ``bench/yolov8_onnx.py``).  One intra-op thread; a few seconds per model, SAM_AMG
about a minute.  README "Accuracy gates" has the figures.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

MODELS = ("MOBILENETV2", "YOLOV8", "DDPM", "DDIM", "CLS_COND_DDIM", "LDM", "SAM_AMG")


def bf16_weights(module: Any) -> Any:
    """``module``'s copy in bfloat16, called with bfloat16 float inputs, returning float32."""
    import torch

    from svc.optimize.tensors import map_tensors, to_float

    class Bf16(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = copy.deepcopy(module).to(torch.bfloat16)

        def forward(self, *args: Any) -> Any:
            cast = map_tensors(list(args), lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)
            return to_float(self.inner(*cast))

        def __getattr__(self, name: str) -> Any:  # what other code reads of the module (SAM's img_size)
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(module, name)

    return Bf16()


def candidate_outputs(model: Any, targets: list, name: str, batch: int, gate_inputs: Any) -> Any:
    """``gate_inputs()`` with every target in mode ``name``; the targets eager again afterwards."""
    from svc.optimize.apply import apply_mode
    from svc.optimize.modes import mode
    from svc.optimize.tensors import set_layout

    if name == "bf16-weights":
        fns = [bf16_weights(t.module) for t in targets]
    else:
        fns = [apply_mode(t, mode(name), "cpu", batch if t.batched else 1) for t in targets]
    try:
        for target, fn in zip(targets, fns):
            target.install(fn)
        return gate_inputs()
    finally:
        for target in targets:
            target.install(target.module)
            set_layout(target.module, False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--modes", nargs="+", default=["bf16", "channels_last+bf16+jit", "bf16-weights"])
    parser.add_argument("--photos", type=int, default=4, help="MOBILENETV2: photo-like images gated too")
    parser.add_argument("--weights", action="append", default=[], metavar="MODEL=PATH",
                        help="gate MODEL on this weights file (its [model] weights) instead of the demo weights")
    args = parser.parse_args()
    weights = dict(item.split("=", 1) for item in args.weights)

    from svc.model import torchenv

    torchenv.configure_threads(1, 1)
    import torch

    from svc.config import load_model_server_config
    from svc.model.api import find_factory, model_config
    from svc.optimize.gates import gate_for

    print(f"{'model':<14} {'gate inputs':<12} {'mode':<24} {'gate':<6} figure")
    for model_id in args.models:
        config = load_model_server_config(f"conf/server/{model_id}.toml")
        factory = find_factory(config.id)
        table = {**config.model, "weights": weights[model_id]} if model_id in weights else config.model
        model = factory.build(model_config(factory, table, config.path), "cpu")
        gate = gate_for(getattr(model, "gate_category", None) or factory.category)
        targets = list(model.optimization_targets())
        inputs: dict[str, Any] = {"own": model.gate_outputs}
        if model_id == "MOBILENETV2" and args.photos:
            from tests.support.photos import photo_like

            photos = torch.stack([torch.from_numpy(photo_like(224, 224, seed)) for seed in range(args.photos)])

            def on_photos(model: Any = model, photos: Any = photos) -> Any:
                with torch.inference_mode():
                    return model.run_net(photos).float()

            inputs["photo-like"] = on_photos
        for label, gate_inputs in inputs.items():
            reference = gate_inputs()
            for name in args.modes:
                started = time.perf_counter()
                try:
                    result = gate(reference, candidate_outputs(model, targets, name, config.max_batch_size,
                                                               gate_inputs))
                    verdict, figure = ("pass" if result.passed else "FAIL"), result.summary
                except Exception as e:  # noqa: BLE001 - a mode that cannot run is a row, not the end
                    verdict, figure = "err", f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
                print(f"{model_id:<14} {label:<12} {name:<24} {verdict:<6} {figure} "
                      f"({time.perf_counter() - started:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
