"""Scale-out costs: what HAProxy, the gateways and Redis add per request, and how exact a key's limit is across gateways.

Everything on this machine's loopback (no namespaces, no root needed but for
HAProxy's ``user haproxy``, which is dropped when not root): Debian's
redis-server and haproxy (``bin/ensure-scaleout``), three real gateways
with ``rate_limit_store`` on that Redis, a fourth with local buckets, HAProxy
from deploy/haproxy.cfg in front of the three, and behind them the trivial
upstream of bench/trivial_upstream.py (so the proxies, not the model, are
what costs) and a real MOBILENETV2 model server (max_batch_size 8).

1. Overhead.  The same closed-loop load (wrk, else Python clients; tiny JSON
   to the trivial upstream) straight to the upstream, through one gateway
   with local buckets, through one gateway with Redis buckets, and through
   HAProxy and the three Redis gateways.  The key is limited to 10^6
   requests/s, so every request runs its bucket (in Redis: one EVALSHA) and
   none is refused.  Printed: p50/p99, added p50 over the direct run,
   requests/s, and CPU per request of the gateways (summed), HAProxy and
   Redis (user + system from /proc over the run, divided by the requests).
   Then MOBILENETV2 (one 224x224 JPEG per request) straight and through
   HAProxy + gateways: img/s, p50/p99, and the model server's CPU per image.
2. Accuracy.  Keys limited to 3, 100 and 1000 requests/s, each under a load
   far above its rate through HAProxy (spread over the three gateways) for
   ``--seconds``: admitted requests (the gateways' counters) against the
   rate x seconds + burst that one bucket allows; then the same with Redis
   stopped (each gateway falls back to its own bucket: about 3 times), and
   Redis started again.

    python -m bench.cluster [--seconds 8] [--concurrency 1 32] [--tool wrk|python] [--parts overhead model accuracy]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gateway import cpu_seconds
from bench.loadgen import run_load, run_python, run_wrk
from bench.shipped import shipped_config
from svc import auth
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.haproxy import HAProxy
from tests.support.http import get
from tests.support.images import image_b64
from tests.support.processes import REPO, child_env, free_port, start_model_server, write_config
from tests.support.redis import RedisServer

LIMITED = (3, 100, 1000)
TINY = b'{"images":["aGk="]}'


def key_file() -> tuple[str, dict[str, str]]:
    """The key file every gateway reads, and the plaintext key of each name."""
    keys = {"fast": "a" * 64, **{f"k{q}": f"{q:x}".rjust(64, "b") for q in LIMITED}}
    rates = {"fast": 1_000_000, **{f"k{q}": q for q in LIMITED}}
    return "".join(auth.key_entry(n, auth.hash_key(k), qps=rates[n]) for n, k in keys.items()), keys


def gateway_metric(proc, sample: str) -> float:
    text = get(proc.url + "/metrics", headers={"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_METRICS_TOKEN']}"},
               timeout=10).body.decode()
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def admitted(gateways, name: str) -> float:
    return sum(gateway_metric(g, f'service_gateway_key_requests_total{{key="{name}"}}') for g in gateways)


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {timeout} s: {what}")
        time.sleep(0.1)


def costed(pids: dict[str, list[int]], url: str, body: bytes, headers: dict, concurrency: int, seconds: float,
           tool: str):
    """The load result and the CPU ms per request of each group of processes over it."""
    before = {name: sum(cpu_seconds(p) for p in group) for name, group in pids.items()}
    result = run_load(url, body, headers, concurrency=concurrency, seconds=seconds, tool=tool)
    requests = max(1, result.requests + result.errors)
    return result, {name: (sum(cpu_seconds(p) for p in group) - before[name]) * 1000.0 / requests
                    for name, group in pids.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tool", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--parts", nargs="+", choices=("overhead", "model", "accuracy"),
                        default=["overhead", "model", "accuracy"], help="what to measure (default: all)")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    servers = tmp / "server"
    servers.mkdir()
    started: list = []
    try:
        upstream = subprocess.Popen([sys.executable, "-m", "bench.trivial_upstream"], cwd=REPO, env=child_env(),
                                    stdout=subprocess.PIPE, text=True)
        started.append(upstream)
        trivial_port = json.loads(upstream.stdout.readline())["port"]
        write_config(servers, "TESTFAULTS", name="TRIVIAL.toml", id="TRIVIAL", port=trivial_port,
                     server_uri="/trivial/predict")
        model = None
        if "model" in args.parts:
            model_port = free_port()
            config = shipped_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=model_port,
                                  max_batch_size=8, max_queue_depth=0)
            model = start_model_server(config, token="bench-upstream", port=model_port)
            started.append(model)
        redis = RedisServer("127.0.0.1", free_port()).start()
        started.append(redis)
        keys_text, keys = key_file()
        env = {"SERVICE_UPSTREAM_TOKEN": "bench-upstream"}
        shared = f'rate_limit_store = "{redis.url}"\n'
        gateways = []
        for i in range(3):
            root = tmp / f"gw{i}"
            root.mkdir()
            gateways.append(start_gateway(root, servers, keys_text, env=env, gateway_table=shared))
        started.extend(gateways)
        (tmp / "local").mkdir()
        local = start_gateway(tmp / "local", servers, keys_text, env=env)
        started.append(local)
        balancer_port = free_port()
        balancer = HAProxy(tmp, f"127.0.0.1:{balancer_port}",
                           {f"g{i}": f"127.0.0.1:{g.port}" for i, g in enumerate(gateways)}, []).start()
        started.append(balancer)
        wait_for(lambda: set(balancer.servers_state().values()) == {"UP"}, "HAProxy sees the gateways UP")
        lb = f"http://127.0.0.1:{balancer_port}"
        fast = {"Authorization": f"Bearer {keys['fast']}", "Content-Type": "application/json"}
        pids = {"gateways": [g.popen.pid for g in gateways], "haproxy": [balancer.popen.pid],
                "redis": [redis.popen.pid]}

        overhead = []
        for c in args.concurrency if "overhead" in args.parts else ():
            direct = run_load(f"http://127.0.0.1:{trivial_port}/trivial/predict", TINY, fast, concurrency=c,
                              seconds=args.seconds, tool=args.tool)
            overhead.append(("direct", c, direct, {}))
            for label, url, group in (
                ("gateway, local buckets", local.url, {"gateways": [local.popen.pid]}),
                ("gateway, Redis buckets", gateways[0].url, {"gateways": [gateways[0].popen.pid],
                                                             "redis": pids["redis"]}),
                ("HAProxy + 3 gateways, Redis", lb, pids),
            ):
                result, cpu = costed(group, url + "/v1/models/TRIVIAL/infer", TINY, fast, c, args.seconds, args.tool)
                overhead.append((label, c, result, cpu))

        model_rows = []
        if model is not None:
            body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=3)]}).encode()
            for c in args.concurrency:
                direct, direct_cpu = costed({"model": [model.popen.pid]}, model.url + "/mobilenetv2/predict", body,
                                            {**model.auth, "Content-Type": "application/json"}, c, args.seconds,
                                            args.tool)
                through, cpu = costed({**pids, "model": [model.popen.pid]}, lb + "/v1/models/MOBILENETV2/infer",
                                      body, fast, c, args.seconds, args.tool)
                model_rows.append((c, direct, direct_cpu, through, cpu))

        accuracy = []
        for phase in ("Redis", "Redis stopped", "Redis back") if "accuracy" in args.parts else ():
            if phase == "Redis stopped":
                redis.stop()
                wait_for(lambda: all(gateway_metric(g, "service_gateway_ratelimit_store_up") == 0 for g in gateways),
                         "the gateways noticed Redis is gone")
            if phase == "Redis back":
                redis.start()
                wait_for(lambda: all(gateway_metric(g, "service_gateway_ratelimit_store_up") == 1 for g in gateways),
                         "the gateways back on Redis")
            for qps in LIMITED:
                name = f"k{qps}"
                headers = {"Authorization": f"Bearer {keys[name]}", "Content-Type": "application/json"}
                time.sleep(2.0)  # every bucket full again (a bucket refills in 1 s): the burst counts once
                before = admitted(gateways, name)
                started_at = time.monotonic()
                load = run_wrk if args.tool == "wrk" or (args.tool == "auto" and shutil.which("wrk")) else run_python
                result = load(lb + "/v1/models/TRIVIAL/infer", TINY, headers, concurrency=16, seconds=args.seconds)
                span = time.monotonic() - started_at
                got = admitted(gateways, name) - before
                accuracy.append((phase, qps, span, result.requests + result.errors, got))
    finally:
        for thing in reversed(started):
            if isinstance(thing, subprocess.Popen):
                thing.terminate()
                thing.wait(10)
            else:
                thing.stop()

    if overhead:
        print_overhead(overhead)
    if model_rows:
        print_model(model_rows)
    if accuracy:
        print_accuracy(accuracy)
    print("\n(all processes, the load generator included, share this machine's cores: figures are noisy)")


def print_overhead(overhead: list) -> None:
    print("Overhead, tiny JSON to a trivial upstream (the key limited to 10^6/s: every request runs its bucket)")
    print(f"  {'path':<30} {'clients':>7} {'p50 ms':>7} {'p99 ms':>7} {'added p50':>9} {'added p99':>9} {'req/s':>7} "
          f"{'gateways CPU/req':>16} {'HAProxy CPU/req':>15} {'Redis CPU/req':>13} {'errors':>6}")
    base = {c: r for label, c, r, _ in overhead if label == "direct"}
    for label, c, r, cpu in overhead:
        def ms(name: str, cpu: dict = cpu) -> str:
            return f"{cpu[name]:.3f} ms" if name in cpu else "-"

        print(f"  {label:<30} {c:7d} {r.p50:7.2f} {r.p99:7.2f} {r.p50 - base[c].p50:9.2f} {r.p99 - base[c].p99:9.2f} "
              f"{r.rate:7.0f} "
              f"{ms('gateways'):>16} {ms('haproxy'):>15} {ms('redis'):>13} {r.errors:6d}")


def print_model(model_rows: list) -> None:
    print("\nMOBILENETV2 (max_batch_size 8, one 224x224 JPEG per request): straight vs HAProxy + gateways")
    print(f"  {'clients':>7} {'direct p50':>10} {'p99':>7} {'img/s':>6} {'model CPU/img':>13} | {'through p50':>11} "
          f"{'p99':>7} {'img/s':>6} {'model CPU/img':>13} {'gateways':>9} {'HAProxy':>8} {'Redis':>7} {'errors':>6}")
    for c, direct, direct_cpu, through, cpu in model_rows:
        print(f"  {c:7d} {direct.p50:10.2f} {direct.p99:7.2f} {direct.rate:6.1f} {direct_cpu['model']:10.1f} ms | "
              f"{through.p50:11.2f} {through.p99:7.2f} {through.rate:6.1f} {cpu['model']:10.1f} ms "
              f"{cpu['gateways']:6.2f} ms {cpu['haproxy']:5.2f} ms {cpu['redis']:4.2f} ms "
              f"{direct.errors + through.errors:6d}")


def print_accuracy(accuracy: list) -> None:
    print("\nRate-limit accuracy through HAProxy over 3 gateways (16 clients far above the rate)")
    print(f"  {'store':<14} {'limit/s':>7} {'seconds':>7} {'sent':>7} {'admitted':>8} {'one bucket allows':>17} "
          f"{'admitted/allowed':>16}")
    for phase, qps, span, sent, got in accuracy:
        allowed = qps * span + max(1, qps)
        print(f"  {phase:<14} {qps:7d} {span:7.2f} {sent:7d} {got:8.0f} {allowed:17.0f} {got / allowed:16.3f}")


if __name__ == "__main__":
    main()
