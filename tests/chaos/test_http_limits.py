"""Hostile clients against a real gateway: slowloris, a connection flood,
pipelining without reading, a burst of new connections.

The gateway routes to no model (an empty catalog): every promise here is about
its HTTP listener (svc.web.limits.LimitedChannel), which the model server and the
supervisor share.
"""

from __future__ import annotations

import errno
import json
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.gateway import start_gateway
from tests.support.http import get

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
#: The idle timeout of the gateway whose client never reads: that client is closed after it.
PIPELINE_IDLE_S = 1
#: "A burst of hundreds of new connections" (README "What survives what").
BURST = 400


@pytest.fixture
def gateway_with(tmp_path: Path):
    started = []

    def start(table: str):
        servers = tmp_path / "server"
        servers.mkdir(exist_ok=True)
        proc = start_gateway(tmp_path, servers, "# no keys: the static token only\n", gateway_table=table)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_until_closed(sock: socket.socket, deadline_s: float) -> bytes:
    """Everything the server sends until it closes, or what came within ``deadline_s``."""
    sock.settimeout(0.2)
    data = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def split_reply(data: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return lines[0], headers, body


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def test_slowloris_is_closed_after_the_header_deadline_while_others_are_served(gateway_with):
    """A connection that trickles header bytes is answered 408 and closed header_timeout_ms after its request
    began, although every byte resets twisted's idle timeout; normal requests keep working meanwhile."""
    gateway = gateway_with("header_timeout_ms = 1500\n")
    slow = connect(gateway.port)
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n")
    started = time.monotonic()
    closed_after = None
    data = b""
    slow.settimeout(0.25)
    while time.monotonic() - started < 8.0:
        try:
            slow.sendall(b"X-Slow: 1\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            chunk = slow.recv(4096)
        except TimeoutError:
            assert get(gateway.url + "/healthz", timeout=5).status == 200
            continue
        except ConnectionResetError:
            chunk = b""
        data += chunk
        if not chunk:
            closed_after = time.monotonic() - started
            break
    slow.close()
    assert closed_after is not None, f"the trickling connection is still open after 8 s; got {data!r}"
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert b"Connection: close" in data
    assert 1.3 <= closed_after <= 6.0
    assert get(gateway.url + "/healthz", timeout=5).status == 200


def test_connections_past_max_connections_get_the_polite_503_and_healthz_keeps_working(gateway_with):
    """Past max_connections, with every connection in the middle of a request, a new connection is answered 503 with
    the unified envelope (status 65) and Connection: close, then closed; the connections already open are served.
    Once they are idle between requests, a new client is served and the connection idle longest is closed for it:
    idle keep-alive connections lock no one out (a security probe held every slot with them for 11 minutes)."""
    gateway = gateway_with("max_connections = 8\n")
    held = [connect(gateway.port) for _ in range(8)]
    for sock in held:  # each answered once, so the gateway has accepted them all; then each begins a request
        sock.sendall(HEALTHZ)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
    extra = connect(gateway.port)
    extra.sendall(HEALTHZ)
    status, headers, body = split_reply(read_until_closed(extra, 5.0))
    extra.close()
    assert status == "HTTP/1.1 503 Service Unavailable"
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert headers["retry-after"] == "1"
    envelope = json.loads(body)
    assert (envelope["status"], envelope["status_str"], envelope["results"]) == (65, "NOT_READY", [])
    assert envelope["model"]["name"] == "gateway"
    assert headers["x-request-id"] == envelope["task_id"]

    for sock in held:  # the open connections' requests are served; then they are idle, held[0] the longest
        sock.sendall(b"Host: gw\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
    assert get(gateway.url + "/healthz", timeout=5).status == 200  # a new client, served at once
    held[0].settimeout(5.0)
    assert held[0].recv(1) == b""  # closed for it (an end of stream, not a timeout), having no request in progress
    held[1].sendall(HEALTHZ)  # the others stay open and served
    assert held[1].recv(65536).startswith(b"HTTP/1.1 200 OK")
    for sock in held:
        sock.close()
    assert gateway.alive()


def test_pipelining_clients_that_never_read_do_not_grow_the_gateway_or_delay_healthz(gateway_with):
    """Six clients pipelining /healthz without reading a reply: the gateway stops reading from them, its RSS grows
    by less than 16 MiB, and /healthz on another connection answers within 5 s throughout (before: 35 s)."""
    gateway = gateway_with("")
    pid = gateway.popen.pid
    before = rss_bytes(pid)
    stop = threading.Event()
    sent = [0] * 6
    socks = []

    def flood(i: int) -> None:
        sock = connect(gateway.port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        socks.append(sock)
        sock.settimeout(0.5)
        burst = HEALTHZ * 400
        while not stop.is_set():
            try:
                sent[i] += sock.send(burst)
            except TimeoutError:
                continue  # the gateway stopped reading: that is the point
            except OSError:
                return

    threads = [threading.Thread(target=flood, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    slowest = 0.0
    try:
        end = time.monotonic() + 4.0  # the unbounded gateway was 35 s late
        while time.monotonic() < end:
            t0 = time.monotonic()
            reply = get(gateway.url + "/healthz", timeout=5)
            slowest = max(slowest, time.monotonic() - t0)
            assert reply.status == 200
            time.sleep(0.2)
        grown = rss_bytes(pid) - before
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for sock in socks:
            sock.close()
    assert grown < 16 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MiB; sent {sum(sent)} request bytes"
    assert gateway.alive()


def test_a_pipelining_client_that_never_reads_is_closed_after_the_idle_timeout(gateway_with):
    """A client that pipelines /healthz and never reads: once its unread replies fill the connection's buffers
    the gateway stops reading from it, and ``idle_timeout_s`` later closes it (the client's next send fails).

    How long the buffers take to fill depends on the kernel (12 s for this client on a loaded 2-core machine,
    the gateway answering all the while); the wait is for the close, with a deadline far above that.
    """
    gateway = gateway_with(f"idle_timeout_s = {PIPELINE_IDLE_S}\n")
    sock = connect(gateway.port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(0.5)
    burst, error = HEALTHZ * 400, None
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                sock.send(burst)
            except TimeoutError:
                continue  # the gateway stopped reading
            except OSError as e:
                error = e
                break
    finally:
        sock.close()
    assert isinstance(error, (ConnectionResetError, BrokenPipeError)), f"still connected after 120 s: {error!r}"
    assert "Timing out client" in gateway.output()
    assert get(gateway.url + "/healthz", timeout=5).status == 200


def test_listen_backlog_reaches_the_listening_socket_and_a_burst_of_hundreds_is_served(gateway_with):
    """listen_backlog is the backlog of the gateway's listening socket (ss shows it as Send-Q), not twisted's 50;
    a burst of BURST connections opened at once is accepted, and each is answered."""
    gateway = gateway_with("listen_backlog = 700\n")
    out = subprocess.run(["ss", "-ltnH", f"sport = :{gateway.port}"], capture_output=True, text=True, check=True).stdout
    fields = out.split()
    assert fields[0] == "LISTEN" and fields[2] == "700", out
    socks = []
    try:
        for _ in range(BURST):  # every SYN sent before the gateway accepts any
            sock = socket.socket()
            sock.setblocking(False)
            assert sock.connect_ex(("127.0.0.1", gateway.port)) in (0, errno.EINPROGRESS)
            socks.append(sock)
        answered = 0
        for sock in socks:
            sock.settimeout(30)
            sock.sendall(HEALTHZ)
            answered += sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
    finally:
        for sock in socks:
            sock.close()
    assert answered == BURST
    assert gateway.alive()
