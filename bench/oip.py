"""Gateway CPU per request: the Open Inference Protocol (binary tensors) against the contract's route.

A real MOBILENETV2 model server behind a real gateway; at each concurrency
the same image is sent, in alternating runs (contract, OIP, contract, OIP:
this machine's speed drifts), as the contract's JSON request
(``/v1/models/MOBILENETV2/infer``, ``params.top_k`` 5) and as an OIP request
with binary tensors asking for the classification output with
``class_count`` 5 as binary data (what ``tritonclient.http`` sends, built
once here).  Both make the model server do the same work (top 5 of one
image); the difference is the gateway's own: the OIP request is parsed,
translated into the contract's request and its envelope into OIP outputs.
Prints the gateway's CPU ms per request (from /proc, user + system) on
each route and their ratio: of the means over the runs, and ``paired``,
the median (and range) of each OIP run's figure over the contract run
just before it, which a drift of the machine's speed moves less (many
short rounds: ``--seconds 2 --rounds 15``).

Goal (issue 29): OIP at most 5 % more gateway CPU per request, at 1 and 32 clients.

Then the same against a trivial stand-in for MOBILENETV2 (bench/oip_upstream.py), where the gateway saturates
and its own cost is not hidden behind the model's.

    python -m bench.oip [--seconds 10] [--concurrency 1 32] [--rounds 2] [--tool auto|wrk|python]
                        [--upstream both|model|trivial]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.gateway import measured
from bench.shipped import shipped_config
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.images import image_bytes
from tests.support.processes import REPO, child_env, free_port, start_model_server, write_config


def oip_body(image: bytes) -> tuple[bytes, dict[str, str]]:
    """The body and extra headers tritonclient sends for one binary BYTES input and a binary class_count output."""
    blob = struct.pack("<I", len(image)) + image
    head = json.dumps({"inputs": [{"name": "IMAGE", "shape": [1], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(blob)}}],
                       "outputs": [{"name": "PROBABILITIES", "parameters": {"classification": 5, "binary_data": True}}]})
    return head.encode() + blob, {"Inference-Header-Content-Length": str(len(head))}


def mean(runs: list, pick: Any) -> float:
    """The mean over the runs of ``pick(result, cpu_ms_per_request)``."""
    return sum(pick(r, cpu) for r, cpu in runs) / len(runs)


def compare(gateway: Any, image: bytes, args: Any) -> list:
    """Alternating runs of the contract's route and OIP through ``gateway``, per concurrency."""
    auth = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}"}
    contract = (gateway.url + "/v1/models/MOBILENETV2/infer",
                json.dumps({"images": [base64.b64encode(image).decode()], "params": {"top_k": 5}}).encode(),
                {**auth, "Content-Type": "application/json"})
    body, extra = oip_body(image)
    oip = (gateway.url + "/v2/models/MOBILENETV2/infer", body, {**auth, **extra})
    rows = []
    for c in args.concurrency:
        runs: dict[str, list] = {"contract": [], "oip": []}
        for _ in range(args.rounds):
            for name, (url, data, headers) in (("contract", contract), ("oip", oip)):
                runs[name].append(measured(gateway, url, data, headers, c, args.seconds, args.tool))
        rows.append((c, runs))
    return rows


def report(title: str, rows: list) -> None:
    print(title)
    print(f"  {'clients':>7} {'tool':>6} {'contract CPU/req':>16} {'OIP CPU/req':>11} {'OIP/contract':>12} "
          f"{'paired':>17} {'contract/s':>10} {'OIP/s':>6} {'contract p50':>12} {'OIP p50':>8} {'errors':>6}")
    for c, runs in rows:
        cpu = {n: mean(runs[n], lambda r, cpu: cpu) for n in runs}
        rate = {n: mean(runs[n], lambda r, cpu: r.rate) for n in runs}
        p50 = {n: mean(runs[n], lambda r, cpu: r.p50) for n in runs}
        errors = sum(r.errors for n in runs for r, _ in runs[n])
        tool = runs["oip"][0][0].tool
        paired = sorted(o / k for (_, o), (_, k) in zip(runs["oip"], runs["contract"]))
        spread = f"{statistics.median(paired):.3f} ({paired[0]:.2f}-{paired[-1]:.2f})"
        print(f"  {c:7d} {tool:>6} {cpu['contract']:14.3f}ms {cpu['oip']:9.3f}ms {cpu['oip'] / cpu['contract']:12.3f} "
              f"{spread:>17} {rate['contract']:10.1f} {rate['oip']:6.1f} {p50['contract']:10.2f}ms {p50['oip']:6.2f}ms {errors:6d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=2, help="alternating contract/OIP pairs per concurrency")
    parser.add_argument("--tool", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--upstream", choices=("both", "model", "trivial"), default="both")
    args = parser.parse_args()

    image = image_bytes(width=224, height=224, fmt="JPEG", seed=3)
    tmp = Path(tempfile.mkdtemp(prefix="bench-oip-"))
    env = {"SERVICE_UPSTREAM_TOKEN": "bench-upstream"}
    if args.upstream in ("both", "model"):
        servers = tmp / "model" / "server"
        servers.mkdir(parents=True)
        port = free_port()
        config = shipped_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=port, max_batch_size=8,
                                max_queue_depth=0)
        model = start_model_server(config, token="bench-upstream", port=port)
        gateway = start_gateway(tmp / "model", servers, None, env=env)
        try:
            rows = compare(gateway, image, args)
        finally:
            gateway.stop()
            model.stop()
        report("Gateway CPU per request, MOBILENETV2 top 5 of one 224x224 JPEG: the contract's route vs OIP binary "
               "tensors", rows)
    if args.upstream in ("both", "trivial"):
        servers = tmp / "trivial" / "server"
        servers.mkdir(parents=True)
        upstream = subprocess.Popen([sys.executable, "-m", "bench.oip_upstream"], cwd=REPO, env=child_env(),
                                    stdout=subprocess.PIPE, text=True)
        port = json.loads(upstream.stdout.readline())["port"]
        write_config(servers, "TESTFAULTS", name="MOBILENETV2.toml", id="MOBILENETV2", port=port,
                     server_uri="/mobilenetv2/predict")
        gateway = start_gateway(tmp / "trivial", servers, None, env=env)
        try:
            rows = compare(gateway, image, args)
        finally:
            gateway.stop()
            upstream.terminate()
            upstream.wait(10)
        report("\nThe same requests to a trivial stand-in for MOBILENETV2 (bench/oip_upstream.py: a fixed top-5 "
               "reply), where the gateway saturates and its own cost is not hidden behind the model's", rows)
    print(f"\n({args.rounds} alternating runs of {args.seconds:g} s per route and concurrency, means; all processes "
          "share the machine's cores)")


if __name__ == "__main__":
    main()
