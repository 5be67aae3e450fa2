"""Three hosts on one machine for the multi-host tests: network namespaces, a supervisor stack per host,
Redis and HAProxy (tests/cluster/conftest.py makes one per module).

    client 10.231.0.30 --> HAProxy 10.231.0.20:8080 (deploy/haproxy.cfg)
                              |-> h1 10.231.0.1:8080  supervisor -> gateway, TESTFAULTS model server
                              |-> h2 10.231.0.2:8080  supervisor -> gateway, TESTFAULTS model server
                              '-> h3 10.231.0.3:8080  supervisor -> gateway, TESTFAULTS model server
    the gateways' rate limits --> Redis 10.231.0.10:6379

Each namespace is a machine of its own: its supervisor on 127.0.0.1:8787
and its model server on 127.0.0.1:9199 are that host's loopback, and the
gateway is bound to the host's address, as docs/scaling.md configures
it (fixed ports are private to this run's namespaces).  Every host has the
same key file, job secret and cluster token, and the same ``[cluster]``
table but for ``host_id``.  Tests talk from the client namespace, and to a
host's supervisor from inside that host.
"""

from __future__ import annotations

import re
import secrets
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from svc import auth
from tests.support.haproxy import HAPROXY, HAProxy
from tests.support.http import Reply, get, request
from tests.support.netns import Host, Network, require_root
from tests.support.processes import Proc, child_env, spawn, wait_until, write_config
from tests.support.redis import REDIS_CLI, REDIS_SERVER, RedisServer, require

HOSTS = {"h1": 1, "h2": 2, "h3": 3}
REDIS, BALANCER, CLIENT = 10, 20, 30
GATEWAY_PORT, SUPERVISOR_PORT, MODEL_PORT, BALANCER_PORT = 8080, 8787, 9199, 8080
LIMITED_QPS = 3
KEYS = {"limited": secrets.token_hex(32), "free": secrets.token_hex(32)}
ENV = {
    "SERVICE_API_TOKEN": "management-" + secrets.token_hex(8),
    "SERVICE_METRICS_TOKEN": "metrics-" + secrets.token_hex(8),
    "SERVICE_JOB_SECRET": "jobs-" + secrets.token_hex(16),
    "SERVICE_CLUSTER_TOKEN": "cluster-" + secrets.token_hex(16),
}


@dataclass
class StackHost:
    """One host of the cluster: its namespace, supervisor and the URLs of its gateway and supervisor."""

    name: str
    host: Host
    root: Path
    supervisor: Proc | None = None

    @property
    def gateway(self) -> str:
        return f"http://{self.host.address}:{GATEWAY_PORT}"

    def api(self, method: str, path: str, timeout: float = 60.0) -> Reply:
        """The host's management API, from inside the host (it listens on that host's loopback)."""
        return self.host.call(request, method, f"http://127.0.0.1:{SUPERVISOR_PORT}{path}",
                              headers={"Authorization": f"Bearer {ENV['SERVICE_API_TOKEN']}"}, timeout=timeout)

    def status(self) -> dict:
        return self.api("GET", "/api/v1/status").json

    def metric(self, sample: str) -> float:
        """One sample of this host's gateway metrics (0 when absent), read from the client namespace."""
        return gateway_metric(self.gateway, sample)


@dataclass
class Cluster:
    network: Network
    client: Host
    hosts: dict[str, StackHost]
    redis: RedisServer
    balancer: HAProxy
    notes: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        """HAProxy's frontend: where clients send everything."""
        return f"http://{self.network.subnet}.{BALANCER}:{BALANCER_PORT}"

    def call(self, fn, *args, **kwargs):
        """``fn`` in the client namespace."""
        return self.client.call(fn, *args, **kwargs)


def gateway_metric(gateway: str, sample: str) -> float:
    text = get(gateway + "/metrics", headers={"Authorization": f"Bearer {ENV['SERVICE_METRICS_TOKEN']}"},
               timeout=10).body.decode()
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def write_host(root: Path, name: str, subnet: str) -> Path:
    """One host's configuration tree; the same keys, catalog and [cluster] peers on every host."""
    servers, profiles = root / "server", root / "profiles"
    servers.mkdir(parents=True)
    profiles.mkdir()
    write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=MODEL_PORT, async_enabled=True,
                 max_batch_size=1)
    (profiles / "cpu.toml").write_text('device = "cpu"\nmodels = ["TESTFAULTS"]\n')
    keys = root / "api_keys.toml"
    keys.write_text(auth.key_entry("limited", auth.hash_key(KEYS["limited"]), qps=LIMITED_QPS)
                    + auth.key_entry("free", auth.hash_key(KEYS["free"])))
    peers = ", ".join(f'{h} = "http://{subnet}.{n}:{GATEWAY_PORT}"' for h, n in HOSTS.items())
    config = root / "service.toml"
    config.write_text(
        f'[gateway]\nhost = "{subnet}.{HOSTS[name]}"\nport = {GATEWAY_PORT}\nkeys_file = "{keys}"\n'
        f'servers_dir = "{servers}"\nrate_limit_store = "redis://{subnet}.{REDIS}:6379/0"\n'
        # A check slower than the default 100 ms (a loaded CI machine) is checked locally, and the shared limit the
        # tests count becomes each gateway's own (a CI run admitted 14 where 10 were due): Redis going away is
        # what they test, by stopping it.
        'rate_limit_timeout_ms = 2000\n'
        f'[supervisor]\nport = {SUPERVISOR_PORT}\nprofile = "cpu"\nservers_dir = "{servers}"\n'
        f'profiles_dir = "{profiles}"\nlog_dir = "{root / "logs"}"\nstop_grace_ms = 5000\n'
        f'[cluster]\nhost_id = "{name}"\npeers = {{ {peers} }}\n')
    return config


def start_supervisor(host: StackHost) -> Proc:
    """The host's supervisor, started in its namespace on the configuration ``write_host`` wrote (again after a stop)."""
    popen, log = spawn(host.host.command(sys.executable, "-m", "twisted", "--log-format", "text",
                                         "service-supervisor", "--config", str(host.root / "service.toml")),
                       env=child_env(ENV), log_dir=host.root)
    host.supervisor = Proc(popen, SUPERVISOR_PORT, log)
    return host.supervisor


def ready(host: StackHost) -> bool:
    try:
        status = host.status()
    except OSError:
        return False
    gateway, [model] = status["gateway"], status["servers"]
    return gateway["state"] == "running" and gateway["ready"] and model["state"] == "running" and model["ready"]


@contextmanager
def running_cluster(root: Path) -> Iterator[Cluster]:
    """The three hosts, Redis and HAProxy, every one ready; everything stopped and deleted afterwards."""
    require_root()
    require(REDIS_SERVER, REDIS_CLI, HAPROXY)
    network = Network()
    started: list = []
    try:
        subnet = network.subnet
        redis_host = network.add("redis", REDIS)
        redis = RedisServer(redis_host.address, 6379, prefix=redis_host.command()).start()
        started.append(redis)
        hosts = {}
        for name, last in HOSTS.items():
            host = StackHost(name, network.add(name, last), root / name)
            write_host(host.root, name, subnet)
            start_supervisor(host)
            started.append(host)
            hosts[name] = host
        balancer_host = network.add("lb", BALANCER)
        balancer = HAProxy(root, f"{balancer_host.address}:{BALANCER_PORT}",
                           {name: f"{subnet}.{n}:{GATEWAY_PORT}" for name, n in HOSTS.items()},
                           balancer_host.command()).start()
        started.append(balancer)
        client = network.add("client", CLIENT)
        for host in hosts.values():
            wait_until(lambda h=host: ready(h) or not h.supervisor.alive(), f"{host.name} ready", timeout=180)
            assert host.supervisor.alive(), host.supervisor.output()[-3000:]
        wait_until(lambda: set(balancer.servers_state().values()) == {"UP"} or balancer.popen.poll() is not None,
                   "HAProxy sees every gateway UP", timeout=30)
        assert balancer.popen.poll() is None, balancer.output()
        yield Cluster(network, client, hosts, redis, balancer)
    finally:
        for thing in reversed(started):
            if isinstance(thing, StackHost):
                if thing.supervisor is not None:
                    thing.supervisor.stop(signal.SIGTERM, timeout=30)
            else:
                thing.stop()
        network.close()
