"""A real gateway process on a free port, and misbehaving upstreams to put behind it."""

from __future__ import annotations

import re
import select
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import Proc, child_env, spawn, wait_bound_port, wait_ready

GATEWAY_TOKENS = {
    "SERVICE_GATEWAY_AUTH_TOKEN": "gw-static-token",
    "SERVICE_API_TOKEN": "gw-management-token",
    "SERVICE_METRICS_TOKEN": "gw-metrics-token",
}


def gateway_args(*extra: str) -> list[str]:
    return [sys.executable, "-m", "twisted", "--log-format", "text", "service-gateway", *extra]


def start_gateway(root: Path, servers: Path, keys_text: str | None, *, env: dict[str, str] | None = None,
                  gateway_table: str = "") -> Proc:
    """A gateway routing to the configs in ``servers`` on a port of its own choosing (``--port 0``, named
    in its "gateway on" line), once ``/healthz`` answers."""
    keys = root / "api_keys.toml"
    if keys_text is not None:
        keys.write_text(keys_text)
    config = root / "service.toml"
    config.write_text(f'[gateway]\nkeys_file = "{keys}"\nservers_dir = "{servers}"\n{gateway_table}')
    popen, log_path = spawn(gateway_args("--config", str(config), "--port", "0"),
                            env=child_env({**GATEWAY_TOKENS, **(env or {})}))
    proc = Proc(popen, 0, log_path, GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"])
    proc.port = wait_bound_port(proc, 60, LISTENING)
    wait_ready(proc, 60, path="/healthz")
    return proc


#: The gateway's startup line: with ``--port 0`` it names the port the kernel gave.
LISTENING = re.compile(r"gateway on http://127\.0\.0\.1:(\d+)/")


@dataclass
class RawUpstream:
    """A TCP server that reads one request and then misbehaves, in a thread.

    ``mode``: ``hang`` (never answers), ``cut`` (headers and half the body,
    then closes), ``garbage`` (a reply that is not HTTP).
    """

    mode: str
    port: int = 0

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.port = self.sock.getsockname()[1]
        self.sock.listen(16)
        self.connections: list[socket.socket] = []
        self.requests = 0
        self.ended = 0  # hang: requests whose connection the client closed
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        self.requests += 1
        if self.mode == "cut":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                         b"Content-Length: 1000\r\n\r\n" + b'{"status":0,"results":[' + b" " * 100)
            conn.close()
        elif self.mode == "garbage":
            conn.sendall(b"this is not HTTP at all\r\n\r\n")
            conn.close()
        else:  # hang: keep the connection open and say nothing, until the other end closes it
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            self.ended += 1

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:
            try:
                conn.close()
            except OSError:
                pass


class Blackhole:
    """A loopback port whose SYNs the kernel drops: a listening socket that never
    accepts, with its accept queue filled.

    Linux drops a SYN to a listener whose accept queue is full (the client's
    connect then hangs, retransmitting), so a connect to ``port`` does not
    complete until the socket is closed: an upstream that "accepts no
    connection in time", with no timing involved.
    """

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.fillers: list[socket.socket] = []
        while True:  # fill the accept queue until a connect no longer completes
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self.fillers.append(filler)
            _, writable, _ = select.select([], [filler], [], 0.5)
            if not writable:
                break
            assert len(self.fillers) < 64, "the kernel accepted every connection: no blackhole"

    def close(self) -> None:
        for s in (*self.fillers, self.sock):
            s.close()
