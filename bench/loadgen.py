"""Closed-loop HTTP load: wrk when it is installed (a C client that costs the
2-core machine almost nothing), else N Python clients on keep-alive
connections.  Each client sends its next request as soon as the previous
reply arrived; latency is measured on the client side.
"""

from __future__ import annotations

import http.client
import re
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LoadResult:
    tool: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    p50: float
    p99: float
    #: CPU ms the load tool itself used over the run (wrk, a child process); NaN for the Python clients,
    #: threads of the measuring process.
    client_cpu_ms: float = float("nan")

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def _percentile(data: list[float], p: float) -> float:
    if not data:
        return float("nan")
    data = sorted(data)
    return data[min(len(data) - 1, int(round(p / 100.0 * (len(data) - 1))))]


def run_load(url: str, body: bytes, headers: dict[str, str], *, concurrency: int, seconds: float,
             method: str = "POST", tool: str = "auto") -> LoadResult:
    """Drive ``concurrency`` clients for ``seconds`` (after a short warm-up)."""
    if tool == "wrk" or (tool == "auto" and shutil.which("wrk")):
        run_python(url, body, headers, concurrency=concurrency, seconds=1.0, method=method)  # warm-up
        return run_wrk(url, body, headers, concurrency=concurrency, seconds=seconds, method=method)
    return run_python(url, body, headers, concurrency=concurrency, seconds=seconds, method=method, warmup=1.0)


def run_wrk(url: str, body: bytes, headers: dict[str, str], *, concurrency: int, seconds: float,
            method: str = "POST") -> LoadResult:
    def lua_string(text: str) -> str:
        return "[==[" + text + "]==]"

    with tempfile.TemporaryDirectory() as tmp:
        # The body is read from a file: a Lua string literal would turn the CR LF pairs of a binary body
        # (a raw JPEG) into LF.
        body_file = Path(tmp) / "body"
        body_file.write_bytes(body)
        lines = [f"wrk.method = {lua_string(method)}",
                 f"local f = assert(io.open({lua_string(str(body_file))}, 'rb'))",
                 "wrk.body = f:read('*a')", "f:close()"]
        lines += [f"wrk.headers[ {lua_string(k)} ] = {lua_string(v)}" for k, v in headers.items()]
        script = Path(tmp) / "request.lua"
        script.write_text("\n".join(lines) + "\n", encoding="latin-1")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            ["wrk", "-t", "1", "-c", str(concurrency), "-d", f"{seconds:g}s", "--latency", "--timeout", "120s",
             "-s", str(script), url],
            capture_output=True, text=True, check=True,
        ).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_ms = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000.0

    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000.0 if unit == "us" else value * 1000.0 if unit == "s" else value

    total = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(bad.group(1)) if bad else 0) + (sum(map(int, socket_errors.groups())) if socket_errors else 0)
    return LoadResult("wrk", concurrency, total - (int(bad.group(1)) if bad else 0), errors, seconds, ms("50"), ms("99"),
                      client_ms)


def run_python(url: str, body: bytes, headers: dict[str, str], *, concurrency: int, seconds: float,
               method: str = "POST", warmup: float = 0.0) -> LoadResult:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    host, port = host_port.split(":")
    now = time.perf_counter()
    measure_from, stop_at = now + warmup, now + warmup + seconds
    lock = threading.Lock()
    latencies: list[float] = []
    counts = {"ok": 0, "errors": 0}

    def client() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        own: list[float] = []
        ok = errors = 0
        while (started := time.perf_counter()) < stop_at:
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                good = 200 <= resp.status < 300
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=120)
                good = False
            finished = time.perf_counter()
            if started >= measure_from and finished <= stop_at:
                if good:
                    ok += 1
                    own.append((finished - started) * 1000.0)
                else:
                    errors += 1
        conn.close()
        with lock:
            latencies.extend(own)
            counts["ok"] += ok
            counts["errors"] += errors

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return LoadResult("python", concurrency, counts["ok"], counts["errors"], seconds,
                      _percentile(latencies, 50), _percentile(latencies, 99))
