"""Resumable download of one file over HTTP(S), outside any reactor.

``svcctl weights pull`` is a command-line program that runs before any
server does, so it uses the standard library's ``http.client`` rather than a
reactor.  A download goes into ``<name>.part``; when that file is already
there (a pull that was cut), the request asks for the rest with
``Range: bytes=<size>-`` and appends, or starts again when the server answers
the whole file.  The caller checks the digest and renames the ``.part`` into
place: this module never produces a file that looks complete.

Proxies: ``https_proxy``/``HTTPS_PROXY``, ``http_proxy``/``HTTP_PROXY`` and
``no_proxy``/``NO_PROXY`` are honoured as hub pulls (huggingface_hub) honour
them (:mod:`svc.weightstore.proxies` decides which): an https URL goes through a CONNECT tunnel (TLS to the
host itself), a plain http URL is asked of the proxy by its absolute URL.

``SERVICE_WEIGHTS_MIRROR`` is a base URL that replaces the scheme and host of
every URL fetched here: ``https://host/path`` is fetched as
``$SERVICE_WEIGHTS_MIRROR/host/path`` (an internal mirror, or the fake
sources of the tests).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from svc import __version__
from svc.weightstore.commit import cache_trouble
from svc.weightstore.proxies import proxy_for, proxy_variable

MIRROR_ENV = "SERVICE_WEIGHTS_MIRROR"
#: Seconds a connect or a single read may take before the pull gives up (the .part stays for a resume).
SOCKET_TIMEOUT_S = 60.0
MAX_REDIRECTS = 5
CHUNK = 1 << 16


class FetchError(Exception):
    """A download that failed; ``str()`` is one line naming the URL and the cause."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(f"{without_credentials(url)}: {cause}")  # a mirror's user:password@ is never printed
        self.url = url
        self.cause = cause


class CacheWriteError(FetchError):
    """The download's own file could not be written (a full or read-only cache): one line naming the file,
    not the URL, which did nothing wrong (it read "URL: [Errno 28] No space left on device")."""

    def __init__(self, url: str, error: OSError, part: Path) -> None:
        super().__init__(url, cache_trouble(error, part))
        self.args = (self.cause,)


@contextlib.contextmanager
def _on_disk(part: Path, url: str) -> Iterator[None]:
    """A step on the local ``part``: its OSError is the cache's (:class:`CacheWriteError`), not the source's."""
    try:
        yield
    except OSError as e:
        raise CacheWriteError(url, e, part) from None


def mirror_problem(env: Mapping[str, str] | None = None) -> str | None:
    """What is wrong with ``$SERVICE_WEIGHTS_MIRROR`` (None: unset, or an http(s) URL with a host): said before a
    pull plans anything, as a bad ``--gateway`` is (it failed each file's download after the plan, exit 1)."""
    env = os.environ if env is None else env
    base = env.get(MIRROR_ENV) or ""
    parts = urlsplit(base)
    if not base or (parts.scheme in ("http", "https") and parts.hostname):
        return None
    return f"${MIRROR_ENV} {base[:80]!r} is not an http:// or https:// URL with a host"


def mirrored(url: str, env: Mapping[str, str] | None = None) -> str:
    """``url`` as fetched: through ``$SERVICE_WEIGHTS_MIRROR`` when it is set."""
    env = os.environ if env is None else env
    base = (env.get(MIRROR_ENV) or "").rstrip("/")
    if not base:
        return url
    parts = urlsplit(url)
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{base}/{parts.netloc}{rest}"


def sha256_file(path: str | os.PathLike, digest: "hashlib._Hash | None" = None) -> str:
    """The hex SHA-256 of a file (``digest`` continues a running hash)."""
    digest = digest or hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """A progress bar on stderr: bytes done of the size, percent, rate and ETA.

    On a terminal the line is redrawn in place; otherwise (a log, a test) a
    line is written at most every ``interval`` seconds, plus a final one, so
    that logs stay short.  The rate counts only the bytes of this run, not
    those a resumed ``.part`` already held.
    """

    def __init__(self, label: str, stream: IO[str] | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if interval is not None else (0.1 if self.tty else 2.0)
        self.clock = clock
        self.total: int | None = None
        self.start_at = 0
        self.done = 0
        self.started = clock()
        self.last_drawn: float | None = None

    def begin(self, total: int | None, already: int = 0) -> None:
        """A (re)started transfer of ``total`` bytes (None: unknown) of which ``already`` are on disk."""
        self.total, self.start_at, self.done = total, already, already
        self.started = self.clock()

    def update(self, done: int) -> None:
        self.done = done
        now = self.clock()
        if self.last_drawn is None or now - self.last_drawn >= self.interval:
            self._draw(now)

    def finish(self) -> None:
        self._draw(self.clock(), final=True)

    def __call__(self, done: int, total: int | None) -> None:
        """The ``progress(done_bytes, total_bytes)`` callback of the hub fetcher (svc.weightstore.hub)."""
        if self.total != total:
            self.begin(total)
        self.update(done)
        if total is not None and done >= total:
            self.finish()

    def interrupted(self) -> None:
        """End a redrawn line before an error is printed under it."""
        if self.tty and self.last_drawn is not None:
            self.stream.write("\n")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """The current progress line (what is drawn)."""
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-6)
        rate = (self.done - self.start_at) / elapsed
        parts = [self.label]
        if self.total:
            parts.append(f"{_size(self.done)} / {_size(self.total)} {100 * self.done / self.total:5.1f}%")
        else:
            parts.append(_size(self.done))
        parts.append(f"{_size(rate)}/s")
        if self.total and rate > 0:
            parts.append(f"ETA {_duration(max(self.total - self.done, 0) / rate)}")
        return "  ".join(parts)

    def _draw(self, now: float, final: bool = False) -> None:
        self.last_drawn = now
        text = self.line(now)
        if self.tty:
            self.stream.write(f"\r{text}\x1b[K" + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _connect(url: str, timeout: float, env: Mapping[str, str] | None = None) -> tuple[http.client.HTTPConnection, str]:
    """A connection for ``url`` (through the proxy :func:`proxy_for` names) and the request target."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(url, "not an http:// or https:// URL")
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    proxy = proxy_for(url, env)
    if proxy is None:
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                               context=ssl.create_default_context()), target
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout), target
    via = urlsplit(proxy)
    if via.scheme != "http" or not via.hostname:
        raise FetchError(url, unsupported_proxy(proxy, proxy_variable(os.environ if env is None else env,
                                                                      parts.scheme, "all")))
    headers: dict[str, str] = {}
    if via.username:
        credentials = f"{unquote(via.username)}:{unquote(via.password or '')}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials).decode()
    if parts.scheme == "https":  # a CONNECT tunnel: TLS end to end, the certificate checked against the host
        connection = http.client.HTTPSConnection(via.hostname, via.port or 80, timeout=timeout,
                                                 context=ssl.create_default_context())
        connection.set_tunnel(parts.hostname, parts.port or 443, headers=headers)
        return connection, target
    proxied = _ProxiedConnection(via.hostname, via.port or 80, timeout=timeout)
    proxied.proxy_headers = headers
    return proxied, f"{parts.scheme}://{parts.netloc}{target}"  # a plain-HTTP proxy takes the absolute URL


class _ProxiedConnection(http.client.HTTPConnection):
    """A plain HTTP request through a proxy: the absolute URL as target, with the proxy's credentials."""

    proxy_headers: dict[str, str] = {}

    def putrequest(self, method: str, url: str, skip_host: bool = False, skip_accept_encoding: bool = False) -> None:
        host = urlsplit(url).netloc
        super().putrequest(method, url, skip_host=True, skip_accept_encoding=skip_accept_encoding)
        self.putheader("Host", host)
        for name, value in self.proxy_headers.items():
            self.putheader(name, value)


def _shown(proxy: str) -> str:
    """``proxy`` as a failure line names it: scheme, host and port, never its ``user:password@``."""
    parts = urlsplit(without_credentials(proxy))
    return f"{parts.scheme}://{parts.netloc}"


def unsupported_proxy(proxy: str, variable: str | None) -> str:
    """The line for a proxy whose scheme pulls cannot use (``socks5://``, the usual form of ``ALL_PROXY``): which
    ones they can, and how to go on, naming the ``variable`` that set it (regression probes: the bare refusal gave
    no way forward, and then named ALL_PROXY for a SOCKS proxy in HTTPS_PROXY)."""
    return (f"proxy {_shown(proxy)} ({variable or 'from the environment'}): only http:// proxies are supported (set "
            f"HTTPS_PROXY and HTTP_PROXY to one, or unset {variable or 'its variable'} to connect directly)")


def without_credentials(url: str) -> str:
    """``url`` without its ``user:password@``, as a line may print it (a proxy's, the mirror's of
    ``$SERVICE_WEIGHTS_MIRROR``: ``http://u:p@host`` printed ``u:p@`` in the pull's failure line)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])) if "@" in parts.netloc else url


def _proxy_cause(error: BaseException, proxy: str) -> str:
    """Why the connection to the proxy itself failed, naming the proxy (without its credentials).

    Without this a dead proxy read as the source refusing ("connection
    refused" after the source's URL), and the user looked at the wrong host.
    """
    shown = _shown(proxy)
    if isinstance(error, ConnectionRefusedError):
        return f"the proxy {shown} refused the connection"
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the proxy's host name ({shown})"
    if isinstance(error, socket.timeout | TimeoutError):
        return f"the proxy {shown} did not answer the connection (timed out)"
    return f"the proxy {shown}: {_cause(error)}"


def _tunnel_refused(error: BaseException) -> bool:
    """Whether ``error`` is http.client's answer to a CONNECT the proxy refused."""
    return type(error) is OSError and str(error).startswith("Tunnel connection failed")


def _cause(error: BaseException) -> str:
    if _tunnel_refused(error):
        return f"the proxy refused the tunnel: {str(error).partition(': ')[2]}"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(error, socket.gaierror):
        return "cannot resolve the host name"
    if isinstance(error, http.client.IncompleteRead):
        return "the connection closed before the end of the file"
    if isinstance(error, ssl.SSLError):
        return f"TLS error: {error.reason or error}"
    if isinstance(error, http.client.RemoteDisconnected | ConnectionError):
        return "the connection closed before the end of the file"
    return f"{type(error).__name__}: {error}"


def download(url: str, part: Path, progress: Progress | None = None, *,
             env: Mapping[str, str] | None = None, timeout: float = SOCKET_TIMEOUT_S) -> None:
    """Fetch ``url`` (through the mirror) into ``part``, resuming what ``part`` already holds.

    Returns when the server's whole file is in ``part``; raises
    :class:`FetchError` (naming the URL as fetched) otherwise, leaving
    ``part`` for the next attempt.  Redirects are followed (at most
    ``MAX_REDIRECTS``); a ``Range`` request answered 200 starts over.
    """
    first = mirrored(url, env)
    current = first
    for _ in range(MAX_REDIRECTS + 1):
        have = part.stat().st_size if part.exists() else 0
        connection, target = _connect(current, timeout, env)
        headers = {"User-Agent": f"svcctl/{__version__}", "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            connection.request("GET", target, headers=headers)
            response = connection.getresponse()
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                current = urljoin(current, response.getheader("Location"))
                connection.close()
                continue
            if response.status == 416 and have:
                # The .part is at least as long as the file: it cannot be resumed; start over.
                part.unlink()
                connection.close()
                continue
            if response.status == 206 and have:
                offset = _range_start(response.getheader("Content-Range"))
                if offset != have:
                    raise FetchError(current, f"the server resumed at byte {offset}, not {have}")
                mode = "ab"
            elif response.status == 200:
                have, mode = 0, "wb"
            else:
                raise FetchError(current, f"HTTP {response.status} {response.reason}")
            length = response.getheader("Content-Length")
            total = have + int(length) if length and length.isdigit() else None
            if progress is not None:
                progress.begin(total, have)
            done = have
            with _on_disk(part, current):
                f = open(part, mode)  # noqa: SIM115 - closed below, its errors told apart from the network's
            try:
                while True:
                    block = response.read(CHUNK)
                    if not block:
                        break
                    with _on_disk(part, current):
                        f.write(block)
                    done += len(block)
                    if progress is not None:
                        progress.update(done)
                with _on_disk(part, current):
                    f.flush()
                    os.fsync(f.fileno())
            finally:
                with contextlib.suppress(OSError):  # the buffer is empty after the flush, or the error is told
                    f.close()
            if total is not None and done != total:
                if progress is not None:
                    progress.interrupted()
                raise FetchError(current, f"the connection closed after {done} of {total} bytes")
            if progress is not None:
                progress.finish()
            return
        except (OSError, http.client.HTTPException) as e:
            if progress is not None:
                progress.interrupted()
            proxy = proxy_for(current, env)
            if proxy is not None and connection.sock is None and isinstance(e, OSError) and not _tunnel_refused(e):
                # No socket: the TCP connection to the proxy failed (http.client also drops the socket of a
                # tunnel the proxy refused, which _cause words).
                raise FetchError(current, _proxy_cause(e, proxy)) from None
            raise FetchError(current, _cause(e)) from None
        finally:
            connection.close()
    raise FetchError(first, f"more than {MAX_REDIRECTS} redirects")


def _range_start(header: str | None) -> int | None:
    # "bytes 100-999/1000"
    if not header or not header.startswith("bytes "):
        return None
    first = header[6:].split("-", 1)[0]
    return int(first) if first.isdigit() else None
