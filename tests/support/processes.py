"""Start the service's real processes on free loopback ports."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from tests.support.http import get
from tests.support.scratch import scratch_dir

REPO = Path(__file__).resolve().parents[2]
TEST_PLUGINS = REPO / "tests" / "plugins"
TEST_CONF = REPO / "tests" / "conf"
SHIPPED_CONF = REPO / "conf" / "server"


def _fixed_port_range() -> tuple[int, int]:
    """Ports below the kernel's ephemeral range (``ip_local_port_range``), which no outgoing connection and no
    ``--port 0`` listener takes: 12,000 of them, or the kernel's own choice where that range starts too low."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0, 0
    return (low - 12_000, low - 1) if low > 14_000 else (0, 0)


_FIXED_PORTS = _fixed_port_range()
_PICK = random.Random(os.urandom(16))  # its own: a test may seed the module's generator, and every worker would pick alike


def free_port() -> int:
    """A port that was free a moment ago, below the kernel's ephemeral range where it has one.

    Racy: the port is released before the child binds it, and another process
    may take it meanwhile.  Only for ports that must be known before a child
    starts (the configs of a gateway's catalog or a supervisor's stack); a model
    server started alone binds port 0 instead (:func:`start_model_server`).
    A port the kernel gave (port 0) is one it also gives to outgoing connections
    and to those ``--port 0`` servers of other test processes: one of them took
    a stack's model port before it started (CI: "port ... is in use; still in
    use after waiting 2 s"), which no port of the fixed range is exposed to.
    """
    low, high = _FIXED_PORTS
    for _ in range(100 if high else 0):
        port = _PICK.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The model server's first line once bound: with ``--port 0`` it names the port the kernel gave.
LISTENING = re.compile(r": listening on 127\.0\.0\.1:(\d+);")


def child_env(extra: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TEST_PLUGINS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONUNBUFFERED", "1")
    for name in drop:
        env.pop(name, None)
    env.update(extra or {})
    return env


def config_source(base: str | Path) -> Path:
    """The config file ``base`` names: a path as given, else a shipped config, else a test config (by id)."""
    if isinstance(base, Path):
        return base
    shipped = SHIPPED_CONF / f"{base}.toml"
    return shipped if shipped.exists() else TEST_CONF / f"{base}.toml"


def write_config(directory: Path, base: str | Path = "MOBILENETV2", name: str | None = None, **overrides: Any) -> Path:
    """A copy of a shipped (or test) config with top-level keys and tables overridden.

    ``backend={...}`` / ``model={...}`` merge into those tables; a value of
    ``None`` removes the key.  ``backend.optimize`` is ``"eager"`` unless the
    test passes its own: a test that is not about optimised execution does
    not pay for choosing a mode at warm-up.
    """
    source = config_source(base)
    doc = tomlkit.parse(source.read_text())
    overrides["backend"] = {"optimize": "eager", **(overrides.get("backend") or {})}
    for key, value in overrides.items():
        if isinstance(value, dict):
            table = doc.setdefault(key, tomlkit.table())
            for k, v in value.items():
                if v is None:
                    table.pop(k, None)
                else:
                    table[k] = v
        elif value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    path = directory / (name or f"{source.stem}-{len(list(directory.glob('*.toml')))}.toml")
    path.write_text(tomlkit.dumps(doc))
    return path


@dataclass
class Proc:
    """A running child process of ours with its log file."""

    popen: subprocess.Popen
    port: int
    log_path: Path
    token: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode


def spawn(args: list[str], *, env: dict[str, str], log_dir: Path | None = None, cwd: Path = REPO) -> tuple[subprocess.Popen, Path]:
    log_dir = log_dir or scratch_dir("svc-test-")
    log_path = log_dir / f"proc-{time.monotonic_ns()}.log"
    out = open(log_path, "wb")
    popen = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
    out.close()
    return popen, log_path


def model_server_args(config: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "twisted", "--log-format", "text", "service-model", "--server", str(config),
            "--port", str(port), *extra]


def start_model_server(
    config: Path,
    *,
    token: str | None = "model-token",
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
    ready_timeout: float = 120.0,
    port: int | None = None,
    cwd: Path = REPO,
) -> Proc:
    """A model server on ``port``, or on a port of its own choosing (``--port 0``), once ``/ready`` says 200."""
    proc = spawn_model_server(config, token=token, env=env, extra_args=extra_args, port=port, cwd=cwd)
    return until_ready(proc, ready_timeout)


def spawn_model_server(
    config: Path,
    *,
    token: str | None = "model-token",
    env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
    port: int | None = None,
    cwd: Path = REPO,
) -> Proc:
    """A model server process started, not waited for (:func:`until_ready`): several start side by side."""
    extra_env = {"SERVICE_AUTH_TOKEN": token} if token else {}
    popen, log_path = spawn(
        model_server_args(config, port or 0, *extra_args),
        env=child_env({**extra_env, **(env or {})}, drop=() if token else ("SERVICE_AUTH_TOKEN",)),
        cwd=cwd,
    )
    return Proc(popen, port or 0, log_path, token)


def checkout(tree: Path) -> dict[str, Any]:
    """The :func:`start_model_server` keywords that run another checkout's code (the benchmarks' ``--tree``).

    Its sources come first on ``PYTHONPATH``, and its folder is the working
    directory: ``python -m twisted`` puts the working directory first on
    ``sys.path``, so from this checkout's folder it would import this one's.
    """
    return {"env": {"PYTHONPATH": f"{tree}:{tree / 'tests' / 'plugins'}"}, "cwd": tree}


def until_ready(proc: Proc, timeout: float = 120.0) -> Proc:
    """``proc`` (a model server) once its port is known and ``/ready`` says 200."""
    if not proc.port:
        proc.port = wait_bound_port(proc, timeout)
    wait_ready(proc, timeout)
    return proc


def until_all_ready(*procs: Proc, timeout: float = 120.0) -> tuple[Proc, ...]:
    """Model servers spawned side by side (:func:`spawn_model_server`), once each is ready.

    If one fails to start (or the wait is interrupted), every one of them is
    stopped before the error propagates: they run in sessions of their own and
    would outlive the test run.
    """
    try:
        for proc in procs:
            until_ready(proc, timeout)
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return procs


def wait_bound_port(proc: Proc, timeout: float, line: re.Pattern = LISTENING) -> int:
    """The port a process started with ``--port 0`` bound, from its log ``line`` (a model server's by default)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = line.search(proc.output())
        if found:
            return int(found.group(1))
        if not proc.alive():
            raise RuntimeError(f"process exited with {proc.popen.returncode}:\n{proc.output()}")
        time.sleep(0.05)
    proc.stop(signal.SIGKILL)
    raise RuntimeError(f"no {line.pattern!r} line after {timeout}s:\n{proc.output()}")


def wait_ready(proc: Proc, timeout: float, path: str = "/ready") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"process exited with {proc.popen.returncode}:\n{proc.output()}")
        try:
            if get(proc.url + path, timeout=5).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    proc.stop(signal.SIGKILL)
    raise RuntimeError(f"not ready after {timeout}s:\n{proc.output()}")


def wait_until(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    """Poll ``predicate`` until it returns something true (returned); fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def metric(proc: Proc, sample: str) -> float:
    """One sample of a process's ``/metrics`` (``name`` or ``name{labels}`` as written), 0 when absent."""
    text = get(proc.url + "/metrics", headers=proc.auth).body.decode()
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def run_to_exit(args: list[str], *, env: dict[str, str], timeout: float = 120.0) -> tuple[int, str]:
    """Run a process that is expected to exit by itself; its code and output."""
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, timeout=timeout)
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs; a zombie (exited, not yet reaped by its new parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
