"""Gateway overhead: the same load through the gateway and straight to the model server, in one run.

1. A real MOBILENETV2 model server (max_batch_size 8) behind a real gateway;
   wrk (or Python clients) with single-image requests at each concurrency,
   first straight to the model server, then through the gateway, then
   straight again (the mean of the two direct runs is the reference: this
   machine's speed drifts).  Prints p50/p99 both ways, the added latency,
   and the gateway's CPU time per request (from /proc, user + system).
   Then the paired point: the same number of clients through the gateway
   and straight to the model server at the same time (two load generators
   side by side), so both halves meet the same batches and the same drift;
   the difference of their p50 is what the gateway adds, free of the
   run-to-run noise that dwarfs it in the sequential comparison.
2. The same against a trivial upstream (bench/trivial_upstream.py), where
   the gateway's own cost is not hidden behind the model's: added latency,
   CPU per request, and at 32 clients its maximum request rate; and the
   same for a minimal Twisted proxy (bench/minimal_proxy.py), the floor.

Goal (issue): added p50 under 2 ms at 32 concurrent clients.

    python -m bench.gateway [--seconds 10] [--concurrency 1 32] [--tool wrk|python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench.loadgen import run_load
from bench.shipped import shipped_config
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.images import image_b64
from tests.support.processes import REPO, child_env, free_port, start_model_server, write_config

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measured(proxy, url, body, headers, concurrency, seconds, tool):
    """The load result and the proxy process's CPU ms per request over it."""
    pid = proxy.popen.pid if hasattr(proxy, "popen") else proxy.pid
    before = cpu_seconds(pid)
    result = run_load(url, body, headers, concurrency=concurrency, seconds=seconds, tool=tool)
    cpu = cpu_seconds(pid) - before
    return result, cpu * 1000.0 / max(1, result.requests)


def side_by_side(proxy, gateway_url, direct_url, body, gateway_headers, direct_headers, concurrency, seconds, tool):
    """The same load through the gateway and straight to the upstream at the same time."""
    results = {}

    def straight() -> None:
        results["direct"] = run_load(direct_url, body, direct_headers, concurrency=concurrency, seconds=seconds,
                                     tool=tool)

    other = threading.Thread(target=straight)
    other.start()
    through, cpu_ms = measured(proxy, gateway_url, body, gateway_headers, concurrency, seconds, tool)
    other.join()
    return results["direct"], through, cpu_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tool", choices=("auto", "wrk", "python"), default="auto")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    servers = tmp / "server"
    servers.mkdir()
    upstream = subprocess.Popen([sys.executable, "-m", "bench.trivial_upstream"], cwd=REPO, env=child_env(),
                                stdout=subprocess.PIPE, text=True)
    trivial_port = json.loads(upstream.stdout.readline())["port"]
    model_port = free_port()
    config = shipped_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=model_port, max_batch_size=8,
                          max_queue_depth=0)
    write_config(servers, "TESTFAULTS", name="TRIVIAL.toml", id="TRIVIAL", port=trivial_port,
                 server_uri="/trivial/predict")
    minimal_port = free_port()
    minimal = subprocess.Popen([sys.executable, "-m", "bench.minimal_proxy", str(minimal_port),
                                f"http://127.0.0.1:{trivial_port}/trivial/predict"], cwd=REPO, env=child_env(),
                               stdout=subprocess.PIPE, text=True)
    minimal.stdout.readline()  # listening
    model = start_model_server(config, token="bench-upstream", port=model_port)
    gateway = start_gateway(tmp, servers, None, env={"SERVICE_UPSTREAM_TOKEN": "bench-upstream"})
    token = GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"]
    body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=3)]}).encode()
    rows, paired_rows = [], []
    try:
        direct_headers = {**model.auth, "Content-Type": "application/json"}
        gateway_headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        for c in args.concurrency:
            first = run_load(model.url + "/mobilenetv2/predict", body, direct_headers, concurrency=c,
                             seconds=args.seconds, tool=args.tool)
            through, cpu_ms = measured(gateway, gateway.url + "/v1/models/MOBILENETV2/infer", body, gateway_headers,
                                       c, args.seconds, args.tool)
            second = run_load(model.url + "/mobilenetv2/predict", body, direct_headers, concurrency=c,
                              seconds=args.seconds, tool=args.tool)
            rows.append((c, first, through, second, cpu_ms))
            paired_rows.append((c, *side_by_side(gateway, gateway.url + "/v1/models/MOBILENETV2/infer",
                                                 model.url + "/mobilenetv2/predict", body, gateway_headers,
                                                 direct_headers, c, args.seconds, args.tool)))
        small = b'{"images":["aGk="]}'
        trivial_rows = []
        for c in args.concurrency:
            direct = run_load(f"http://127.0.0.1:{trivial_port}/trivial/predict", small, gateway_headers,
                              concurrency=c, seconds=args.seconds, tool=args.tool)
            through, cpu_ms = measured(gateway, gateway.url + "/v1/models/TRIVIAL/infer", small, gateway_headers,
                                       c, args.seconds, args.tool)
            floor, floor_cpu = measured(minimal, f"http://127.0.0.1:{minimal_port}/", small, gateway_headers,
                                        c, args.seconds, args.tool)
            trivial_rows.append((c, direct, through, cpu_ms, floor, floor_cpu))
    finally:
        gateway.stop()
        model.stop()
        for proc in (minimal, upstream):
            proc.terminate()
            proc.wait(10)

    print("MOBILENETV2 (max_batch_size 8, one 224x224 JPEG per request): straight vs through the gateway")
    print(f"  {'clients':>7} {'tool':>5} {'direct p50':>10} {'gw p50':>8} {'added p50':>9} {'direct p99':>10} "
          f"{'gw p99':>8} {'added p99':>9} {'direct/s':>8} {'gw/s':>7} {'gw CPU/req':>10} {'errors':>6}")
    for c, first, through, second, cpu_ms in rows:
        p50 = (first.p50 + second.p50) / 2
        p99 = (first.p99 + second.p99) / 2
        rate = (first.rate + second.rate) / 2
        print(f"  {c:7d} {through.tool:>5} {p50:10.2f} {through.p50:8.2f} {through.p50 - p50:9.2f} {p99:10.2f} "
              f"{through.p99:8.2f} {through.p99 - p99:9.2f} {rate:8.1f} {through.rate:7.1f} {cpu_ms:8.3f}ms "
              f"{through.errors + first.errors + second.errors:6d}")
    print("\nMOBILENETV2 side by side: N clients through the gateway and N straight to the model, at the same time")
    print(f"  {'clients':>7} {'direct p50':>10} {'gw p50':>8} {'added p50':>9} {'direct p99':>10} {'gw p99':>8} "
          f"{'added p99':>9} {'direct/s':>8} {'gw/s':>7} {'gw CPU/req':>10} {'errors':>6}")
    for c, direct, through, cpu_ms in paired_rows:
        print(f"  {c:7d} {direct.p50:10.2f} {through.p50:8.2f} {through.p50 - direct.p50:9.2f} {direct.p99:10.2f} "
              f"{through.p99:8.2f} {through.p99 - direct.p99:9.2f} {direct.rate:8.1f} {through.rate:7.1f} "
              f"{cpu_ms:8.3f}ms {through.errors + direct.errors:6d}")
    print("\nA trivial upstream (tiny JSON body, answered at once): straight vs through the gateway")
    print(f"  {'clients':>7} {'direct p50':>10} {'gw p50':>8} {'added p50':>9} {'direct p99':>10} {'gw p99':>8} "
          f"{'gw req/s':>8} {'gw CPU/req':>10} {'errors':>6} | {'minimal proxy: p50':>18} {'req/s':>6} {'CPU/req':>8}")
    for c, direct, through, cpu_ms, floor, floor_cpu in trivial_rows:
        print(f"  {c:7d} {direct.p50:10.2f} {through.p50:8.2f} {through.p50 - direct.p50:9.2f} {direct.p99:10.2f} "
              f"{through.p99:8.2f} {through.rate:8.0f} {cpu_ms:8.3f}ms {through.errors:6d} | {floor.p50:18.2f} "
              f"{floor.rate:6.0f} {floor_cpu:6.3f}ms")
    print("  (at 32 clients the proxies are saturated: their req/s is their maximum rate on one core; the minimal")
    print("   proxy, bench/minimal_proxy.py, is the floor: Agent + pool + twisted.web, no features, no access log)")
    print("\n(direct figures: mean of the runs before and after the gateway run; all processes share 2 cores)")


if __name__ == "__main__":
    main()
