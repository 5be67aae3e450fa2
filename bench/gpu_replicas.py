"""MOBILENETV2 replicas sharing one GPU, behind one or more gateways: how far requests/s scale.

The run to do on a GPU machine with many cores (bench/README.md says what it showed):

    python -m bench.gpu_replicas [--replicas 1 2 4 6] [--gateways 1 2 3] [--concurrency 256] [--seconds 6]

One model-server process serves about 500 single-image requests/s on a GPU,
bound by its interpreter lock (``bench.gpu_mobilenet``), and one gateway
process about 800 (1.2 ms of its CPU per request). Replicas on one host
(docs/scaling.md) put several model-server processes on the same GPU
(``devices = [0]``); several gateways (one per host of a cluster, or several
processes behind HAProxy) share the clients. This bench starts the largest
``--replicas`` count of real MOBILENETV2 model servers on GPU 0 side by side,
then for each replica count R:

1. straight: R load tools at once, ``--concurrency``/R clients each, one per
   replica (what the model servers take without a gateway);
2. for each gateway count G: G real gateways, each routing to the first R
   replicas (``SERVICE_UPSTREAM_PORTS``, as the supervisor writes it), and G
   load tools at once, ``--concurrency``/G clients each.

Each point prints the summed requests/s, the load tools' p50 and p99 (the
largest of them), errors, and the cores the model servers and the gateways
used over it (``/proc/<pid>/stat``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.loadgen import LoadResult, run_load
from bench.threadcpu import process_cpu_ms
from svc.infra.replicas import encode
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.images import image_b64
from tests.support.processes import Proc, free_port, spawn_model_server, until_all_ready, write_config

UPSTREAM_TOKEN = "bench-upstream"


@dataclass
class Point:
    path: str
    replicas: int
    gateways: int
    results: list[LoadResult]
    seconds: float
    model_cores: float
    gateway_cores: float

    @property
    def rate(self) -> float:
        return sum(r.rate for r in self.results)


def loads(urls: list[str], body: bytes, headers: dict[str, str], concurrency: int, seconds: float,
          tool: str) -> list[LoadResult]:
    """One load tool per URL at the same time, ``concurrency`` clients shared among them."""
    results: list[LoadResult | None] = [None] * len(urls)
    share = max(1, concurrency // len(urls))

    def drive(i: int) -> None:
        results[i] = run_load(urls[i], body, headers, concurrency=share, seconds=seconds, tool=tool)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def measured(path: str, models: list[Proc], gateways: list[Proc], urls: list[str], body: bytes,
             headers: dict[str, str], args: argparse.Namespace) -> Point:
    procs = models + gateways
    before = [process_cpu_ms(p.popen.pid) for p in procs]
    started = time.monotonic()
    results = loads(urls, body, headers, args.concurrency, args.seconds, args.tool)
    elapsed = time.monotonic() - started
    used = [(process_cpu_ms(p.popen.pid) - b) / 1000.0 / elapsed for p, b in zip(procs, before)]
    return Point(path, len(models), len(gateways), results, elapsed, sum(used[:len(models)]),
                 sum(used[len(models):]))


def gpu_memory() -> str:
    """Each GPU process's memory, as nvidia-smi reports it (empty where it cannot)."""
    if not shutil.which("nvidia-smi"):
        return ""
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                          capture_output=True, text=True)
    return done.stdout.strip().replace("\n", "; ")


HEADER = (f"{'path':>8} {'replicas':>8} {'gateways':>8} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6} "
          f"{'model cores':>11} {'gateway cores':>13}")


def row(p: Point) -> str:
    return (f"{p.path:>8} {p.replicas:8d} {p.gateways:8d} {p.rate:7.0f} {max(r.p50 for r in p.results):7.1f} "
            f"{max(r.p99 for r in p.results):7.1f} {sum(r.errors for r in p.results):6d} {p.model_cores:11.2f} "
            f"{p.gateway_cores:13.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimize", default="channels_last+fp16+cuda_graphs",
                        help="backend.optimize of every replica (default: what auto chose on an H200)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                        help="backend.device (cpu: to try the bench itself on a machine without a GPU)")
    parser.add_argument("--max-batch", type=int, default=64, help="max_batch_size of each replica")
    parser.add_argument("--decode-threads", type=int, default=8)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 6])
    parser.add_argument("--gateways", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--concurrency", type=int, default=256, help="clients of each point, in all")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per point")
    parser.add_argument("--tool", choices=("auto", "wrk", "python"), default="auto")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-replicas-"))
    servers = tmp / "server"
    servers.mkdir()
    ports = [free_port() for _ in range(max(args.replicas))]
    config = write_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=ports[0],
                          max_batch_size=args.max_batch, max_queue_depth=0, max_batch_delay_ms=2, gpu_mem_limit_mb=0,
                          backend={"device": args.device, "optimize": args.optimize, "decode_threads": args.decode_threads})
    started = time.monotonic()
    models = list(until_all_ready(*(spawn_model_server(config, token=UPSTREAM_TOKEN, port=port, env={
        "SERVICE_REPLICA": str(i)}) for i, port in enumerate(ports)), timeout=600))
    print(f"{len(models)} MOBILENETV2 model servers ready on the {args.device} in {time.monotonic() - started:.1f} s "
          f"(optimize {args.optimize}, max_batch_size {args.max_batch}, {args.decode_threads} decode threads each)")
    print(f"  GPU memory per process (pid, MiB): {gpu_memory() or 'not reported'}")

    body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=3)]}).encode()
    gateway_headers = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}",
                       "Content-Type": "application/json"}
    model_headers = {"Authorization": f"Bearer {UPSTREAM_TOKEN}", "Content-Type": "application/json"}
    points: list[Point] = []
    print(HEADER)
    try:
        for r in args.replicas:
            serving = models[:r]
            points.append(measured("straight", serving, [], [m.url + "/mobilenetv2/predict" for m in serving],
                                   body, model_headers, args))
            print(row(points[-1]), flush=True)
            env = {"SERVICE_UPSTREAM_TOKEN": UPSTREAM_TOKEN, "SERVICE_UPSTREAM_PORTS": encode(
                {"MOBILENETV2": [m.port for m in serving]})}
            for g in args.gateways:
                gateways = []
                try:
                    for i in range(g):
                        root = tmp / f"gateway-{r}-{g}-{i}"
                        root.mkdir()
                        gateways.append(start_gateway(root, servers, None, env=env))
                    points.append(measured("gateway", serving, gateways,
                                           [gw.url + "/v1/models/MOBILENETV2/infer" for gw in gateways], body,
                                           gateway_headers, args))
                    print(row(points[-1]), flush=True)
                finally:
                    for gw in gateways:
                        gw.stop()
    finally:
        for m in models:
            m.stop()
    best = max(points, key=lambda p: p.rate if p.path == "gateway" else 0.0)
    print(f"\nbest through gateways: {best.rate:.0f} req/s with {best.replicas} replica(s) and {best.gateways} "
          f"gateway(s); {args.concurrency} clients, one 224x224 JPEG per request")


if __name__ == "__main__":
    main()
