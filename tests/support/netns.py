"""Hosts on one machine: Linux network namespaces on a bridge, for the multi-host tests (tests/cluster/).

Every "host" is a network namespace with one address on a private /24,
joined by veth pairs to a bridge that lives in a namespace of its own:
nothing is created in the machine's own namespace, and only these
namespaces' addresses are ever used.  Names carry a per-run prefix, so two
runs (or the leftover of a killed one) never collide.  A process runs in a
host with ``ip netns exec NS ...`` (:meth:`Host.command`); the test itself
talks from a host through threads that entered its namespace
(:meth:`Host.call`: ``setns(2)`` changes the calling thread only, and the
sockets a thread opens stay in the namespace it was in).

:meth:`Network.close` kills what still runs in the namespaces (only
processes this run started there) and deletes them, also after a failure.
Needs root; without it the caller fails with one line (:func:`require_root`).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def ip(*args: str) -> str:
    """Run ``ip ARGS``; its output (raises with the error text)."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def require_root() -> None:
    """Fail in one line when network namespaces cannot be made here."""
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests need root for network namespaces (ip netns): run tox as root",
                    pytrace=False)
    probe = f"svcprobe{secrets.token_hex(3)}"
    try:
        ip("netns", "add", probe)
    except (RuntimeError, FileNotFoundError) as e:
        pytest.fail(f"the multi-host tests need network namespaces (ip netns add): {e}", pytrace=False)
    ip("netns", "del", probe)


def _enter(namespace: str) -> None:
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(fd)


class Host:
    """One namespace: its address on the bridge, and threads of the test inside it."""

    def __init__(self, namespace: str, address: str) -> None:
        self.namespace = namespace
        self.address = address
        self._threads: ThreadPoolExecutor | None = None

    def command(self, *args: str) -> list[str]:
        """``args`` as a command that runs inside this host."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a thread inside this host (its sockets are this host's)."""
        return self.submit(fn, *args, **kwargs).result()

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """As :meth:`call`, without waiting: a Future."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix=self.namespace,
                                               initializer=_enter, initargs=(self.namespace,))
        return self._threads.submit(fn, *args, **kwargs)

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in ip("netns", "pids", self.namespace).split()]
        except RuntimeError:
            return []

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
            self._threads = None


class Network:
    """Namespaces ``<prefix><name>`` with addresses ``<subnet>.<n>/24`` on one bridge."""

    def __init__(self, subnet: str = "10.231.0") -> None:
        self.prefix = f"svc{secrets.token_hex(3)}"
        self.subnet = subnet
        self.hosts: dict[str, Host] = {}
        self.bridge = self.prefix + "br"
        ip("netns", "add", self.bridge)
        try:
            ip("-n", self.bridge, "link", "set", "lo", "up")
            ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            ip("-n", self.bridge, "link", "set", "br0", "up")
        except RuntimeError:
            self.close()
            raise

    def add(self, name: str, last: int) -> Host:
        """A new host ``name`` at ``<subnet>.<last>``, plugged into the bridge."""
        namespace = self.prefix + name
        ip("netns", "add", namespace)
        host = self.hosts[name] = Host(namespace, f"{self.subnet}.{last}")  # deleted by close() from now on
        ip("-n", namespace, "link", "set", "lo", "up")
        port = f"v{name}"[:15]
        ip("link", "add", port, "netns", self.bridge, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        ip("-n", self.bridge, "link", "set", port, "master", "br0", "up")
        ip("-n", namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        return host

    def close(self) -> None:
        """Kill what still runs inside, then delete every namespace of this run (never raises)."""
        for host in self.hosts.values():
            host.close()
            for pid in host.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for namespace in [h.namespace for h in self.hosts.values()] + [self.bridge]:
            try:
                ip("netns", "del", namespace)
            except RuntimeError:
                pass
