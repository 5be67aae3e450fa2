"""The listener's own refusals in a real model server's metrics and access log: the bare 408 of a head that did
not arrive within ``header_timeout_ms`` and the 503 of a connection past ``max_connections``.

docs/operations.md: ``service_http_requests_total`` has every reply (method ``-`` for a request refused before
its method was read), and the access log one line per request with its duration.  Both refusals were seen by no
counter (a slowloris or a connection flood was invisible to Prometheus), and the 408's line said 0.0 ms after
waiting ``header_timeout_ms``.
"""

from __future__ import annotations

import re
import socket
import time

import pytest

from tests.support.http import get
from tests.support.processes import start_model_server, wait_until, write_config

HEADER_TIMEOUT_MS = 1500
MAX_CONNECTIONS = 3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("refusals")
    proc = start_model_server(write_config(root, "TESTFAULTS", name="TESTFAULTS.toml",
                                           header_timeout_ms=HEADER_TIMEOUT_MS, max_connections=MAX_CONNECTIONS))
    yield proc
    proc.stop()


def requests_total(model, code: int, method: str) -> float:
    """The counter's sample, read once a scrape gets through (a slot a closed connection held may still be taken
    when the scrape connects: it then gets the 503 itself)."""
    sample = f'service_http_requests_total{{code="{code}",method="{method}",route="unmatched"}}'

    def scrape() -> str | None:
        reply = get(model.url + "/metrics", headers=model.auth, timeout=10)
        return reply.body.decode() if reply.status == 200 else None

    found = re.search(rf"^{re.escape(sample)} (\S+)$", wait_until(scrape, f"a scrape of {model.url}/metrics"), re.M)
    return float(found.group(1)) if found else 0.0


def hold(port: int) -> socket.socket:
    """A keep-alive connection the server has accepted (and counted): its first request was answered."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")
    return sock


def test_a_head_past_header_timeout_ms_is_counted_and_logged_with_its_time(model):
    before = requests_total(model, 408, "GET")
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", model.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the head's blank line never comes
        reply = sock.recv(65536)
    waited_ms = (time.monotonic() - started) * 1000
    assert re.fullmatch(rb"HTTP/1\.1 408 Request Timeout\r\nDate: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} [0-9:]{8} GMT"
                        rb"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", reply), reply
    assert requests_total(model, 408, "GET") == before + 1
    lines = wait_until(lambda: [x for x in model.output().splitlines() if "GET /healthz 408 " in x], "the 408's line")
    took = float(re.search(r"GET /healthz 408 ([0-9.]+)ms key=- rid=-$", lines[-1]).group(1))
    assert HEADER_TIMEOUT_MS <= took <= waited_ms, (took, waited_ms)


def test_a_connection_past_max_connections_gets_a_503_that_is_counted(model):
    before = requests_total(model, 503, "-")
    held = [hold(model.port) for _ in range(MAX_CONNECTIONS)]
    for sock in held:  # each in the middle of its next request: none idle, none closed for the new one
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
    try:
        with socket.create_connection(("127.0.0.1", model.port), timeout=30) as extra:
            reply = extra.recv(65536)
    finally:
        for sock in held:
            sock.close()
    assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), reply[:200]
    assert b'"status":65' in reply.replace(b" ", b""), reply
    assert requests_total(model, 503, "-") == before + 1
