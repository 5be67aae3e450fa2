"""MOBILENETV2's served mode without HTTP: what decoding each image costs the cores that run the network.

    python -m bench.decode_pipeline [--seconds 6] [--rounds 2] [--photo]

The ceiling of the model server's own structure on a CPU: ``backend.workers``
threads (2), each taking a batch of 8, decoding its JPEGs with the plugin's
``preprocess`` and running the converted model (``bf16+openvino``, one
OpenVINO stream of one thread per worker, as ``svc/optimize/runtimes.py``
compiles it), against the same threads running the same model on a batch
decoded once (the bare figure the goal of issue 26 compares with), and one
stream of two threads called by one thread (``bench.bare_runtimes``'s shape).
No HTTP, no queue, no JSON: what is left between the served figure and the
first row is the server's; what is between the first two rows is decoding's.

Per row: images/s over ``--seconds``, the cores left idle on the machine
(``/proc/stat``), and per image the decode's thread CPU ms and the batch's
forward wall ms.  ``--photo`` decodes a photo-like 224x224 JPEG
(``tests/support/photos.py``) instead of the noise ``bench.modelserver`` sends.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BATCH = 8


def _idle_ticks() -> tuple[int, int]:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return values[3] + values[4], sum(values)


def measure(core: Any, xml: str, model: Any, data: bytes, streams: int, callers: int, decode: bool,
            seconds: float) -> str:
    """One row: ``callers`` threads, each decoding (or not) a batch and calling its infer request."""
    import numpy as np
    from PIL import Image

    compiled = core.compile_model(core.read_model(xml), "CPU", {
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": 2,
        "NUM_STREAMS": streams})
    batches, decode_cpu, forward_wall = [0] * callers, [0.0] * callers, [0.0] * callers
    stop = threading.Event()

    def decoded() -> Any:
        return np.stack([model.preprocess(Image.open(io.BytesIO(data)), {}) for _ in range(BATCH)])

    def loop(i: int) -> None:
        request, fixed = compiled.create_infer_request(), decoded()
        while not stop.is_set():
            cpu = time.thread_time()
            x = decoded() if decode else fixed
            decode_cpu[i] += time.thread_time() - cpu
            wall = time.perf_counter()
            request.infer([x], share_inputs=True)
            forward_wall[i] += time.perf_counter() - wall
            batches[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # warm: the first calls allocate
    before, (idle0, total0), started = sum(batches), _idle_ticks(), time.perf_counter()
    time.sleep(seconds)
    done, (idle1, total1), elapsed = sum(batches) - before, _idle_ticks(), time.perf_counter() - started
    stop.set()
    for t in threads:
        t.join()
    n = max(1, sum(batches))
    label = f"{streams} stream(s), {callers} caller(s), {'decoding' if decode else 'decoded once'}"
    return (f"  {label:44s} {done * BATCH / elapsed:7.1f} img/s  idle {2 * (idle1 - idle0) / (total1 - total0):4.2f}"
            f"  decode {sum(decode_cpu) / n / BATCH * 1000:5.2f} ms/img  forward {sum(forward_wall) / n * 1000:5.1f}"
            " ms/batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--photo", action="store_true", help="a photo-like JPEG instead of noise")
    args = parser.parse_args()

    from svc.model import torchenv

    torchenv.tune_malloc()
    torchenv.configure_threads(1, 1)
    import openvino
    import torch

    from bench.modelserver import photo_jpeg
    from models.mobilenetv2 import mobilenetv2
    from svc.optimize import runtimes
    from tests.support.images import image_bytes

    model = mobilenetv2.build({"weights": "random", "seed": 0}, "cpu")
    directory = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    runtimes.converted(model.pixels, lambda n: (torch.zeros(n, 224, 224, 3, dtype=torch.uint8),), BATCH, True,
                       "openvino", True, "MOBILENETV2", directory)
    xml = str(next(directory.glob("*-openvino-*.xml")))
    data = photo_jpeg() if args.photo else image_bytes(width=224, height=224, fmt="JPEG", seed=3)
    core = openvino.Core()
    print(f"MOBILENETV2 bf16+openvino, batch {BATCH}, one {len(data)}-byte 224x224 JPEG "
          f"({'photo-like' if args.photo else 'noise'}), {args.seconds:g} s per row", flush=True)
    for round_ in range(1, args.rounds + 1):
        print(f"round {round_}", flush=True)
        for streams, callers, decode in ((2, 2, True), (2, 2, False), (1, 1, False)):
            print(measure(core, xml, model, data, streams, callers, decode, args.seconds), flush=True)


if __name__ == "__main__":
    main()
