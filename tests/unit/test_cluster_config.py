"""Settings of a cluster host: [cluster], rate_limit_store, the cluster token and the refusals they bring."""

from __future__ import annotations

import re
import subprocess

import pytest

from svc.auth import Refused, cluster_problem, decide, hash_key, key_entry
from svc.cluster_config import CLUSTER_KEYS, ClusterConfig, load_cluster_config, own_entry_problem
from svc.config import ConfigError
from svc.gateway import tap as gateway_tap
from svc.gateway.config import RedisAddress, load_gateway_config, redis_address
from svc.gateway.ratestore import LocalRates, RedisRates
from svc.supervisor import tap as supervisor_tap
from svc.supervisor.config import load_supervisor_config
from svc.supervisor.manager import GATEWAY
from svc.supervisor.preflight import gateway_refusal
from svc.supervisor.probe import HttpProbe
from tests.support.haproxy import HAPROXY, SHIPPED, config_for
from tests.support.processes import REPO
from tests.support.redis import require
from tests.unit.test_supervisor_manager import manager as child_manager
from tests.unit.test_taps import INFERENCE, METRICS, SERVERS, build, environment, refusal  # noqa: F401

PEERS = '[cluster]\nhost_id = "h1"\npeers = { h1 = "http://10.0.0.1:8080", h2 = "http://10.0.0.2:8080/" }\n'


def write(tmp_path, text: str) -> str:
    path = tmp_path / "service.toml"
    path.write_text(text)
    return str(path)


def test_no_table_is_a_single_host(tmp_path):
    config = load_cluster_config(write(tmp_path, "[gateway]\nport = 8080\n"))
    assert config == ClusterConfig.single_host() and not config.enabled
    assert (config.host_id, config.peers, config.peer_timeout_ms, config.peer_connect_timeout_ms) == ("", {}, 10000, 2000)
    assert [k.name for k in CLUSTER_KEYS] == ["host_id", "peers", "peer_timeout_ms", "peer_connect_timeout_ms"]


def test_a_cluster_table(tmp_path):
    path = write(tmp_path, PEERS + "peer_timeout_ms = 4000\n")
    config = load_cluster_config(path)
    assert config.enabled and config.host_id == "h1" and config.peer_timeout_ms == 4000
    assert config.peers == {"h1": "http://10.0.0.1:8080", "h2": "http://10.0.0.2:8080"}
    # The gateway and the supervisor read the same table.
    assert load_gateway_config(path).cluster == config == load_supervisor_config(path).cluster


@pytest.mark.parametrize("table, key, problem", [
    ('host_id = "H1"\n', "cluster.host_id", "must match"),
    ('host_id = "-a"\n', "cluster.host_id", "must match"),
    ('peers = ["http://10.0.0.1:8080"]\n', "cluster.peers", "must be a table of host id"),
    ('host_id = "a"\npeers = { "A_B" = "http://10.0.0.1:8080" }\n', "cluster.peers.A_B", "a host id must match"),
    ('host_id = "a"\npeers = { b = "https://10.0.0.2:8080" }\n', "cluster.peers.b", "must be http://ADDRESS:PORT"),
    ('host_id = "a"\npeers = { b = "http://10.0.0.2" }\n', "cluster.peers.b", "must name the gateway's port"),
    ('host_id = "a"\npeers = { b = "http://10.0.0.2:8080/v1" }\n', "cluster.peers.b", "without a path"),
    ('host_id = "a"\npeers = { b = "http://u:p@10.0.0.2:8080" }\n', "cluster.peers.b", "without a path, query or user"),
    ('host_id = "a"\npeers = { b = 8080 }\n', "cluster.peers.b", "must be a string"),
    ('host_id = "a"\npeers = { b = "http://[fd00::2]:8080" }\n', "cluster.peers.b", "an IPv4 address or a host name"),
    ('peers = { b = "http://10.0.0.2:8080" }\n', "cluster.host_id", "required when cluster.peers is set"),
    ('host_id = "a"\npeer_timeout_ms = 0\n', "cluster.peer_timeout_ms", "must be at least 1"),
    ('hosts = 3\n', "cluster.hosts", "unknown key"),
])
def test_cluster_problems_are_one_line_naming_the_key(tmp_path, table, key, problem):
    path = write(tmp_path, "[cluster]\n" + table)
    for load in (load_cluster_config, load_gateway_config, load_supervisor_config):
        with pytest.raises(ConfigError) as e:
            load(path)
        assert str(e.value).startswith(f"{path}: {key}: ") and problem in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value, expected", [
    ("local", None),
    ("redis://10.0.0.5:6380/2", RedisAddress("10.0.0.5", 6380, 2)),
    ("redis://redis.internal", RedisAddress("redis.internal", 6379, 0)),
    ("redis://[::1]:6379/0", RedisAddress("::1", 6379, 0)),
])
def test_rate_limit_store_values(value, expected):
    assert redis_address(value) == expected


@pytest.mark.parametrize("value, problem", [
    ("memcached://10.0.0.5", 'must be "local" or "redis://HOST:PORT/DB"'),
    ("Local", 'must be "local" or "redis://HOST:PORT/DB"'),
    ("redis://10.0.0.5:6379/16", "the database must be a number 0-15"),
    ("redis://10.0.0.5:6379/x", "the database must be a number 0-15"),
    ("redis://:secret@10.0.0.5:6379/0", "without a user, password or query"),
    ("redis://10.0.0.5:99999/0", "is not a URL"),
])
def test_bad_rate_limit_stores_are_refused_in_one_line(tmp_path, value, problem):
    path = write(tmp_path, f'[gateway]\nrate_limit_store = "{value}"\n')
    with pytest.raises(ConfigError) as e:
        load_gateway_config(path)
    assert str(e.value).startswith(f"{path}: gateway.rate_limit_store: ") and problem in str(e.value)


@pytest.mark.parametrize("env, peers, expected", [
    ({}, False, None),
    ({"SERVICE_CLUSTER_TOKEN": "c"}, False, None),
    ({"SERVICE_CLUSTER_TOKEN": "c", "SERVICE_JOB_SECRET": "s"}, True, None),
    ({"SERVICE_JOB_SECRET": "s"}, True, "[cluster] peers is set but SERVICE_CLUSTER_TOKEN is not"),
    ({"SERVICE_CLUSTER_TOKEN": "c"}, True, "[cluster] peers is set but SERVICE_JOB_SECRET is not"),
    ({"SERVICE_CLUSTER_TOKEN": "t", "SERVICE_GATEWAY_AUTH_TOKEN": "t"}, False,
     "SERVICE_CLUSTER_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN"),
    ({"SERVICE_CLUSTER_TOKEN": "t", "SERVICE_API_TOKEN": "t"}, True, "SERVICE_CLUSTER_TOKEN equals SERVICE_API_TOKEN"),
    ({"SERVICE_CLUSTER_TOKEN": "t", "SERVICE_METRICS_TOKEN": "t"}, False,
     "SERVICE_CLUSTER_TOKEN equals SERVICE_METRICS_TOKEN"),
    ({"SERVICE_CLUSTER_TOKEN": "t", "SERVICE_JOB_SECRET": "t"}, True, "SERVICE_CLUSTER_TOKEN equals SERVICE_JOB_SECRET"),
])
def test_cluster_problem_rules(env, peers, expected):
    problem = cluster_problem(env, peers)
    assert problem == expected if expected is None else expected in problem
    # The supervisor refuses to spawn the gateway for the same reasons.
    refused = gateway_refusal({"SERVICE_API_TOKEN": "a", "SERVICE_METRICS_TOKEN": "m", **env}, peers)
    assert refused is None if expected is None else refused == f"{problem} (set it and restart the supervisor)"


def test_the_cluster_token_cannot_be_an_api_key(tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text(key_entry("tenant", hash_key("a" * 64)))
    env = {"SERVICE_METRICS_TOKEN": METRICS, "SERVICE_CLUSTER_TOKEN": "a" * 64}
    with pytest.raises(Refused, match=f"SERVICE_CLUSTER_TOKEN is the API key tenant of {keys}"):
        decide(env, str(keys))
    assert decide({**env, "SERVICE_CLUSTER_TOKEN": "b" * 64}, str(keys)).cluster_token == "b" * 64


@pytest.fixture
def cluster_gateway_config(tmp_path, environment):  # noqa: F811
    environment.setenv("SERVICE_METRICS_TOKEN", METRICS)
    environment.setenv("SERVICE_GATEWAY_AUTH_TOKEN", INFERENCE)
    environment.setenv("SERVICE_CLUSTER_TOKEN", "cluster-" + "4" * 20)
    environment.setenv("SERVICE_JOB_SECRET", "secret-" + "5" * 20)
    config = tmp_path / "service.toml"
    config.write_text(f'[gateway]\nhost = "10.0.0.1"\nport = 18080\nservers_dir = "{SERVERS}"\n'
                      f'keys_file = "{tmp_path / "none.toml"}"\nrate_limit_store = "redis://10.0.0.9:6379/1"\n'
                      + PEERS)
    return config


def test_a_cluster_gateways_tree(cluster_gateway_config):
    service, _ = build(gateway_tap, ["--config", str(cluster_gateway_config)])
    assert isinstance(service.rates, RedisRates) and service.rates.parent is service
    assert (service.rates.address, service.rates.timeout_s, service.rates.retry_s) == (
        RedisAddress("10.0.0.9", 6379, 1), 0.1, 1.0)
    assert service.app.rates is service.rates and service.app.cluster is service.cluster
    assert (service.cluster.host_id, service.cluster.peers, service.cluster.secret) == (
        "h1", {"h2": "http://10.0.0.2:8080"}, "secret-" + "5" * 20)
    assert service.cluster.describe() == "host h1 with peers h2"
    assert service.setup.cluster_token == "cluster-" + "4" * 20
    assert service.metrics.ratelimit_store_up._value.get() == 0  # until connected


def test_a_single_hosts_gateway_keeps_local_buckets(cluster_gateway_config, tmp_path):
    plain = tmp_path / "plain.toml"
    plain.write_text(f'[gateway]\nport = 18080\nservers_dir = "{SERVERS}"\nkeys_file = "{tmp_path / "none.toml"}"\n')
    service, _ = build(gateway_tap, ["--config", str(plain)])
    assert isinstance(service.rates, LocalRates) and service.cluster.describe() == "a single host"
    assert service.metrics.ratelimit_store_up._value.get() == 1


def test_gateway_cluster_refusals(cluster_gateway_config, environment):  # noqa: F811
    config = str(cluster_gateway_config)
    environment.delenv("SERVICE_CLUSTER_TOKEN")
    assert refusal(gateway_tap, ["--config", config]) == (
        "service-gateway: [cluster] peers is set but SERVICE_CLUSTER_TOKEN is not: the gateways of a cluster "
        "authenticate to one another with it (the same value on every host)")
    environment.setenv("SERVICE_CLUSTER_TOKEN", INFERENCE)
    assert refusal(gateway_tap, ["--config", config]) == (
        "service-gateway: SERVICE_CLUSTER_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN: the cluster token must differ "
        "from every other token")
    environment.setenv("SERVICE_CLUSTER_TOKEN", "cluster-" + "4" * 20)
    environment.delenv("SERVICE_JOB_SECRET")
    assert "[cluster] peers is set but SERVICE_JOB_SECRET is not" in refusal(gateway_tap, ["--config", config])
    environment.setenv("SERVICE_JOB_SECRET", "secret-" + "5" * 20)
    environment.setenv("SERVICE_HOST_ID", "h2")
    assert refusal(gateway_tap, ["--config", config]) == (
        "service-gateway: SERVICE_HOST_ID='h2' differs from [cluster] host_id 'h1': the model servers would mint "
        "job ids this gateway does not take for its own")
    environment.setenv("SERVICE_HOST_ID", "h1")
    build(gateway_tap, ["--config", config])  # agrees: accepted


def test_the_supervisor_gives_every_child_the_host_id_and_refuses_a_gateway_without_the_cluster_token(tmp_path):
    m, reactor, probe, _ = child_manager(tmp_path)
    assert m.config.cluster.host_id == ""
    assert {spec_env["SERVICE_HOST_ID"] for spec_env in (c.spec.env for c in m.children.values())} == {""}
    conf = tmp_path / "service.toml"
    conf.write_text(f'[supervisor]\nlog_dir = "{tmp_path / "logs"}"\n' + PEERS)
    config = load_supervisor_config(str(conf))
    from svc.supervisor.manager import ChildManager
    from tests.unit.test_supervisor_manager import ENV, FakeSocket, catalog

    def manager_with(env):
        return ChildManager(reactor=reactor, config=config, profile=m.profile, probe=probe, env=env,
                            catalog=catalog(tmp_path), port_free=lambda port: True, binder=FakeSocket.bind)

    refused = manager_with({**ENV, "SERVICE_HOST_ID": "stale"})
    assert {c.spec.env["SERVICE_HOST_ID"] for c in refused.children.values()} == {"h1"}  # the config's, always
    assert "[cluster] peers is set but SERVICE_CLUSTER_TOKEN is not" in refused.children[GATEWAY].spec.refused
    accepted = manager_with({**ENV, "SERVICE_CLUSTER_TOKEN": "c" * 20, "SERVICE_JOB_SECRET": "s" * 20})
    assert accepted.children[GATEWAY].spec.refused is None
    assert {c.spec.env["SERVICE_JOB_SECRET"] for c in accepted.children.values()} == {"s" * 20}


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", "http://127.0.0.1:18080/healthz"),
    ("0.0.0.0", "http://127.0.0.1:18080/healthz"),
    ("10.0.0.1", "http://10.0.0.1:18080/healthz"),
    ("fd00::1", "http://[fd00::1]:18080/healthz"),
])
def test_the_supervisor_probes_its_gateway_where_it_listens(tmp_path, environment, host, expected):  # noqa: F811
    environment.setenv("SERVICE_API_TOKEN", "m" * 20)
    environment.setenv("SERVICE_METRICS_TOKEN", "x" * 20)
    environment.setenv("SERVICE_EXPOSE", "unsafe")
    conf = tmp_path / "service.toml"
    conf.write_text(f'[gateway]\nhost = "{host}"\nport = 18080\n[supervisor]\nport = 18787\n'
                    f'servers_dir = "{SERVERS}"\nlog_dir = "{tmp_path / "logs"}"\n')
    service, _ = build(supervisor_tap, ["--config", str(conf), "--profile", "cpu"])
    probe = service.manager.children[GATEWAY].probe
    assert isinstance(probe, HttpProbe)
    assert probe.url(18080, "/healthz") == expected
    assert probe.url(9101, "/ready") == "http://127.0.0.1:9101/ready"  # model servers: loopback always


def test_the_docs_worked_example_loads(tmp_path):
    page = (REPO / "docs" / "scaling.md").read_text()
    example = page.split("## A worked example: three hosts", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```toml\n(.*?)```", example, re.S)
    text = "\n".join(line[3:] for line in block.splitlines())  # the block is indented in a list item
    path = write(tmp_path, text)
    gateway, supervisor = load_gateway_config(path), load_supervisor_config(path)
    assert (gateway.host, gateway.port, gateway.rate_limit_store) == ("10.0.0.1", 8080, "redis://10.0.0.9:6379/0")
    assert gateway.cluster == supervisor.cluster and gateway.cluster.host_id == "h1"
    assert gateway.cluster.peers == {f"h{i}": f"http://10.0.0.{i}:8080" for i in (1, 2, 3)}


def test_the_shipped_haproxy_config_is_valid_and_makes_the_tests_config(tmp_path):
    require(HAPROXY)
    shipped = subprocess.run([HAPROXY, "-c", "-f", str(SHIPPED)], capture_output=True, text=True)
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    text = config_for("10.1.0.9:80", {"a": "10.1.0.1:8080", "b": "10.1.0.2:8080"}, tmp_path / "s.sock")
    assert "    bind 10.1.0.9:80\n" in text and f"stats socket {tmp_path / 's.sock'} " in text
    assert re.findall(r"^    server .*$", text, re.M) == ["    server a 10.1.0.1:8080", "    server b 10.1.0.2:8080"]
    assert "http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host gateway hdr User-Agent service-balancer-check" \
        in text and "retry-on conn-failure empty-response" in text
    (tmp_path / "haproxy.cfg").write_text(text)
    made = subprocess.run([HAPROXY, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr


def test_without_root_or_the_debian_programs_the_scale_out_tests_fail_in_one_line(monkeypatch):
    from tests.support import netns

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.fail.Exception) as no_root:
        netns.require_root()
    assert str(no_root.value) == ("the multi-host tests need root for network namespaces (ip netns): run tox as "
                                  "root")
    with pytest.raises(pytest.fail.Exception) as missing:
        require("/usr/sbin/no-such-haproxy")
    assert str(missing.value) == ("missing /usr/sbin/no-such-haproxy: run bin/ensure-scaleout as root (tox does) to "
                                  "install Debian's redis-server and haproxy")


def test_a_host_id_left_at_another_hosts_id_is_seen_from_the_port():
    """A table copied to h3 with host_id still "h2": h3 signed its jobs as h2's, and reads of them through the
    other hosts went to h2 and were 404, with no line anywhere.  The gateway warns at start."""
    peers = {"h1": "http://10.0.0.1:8080", "h2": "http://10.0.0.2:8081", "h3": "http://10.0.0.3:8082"}
    copied = ClusterConfig(host_id="h2", peers=peers, peer_timeout_ms=1000, peer_connect_timeout_ms=500)
    assert own_entry_problem(copied, 8082) == (
        "cluster.peers.h2 is http://10.0.0.2:8081, but this gateway listens on port 8082: is host_id 'h2' this "
        "host's id? Its peers send the reads of its jobs to http://10.0.0.2:8081")
    assert own_entry_problem(ClusterConfig(host_id="h3", peers=peers, peer_timeout_ms=1000, peer_connect_timeout_ms=500), 8082) is None
    assert own_entry_problem(ClusterConfig.single_host(), 8080) is None
    assert own_entry_problem(ClusterConfig(host_id="h9", peers=peers, peer_timeout_ms=1000, peer_connect_timeout_ms=500), 8080) is None  # no entry of its own


def test_the_probe_reaches_a_gateway_on_an_ipv6_address():
    """A probe's fetch with an IPv6 literal in its URL raised in treq (hyperlink runs the host through IDNA): the
    supervisor of a gateway on ``::1`` logged critical tracebacks and its series stopped (a regression probe).
    Every request names 127.0.0.1 and the endpoint connects where the child listens."""
    from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint
    from twisted.internet.testing import MemoryReactorClock
    from twisted.web.client import URI

    from svc.web.client import AddressByPort

    reactor = MemoryReactorClock()
    probe = HttpProbe(reactor, hosts={18080: "[::1]"})
    outcomes = []
    probe(18080, "/healthz").addBoth(outcomes.append)
    probe.fetch(18080, "/metrics").addBoth(outcomes.append)
    reactor.advance(probe.timeout)
    assert [bool(outcomes[0]), outcomes[1]] == [False, None]  # nothing listens in a memory reactor: not ready
    addresses = AddressByPort(reactor, {18080: "[::1]"}, 2.0)
    gateway = addresses.endpointForURI(URI.fromBytes(b"http://127.0.0.1:18080/healthz"))
    model = addresses.endpointForURI(URI.fromBytes(b"http://127.0.0.1:9101/ready"))
    assert isinstance(gateway, HostnameEndpoint) and gateway._hostText == "::1" and gateway._port == 18080
    assert isinstance(model, TCP4ClientEndpoint) and (model._host, model._port) == ("127.0.0.1", 9101)
    tls = addresses.endpointForURI(URI.fromBytes(b"https://127.0.0.1:18080/"))  # svcctl --gateway https://[::1]:...
    assert tls._wrappedEndpoint._hostText == "::1" and tls._wrapperFactory is not None  # TLS over that address
