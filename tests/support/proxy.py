"""A tiny forward HTTP proxy on 127.0.0.1 that records what went through it.

A plain ``GET http://host:port/path`` is forwarded (``http.client``) and the
reply streamed back; ``CONNECT host:port`` opens a tunnel and pipes bytes
both ways.  ``requests`` lists ``(method, target, Proxy-Authorization)`` of
every request, so that a test can tell a download used the proxy (and which
credentials it sent), or that ``NO_PROXY`` kept it away.
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class LoopbackProxy:
    """``url`` is what ``HTTP_PROXY``/``HTTPS_PROXY`` take."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                proxy.requests.append(("GET", self.path, self.headers.get("Proxy-Authorization")))
                parts = urlsplit(self.path)
                upstream = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-authorization",
                                                                                      "proxy-connection")}
                upstream.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
                reply = upstream.getresponse()
                body = reply.read()
                self.send_response(reply.status)
                for name, value in reply.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                upstream.close()

            def do_CONNECT(self) -> None:  # noqa: N802
                proxy.requests.append(("CONNECT", self.path, self.headers.get("Proxy-Authorization")))
                host, _, port = self.path.rpartition(":")
                try:
                    upstream = socket.create_connection((host, int(port)), timeout=5)
                except OSError:
                    self.send_response(502)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200, "Connection established")
                self.end_headers()
                self.close_connection = True
                sockets = [self.connection, upstream]
                try:
                    while True:
                        ready, _, _ = select.select(sockets, [], [], 5)
                        if not ready:
                            return
                        for sock in ready:
                            data = sock.recv(65536)
                            if not data:
                                return
                            (upstream if sock is self.connection else self.connection).sendall(data)
                finally:
                    upstream.close()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
