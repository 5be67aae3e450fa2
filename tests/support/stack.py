"""A whole service on free ports: supervisor, gateway and model servers, in a temp tree."""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from svc import auth
from tests.support.http import get
from tests.support.processes import REPO, Proc, child_env, free_port, spawn, write_config

TOKENS = {
    "SERVICE_API_TOKEN": "management-" + secrets.token_hex(8),
    "SERVICE_GATEWAY_AUTH_TOKEN": "inference-" + secrets.token_hex(8),
    "SERVICE_METRICS_TOKEN": "metrics-" + secrets.token_hex(8),
}


def key_entry(name: str, key: str, scope: str = "inference", qps: int = 0) -> str:
    """The key file's entry for the plaintext ``key`` (svc.auth writes every entry)."""
    return auth.key_entry(name, auth.hash_key(key), scope, qps)


@dataclass
class Stack:
    root: Path
    supervisor: Proc
    gateway_port: int
    model_ports: dict[str, int]
    keys_file: Path
    env: dict[str, str]
    key: str
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.supervisor.url

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.env['SERVICE_API_TOKEN']}"}

    def status(self) -> dict:
        return get(self.url + "/api/v1/status", headers=self.auth).json

    def child(self, name: str) -> dict:
        status = self.status()
        if name == "__gateway":
            return status["gateway"]
        return next(s for s in status["servers"] if s["id"] == name)

    def model_metric(self, model_id: str, sample: str) -> float:
        """One sample of ``model_id``'s own ``/metrics`` (0 when absent), e.g. ``service_batch_size_count``.

        Asked with the token the supervisor gave that server, read from the
        process's environment (the supervisor shows it nowhere).
        """
        import re

        pid = self.child(model_id)["pid"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        token = next(e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"SERVICE_AUTH_TOKEN="))
        text = get(f"http://127.0.0.1:{self.model_ports[model_id]}/metrics",
                   headers={"Authorization": f"Bearer {token}"}).body.decode()
        found = re.search(r"^" + re.escape(sample) + r" (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    def wait_for(self, name: str, predicate, timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            child = self.child(name)
            if predicate(child):
                return child
            time.sleep(0.2)
        raise AssertionError(f"{name} never reached the expected state: {child}\n{self.supervisor.output()[-3000:]}")


def build_stack(root: Path, models: dict[str, dict], *, env_overrides: dict[str, str] | None = None,
                supervisor_extra: str = "", gateway_extra: str = "", profile: str = "cpu",
                replicas: dict[str, int] | None = None, server_extra: dict[str, str] | None = None,
                start: bool = True) -> Stack:
    """Write configs for ``models`` (base config name -> overrides) and start the supervisor.

    ``profiles/cpu.toml`` lists ``models``; ``profile`` is the config's ``supervisor.profile``.
    ``replicas``: model id -> replica count, each replica on a free port (``[servers.<ID>] ports``,
    in ``extra["replica_ports"]``: the stride's ports may be anyone's on a shared machine);
    ``server_extra``: model id -> more lines of its ``[servers.<ID>]`` table; ``start`` False: only the
    files (the stack's ``supervisor`` is None), for a test that starts the supervisor its own way.
    """
    servers, profiles, logs = root / "server", root / "profiles", root / "logs"
    for d in (servers, profiles):
        d.mkdir(parents=True, exist_ok=True)
    ports = {}
    for model_id, overrides in models.items():
        port = free_port()
        write_config(servers, model_id, name=f"{model_id}.toml", port=port, **overrides)
        ports[model_id] = port
    ids = ", ".join(f'"{m}"' for m in models)
    (profiles / "cpu.toml").write_text(f'device = "cpu"\nmodels = [{ids}]\n')
    key = secrets.token_hex(32)
    keys_file = root / "api_keys.toml"
    keys_file.write_text(key_entry("tenant-a", key))
    gateway_port, supervisor_port = free_port(), free_port()
    replica_ports = {m: [ports[m], *(free_port() for _ in range(n - 1))] for m, n in (replicas or {}).items()}
    tables = "".join(f"\n[servers.{m}]\n" + (f"replicas = {len(replica_ports[m])}\nports = {replica_ports[m]}\n"
                                              if m in replica_ports else "") + (server_extra or {}).get(m, "")
                     for m in {**replica_ports, **(server_extra or {})})
    config = root / "service.toml"
    config.write_text(
        f'[gateway]\nhost = "127.0.0.1"\nport = {gateway_port}\nkeys_file = "{keys_file}"\nservers_dir = "{servers}"\n{gateway_extra}\n'
        f'[supervisor]\nport = {supervisor_port}\nprofile = "{profile}"\nservers_dir = "{servers}"\n'
        f'profiles_dir = "{profiles}"\nlog_dir = "{logs}"\nstop_grace_ms = 8000\nbackoff_initial_ms = 300\n'
        f"{supervisor_extra}{tables}"
    )
    env = {**TOKENS, **(env_overrides or {})}
    stack = Stack(root, None, gateway_port, ports, keys_file, env, key,  # type: ignore[arg-type]
                  extra={"supervisor_port": supervisor_port, "replica_ports": replica_ports})
    return start_supervisor(stack) if start else stack


def start_supervisor(stack: Stack, *, cwd: Path = REPO, flags: tuple[str, ...] = ()) -> Stack:
    """Start a supervisor on ``stack``'s config (again, after the first one died); returns once it answers.

    ``cwd``: its working directory (its children's too); ``flags``: the interpreter's own (``-P``: no working
    directory on ``sys.path``, as for the ``twist`` and ``twistd`` scripts).
    """
    supervisor_port = stack.extra["supervisor_port"]
    popen, log_path = spawn(
        [__import__("sys").executable, *flags, "-m", "twisted", "--log-format", "text", "service-supervisor",
         "--config", str(stack.root / "service.toml")],
        env=child_env(stack.env), cwd=cwd,
    )
    proc = Proc(popen, supervisor_port, log_path, stack.env.get("SERVICE_API_TOKEN"))
    atexit.register(stop_at_exit, proc)
    stack = Stack(stack.root, proc, stack.gateway_port, stack.model_ports, stack.keys_file, stack.env, stack.key,
                  {**stack.extra, "spawned_at": time.monotonic()})
    deadline = time.monotonic() + 60
    while True:
        try:
            if get(stack.url + "/api/v1/health", timeout=5).status == 200:
                break
        except OSError:
            pass
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"supervisor did not come up:\n{proc.output()}")
        time.sleep(0.2)
    return stack


def stop_at_exit(proc: Proc) -> None:
    """Stop a supervisor (and so its children) that is still running when the test process exits: a module
    fixture that failed after starting one (a model that never became ready) never reaches its teardown, and a
    CI run left a supervisor, a gateway and a model running after the suite."""
    if proc.alive():
        proc.stop(signal.SIGTERM, timeout=30)


def stop_stack(stack: Stack) -> tuple[int, list[int]]:
    """SIGTERM the supervisor; its exit code and the child pids that survived it.

    The status call must succeed: a supervisor that is already gone would give
    no pids, and "no children left behind" would then hold vacuously.
    """
    status = stack.status()
    replicas = [r for s in status["servers"] for r in s["replicas"]]
    pids = [c["pid"] for c in [status["gateway"], *replicas] if c["pid"]]
    assert pids, f"no running child to check: {status}"
    code = stack.supervisor.stop(signal.SIGTERM, timeout=60)
    survivors = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            survivors.append(pid)
        except ProcessLookupError:
            pass
    return code, survivors


def ready_stack(root: Path, models: dict[str, dict], *, timeout: float = 240, **kwargs: Any) -> Stack:
    """:func:`build_stack`, then wait until the gateway and every replica of every model run and are ready."""
    stack = build_stack(root, models, **kwargs)
    for name in ("__gateway", *models):
        stack.wait_for(name, lambda c: all(r["state"] == "running" and r["ready"] for r in c.get("replicas", [c])),
                       timeout=timeout)
    return stack


def stop_cleanly(stack: Stack) -> None:
    """:func:`stop_stack`, asserting that the supervisor exited 0 and left no child behind."""
    code, survivors = stop_stack(stack)
    assert code == 0 and survivors == []
