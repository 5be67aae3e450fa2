"""A model server stopped (SIGTERM) under load through the gateway: what the clients get.

A TESTFAULTS model server (batches of one) behind a real gateway; ``--clients``
threads send inference requests as fast as they are answered, each on its
own kept-alive connection to the gateway; after a second the model server
gets SIGTERM (what the supervisor's stop and restart send), and the clients
go on for half a second after it exited.  Per round: the count of each
status.  The contract's answer to a stopping server is 503 status 65 (no
request is lost in silence); 502 is a transport failure, which an orderly
stop should not produce.

    python -m bench.stop_under_load [--rounds 8] [--clients 8]
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import tempfile
import threading
import time
from pathlib import Path

from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.images import image_b64
from tests.support.processes import free_port, start_model_server, write_config


def one_round(clients: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-stop-"))
    servers = tmp / "server"
    servers.mkdir()
    port = free_port()
    config = write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=port, max_batch_size=1)
    model = start_model_server(config, token="t", port=port)
    gateway = start_gateway(tmp, servers, None, env={"SERVICE_UPSTREAM_TOKEN": "t"})
    body = json.dumps({"images": [image_b64()]}).encode()
    headers = {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}",
               "Content-Type": "application/json"}
    stop, lock, counts = threading.Event(), threading.Lock(), {}

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
        while not stop.is_set():
            try:
                connection.request("POST", "/v1/models/TESTFAULTS/infer", body, headers)
                reply = connection.getresponse()
                data = reply.read()
                outcome: object = reply.status
                if reply.status == 502:  # which transport failure: the gateway's words
                    outcome = "502 " + json.loads(data)["error"].split(": ", 1)[-1][:80]
            except (OSError, http.client.HTTPException) as e:
                outcome = type(e).__name__
                connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
            with lock:
                counts[outcome] = counts.get(outcome, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        model.popen.send_signal(signal.SIGTERM)
        model.popen.wait(30)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        gateway.stop()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    total: dict = {}
    for round_ in range(1, args.rounds + 1):
        counts = one_round(args.clients)
        print(f"  round {round_}: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=str)), flush=True)
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    print(f"  all rounds ({args.rounds} stops): " + ", ".join(f"{k}: {v}" for k, v in sorted(total.items(), key=str)))


if __name__ == "__main__":
    main()
