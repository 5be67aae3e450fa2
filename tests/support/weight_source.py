"""A fake weights source on loopback: official URL paths behind ``SERVICE_WEIGHTS_MIRROR``.

``svcctl weights pull`` fetches ``https://host/path`` as
``$SERVICE_WEIGHTS_MIRROR/host/path``; this server answers those paths from
a dict, honours ``Range: bytes=N-`` (206), can cut the connection after a
number of bytes (a network failure mid-file) and records every request's
path and ``Range`` header.
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up midway (a pull whose disk is full) is no error of the source's: http.server
    printed its traceback into the command's captured stderr."""

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeSource:
    """Serve ``files`` (URL -> bytes, keyed by the official URL) on 127.0.0.1."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut_after: dict[str, int] = {}  # path -> bytes sent before the next full reply is cut (once)
        self.redirects: dict[str, str] = {}  # path -> Location
        self.requests: list[tuple[str, str | None]] = []
        source = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                source.requests.append((self.path, self.headers.get("Range")))
                if self.path in source.redirects:
                    self.send_response(302)
                    self.send_header("Location", source.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = source.files.get(self.path)
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                wanted = self.headers.get("Range")
                if wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
                    start = int(wanted[6:-1])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                cut = source.cut_after.pop(self.path, None)
                if cut is not None:
                    self.wfile.write(body[start:start + cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def mirror(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @staticmethod
    def path_of(url: str) -> str:
        """The path under the mirror of an official URL."""
        parts = urlsplit(url)
        return f"/{parts.netloc}{parts.path}"

    def serve(self, url: str, body: bytes) -> None:
        self.files[self.path_of(url)] = body

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
