"""MOBILENETV2 as shipped, measured by Triton's perf_analyzer through the gateway's ``/v2``, beside bare
OpenVINO: issue 26's goals read with the tool operators measure Triton with.

    python -m bench.perf_analyzer [--seconds 5] [--rounds 2] [--concurrency 1 32] [--batch 1]
                                  [--bare-threads 2] [--image noise|photo] [--perf-analyzer DIR]

perf_analyzer is the one ``bin/ensure-perf-analyzer`` puts beside the test
environment's interpreter (``.tox/py311/perf_analyzer``; tox's setup runs it),
or the folder ``--perf-analyzer`` names (``bin/perf_analyzer`` and
``lib/libcudart.so.12`` in it).  One model server of the shipped config
(``backend.optimize`` its own ``auto``) behind one gateway with one API key;
each round measures every concurrency through the gateway (perf_analyzer reads
the model's metadata, which only the gateway serves), with
``--measurement-interval`` of ``--seconds``
(perf_analyzer's time windows, until three agree within 10 %, at most 10: a
point that did not stabilise says so and still gives its last window).  Each
request carries ``--batch`` images (rows of one 224x224 JPEG: noise, the worst
case for decoding, or photo-like).  perf_analyzer runs on the same cores and
takes its share of them, as ``wrk`` does in ``python -m bench.modelserver``.

Bare OpenVINO (``bench/bare_runtimes.py``, at ``--bare-threads``, in the precision ``auto`` would choose:
the faster of f32 and, where the CPU computes in bf16 and the gate passes, bf16) is measured before the first
round and after each;
the summary gives the medians and the issue's goals: at 32 clients at least 0.75 x bare batch-8 img/s and
p99/p50 at most 1.3, at 1 client a p50 at most 1.3 x (bare batch-1 ms + 1 ms).
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.modelserver import bare_runtime, photo_jpeg, reference_precision
from bench.shipped import shipped_config
from svc.optimize.support import cpu_has_native_bf16
from tests.support.gateway import start_gateway
from tests.support.images import image_bytes
from tests.support.processes import free_port, start_model_server
from tests.support.stack import key_entry

KEY, TOKEN = "k" * 64, "upstream"
DEFAULT_TOOL = Path(sys.executable).parent.parent / "perf_analyzer"


@dataclass
class Point:
    round: int
    clients: int
    rate: float  # images per second (perf_analyzer's inferences: one per row)
    p50_ms: float
    p99_ms: float
    stable: bool


def measure(tool: Path, port: int, auth: str, data: Path, *, clients: int, batch: int, seconds: float,
            out: Path) -> tuple[float, float, float, bool]:
    """One perf_analyzer point: images/s, p50 and p99 (ms), and whether it stabilised."""
    args = [str(tool / "bin" / "perf_analyzer"), "-m", "MOBILENETV2", "-u", f"127.0.0.1:{port}", "-i", "http",
            "-H", f"Authorization: Bearer {auth}", "--input-data", str(data), "-b", str(batch),
            "--concurrency-range", str(clients), "--measurement-interval", str(int(seconds * 1000)),
            "--percentile", "99", "-f", str(out)]
    run = subprocess.run(args, env={**os.environ, "LD_LIBRARY_PATH": str(tool / "lib")}, capture_output=True,
                         text=True, timeout=600)
    if not out.exists():
        raise SystemExit(f"perf_analyzer failed ({run.returncode}):\n{run.stdout}{run.stderr}")
    [row] = list(csv.DictReader(out.open()))
    out.unlink()
    return (float(row["Inferences/Second"]), float(row["p50 latency"]) / 1000, float(row["p99 latency"]) / 1000,
            run.returncode == 0)


def bare_reference(threads: int, seconds: float) -> tuple[str, dict]:
    """Bare OpenVINO in the precision auto would choose (bench.modelserver.reference_precision: the faster at
    batch 8 of f32 and, where the CPU computes in it and the gate passes, bf16): (precision, {batch: row})."""
    specs = ["openvino:f32"] + (["openvino:bf16"] if cpu_has_native_bf16() else [])
    measured = {spec: bare_runtime(spec, threads, seconds) for spec in specs}
    usable = {spec: [rows] for spec, rows in measured.items() if "missing" not in rows}
    chosen = reference_precision(usable)
    if chosen is None:
        raise SystemExit(f"bare OpenVINO: {measured['openvino:f32'].get('missing')}")
    return chosen.split(":")[1], measured[chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="perf_analyzer's measurement window")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--batch", type=int, default=1, help="images per request (perf_analyzer's -b)")
    parser.add_argument("--bare-threads", type=int, default=2)
    parser.add_argument("--bare-seconds", type=float, default=4.0)
    parser.add_argument("--image", choices=("noise", "photo"), default="noise")
    parser.add_argument("--perf-analyzer", type=Path, default=DEFAULT_TOOL, metavar="DIR")
    args = parser.parse_args()
    if not (args.perf_analyzer / "bin" / "perf_analyzer").exists():
        raise SystemExit(f"no perf_analyzer under {args.perf_analyzer}: run bin/ensure-perf-analyzer {sys.executable}")

    tmp = Path(tempfile.mkdtemp(prefix="bench-pa-"))
    image = photo_jpeg() if args.image == "photo" else image_bytes(width=224, height=224, fmt="JPEG", seed=3)
    data = tmp / "image.json"  # Triton's serialized BYTES element: a 4-byte length, then the file
    data.write_text(json.dumps({"data": [{"IMAGE": {"b64": base64.b64encode(
        struct.pack("<I", len(image)) + image).decode()}}]}))
    servers = tmp / "server"
    servers.mkdir()
    port = free_port()
    config = shipped_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=port)
    print(f"MOBILENETV2 (shipped config) measured by perf_analyzer: one 224x224 {args.image} JPEG per row "
          f"({len(image)} bytes), {args.batch} row(s) per request, {args.seconds:g} s windows, {args.rounds} round(s)\n")
    bare = [bare_reference(args.bare_threads, args.bare_seconds)]
    model = start_model_server(config, token=TOKEN, port=port, ready_timeout=300)
    gateway = start_gateway(tmp, servers, key_entry("bench", KEY), env={"SERVICE_UPSTREAM_TOKEN": TOKEN})
    points: list[Point] = []
    print(f"{'round':>5} {'clients':>7} {'img/s':>8} {'p50 ms':>8} {'p99 ms':>8} stable")
    try:
        for round_ in range(1, args.rounds + 1):
            for clients in args.concurrency:
                rate, p50, p99, stable = measure(args.perf_analyzer, gateway.port, KEY, data, clients=clients,
                                                 batch=args.batch, seconds=args.seconds, out=tmp / "point.csv")
                points.append(Point(round_, clients, rate, p50, p99, stable))
                print(f"{round_:>5} {clients:>7} {rate:>8.1f} {p50:>8.1f} {p99:>8.1f} {'yes' if stable else 'no'}",
                      flush=True)
            model.stop()  # the bare reference alone on the cores, as bench.modelserver measures it
            bare.append(bare_reference(args.bare_threads, args.bare_seconds))
            if round_ < args.rounds:
                model = start_model_server(config, token=TOKEN, port=port, ready_timeout=300)
    finally:
        gateway.stop()
        model.stop()
    summary(points, bare, args)


def summary(points: list[Point], bare: list[tuple[str, dict]], args: argparse.Namespace) -> None:
    precision = bare[-1][0]
    ov8 = statistics.median(rows[8]["images_per_s"] for _, rows in bare)
    ov1 = statistics.median(rows[1]["ms_per_batch"] for _, rows in bare)
    print(f"\nbare OpenVINO {precision} at {args.bare_threads} thread(s), medians of {len(bare)}: batch 8 "
          f"{ov8:.1f} img/s, batch 1 {ov1:.1f} ms")
    for clients in args.concurrency:
        mine = [p for p in points if p.clients == clients]
        rate = statistics.median(p.rate for p in mine)
        p50 = statistics.median(p.p50_ms for p in mine)
        tail = statistics.median(p.p99_ms / p.p50_ms for p in mine)
        line = f"  c={clients}: {rate:.1f} img/s, p50 {p50:.1f} ms, p99/p50 {tail:.2f}"
        if clients == 32:
            line += (f"; {rate / ov8:.2f} x bare OV batch 8 (goal >= 0.75: {'met' if rate / ov8 >= 0.75 else 'missed'}"
                     f"), p99/p50 goal <= 1.3: {'met' if tail <= 1.3 else 'missed'}")
        if clients == 1 and args.batch == 1:
            bound = 1.3 * (ov1 + 1.0)
            line += (f"; p50 = {p50 / (ov1 + 1.0):.2f} x (bare OV batch 1 + 1 ms) (goal <= 1.3, i.e. "
                     f"{bound:.1f} ms: {'met' if p50 <= bound else 'missed'})")
        print(line)


if __name__ == "__main__":
    main()
