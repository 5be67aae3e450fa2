"""Debian's redis-server for the tests: started on an address and port of the test's choosing, stopped after.

``bin/ensure-scaleout`` installs it (tox runs it first); without it a test
fails with one line saying so, never skips.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.scratch import scratch_dir

REDIS_SERVER = "/usr/bin/redis-server"
REDIS_CLI = "/usr/bin/redis-cli"


def require(*programs: str) -> None:
    """Fail the test in one line when a Debian program it needs is missing."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run bin/ensure-scaleout as root (tox does) to install Debian's "
                    "redis-server and haproxy", pytrace=False)


@dataclass
class RedisServer:
    """One redis-server process without persistence; ``prefix`` runs it inside a network namespace."""

    host: str
    port: int
    prefix: list[str] = field(default_factory=list)
    popen: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> "RedisServer":
        require(REDIS_SERVER, REDIS_CLI)
        workdir = scratch_dir("svc-redis-")
        self.log_path = workdir / "redis.log"
        args = [*self.prefix, REDIS_SERVER, "--bind", self.host, "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no", "--dir", str(workdir),
                "--logfile", str(self.log_path)]
        self.popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while self.cli("PING") != "PONG":
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {self.output()}")
            time.sleep(0.05)
        return self

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except FileNotFoundError:
            return ""

    def cli(self, *args: str) -> str:
        """One command through redis-cli; its output without the newline ("" when it cannot connect)."""
        done = subprocess.run([*self.prefix, REDIS_CLI, "-h", self.host, "-p", str(self.port), *args],
                              capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 and "Could not connect" not in done.stderr else ""

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.terminate()
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)

    def pause(self) -> None:
        """SIGSTOP: it keeps its port and accepts connections, but answers nothing."""
        assert self.popen is not None
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGCONT)
