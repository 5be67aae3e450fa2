"""A trivial stand-in for MOBILENETV2 in bench/oip.py: a fixed top-5 reply, and its ``/openapi.json``.

Like bench/trivial_upstream.py (asyncio, keep-alive, much cheaper than the
gateway), so that the gateway saturates and its CPU per request is its own:
a POST to the contract's route gets one successful item of MOBILENETV2's
shape, a POST under ``/v2`` the model server's Open Inference Protocol
reply of the same top 5 (binary ``class_count`` strings, as
svc/modelserver/oip_route.py writes it), a GET the part of MOBILENETV2's
document the gateway reads for the protocol's metadata (its data schema).
Prints its port as one JSON line.

    python -m bench.oip_upstream [--port 0]
"""

from __future__ import annotations

import json

from bench import trivial_upstream
from svc.model.api import find_factory


def reply(body: bytes, content_type: bytes = b"application/json; charset=utf-8", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\n" + extra + b"Content-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


DATA = {"class_id": 281, "category": "tabby", "scores": [0.5, 0.2, 0.1, 0.05, 0.01],
        "class_ids": [281, 282, 285, 287, 728], "categories": ["tabby", "tiger cat", "Egyptian cat", "lynx", "bag"]}
INFER = reply(json.dumps({"status": 0, "status_str": "SUCCESS", "task_id": "t",
                          "model": {"name": "MOBILENETV2", "version": "0"}, "results": [{"status": 0, "data": DATA}],
                          "server_time_ms": 0.0, "partial": False}, separators=(",", ":")).encode(),
              extra=b"X-Request-ID: t\r\nCache-Control: no-store\r\n")  # what a model server sends on both routes

def _oip() -> bytes:
    from svc.web.oip.codec import BINARY_CONTENT_TYPE
    from svc.web.oip.encode import Output, encode_reply

    texts = [f"{s:f}:{c}:{label}" for s, c, label in zip(DATA["scores"], DATA["class_ids"], DATA["categories"])]
    body, length = encode_reply({"model_name": "MOBILENETV2", "model_version": "0"},
                                [(Output("PROBABILITIES", "BYTES", [1, 5], texts), True)])
    headers = b"Inference-Header-Content-Length: " + str(length).encode() + b"\r\nX-Request-ID: t\r\n" \
        b"Cache-Control: no-store\r\n"
    return reply(body, BINARY_CONTENT_TYPE, headers)


OIP_INFER = _oip()
DOCUMENT = reply(json.dumps({"components": {"schemas": {
    "MOBILENETV2_Data": find_factory("MOBILENETV2").data_schema}}}).encode())


class Upstream(trivial_upstream.Upstream):
    def reply_for(self, head: bytes) -> bytes:
        if head.startswith(b"get "):
            return DOCUMENT
        return OIP_INFER if head.startswith(b"post /v2/") else INFER


def main() -> None:
    trivial_upstream.main(Upstream, __doc__)


if __name__ == "__main__":
    main()
