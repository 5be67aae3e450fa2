"""Debian's haproxy for the multi-host tests, run from the shipped deploy/haproxy.cfg with the test's addresses."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import REPO
from tests.support.redis import require

HAPROXY = "/usr/sbin/haproxy"
SHIPPED = REPO / "deploy" / "haproxy.cfg"


def config_for(bind: str, servers: dict[str, str], stats_socket: Path) -> str:
    """deploy/haproxy.cfg with ``bind`` (ADDRESS:PORT), one server line per ``servers`` (name -> ADDRESS:PORT),
    and the stats socket at ``stats_socket``; everything else as shipped (but ``user``/``group`` when not root:
    only root can switch to them)."""
    text = SHIPPED.read_text()
    if os.geteuid() != 0:
        text = re.sub(r"^    (user|group) haproxy\n", "", text, flags=re.M)
    text, binds = re.subn(r"^    bind :\d+$", f"    bind {bind}", text, flags=re.M)
    text, sockets = re.subn(r"stats socket /run/haproxy/admin\.sock", f"stats socket {stats_socket}", text)
    lines = text.splitlines()
    shipped_servers = [i for i, line in enumerate(lines) if line.startswith("    server ")]
    assert (binds, sockets, len(shipped_servers)) == (1, 1, 3), "deploy/haproxy.cfg changed its bind/server lines"
    ours = [f"    server {name} {address}" for name, address in servers.items()]
    lines[shipped_servers[0]:shipped_servers[-1] + 1] = ours
    return "\n".join(lines) + "\n"


@dataclass
class HAProxy:
    """haproxy in the foreground (``-db``), started with ``prefix`` (a namespace) and stopped after."""

    workdir: Path
    bind: str
    servers: dict[str, str]
    prefix: list[str]
    popen: subprocess.Popen | None = None

    @property
    def stats_socket(self) -> Path:
        return self.workdir / "haproxy.sock"

    @property
    def log_path(self) -> Path:
        return self.workdir / "haproxy.log"

    def start(self) -> "HAProxy":
        require(HAPROXY)
        config = self.workdir / "haproxy.cfg"
        config.write_text(config_for(self.bind, self.servers, self.stats_socket))
        check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen([*self.prefix, HAPROXY, "-db", "-f", str(config)], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def servers_state(self) -> dict[str, str]:
        """Each server's status in the backend (``UP``, ``DOWN``, ``UP 1/2``...); {} before the socket exists."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                s.connect(str(self.stats_socket))
                s.sendall(b"show stat\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:
            return {}
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
        return {r["svname"]: r["status"] for r in rows if r["pxname"] == "gateways" and r["svname"] in self.servers}

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
