"""Bare MobileNetV2 in OpenVINO and in ONNX Runtime on the CPU, in a process of its own.

The network is the served one (the MOBILENETV2 plugin's build: random init
with seeded BatchNorm statistics), converted as a new user of each runtime
would convert it:

- ``openvino``: ``openvino.convert_model`` straight from the torch module
  (example input 1x3x224x224), reshaped and compiled for each batch size,
  ``PERFORMANCE_HINT`` ``LATENCY``, ``INFERENCE_NUM_THREADS`` = ``--threads``,
  ``INFERENCE_PRECISION_HINT`` ``f32`` or ``bf16`` (``--precision``; bf16 is
  OpenVINO's own default on a CPU with AVX512-BF16 or AMX);
- ``onnxruntime``: ``torch.onnx.export`` (the TorchScript exporter, opset
  17, the batch dimension dynamic), an ``InferenceSession`` on the CPU
  provider with every graph optimisation and ``intra_op_num_threads`` =
  ``--threads``, float32.

Each runtime's outputs on the plugin's accuracy-gate inputs are checked with
the classification gate against eager torch (``svc/optimize/gates.py``): the
``gate`` field says whether this precision would pass, which decides the
precision of the bare reference (bf16 where it passes).

Prints one JSON line per batch size, as ``bench/bare_forward.py`` does, plus
``runtime``, ``precision`` and ``gate``; or, when the runtime cannot be
imported, one line ``{"runtime": R, "missing": "..."}`` (and exit status 0),
so that ``bench.modelserver`` prints "not installed" and goes on.

    python -m bench.bare_runtimes --runtime openvino --precision bf16 [--threads 2] [--batch 1 8] [--seconds 4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bare_forward import _cpu_ms


def normalized(model: Any, pixels: Any) -> Any:
    """uint8 NHWC pixels as the float NCHW input of the bare network (what the plugin's ``pixel_net`` computes)."""
    mean, std = model.pixels.mean, model.pixels.std
    return (pixels.permute(0, 3, 1, 2).contiguous().float().div(255) - mean) / std


def openvino_runner(net: Any, precision: str, threads: int) -> Any:
    """A function batch (numpy float32) -> logits, compiled by OpenVINO per batch size."""
    import openvino as ov
    import torch

    core = ov.Core()
    model = ov.convert_model(net, example_input=torch.zeros(1, 3, 224, 224))
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
              "INFERENCE_PRECISION_HINT": precision}
    compiled: dict[int, Any] = {}

    def run(batch: Any) -> Any:
        n = batch.shape[0]
        if n not in compiled:
            shaped = model.clone()
            shaped.reshape([n, 3, 224, 224])
            compiled[n] = core.compile_model(shaped, "CPU", config).create_infer_request()
        request = compiled[n]
        request.infer({0: batch})
        return request.get_output_tensor(0).data

    return run


def onnxruntime_runner(net: Any, precision: str, threads: int) -> Any:
    """A function batch (numpy float32) -> logits, by an ONNX Runtime session of the exported network."""
    import onnxruntime as ort
    import torch

    if precision != "f32":
        raise SystemExit("onnxruntime: float32 only")
    path = Path(tempfile.mkdtemp(prefix="bench-onnx-")) / "mobilenetv2.onnx"
    torch.onnx.export(net, (torch.zeros(1, 3, 224, 224),), str(path), input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(batch: Any) -> Any:
        return session.run(None, {"x": batch})[0]

    return run


RUNNERS = {"openvino": ("openvino", openvino_runner), "onnxruntime": ("onnxruntime", onnxruntime_runner)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=tuple(RUNNERS), required=True)
    parser.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=0, help="the runtime's threads; 0 = the CPU cores")
    args = parser.parse_args()

    module, make = RUNNERS[args.runtime]
    try:
        __import__(module)
    except ImportError as e:
        print(json.dumps({"runtime": args.runtime, "precision": args.precision,
                          "missing": f"{module} not installed ({e})"}), flush=True)
        return
    from svc.model import torchenv

    torchenv.tune_malloc()
    threads = torchenv.configure_threads(args.threads, 1)
    import numpy as np
    import torch

    from models.mobilenetv2 import GATE_IMAGES, mobilenetv2
    from svc.optimize.gates import classification

    model = mobilenetv2.build({"weights": "random", "seed": 0}, "cpu")
    run = make(model.net.eval(), args.precision, threads)
    with torch.inference_mode():
        reference = model.pixels(model.gate_images(GATE_IMAGES))  # eager, normalisation included
        gate_input = normalized(model, model.gate_images(GATE_IMAGES))
    gate = classification(reference, torch.from_numpy(np.array(run(gate_input.numpy()))))
    for batch in args.batch:
        x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32)
        for _ in range(3):
            run(x)
        n = 0
        cpu = _cpu_ms()
        started = time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            run(x)
            n += 1
        elapsed = time.perf_counter() - started
        cpu = _cpu_ms() - cpu
        print(json.dumps({"batch": batch, "threads": threads, "images_per_s": n * batch / elapsed,
                          "ms_per_batch": elapsed / n * 1000, "core_ms_per_image": cpu / (n * batch),
                          "runtime": args.runtime, "precision": args.precision, "gate": gate.passed,
                          "gate_figure": gate.summary}), flush=True)


if __name__ == "__main__":
    main()
