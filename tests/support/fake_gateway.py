"""A stand-in gateway for client tests: a real HTTP server on a free loopback port.

It records every request (method, path with query, headers, body) and answers
the canned reply set by the test: a status, a JSON body and extra headers, or a
stall before the headers or in the middle of the body (to test deadlines).
``script`` holds replies answered first, one per request in order (a
conversation such as submit, wait, wait, result); ``reply`` answers the rest.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it; header names are lowercase."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    """What the server answers; ``stall`` is None, "headers" or "body"."""

    status: int = 200
    body: Any = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    stall: str | None = None


class FakeGateway:
    """``with FakeGateway() as gw:`` serves on ``gw.url`` until the block ends."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.reply = Reply()
        self.script: list[Reply] = []
        self.release = threading.Event()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                gateway.requests.append(Recorded(self.command, self.path,
                                                 {k.lower(): v for k, v in self.headers.items()}, body))
                reply = gateway.script.pop(0) if gateway.script else gateway.reply
                if reply.stall == "headers":
                    gateway.release.wait(10)
                    return
                data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if reply.stall == "body":
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    gateway.release.wait(10)
                    return
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeGateway:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
