"""A fake Hugging Face hub on 127.0.0.1: just what ``huggingface_hub.snapshot_download`` needs.

Serves local folders under repository ids: the revision info
(``/api/models/<repo>/revision/<rev>``: ``sha`` and ``siblings``), the
recursive tree listing (``/api/models/<repo>/tree/<commit>``), and the
resolve URLs (``/<repo>/resolve/<rev>/<path>``, HEAD and GET) with the headers
huggingface_hub reads: ``X-Repo-Commit``, ``ETag`` (the SHA-256 of the file,
as the hub gives for LFS files), ``Content-Length``.  Every request is
recorded, so a test can tell what was fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class FakeHub:
    """``repos`` maps a repository id to a local folder; ``url`` is what ``HF_ENDPOINT`` takes."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = {repo: Path(folder) for repo, folder in repos.items()}
        self.commits = {repo: hashlib.sha1(repo.encode()).hexdigest() for repo in self.repos}
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo: str) -> list[str]:
        root = self.repos[repo]
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    def _send(self, handler: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str],
              body: bool) -> None:
        handler.send_response(status)
        for name, value in {"Content-Length": str(len(data)), **headers}.items():
            handler.send_header(name, value)
        handler.end_headers()
        if body:
            handler.wfile.write(data)

    def _json(self, handler: BaseHTTPRequestHandler, doc: object, body: bool, status: int = 200) -> None:
        self._send(handler, status, json.dumps(doc).encode(), {"Content-Type": "application/json"}, body)

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        self.requests.append((handler.command, path))
        for repo, root in self.repos.items():
            commit = self.commits[repo]
            if path.startswith(f"/api/models/{repo}/revision/"):
                siblings = [{"rfilename": f} for f in self.files(repo)]
                return self._json(handler, {"id": repo, "sha": commit, "siblings": siblings}, body)
            if path.startswith(f"/api/models/{repo}/tree/"):
                entries = []
                for f in self.files(repo):
                    data = (root / f).read_bytes()
                    entries.append({"type": "file", "path": f, "size": len(data),
                                    "oid": hashlib.sha1(data).hexdigest()})
                return self._json(handler, entries, body)
            prefix = f"/{repo}/resolve/"
            if path.startswith(prefix):
                _, _, name = path[len(prefix):].partition("/")
                file = root / name
                if not file.is_file():
                    return self._json(handler, {"error": "Entry not found"}, body, status=404)
                data = file.read_bytes()
                headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                           "Content-Type": "application/octet-stream"}
                return self._send(handler, 200, data, headers, body)
        self._send(handler, 404, b'{"error": "Repository not found"}',
                   {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, body)
