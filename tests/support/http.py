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
        return Reply(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def get(url: str, **kw: Any) -> Reply:
    return request("GET", url, **kw)


def post(url: str, body: Any = None, **kw: Any) -> Reply:
    return request("POST", url, body, **kw)
