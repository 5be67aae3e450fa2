"""A trivial stand-in for MOBILENETV2 in bench/oip.py: a fixed top-5 reply, and its ``/openapi.json``.

Like bench/trivial_upstream.py (asyncio, keep-alive, much cheaper than the
gateway), so that the gateway saturates and its CPU per request is its own:
every POST gets one successful item of MOBILENETV2's shape, a GET the
part of MOBILENETV2's document the gateway reads for the Open Inference
Protocol (its data schema).  Prints its port as one JSON line.

    python -m bench.oip_upstream [--port 0]
"""

from __future__ import annotations

import json

from bench import trivial_upstream
from svc.model.api import find_factory


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
    def reply_for(self, head: bytes) -> bytes:
        return DOCUMENT if head.startswith(b"get ") else INFER


def main() -> None:
    trivial_upstream.main(Upstream, __doc__)


if __name__ == "__main__":
    main()
