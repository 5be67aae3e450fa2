"""A trivial stand-in for MOBILENETV2 in bench/oip.py: a fixed top-5 reply, and its ``/openapi.json``.

Like bench/trivial_upstream.py (asyncio, keep-alive, much cheaper than the
gateway), so that the gateway saturates and its CPU per request is its own:
every POST gets one successful item of MOBILENETV2's shape, a GET the
part of MOBILENETV2's document the gateway reads for the Open Inference
Protocol (its data schema).  Prints its port as one JSON line.

    python -m bench.oip_upstream [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json

from bench import trivial_upstream
from svc.modelapi import find_factory


def reply(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


DATA = {"class_id": 281, "category": "tabby", "scores": [0.5, 0.2, 0.1, 0.05, 0.01],
        "class_ids": [281, 282, 285, 287, 728], "categories": ["tabby", "tiger cat", "Egyptian cat", "lynx", "bag"]}
INFER = reply(json.dumps({"status": 0, "status_str": "SUCCESS", "task_id": "t",
                          "model": {"name": "MOBILENETV2", "version": "0"}, "results": [{"status": 0, "data": DATA}],
                          "server_time_ms": 0.0, "partial": False}, separators=(",", ":")).encode())
DOCUMENT = reply(json.dumps({"components": {"schemas": {
    "MOBILENETV2_Data": find_factory("MOBILENETV2").data_schema}}}).encode())


class Upstream(trivial_upstream.Upstream):
    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            marker = head.find(b"content-length:")
            if marker >= 0:
                length = int(head[marker + 15:].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            self.transport.write(DOCUMENT if head.startswith(b"get ") else INFER)


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", port)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
