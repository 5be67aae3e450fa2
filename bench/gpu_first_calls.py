"""What the first forward of each batch size costs on a GPU, by precision and layout: cuDNN's plans.

The run to do on a GPU machine (bench/README.md says what it showed):

    python -m bench.gpu_first_calls [--cudnn default|benchmark|off]

A GPU model server's warm-up runs every batch size it captures a CUDA graph
for (``svc.optimize.buckets.capture_sizes``: 1, 2, 4 ... ``max_batch_size``),
and its start was found to take 11 s in ``conv2d`` alone for MOBILENETV2 in
``channels_last+fp16+cuda_graphs``.  This bench builds torchvision's
MobileNetV2 (random weights) in float32, float16 and float16 channels_last,
and times the first and the second forward of each batch size, 64 down to 1,
then the steady time of a batch of 64.  ``--cudnn benchmark`` turns cuDNN's
autotuner on, ``--cudnn off`` cuDNN itself (torch's own kernels).
"""

from __future__ import annotations

import argparse
import time

SIZES = (64, 32, 16, 8, 4, 2, 1)


def main(cudnn: str) -> None:
    import torch
    import torchvision

    torch.backends.cudnn.enabled = cudnn != "off"
    torch.backends.cudnn.benchmark = cudnn == "benchmark"
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}, "
          f"cudnn {cudnn}", flush=True)
    for dtype, layout in ((torch.float32, torch.contiguous_format), (torch.float16, torch.contiguous_format),
                          (torch.float16, torch.channels_last)):
        model = torchvision.models.mobilenet_v2().eval().cuda().to(dtype=dtype, memory_format=layout)
        firsts, seconds = [], []
        with torch.inference_mode():
            for n in SIZES:
                x = torch.randn(n, 3, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=layout)
                for runs in (firsts, seconds):
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                    model(x)
                    torch.cuda.synchronize()
                    runs.append((time.perf_counter() - started) * 1000)
            x = torch.randn(64, 3, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=layout)
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(20):
                model(x)
            torch.cuda.synchronize()
            steady = (time.perf_counter() - started) / 20 * 1000
        layout_name = "channels_last" if layout is torch.channels_last else "contiguous"
        name = f"{str(dtype).removeprefix('torch.')} {layout_name}"
        print(f"{name:24s} first call ms (batch {SIZES[0]}..{SIZES[-1]}) {[round(v) for v in firsts]}, "
              f"{sum(firsts) / 1000:.1f} s in all; second call ms {[round(v, 1) for v in seconds]}; "
              f"batch 64 steady {steady:.2f} ms", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cudnn", choices=("default", "benchmark", "off"), default="default")
    main(parser.parse_args().cudnn)
