"""Faults on GPU replicas under load: what clients get while a replica is killed, and while one hangs.

The run to do on a GPU machine (bench/README.md says what it showed):

    python -m bench.gpu_faults [cpu]

A real supervisor runs MOBILENETV2 as 2 replicas on GPU 0 (``devices = [0]``,
``channels_last+fp16+cuda_graphs``) behind its gateway; 32 clients (4 with
``cpu``, a dry run of the bench on a machine without a GPU) send one 224x224
JPEG each, over and over, for about 40 s.  Replica 0 is killed (SIGKILL) after
4 s; once it runs again, replica 1 is hung (SIGSTOP) for 4 s.  Printed: the
replies of each second by HTTP code and envelope status, when the respawned
replica was ready again, the GPU memory of each process before and after (the
killed one's released), the replicas' status, and the error lines of every log.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.images import image_b64
from tests.support.stack import build_stack, start_supervisor, stop_cleanly


def gpu_apps(device: str) -> dict[int, int]:
    """MiB of GPU memory by pid (nvidia-smi); {} off a GPU."""
    if device != "gpu":
        return {}
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return {int(p): int(m) for p, m in (line.split(", ") for line in out.strip().splitlines() if line)}


def main(device: str) -> None:
    clients = 32 if device == "gpu" else 4
    root = Path(tempfile.mkdtemp(prefix="gpu-faults-"))
    backend = {"optimize": "channels_last+fp16+cuda_graphs", "decode_threads": 8} if device == "gpu" else {}
    stack = build_stack(root, {"MOBILENETV2": {"max_batch_size": 64, "max_batch_delay_ms": 2, "max_queue_depth": 0,
                                               "backend": backend}},
                        replicas={"MOBILENETV2": 2}, server_extra={"MOBILENETV2": "devices = [0]\n"},
                        profile=device, start=False)
    (root / "profiles" / f"{device}.toml").write_text(f'device = "{device}"\nmodels = ["MOBILENETV2"]\n')
    t0 = time.monotonic()
    stack = start_supervisor(stack)
    events = []
    try:
        def replicas():
            return stack.child("MOBILENETV2")["replicas"]

        stack.wait_for("MOBILENETV2", lambda c: all(r["state"] == "running" and r["ready"] for r in c["replicas"]),
                       timeout=300)
        print(f"ready in {time.monotonic() - t0:.1f} s; GPU memory by pid (MiB):", gpu_apps(device), flush=True)
        pids = [r["pid"] for r in replicas()]
        print("replica pids", pids, flush=True)
        body = json.dumps({"images": [image_b64(width=224, height=224, fmt="JPEG", seed=3)]}).encode()
        gw = urlsplit(stack.gateway)
        headers = {"Authorization": f"Bearer {stack.key}", "Content-Type": "application/json"}
        results = []  # (t, status, envelope status)
        stop = threading.Event()
        start = time.monotonic()

        def client():
            conn = http.client.HTTPConnection(gw.hostname, gw.port, timeout=30)
            while not stop.is_set():
                try:
                    conn.request("POST", "/v1/models/MOBILENETV2/infer", body, headers)
                    reply = conn.getresponse()
                    data = reply.read()
                    status = json.loads(data).get("status") if data[:1] == b"{" else None
                    results.append((time.monotonic() - start, reply.status, status))
                    if reply.getheader("Connection", "").lower() == "close":
                        conn.close()
                        conn = http.client.HTTPConnection(gw.hostname, gw.port, timeout=30)
                except Exception as e:  # noqa: BLE001
                    results.append((time.monotonic() - start, type(e).__name__, None))
                    conn.close()
                    conn = http.client.HTTPConnection(gw.hostname, gw.port, timeout=30)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(4)
        killed_at = time.monotonic() - start
        os.kill(pids[0], signal.SIGKILL)
        events.append(f"{killed_at:.2f} s: SIGKILL replica 0 (pid {pids[0]})")
        respawned = None
        while time.monotonic() - start < 60:
            r0 = replicas()[0]
            if r0["pid"] not in (None, pids[0]) and r0["state"] == "running" and r0["ready"]:
                respawned = time.monotonic() - start
                events.append(f"{respawned:.2f} s: replica 0 running and ready again (pid {r0['pid']}, restarts "
                              f"{r0['restarts']}); {respawned - killed_at:.1f} s after the kill")
                break
            time.sleep(0.2)
        after_respawn = gpu_apps(device)
        time.sleep(3)
        hung_at = time.monotonic() - start
        os.kill(pids[1], signal.SIGSTOP)
        events.append(f"{hung_at:.2f} s: SIGSTOP replica 1 (pid {pids[1]})")
        time.sleep(4)
        os.kill(pids[1], signal.SIGCONT)
        events.append(f"{time.monotonic() - start:.2f} s: SIGCONT replica 1")
        time.sleep(4)
        stop.set()
        for t in threads:
            t.join(35)
        for line in events:
            print(line)
        print("GPU memory after the respawn (MiB):", after_respawn, "; the killed pid's entry gone:",
              pids[0] not in after_respawn)
        by_second = {}
        for t, code, status in results:
            by_second.setdefault(int(t), Counter())[(code, status)] += 1
        for second in sorted(by_second):
            print(f"  second {second:2d}:", dict(by_second[second]))
        total = Counter((code, status) for _, code, status in results)
        print("all:", dict(total), "requests", len(results))
        print("status of the replicas:", [{k: r.get(k) for k in ("index", "state", "ready", "restarts", "last_error")}
                                          for r in replicas()])
    finally:
        stop_cleanly(stack)
        print("stopped cleanly")
        for log in sorted((root / "logs").glob("*.log")):
            bad = [line for line in log.read_text().splitlines()
                   if "Traceback" in line or "#critical" in line or "#error" in line]
            print(log.name, len(bad), "error lines", bad[:3])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("device", nargs="?", default="gpu", choices=("gpu", "cpu"),
                        help="cpu: a dry run of the bench on a machine without a GPU")
    main(parser.parse_args().device)
