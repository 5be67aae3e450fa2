"""Replicas in the supervisor, on a fake reactor: the layout, each replica's child, the model-level actions.

Every replica is a real :class:`svc.supervisor.child.Child` spawned through
the fake reactor of test_supervisor_child (nothing runs); readiness comes
from a probe that answers per port, so a test says which replica is ready.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from twisted.internet.defer import succeed
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.python.failure import Failure

from svc.config import ConfigError, load_model_server_config
from svc.infra.replicas import PORT_STRIDE, find_clash, replica_name, replica_ports
from svc.supervisor.child import BACKOFF, FAILED, RUNNING, START_FAILED, STARTING, STOPPED, STOPPING, ChildError
from svc.supervisor.config import Profile, ServerSettings, load_supervisor_config
from svc.supervisor.manager import GATEWAY, ChildManager
from svc.supervisor.metrics import ChildCollector
from tests.unit.test_supervisor_child import ProcessReactor, results
from tests.unit.test_supervisor_manager import ENV, FakeSocket


class PortProbe:
    """Readiness per port: a port in ``ready`` answers 200."""

    def __init__(self) -> None:
        self.ready: set[int] = set()

    def __call__(self, port: int, path: str):
        return succeed(port in self.ready)


def models(tmp_path, *specs):
    configs = []
    for mid, port in specs:
        path = tmp_path / f"{mid}.toml"
        path.write_text(f'id = "{mid}"\nport = {port}\nserver_uri = "/{mid.lower()}"\n')
        configs.append(load_model_server_config(str(path)))
    return configs


def manager(tmp_path, servers="", *, catalog=(("AAA", 9300), ("BBB", 9301)), profile=("AAA", "BBB"), gateway=8080,
            probe_interval_ms=1000):
    conf = tmp_path / "service.toml"
    conf.write_text(f'[gateway]\nport = {gateway}\nreplica_probe_interval_ms = {probe_interval_ms}\n'
                    f'[supervisor]\nlog_dir = "{tmp_path / "logs"}"\n{servers}')
    reactor, probe, kills = ProcessReactor(), PortProbe(), []
    m = ChildManager(reactor=reactor, config=load_supervisor_config(str(conf)), profile=Profile("cpu", "cpu", profile),
                     probe=probe, env=ENV, killer=lambda pid, sig: kills.append((pid, sig)),
                     catalog=models(tmp_path, *catalog), port_free=lambda port: True, binder=FakeSocket.bind)
    return m, reactor, probe, kills


def spawned(reactor, child):
    """What ``child``'s current process was spawned with: (argv of the command, env)."""
    for protocol, _, args, env, _ in reactor.spawned:
        if protocol is child._protocol:
            return args[4:], env  # after the wrapper: -P -c GROUP_LEADER
    raise AssertionError(f"{child.name} has no process")


def end(child, code=0, sig=None):
    """``child``'s process exits."""
    reason = ProcessDone(0) if code == 0 and sig is None else ProcessTerminated(code, sig)
    child._protocol.processEnded(Failure(reason))


TWO = "[servers.AAA]\nreplicas = 2\n"


# -- the layout ------------------------------------------------------------------------------------


def test_replica_ports_follow_the_stride_unless_listed():
    assert PORT_STRIDE == 100
    assert replica_ports(9101, 1) == (9101,)
    assert replica_ports(9101, 3) == (9101, 9201, 9301)
    assert replica_ports(9101, 2, (9500, 9600)) == (9500, 9600)
    with pytest.raises(ValueError, match=r"lists 1 port\(s\) for 2 replica\(s\)"):
        replica_ports(9101, 2, (9500,))
    with pytest.raises(ValueError, match="replica 2 would listen on port 65536 \\(port 65336 \\+ 2 x 100\\), above"):
        replica_ports(65336, 3)
    assert replica_ports(65335, 3) == (65335, 65435, 65535)
    assert (replica_name("M", 0, 1), replica_name("M", 0, 2), replica_name("M", 1, 2)) == ("M", "M.0", "M.1")
    assert find_clash([(1, "a"), (2, "b"), (1, "c")]) == "port 1 is used twice: by a and by c"
    assert find_clash([(1, "a"), (2, "b")]) is None


@pytest.mark.parametrize("table, message", [
    ("replicas = 0", "servers.AAA.replicas: must be at least 1, got 0"),
    ("replicas = 65", "servers.AAA.replicas: must be at most 64, got 65"),
    ("replicas = 2\nports = [9300]", "servers.AAA.ports: lists 1 port(s) for 2 replica(s) (replicas): give one port "
                                     "per replica"),
    ("replicas = 3\nports = [9300, 9301, 9300]", "servers.AAA.ports: port 9300 is used twice: by replica 0 and by "
                                                 "replica 2"),
    ('ports = ["9300"]', "servers.AAA.ports: must be an array of integers (1 to 65535), got '9300' in it"),
    ("ports = [70000]", "servers.AAA.ports: must be an array of integers (1 to 65535), got 70000 in it"),
    ("devices = [-1]", "servers.AAA.devices: must be an array of integers (at least 0), got -1 in it"),
    ("devices = 0", "servers.AAA.devices: must be an array, got integer 0"),
    ("cpus = [0, 1]", "servers.AAA.cpus: must be an array of CPU lists such as [[0, 1], [2, 3]], got 0 in it"),
    ("cpus = [[]]", "servers.AAA.cpus: must be an array of CPU lists such as [[0, 1], [2, 3]], got [] in it"),
    ("cpus = [[100000]]", "servers.AAA.cpus: CPU 100000 is not available on this host (available: "),
    ("replica = 2", "servers.AAA.replica: unknown key; known keys: cpus, devices, ports, replicas, restart"),
])
def test_server_tables_are_checked(tmp_path, table, message):
    conf = tmp_path / "service.toml"
    conf.write_text(f"[servers.AAA]\n{table}\n")
    with pytest.raises(ConfigError) as error:
        load_supervisor_config(str(conf))
    assert str(error.value).startswith(f"{conf}: {message}"), str(error.value)


def test_server_settings_per_replica():
    cpu0 = min(os.sched_getaffinity(0))
    settings = ServerSettings(replicas=3, devices=(0, 1), cpus=((cpu0,), (cpu0, cpu0 + 1)))
    assert [settings.gpu_of(i) for i in range(3)] == [0, 1, 0]
    assert [settings.cpus_of(i) for i in range(3)] == [(cpu0,), (cpu0, cpu0 + 1), (cpu0,)]
    assert [settings.cpu_share(i) for i in range(3)] == [3, 3, 3]  # all three run on cpu0
    assert ServerSettings(replicas=4).cpu_share(1) == 4 and ServerSettings().gpu_of(0) is None
    # Lists that overlap share their common CPUs: the third replica on both cores runs one thread, not two.
    overlapping = ServerSettings(replicas=3, cpus=((0,), (1,), (0, 1)))
    assert [overlapping.cpu_share(i) for i in range(3)] == [2, 2, 2]
    assert [ServerSettings(replicas=2, cpus=((0, 1), (1, 2))).cpu_share(i) for i in range(2)] == [2, 2]


@pytest.mark.parametrize("servers, gateway, message", [
    ("[servers.AAA]\nreplicas = 2\nports = [9300, 9301]\n", 8080,
     "port 9301 is used twice: by AAA replica 1 ([servers.AAA] of {conf}) and by BBB ({tmp}/BBB.toml)"),
    ("[servers.AAA]\nreplicas = 2\n", 9400,
     "port 9400 is used twice: by the gateway ([gateway] port) and by AAA replica 1 ([servers.AAA] of {conf})"),
    ("[servers.BBB]\nports = [8787]\n", 8080,
     "port 8787 is used twice: by the supervisor ([supervisor] port) and by BBB ([servers.BBB] of {conf})"),
    ("[servers.AAA]\nreplicas = 2\n[servers.BBB]\nports = [9400]\n", 8080,
     "port 9400 is used twice: by AAA replica 1 ([servers.AAA] of {conf}) and by BBB ([servers.BBB] of {conf})"),
])
def test_a_port_used_twice_refuses_to_start_naming_both(tmp_path, servers, gateway, message):
    with pytest.raises(ValueError) as error:
        manager(tmp_path, servers, gateway=gateway)
    assert str(error.value) == message.format(conf=tmp_path / "service.toml", tmp=tmp_path)


def test_a_layout_past_the_last_port_or_for_an_unknown_model_is_refused(tmp_path):
    conf = tmp_path / "service.toml"
    with pytest.raises(ValueError) as error:
        manager(tmp_path, "[servers.AAA]\nreplicas = 3\n", catalog=(("AAA", 65400), ("BBB", 9301)))
    assert str(error.value) == (f"{conf}: servers.AAA: replica 2 would listen on port 65600 (port 65400 + 2 x 100), "
                                "above 65535: list the ports with ports = [...]")
    with pytest.raises(ValueError) as error:
        manager(tmp_path, "[servers.AAB]\nreplicas = 2\n")
    assert str(error.value) == f"{conf}: servers.AAB: no model-server config has this id in conf/server"


def test_the_supervisor_refuses_a_clash_with_one_line(tmp_path, monkeypatch):
    """Through the tap: a refusal (exit 1) before anything listens or is spawned."""
    from svc.supervisor import tap
    from tests.unit.test_taps import build

    monkeypatch.setenv("SERVICE_API_TOKEN", "mgmt")
    monkeypatch.setenv("SERVICE_METRICS_TOKEN", "metrics")
    servers = tmp_path / "servers"
    servers.mkdir()
    models(servers, ("AAA", 9300), ("BBB", 9301))
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "cpu.toml").write_text('device = "cpu"\nmodels = ["AAA"]\n')
    conf = tmp_path / "service.toml"
    conf.write_text(f'[supervisor]\nservers_dir = "{servers}"\nprofiles_dir = "{profiles}"\nprofile = "cpu"\n'
                    "[servers.BBB]\nreplicas = 2\nports = [9301, 9300]\n")
    with pytest.raises(SystemExit) as exit_:
        build(tap, ["--config", str(conf)])
    assert exit_.value.code == (f"service-supervisor: port 9300 is used twice: by AAA ({servers}/AAA.toml) and by "
                                f"BBB replica 1 ([servers.BBB] of {conf})")


# -- one child per replica ----------------------------------------------------------------------------


def test_each_replica_is_a_child_with_its_port_token_index_log_and_env(tmp_path):
    cpu0 = min(os.sched_getaffinity(0))
    m, reactor, probe, _ = manager(tmp_path, f"[servers.AAA]\nreplicas = 3\ndevices = [1, 0]\n"
                                             f"cpus = [[{cpu0}], [{cpu0}]]\nrestart = \"always\"\n")
    assert list(m.children) == [GATEWAY, "AAA.0", "AAA.1", "AAA.2", "BBB"]
    aaa = m.sets["AAA"]
    assert [c.spec.port for c in aaa.children] == [9300, 9400, 9500]
    assert all(c.spec.policy == "always" for c in aaa.children)
    m.start_all()
    probe.ready.add(8080)
    reactor.advance(0.5)
    gateway_env = spawned(reactor, m.gateway)[1]
    assert json.loads(gateway_env["SERVICE_UPSTREAM_PORTS"]) == {"AAA": [9300, 9400, 9500], "BBB": [9301]}
    tokens = json.loads(gateway_env["SERVICE_UPSTREAM_TOKENS"])
    assert len(tokens["AAA"]) == 3 and len({*tokens["AAA"], *tokens["BBB"]}) == 4
    for i, child in enumerate(aaa.children):
        argv, env = spawned(reactor, child)
        assert (env["SERVICE_AUTH_TOKEN"], env["SERVICE_REPLICA"]) == (tokens["AAA"][i], str(i))
        assert env["CUDA_VISIBLE_DEVICES"] == ["1", "0", "1"][i]
        assert env["SERVICE_CPU_AFFINITY"] == str(cpu0)
        assert env["SERVICE_CPU_SHARE"] == "3"  # every replica runs on the same one CPU
        assert env["SERVICE_JOB_SECRET"] == m.job_secret
        assert argv[argv.index("--port") + 1] == str(child.spec.port)  # replica 0's too: its config's, always
        assert m.metrics_token(child.name) == tokens["AAA"][i]
    argv, env = spawned(reactor, m.children["BBB"])
    assert (env["SERVICE_REPLICA"], env["SERVICE_CPU_SHARE"]) == ("0", "1")
    assert argv[argv.index("--port") + 1] == str(m.children["BBB"].spec.port)
    assert "CUDA_VISIBLE_DEVICES" not in env and "SERVICE_CPU_AFFINITY" not in env
    assert "SERVICE_REPLICA" not in gateway_env and "SERVICE_CPU_AFFINITY" not in gateway_env
    for child in aaa.children:
        child.logs.note("hello")
        child.logs.close()
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["AAA.0.log", "AAA.1.log", "AAA.2.log", "BBB.log",
                                                                  "__gateway.log"]


def test_the_inherited_environment_does_not_pin_or_number_a_child(tmp_path):
    conf = tmp_path / "service.toml"
    conf.write_text(f'[supervisor]\nlog_dir = "{tmp_path / "logs"}"\n')
    reactor = ProcessReactor()
    env = {**ENV, "SERVICE_CPU_AFFINITY": "0", "SERVICE_REPLICA": "7", "SERVICE_CPU_SHARE": "9"}
    m = ChildManager(reactor=reactor, config=load_supervisor_config(str(conf)), profile=Profile("cpu", "cpu", ("AAA",)),
                     probe=PortProbe(), env=env, killer=lambda pid, sig: None, catalog=models(tmp_path, ("AAA", 9300)),
                     port_free=lambda port: True, binder=FakeSocket.bind)
    gateway_env = m.gateway.spec.env
    assert not {"SERVICE_CPU_AFFINITY", "SERVICE_REPLICA", "SERVICE_CPU_SHARE"} & set(gateway_env)
    model_env = m.children["AAA"].spec.env
    assert (model_env["SERVICE_REPLICA"], model_env["SERVICE_CPU_SHARE"]) == ("0", "1")
    assert "SERVICE_CPU_AFFINITY" not in model_env


def start_two(tmp_path, servers=TWO):
    m, reactor, probe, kills = manager(tmp_path, servers)
    started = results(m.start_all())
    probe.ready.update({8080, 9300, 9400, 9301})
    reactor.advance(0.5)
    reactor.advance(0.5)
    assert started == [None]
    assert [c.state for c in m.children.values()] == [RUNNING] * 4
    return m, reactor, probe, kills


def test_status_lists_the_replicas_under_their_model_with_an_honest_aggregate(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    status = {s["id"]: s for s in m.status_view()["servers"]}
    aaa, bbb = status["AAA"], status["BBB"]
    assert (aaa["state"], aaa["ready"], aaa["pid"], aaa["restarts"], aaa["port"]) == (RUNNING, True, None, 0, 9300)
    assert [(r["index"], r["name"], r["port"], r["state"], r["ready"], r["restarts"], r["gpu"], r["cpus"])
            for r in aaa["replicas"]] == [(0, "AAA.0", 9300, RUNNING, True, 0, None, None),
                                          (1, "AAA.1", 9400, RUNNING, True, 0, None, None)]
    assert [r["pid"] for r in aaa["replicas"]] == [m.children["AAA.0"].pid, m.children["AAA.1"].pid]
    # A model of one replica: its child's fields as before, and the one replica listed.
    assert (bbb["pid"], bbb["replicas"][0]["name"], bbb["replicas"][0]["pid"]) == (
        m.children["BBB"].pid, "BBB", m.children["BBB"].pid)
    end(m.children["AAA.1"], None, signal.SIGKILL)
    aaa = {s["id"]: s for s in m.status_view()["servers"]}["AAA"]
    assert (aaa["state"], aaa["ready"]) == (RUNNING, True)  # replica 0 still serves
    assert aaa["last_exit"] == "replica 1: killed by signal 9" and aaa["last_error"].startswith("replica 1: killed")
    assert [r["state"] for r in aaa["replicas"]] == [RUNNING, BACKOFF]
    probe.ready.discard(9300)
    reactor.advance(2)
    aaa = {s["id"]: s for s in m.status_view()["servers"]}["AAA"]
    assert (aaa["state"], aaa["ready"]) == (RUNNING, False)  # respawned replica 1 not ready yet, replica 0 not either
    assert aaa["restarts"] == 1


def test_the_aggregate_says_the_exit_of_the_replica_that_exited_last(tmp_path):
    """A replicas probe: replica 1 was killed, and the model said replica 0's exit of an earlier restart (the
    first replica's that had one)."""
    m, reactor, probe, kills = start_two(tmp_path)
    end(m.children["AAA.0"], 3)
    reactor.advance(5)  # respawned
    end(m.children["AAA.1"], None, signal.SIGKILL)
    aaa = {s["id"]: s for s in m.status_view()["servers"]}["AAA"]
    assert [r["last_exit"] for r in aaa["replicas"]] == ["exit code 3", "killed by signal 9"]
    assert aaa["last_exit"] == "replica 1: killed by signal 9" and aaa["last_error"].startswith("replica 1: killed")


def test_a_replica_failing_now_is_the_models_error_before_another_replicas_later_crash(tmp_path):
    """A regression probe: replica 1 could not start (start_failed), then replica 0 was killed and came back; the
    model's last_error named replica 0's crash, which the UI showed muted as mended, and hid replica 1's fault."""
    m, reactor, probe, kills = start_two(tmp_path)
    replica = m.children["AAA.1"]
    results(m.sets["AAA"].replica(1).restart())
    end(replica, 0)
    reactor.advance(0.1)
    end(replica, 1)  # it refuses to start
    assert replica.state == START_FAILED
    reactor.advance(1)
    end(m.children["AAA.0"], None, signal.SIGKILL)  # later, replica 0 crashes, and comes back
    for _ in range(20):
        reactor.advance(0.5)
    assert m.children["AAA.0"].state == RUNNING
    aaa = {s["id"]: s for s in m.status_view()["servers"]}["AAA"]
    assert aaa["last_exit"] == "replica 0: killed by signal 9"  # the last exit
    assert aaa["last_error"].startswith("replica 1: ")  # the fault of now


def test_the_models_weights_are_what_a_ready_replica_loaded_not_the_last_attempt(tmp_path):
    """A UI probe: replica 1 restarted on a weights file that is missing failed its start while replica 0 served
    demo weights, and the model showed "file" (the UI hid its demo-weights banner)."""
    m, reactor, probe, kills = start_two(tmp_path)

    def weights() -> dict:
        return {s["id"]: s for s in m.status_view()["servers"]}["AAA"]["weights"]

    assert weights() == {"kind": "demo", "variant": None}
    config = tmp_path / "AAA.toml"
    config.write_text(config.read_text() + '[model]\nweights = "/missing.pth"\n')
    replica = m.children["AAA.1"]
    restarting = results(m.sets["AAA"].replica(1).restart())
    end(replica, 0)  # the old process's exit: the new one spawns
    reactor.advance(0.1)
    assert m.weights["AAA"][1]["kind"] == "file"  # the attempt's, read from the edited file at its spawn
    end(replica, 1)  # it refuses: no such file
    assert replica.state == START_FAILED and restarting and m.children["AAA.0"].ready
    assert weights() == {"kind": "demo", "variant": None}  # what replica 0 serves
    assert m.catalog_view()[0]["weights"] == {"kind": "demo", "variant": None}


def test_aggregate_state_when_no_replica_runs(tmp_path):
    m, reactor, probe, kills = manager(tmp_path, TWO)
    aaa = m.sets["AAA"]
    assert aaa.snapshot()["state"] == STOPPED and aaa.snapshot()["uptime_s"] is None
    results(aaa.replica(0).start())
    assert aaa.snapshot()["state"] == STARTING
    end(aaa.replica(0), 1)  # refused: start_failed
    assert aaa.snapshot()["state"] == START_FAILED


def test_model_start_and_stop_act_on_every_replica(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    aaa = m.sets["AAA"]
    spawned = len(reactor.spawned)
    assert results(aaa.start()) == [None] and len(reactor.spawned) == spawned  # running: done, nothing spawned
    stopped = results(aaa.stop())
    assert [c.state for c in aaa.children] == [STOPPING, STOPPING] and stopped == []
    assert {(c.pid, signal.SIGTERM) for c in aaa.children} <= set(kills)
    for c in aaa.children:
        end(c)
    assert stopped == [None] and [c.state for c in aaa.children] == [STOPPED, STOPPED]
    assert results(aaa.stop()) == [None]  # stopped already: done
    # start: both, all at once; the action answers when both are ready
    probe.ready.clear()
    started = results(aaa.start())
    assert [c.state for c in aaa.children] == [STARTING, STARTING]
    probe.ready.add(9300)
    reactor.advance(0.5)
    assert started == []
    probe.ready.add(9400)
    reactor.advance(0.5)
    assert started == [None]


def test_model_start_starts_only_the_replicas_that_are_down(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    aaa = m.sets["AAA"]
    results(aaa.replica(1).stop())
    end(aaa.replica(1))
    spawned_before = len(reactor.spawned)
    started = results(aaa.start())
    assert len(reactor.spawned) == spawned_before + 1 and aaa.replica(0).state == RUNNING
    reactor.advance(0.5)
    assert started == [None]


def test_a_replica_that_cannot_start_fails_the_model_start_naming_it(tmp_path):
    m, reactor, probe, kills = manager(tmp_path, TWO)
    started = results(m.sets["AAA"].start())
    end(m.children["AAA.1"], 1)
    probe.ready.add(9300)
    reactor.advance(0.5)
    assert isinstance(started[0], Failure)
    assert str(started[0].value).startswith("AAA replica 1: AAA.1 could not start: ")


def test_restart_is_rolling_one_replica_at_a_time_waiting_for_ready_and_the_gateways_probe(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    aaa = m.sets["AAA"]
    first, second = aaa.children
    pids = [first.pid, second.pid]
    done = results(m.target("AAA").restart())
    assert (first.state, second.state) == (STOPPING, RUNNING) and kills[-1] == (pids[0], signal.SIGTERM)
    end(first)
    assert (first.state, second.state) == (STARTING, RUNNING)
    reactor.advance(0.5)  # ready again (its port answers)
    assert (first.state, second.state) == (RUNNING, RUNNING) and first.pid != pids[0]
    # The gateway probes every second: replica 1 is stopped once replica 0 had a probe interval (+ 0.5 s).
    reactor.advance(1.4)
    assert second.state == RUNNING and second.pid == pids[1]
    reactor.advance(0.1)
    assert second.state == STOPPING and kills[-1] == (pids[1], signal.SIGTERM)
    end(second)
    assert done == []
    reactor.advance(0.5)
    assert done == [None] and [c.state for c in aaa.children] == [RUNNING, RUNNING]
    assert [c.restarts for c in aaa.children] == [1, 1] and aaa.snapshot()["restarts"] == 2
    assert second.pid != pids[1]


def test_a_replica_that_does_not_come_back_stops_the_roll_and_the_others_keep_running(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    aaa = m.sets["AAA"]
    done = results(aaa.restart())
    end(aaa.replica(0))
    end(aaa.replica(0), 1, None)  # the new process refuses to start
    assert isinstance(done[0], Failure) and done[0].check(ChildError)
    assert str(done[0].value).startswith("AAA: the rolling restart stopped at replica 0 (the others keep running): "
                                         "AAA.0 could not start: ")
    assert (aaa.replica(0).state, aaa.replica(1).state) == (START_FAILED, RUNNING)


def test_a_stop_during_a_roll_ends_it_and_no_replica_starts_again(tmp_path):
    """A model stop while its roll restarted replica 0: every replica ended stopped, as asked, but the roll's
    500 said it "stopped at replica 0 (the others keep running)" (a replicas probe); and a stop during the pause
    between replicas let the roll restart the next one.  The roll now ends with the documented
    "stopped before it started again", and nothing is started after the stop."""
    m, reactor, probe, kills = start_two(tmp_path)
    aaa = m.sets["AAA"]
    done = results(aaa.restart())
    stopped = results(aaa.stop())  # replica 0 is stopping for the roll; replica 1 runs
    end(aaa.replica(0))
    end(aaa.replica(1))
    assert isinstance(done[0], Failure) and str(done[0].value) == "AAA: stopped before it started again"
    assert stopped == [None] and [c.state for c in aaa.children] == [STOPPED, STOPPED] and not aaa.rolling
    # Stopped during the pause between two replicas: the second one is not restarted.
    results(aaa.start())
    reactor.advance(0.5)
    done = results(aaa.restart())
    end(aaa.replica(0))
    reactor.advance(0.5)  # replica 0 is back; the roll waits for the gateway's probe before replica 1
    stopped = results(aaa.stop())
    end(aaa.replica(0))
    end(aaa.replica(1))
    spawned = len(reactor.spawned)
    reactor.advance(2.0)
    assert isinstance(done[0], Failure) and str(done[0].value) == "AAA: stopped before it started again"
    assert len(reactor.spawned) == spawned and [c.state for c in aaa.children] == [STOPPED, STOPPED]
    # The supervisor's own shutdown during a roll is a stop too (a regression probe: "the others keep running").
    results(aaa.start())
    reactor.advance(0.5)
    done = results(aaa.restart())
    results(aaa.shutdown())
    end(aaa.replica(0))
    end(aaa.replica(1))
    assert isinstance(done[0], Failure) and str(done[0].value) == "AAA: stopped before it started again"


def test_a_roll_restarts_the_replica_that_serves_nothing_first(tmp_path):
    """Replica 1 stopped (or crashed), then a model restart: the roll stopped replica 0, the only one
    serving, and the model answered 503 for seconds. Now replica 1 comes back first."""
    m, reactor, probe, kills = start_two(tmp_path)
    aaa = m.sets["AAA"]
    first, second = aaa.children
    results(second.stop())
    end(second)
    pid = first.pid
    done = results(aaa.restart())
    assert (first.state, first.pid, second.state) == (RUNNING, pid, STARTING)  # replica 0 keeps serving
    reactor.advance(0.5)
    assert second.state == RUNNING and first.state == RUNNING
    reactor.advance(1.5)  # the gateway's probe interval (+ 0.5 s): now replica 0
    assert first.state == STOPPING and second.state == RUNNING
    end(first)
    reactor.advance(0.5)
    assert done == [None] and [c.state for c in aaa.children] == [RUNNING, RUNNING] and first.pid != pid


def test_a_roll_never_restarts_the_only_replica_that_serves(tmp_path):
    """Replica 1 is restarted first (it was down) and comes back, then fails its probe while the roll waits
    for the gateway to see it: replica 0, the only one serving then, is not stopped; the roll fails."""
    m, reactor, probe, kills = manager(tmp_path, TWO, probe_interval_ms=3000)  # settle 3.5 s > a 2 s probe
    started = results(m.start_all())
    probe.ready.update({8080, 9300, 9400, 9301})
    reactor.advance(0.5)
    reactor.advance(0.5)
    assert started == [None]
    aaa = m.sets["AAA"]
    first, second = aaa.children
    results(second.stop())
    end(second)
    done = results(aaa.restart())
    reactor.advance(0.5)
    assert second.state == RUNNING and second.ready
    probe.ready.discard(9400)  # its next probe fails
    reactor.advance(3.5)
    assert not second.ready
    assert isinstance(done[0], Failure) and str(done[0].value) == (
        "AAA: the rolling restart stopped at replica 0: it is the only replica that serves, and restarting it "
        "would take AAA down")
    assert first.state == RUNNING and first.ready and (first.pid, signal.SIGTERM) not in kills
    assert not aaa.rolling


def test_a_roll_that_fails_at_once_says_why(tmp_path):
    """A replica whose start fails at once (here: refused) ended the roll before restart() returned."""
    m, reactor, probe, kills = start_two(tmp_path)
    aaa = m.sets["AAA"]
    first, second = aaa.children
    results(second.stop())
    end(second)
    second.spec.refused = "refused for this test"
    done = results(aaa.restart())
    assert isinstance(done[0], Failure) and done[0].check(ChildError), done
    assert str(done[0].value).startswith("AAA: the rolling restart stopped at replica 1 (the others keep running)")
    assert first.state == RUNNING and not aaa.rolling


def test_a_second_restart_joins_the_roll_and_a_replica_action_is_refused_during_it(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    aaa = m.sets["AAA"]
    first, second = aaa.children
    done, again = results(aaa.restart()), results(aaa.restart())
    assert aaa.rolling and first.state == STOPPING and second.state == RUNNING
    end(first)
    reactor.advance(0.5)
    reactor.advance(1.5)
    assert second.state == STOPPING
    end(second)
    reactor.advance(0.5)
    assert done == again == [None] and not aaa.rolling
    assert [c.restarts for c in aaa.children] == [1, 1]


def test_one_replica_alone_stops_starts_and_restarts(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    second = m.process("AAA", 1)
    assert second is m.children["AAA.1"] and m.process("AAA") is m.children["AAA.0"]
    done = results(second.restart())
    assert m.children["AAA.0"].state == RUNNING and second.state == STOPPING
    end(second)
    reactor.advance(0.5)
    assert done == [None] and second.restarts == 1 and m.children["AAA.0"].restarts == 0
    with pytest.raises(ChildError, match=r"AAA has no replica 2 \(it runs 2\)"):
        m.process("AAA", 2)
    with pytest.raises(ChildError, match="the gateway has no replicas"):
        m.process(GATEWAY, 0)
    with pytest.raises(ChildError, match="unknown server 'ZZZ'"):
        m.target("ZZZ")


def test_metrics_label_each_replica(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    end(m.children["AAA.1"], None, signal.SIGKILL)
    rows = {}
    for family in ChildCollector(m).collect():
        for sample in family.samples:
            rows[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    state = "service_supervisor_child_state"
    assert rows[(state, (("child", "AAA"), ("replica", "0"), ("state", RUNNING)))] == 1.0
    assert rows[(state, (("child", "AAA"), ("replica", "1"), ("state", BACKOFF)))] == 1.0
    assert rows[(state, (("child", "BBB"), ("replica", "0"), ("state", RUNNING)))] == 1.0
    assert rows[(state, (("child", GATEWAY), ("replica", "0"), ("state", RUNNING)))] == 1.0
    assert rows[("service_supervisor_child_ready", (("child", "AAA"), ("replica", "1")))] == 0.0
    assert {k[1] for k in rows if k[0] == "service_supervisor_child_restarts_total"} == {
        (("child", c), ("replica", r)) for c, r in ((GATEWAY, "0"), ("AAA", "0"), ("AAA", "1"), ("BBB", "0"))}


def test_stop_all_stops_every_replica(tmp_path):
    m, reactor, probe, kills = start_two(tmp_path)
    done = results(m.stop_all())
    assert m.gateway.state == STOPPING  # first: its socket closes while the models still answer what it holds
    assert all(m.children[name].state != STOPPING for name in ("AAA.0", "AAA.1", "BBB"))
    end(m.gateway)
    for name in ("AAA.0", "AAA.1", "BBB"):
        assert m.children[name].state == STOPPING
        end(m.children[name])
    assert done == [None] and all(c.state == STOPPED for c in m.children.values())
    assert FAILED not in {c.state for c in m.children.values()}
