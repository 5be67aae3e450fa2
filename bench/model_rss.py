"""A model server's RSS under large replies, and after it went idle.

A real MOBILENETV2 server from the shipped config (``optimize = "eager"``,
so that it starts in seconds; ``tune_malloc`` on, as shipped) gets
``--rounds`` rounds of ``--requests`` synchronous requests from 4 client
threads, each request 16 noise JPEGs with ``top_k`` 1000 (a reply of about
660 kB: the replies of different sizes are what fragment the tuned heap).
Prints the server's RSS after each round, then after ``--idle`` seconds
without requests (the model server gives its free heap back once idle:
svc/modelserver/memory.py).  ``--tree NAME=PATH`` runs the same on another
checkout's code, one after the other.

    python -m bench.model_rss [--rounds 6] [--requests 60] [--idle 12] [--tree NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from tests.support.http import post
from tests.support.images import image_b64
from tests.support.processes import REPO, checkout, start_model_server, write_config


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def client(url: str, body: bytes, headers: dict[str, str], left: list[int], lock: threading.Lock) -> None:
    """Send requests until ``left`` is used up, one at a time."""
    while True:
        with lock:
            if left[0] == 0:
                return
            left[0] -= 1
        reply = post(url, body, headers=headers, timeout=120)
        assert reply.status == 200, reply.status


def run(tree: Path, rounds: int, requests: int, idle: float) -> list[float]:
    """RSS in MB: after the warm-up, after each round, after the idle wait."""
    directory = Path(tempfile.mkdtemp(prefix="bench-rss-"))
    config = write_config(directory, "MOBILENETV2")
    server = start_model_server(config, **({} if tree == REPO else checkout(tree)))
    try:
        body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=i) for i in range(16)],
                           "params": {"top_k": 1000}}).encode()
        url = server.url + "/mobilenetv2/predict"
        headers = {**server.auth, "Content-Type": "application/json"}
        pid = server.popen.pid
        found = [rss_mb(pid)]
        for _ in range(rounds):
            left = [requests]
            lock = threading.Lock()
            threads = [threading.Thread(target=client, args=(url, body, headers, left, lock)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            found.append(rss_mb(pid))
        time.sleep(idle)
        found.append(rss_mb(pid))
        return found
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--idle", type=float, default=12.0, help="seconds without requests before the last RSS")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH")
    args = parser.parse_args()
    trees = [("this", REPO)] + [(spec.partition("=")[0], Path(spec.partition("=")[2]).resolve()) for spec in args.tree]
    print(f"MOBILENETV2 (eager, tune_malloc on), {args.requests} requests of 16 images with top_k 1000 per round, "
          "4 clients; RSS in MB: after warm-up, after each round, after the idle wait")
    for name, tree in trees:
        found = run(tree, args.rounds, args.requests, args.idle)
        print(f"  {name:<8} " + " ".join(f"{v:.0f}" for v in found[:-1]) + f"  | idle {args.idle:g} s: {found[-1]:.0f}",
              flush=True)


if __name__ == "__main__":
    main()
