"""A small blocking HTTP client for tests (the services under test are real)."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    reason: str = ""  # the status line's reason phrase

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


def request(
    method: str,
    url: str,
    body: bytes | str | dict | list | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Reply:
    """One request on a fresh connection; ``dict``/``list`` bodies are sent as JSON."""
    assert url.startswith("http://")
    hostport, _, path = url[len("http://"):].partition("/")
    host, _, port = hostport.partition(":")
    headers = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        headers.setdefault("Content-Type", "application/json")
    if isinstance(body, str):
        body = body.encode("utf-8")
    conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout)
    try:
        conn.request(method, "/" + path, body=body, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, resp.headers, resp.read(), resp.reason)
    finally:
        conn.close()


def get(url: str, **kw: Any) -> Reply:
    return request("GET", url, **kw)


def post(url: str, body: Any = None, **kw: Any) -> Reply:
    return request("POST", url, body, **kw)


def raw_exchange(port: int, data: bytes, timeout: float = 30.0) -> bytes:
    """Send ``data`` as is on a fresh loopback connection; everything the server sends until it closes.

    For what http.client hides or refuses to send: the status line's bytes, an oversized head.
    """
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading everything: read its answer
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received
