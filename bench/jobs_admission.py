"""Admission latency of asynchronous jobs while the queue is half full.

A real MOBILENETV2 server with jobs on (async_max_queue 8) is kept busy by
four heavy jobs (16 images each, resubmitted as they finish); a second
client submits single-image jobs one after the other, timing each 202 on the
client side, and waits for each to finish before the next.  Prints p50/p99
of the 202.  Goal (async-jobs issue): p99 under 10 ms on the 2-core machine.

    python -m bench.jobs_admission [--jobs 300] [--decode-in-worker]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.shipped import shipped_config
from tests.support.images import image_b64
from tests.support.processes import start_model_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300, help="measured submissions")
    parser.add_argument("--heavy", type=int, default=4, help="background jobs kept in the queue")
    parser.add_argument("--decode-in-worker", action="store_true", help="backend.decode_in_worker = true")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    server = start_model_server(shipped_config(tmp, "MOBILENETV2", async_enabled=True, async_max_queue=8,
                                             max_batch_size=8,
                                             backend={"decode_in_worker": args.decode_in_worker}))
    image = image_b64(width=224, height=224, fmt="JPEG", seed=5)
    heavy_body = json.dumps({"images": [image] * 16}).encode()
    light_body = json.dumps({"images": [image]}).encode()
    headers = {**server.auth, "Content-Type": "application/json"}
    stop = threading.Event()
    depth_seen: list[int] = []

    def call(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())

    def call_text(server, path: str) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", path, headers=server.auth)
        return conn.getresponse().read().decode()

    def keep_busy() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        while not stop.is_set():
            status, body = call(conn, "POST", "/jobs", heavy_body)
            if status == 202:
                call(conn, "GET", f"/jobs/{body['job_id']}/wait?timeout=60000")

    try:
        workers = [threading.Thread(target=keep_busy) for _ in range(args.heavy)]
        for w in workers:
            w.start()
        time.sleep(2.0)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        latencies, refused = [], 0
        for _ in range(args.jobs):
            started = time.perf_counter()
            status, body = call(conn, "POST", "/jobs", light_body)
            elapsed = (time.perf_counter() - started) * 1000.0
            if status != 202:
                refused += 1
                continue
            latencies.append(elapsed)
            state = call(conn, "GET", f"/jobs/{body['job_id']}")[1]
            depth_seen.append(state["state"] == "pending")
            call(conn, "GET", f"/jobs/{body['job_id']}/wait?timeout=60000")
        stop.set()
        for w in workers:
            w.join()
        metrics = call_text(server, "/metrics")
    finally:
        server.stop()

    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
    print(f"admission (202) latency over {len(latencies)} submits, {args.heavy} heavy jobs running/pending "
          f"(async_max_queue 8, decode_in_worker {args.decode_in_worker}):")
    print(f"  p50 {statistics.median(latencies):.2f} ms   p99 {p99:.2f} ms   max {latencies[-1]:.2f} ms   "
          f"refused {refused}")
    print(f"  measured jobs still pending right after their 202: {sum(depth_seen)}/{len(depth_seen)}")
    gc_lines = [line for line in metrics.splitlines() if line.startswith(("python_gc_collections_total",
                                                                           "service_gc_frozen_objects"))]
    print("  server garbage collector: " + ("; ".join(gc_lines) or "no gc metrics"))


if __name__ == "__main__":
    main()
