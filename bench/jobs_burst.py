"""Admission under a burst: 100 asynchronous job submits at once, through the gateway and straight to the model server.

A MOBILENETV2 model server from the shipped config, jobs on
(``async_max_queue`` at least the burst, so that every submit may be
admitted), behind a real gateway.  Each round fires ``--burst`` submits of
one 224x224 JPEG at the same instant, each on a connection of its own
(asyncio, one process: the client adds little per request), first through
the gateway (``POST /v1/models/MOBILENETV2/jobs``), then straight to the
model server (``POST /jobs``), and times each reply from the first byte
sent to the last byte read; after each burst it waits for every job to
finish.  Prints the status counts, the 202's p50/p99/max per path and
round, and the CPU per submit of the model server's reactor thread (and the
time it was runnable but waiting for a core: ``waited``, from its
``schedstat``) and of the gateway process over the burst
(``bench/threadcpu.py``; the connections' accepts included, the jobs' own
work on the worker threads not).  Goal (issue 27, item 20): p99 at most 50 ms with 100 concurrent
submits on 2 idle cores.

``--tree NAME=PATH`` adds a model server running another checkout's code
(tests.support.processes.checkout), fired at straight in the same rounds:
an A/B of two versions under the same load.  ``--stand-in`` puts a trivial
stand-in (bench/jobs_upstream.py: a fixed 202 at once) in the model
server's place and fires through the gateway only: the gateway's own share.
``--gateway-setting`` adds a line to the gateway's ``[gateway]`` table
(``upstream_max_connections=128``).

    python -m bench.jobs_burst [--burst 100] [--rounds 3] [--no-gateway] [--tree NAME=PATH ...] [--stand-in]
                             [--gateway-setting KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.shipped import shipped_config
from bench.threadcpu import ThreadCpu, process_cpu_ms
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.images import image_b64
from tests.support.processes import REPO, checkout, child_env, free_port, start_model_server, write_config

UPSTREAM_TOKEN = "bench-upstream"


async def submit(port: int, path: str, head: bytes, body: bytes, start: asyncio.Event) -> tuple[int, float, str]:
    """One submit on a connection of its own, sent when ``start`` fires: (status, ms, job id)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await start.wait()
    started = time.perf_counter()
    writer.write(head + body)
    await writer.drain()
    data = await reader.read()  # Connection: close
    elapsed = (time.perf_counter() - started) * 1000.0
    writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    status = int(status_line.split()[1]) if status_line else 0
    job = ""
    if status == 202:
        job = json.loads(rest.partition(b"\r\n\r\n")[2]).get("job_id", "")
    return status, elapsed, job


async def burst(port: int, path: str, auth: str, body: bytes, n: int) -> list[tuple[int, float, str]]:
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {auth}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    start = asyncio.Event()
    tasks = [asyncio.ensure_future(submit(port, path, head, body, start)) for _ in range(n)]
    await asyncio.sleep(0.5)  # every connection open and waiting
    start.set()
    return await asyncio.gather(*tasks)


def wait_done(port: int, auth: str, prefix: str, jobs: list[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    for job in jobs:
        conn.request("GET", f"{prefix}/{job}/wait?timeout=120000", headers={"Authorization": auth})
        conn.getresponse().read()
    conn.close()


class StandIn:
    """bench/jobs_upstream.py as a started server: its ``popen`` and ``port``, and ``stop``."""

    def __init__(self) -> None:
        self.popen = subprocess.Popen([sys.executable, "-m", "bench.jobs_upstream"], cwd=REPO, env=child_env(),
                                      stdout=subprocess.PIPE, text=True)
        self.port = json.loads(self.popen.stdout.readline())["port"]

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)


def stand_in(servers: Path) -> StandIn:
    """The stand-in, and a config that names it as MOBILENETV2 for the gateway."""
    server = StandIn()
    write_config(servers, "TESTFAULTS", name="MOBILENETV2.toml", id="MOBILENETV2", port=server.port)
    return server


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-gateway", dest="gateway", action="store_false")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="also a model server from the checkout at PATH, named NAME in the table")
    parser.add_argument("--stand-in", action="store_true",
                        help="a trivial stand-in for the model server (bench/jobs_upstream.py), through the gateway")
    parser.add_argument("--gateway-setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a line of the gateway's [gateway] table, e.g. upstream_max_connections=128")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-burst-"))
    servers = tmp / "server"
    servers.mkdir()
    if args.stand_in:
        model = stand_in(servers)
    else:
        port = free_port()
        config = shipped_config(servers, "MOBILENETV2", name="MOBILENETV2.toml", port=port, async_enabled=True,
                                async_max_queue=max(128, args.burst), max_queue_depth=0)
        model = start_model_server(config, token=UPSTREAM_TOKEN, port=port, ready_timeout=300)
    tree_servers = []
    for spec in args.tree:
        name, _, path = spec.partition("=")
        tree = Path(path).resolve()
        folder = tmp / f"tree-{name}"
        folder.mkdir()
        other_port = free_port()
        other_config = shipped_config(folder, tree / "conf" / "server" / "MOBILENETV2.toml", name="MOBILENETV2.toml",
                                      port=other_port, async_enabled=True, async_max_queue=max(128, args.burst),
                                      max_queue_depth=0)
        tree_servers.append((name, start_model_server(other_config, token=UPSTREAM_TOKEN, port=other_port,
                                                ready_timeout=300, **checkout(tree))))
    gateway = start_gateway(tmp, servers, None, env={"SERVICE_UPSTREAM_TOKEN": UPSTREAM_TOKEN},
                            gateway_table="".join(f"{line}\n" for line in args.gateway_setting)) if args.gateway \
        else None
    body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=3)]}).encode()
    paths = [] if args.stand_in else [("model server", model, "/jobs", f"Bearer {UPSTREAM_TOKEN}", "/jobs")]
    paths += [(name[:13], other, "/jobs", f"Bearer {UPSTREAM_TOKEN}", "/jobs") for name, other in tree_servers]
    if gateway is not None:
        token = f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}"
        paths.insert(0, ("gateway", model, "/v1/models/MOBILENETV2/jobs", token, "/v1/models/MOBILENETV2/jobs"))
    print(f"{args.burst} job submits at once (one 224x224 JPEG each), MOBILENETV2 shipped config with "
          f"async_max_queue {max(128, args.burst)}; ms from the first byte sent to the reply's last byte")
    print(f"  {'round':>5} {'path':<13} {'202':>4} {'other':>5} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'model reactor CPU/submit':>24} {'waited/submit':>14} {'gateway CPU/submit':>18}")
    results: dict[str, list[float]] = {}
    try:
        for round_ in range(1, args.rounds + 1):
            # the order alternates by round, so that no server always fires first
            for name, server, path, auth, prefix in (paths if round_ % 2 else paths[::-1]):
                target = gateway.port if name == "gateway" else server.port
                cpu = ThreadCpu(server.popen.pid)
                gateway_before = process_cpu_ms(gateway.popen.pid) if gateway is not None else 0.0
                cpu.start()
                replies = asyncio.run(burst(target, path, auth, body, args.burst))
                cpu.stop()
                reactor_ms, reactor_wait_ms = (ms / args.burst for ms in cpu.main_thread_ms())
                gateway_ms = (process_cpu_ms(gateway.popen.pid) - gateway_before) / args.burst \
                    if gateway is not None and name == "gateway" else float("nan")
                admitted = [ms for status, ms, _ in replies if status == 202]
                others = sorted({status for status, _, _ in replies if status != 202})
                results.setdefault(name, []).extend(admitted)
                print(f"  {round_:5d} {name:<13} {len(admitted):4d} {len(replies) - len(admitted):5d} "
                      f"{statistics.median(admitted) if admitted else float('nan'):7.1f} "
                      f"{percentile(admitted, 0.99) if admitted else float('nan'):7.1f} "
                      f"{max(admitted, default=float('nan')):7.1f} {reactor_ms:21.2f} ms {reactor_wait_ms:11.2f} ms "
                      f"{gateway_ms:15.2f} ms"
                      + (f"  statuses {others}" if others else ""),
                      flush=True)
                if not args.stand_in:
                    wait_done(target, auth, prefix, [job for status, _, job in replies if status == 202])
    finally:
        if gateway is not None:
            gateway.stop()
        model.stop()
        for _, other in tree_servers:
            other.stop()
    for name, values in results.items():
        p99 = percentile(values, 0.99)
        print(f"  all rounds, {name}: 202 p50 {statistics.median(values):.1f} ms, p99 {p99:.1f} ms "
              f"(goal <= 50 ms: {'met' if p99 <= 50 else 'missed'})")


if __name__ == "__main__":
    main()
