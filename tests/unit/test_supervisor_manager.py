"""The child manager: order, injected tokens, the gateway's permanent refusal."""

from __future__ import annotations

import json
import signal

import pytest
from twisted.internet.error import ProcessTerminated
from twisted.python.failure import Failure

from svc.config import load_model_server_config
from svc.supervisor.child import FAILED, RUNNING, STARTING, STOPPED, STOPPING
from svc.supervisor.config import (
    Profile,
    check_device,
    load_profile,
    load_supervisor_config,
    nvidia_present,
    weights_choice,
)
from svc.supervisor.manager import GATEWAY, ChildManager
from svc.supervisor.preflight import gateway_refusal
from tests.unit.test_supervisor_child import Probe, ProcessReactor, results

ENV = {"SERVICE_API_TOKEN": "mgmt", "SERVICE_METRICS_TOKEN": "metrics", "PATH": "/usr/bin"}


class FakeSocket:
    """A listening socket that is only a descriptor number (no port is bound in unit tests)."""

    def __init__(self, host: str, port: int) -> None:
        self.address, self.closed = (host, port), False

    @classmethod
    def bind(cls, host: str, port: int) -> "FakeSocket":
        return cls(host, port)

    def fileno(self) -> int:
        return 77

    def close(self) -> None:
        self.closed = True


def catalog(tmp_path):
    configs = []
    for i, mid in enumerate(("AAA", "BBB", "CCC")):
        path = tmp_path / f"{mid}.toml"
        path.write_text(f'id = "{mid}"\nport = {9300 + i}\nserver_uri = "/{mid.lower()}"\n')
        configs.append(load_model_server_config(str(path)))
    return configs


def manager(tmp_path, env=ENV, models=("AAA", "BBB"), port_free=lambda port: True):
    conf = tmp_path / "service.toml"
    conf.write_text(f'[supervisor]\nlog_dir = "{tmp_path / "logs"}"\n[servers.BBB]\nrestart = "no"\n')
    reactor, probe = ProcessReactor(), Probe()
    kills = []
    m = ChildManager(reactor=reactor, config=load_supervisor_config(str(conf)), profile=Profile("cpu", "cpu", models),
                     probe=probe, env=env, killer=lambda pid, sig: kills.append((pid, sig)), catalog=catalog(tmp_path),
                     port_free=port_free,
                     describe=lambda mid: {"category": "classification", "task": "t"}, binder=FakeSocket.bind)
    return m, reactor, probe, kills


def spawned_names(reactor):
    return [args[4:][6] for _, _, args, _, _ in reactor.spawned]  # the twistd plugin name (python -P -m twisted ...)


@pytest.mark.parametrize("env, expected", [
    ({"SERVICE_API_TOKEN": "a"}, "SERVICE_METRICS_TOKEN is not set"),
    ({"SERVICE_API_TOKEN": "a", "SERVICE_METRICS_TOKEN": ""}, "SERVICE_METRICS_TOKEN is not set"),
    ({"SERVICE_API_TOKEN": "a", "SERVICE_METRICS_TOKEN": "a"}, "equals SERVICE_API_TOKEN"),
    ({"SERVICE_API_TOKEN": "a", "SERVICE_GATEWAY_AUTH_TOKEN": "g", "SERVICE_METRICS_TOKEN": "g"},
     "equals SERVICE_GATEWAY_AUTH_TOKEN"),
    ({"SERVICE_API_TOKEN": "a", "SERVICE_METRICS_TOKEN": "m"}, None),
])
def test_gateway_refusal_rules(env, expected):
    refusal = gateway_refusal(env)
    assert (refusal is None) if expected is None else (expected in refusal)


def test_gateway_first_then_the_profile_models_with_their_tokens(tmp_path):
    # SERVICE_API_KEY: a client's key, when the supervisor was started from a shell that sourced secrets/local.env.
    m, reactor, probe, _ = manager(tmp_path, env={**ENV, "SERVICE_API_KEY": "a-client-key"})
    m.start_all()
    assert spawned_names(reactor) == ["service-gateway"]
    probe.ok = True
    reactor.advance(0.5)
    assert spawned_names(reactor) == ["service-gateway", "service-model", "service-model"]
    gateway_env = reactor.spawned[0][3]
    tokens = json.loads(gateway_env["SERVICE_UPSTREAM_TOKENS"])
    assert set(tokens) == {"AAA", "BBB", "CCC"} and len({t for ts in tokens.values() for t in ts}) == 3
    assert json.loads(gateway_env["SERVICE_UPSTREAM_PORTS"]) == {"AAA": [9300], "BBB": [9301], "CCC": [9302]}
    for _, _, args, env, _ in reactor.spawned[1:]:
        model_id = args[args.index("--server") + 1].rsplit("/", 1)[1][:-5]
        assert [env["SERVICE_AUTH_TOKEN"]] == tokens[model_id]
        assert (env["SERVICE_REPLICA"], env["SERVICE_CPU_SHARE"]) == ("0", "1")
        assert "CUDA_VISIBLE_DEVICES" not in env and "SERVICE_CPU_AFFINITY" not in env
        # The port it is probed on and routed to, always given: an edit of the file's port would move it away.
        assert [int(args[args.index("--port") + 1])] == json.loads(gateway_env["SERVICE_UPSTREAM_PORTS"])[model_id]
        assert args[args.index("--device") + 1] == "cpu"
        # The environment is inherited, but for the gateway's and the supervisor's credentials.
        assert env["PATH"] == "/usr/bin" and env["SERVICE_JOB_SECRET"] == gateway_env["SERVICE_JOB_SECRET"]
        assert not {"SERVICE_API_TOKEN", "SERVICE_METRICS_TOKEN", "SERVICE_GATEWAY_AUTH_TOKEN",
                    "SERVICE_CLUSTER_TOKEN", "SERVICE_API_KEY"} & set(env)
    assert (gateway_env["SERVICE_API_TOKEN"], gateway_env["SERVICE_METRICS_TOKEN"]) == ("mgmt", "metrics")
    assert "SERVICE_API_KEY" not in gateway_env  # no process of the service reads a client's key
    assert m.children["CCC"].state == STOPPED  # not in the profile
    assert m.children["BBB"].spec.policy == "no"


def test_the_models_do_not_wait_for_the_gateways_busy_port(tmp_path):
    """A probe: with the gateway's port held (another program, an orphaned gateway) every model waited with it, up
    to port_wait_ms (60 s), before it was spawned. The gateway still comes first; its port wait is its own."""
    taken = {8080}
    m, reactor, probe, _ = manager(tmp_path, port_free=lambda port: port not in taken)
    m.start_all()
    assert m.gateway.state == STARTING and m.gateway.pid is None  # waiting for its port
    assert spawned_names(reactor) == ["service-model", "service-model"]  # at once
    taken.clear()  # the port is freed: the gateway starts at its next try
    reactor.advance(1)
    assert spawned_names(reactor) == ["service-model", "service-model", "service-gateway"]


def test_a_shutdown_while_the_gateway_waits_for_its_port_spawns_nothing_more(tmp_path):
    """A config probe: SIGTERM during the gateway's port wait ended the wait, and the start went on to spawn the
    profile's models, stopped again at once ("starting: spawned pid", then "stopping: SIGTERM"). The models now
    start beside the wait; the shutdown stops them, and nothing is spawned after it."""
    m, reactor, probe, _ = manager(tmp_path, port_free=lambda port: port != 8080)  # the gateway's port is taken
    started = m.start_all()
    reactor.advance(1)
    assert m.gateway.state == "starting" and spawned_names(reactor) == ["service-model", "service-model"]
    stopped = m.stop_all()
    for protocol, _, _, _, _ in reactor.spawned:
        protocol.processEnded(Failure(ProcessTerminated(signal=signal.SIGTERM)))
    reactor.advance(10)
    assert started.called and stopped.called
    assert spawned_names(reactor) == ["service-model", "service-model"] and m.gateway.state == STOPPED
    assert {m.children[name].state for name in ("AAA", "BBB")} == {STOPPED}


def test_models_start_even_if_the_gateway_is_refused(tmp_path):
    m, reactor, probe, _ = manager(tmp_path, env={"SERVICE_API_TOKEN": "mgmt"})
    m.start_all()
    assert m.gateway.state == FAILED and "SERVICE_METRICS_TOKEN" in m.gateway.last_error
    assert spawned_names(reactor) == ["service-model", "service-model"]
    reactor.advance(600)
    assert m.gateway.state == FAILED and spawned_names(reactor).count("service-gateway") == 0


def test_stop_all_stops_the_gateway_before_the_models(tmp_path):
    """The gateway's socket closes first and its requests finish against running models; models first gave a load
    balancer's traffic 503 "not reachable" for seconds while the gateway's /healthz still said 200."""
    m, reactor, probe, kills = manager(tmp_path)
    probe.ok = True
    m.start_all()
    reactor.advance(0.5)
    reactor.advance(0.5)
    assert all(c.state == RUNNING for name, c in m.children.items() if name != "CCC")
    done = []
    m.stop_all().addCallback(done.append)
    gateway_pid = m.gateway.pid
    assert kills == [(gateway_pid, signal.SIGTERM)]  # to its process group: the gateway alone so far
    assert all(m.children[name].state == RUNNING for name in ("AAA", "BBB"))
    from twisted.internet.error import ProcessDone
    from twisted.python.failure import Failure

    m.gateway._protocol.processEnded(Failure(ProcessDone(0)))
    assert len(kills) == 3 and all(m.children[name].state == STOPPING for name in ("AAA", "BBB"))
    protocols = {c.pid: p for p, _, _, _, _ in reactor.spawned for c in m.children.values() if c._protocol is p}
    for name in ("AAA", "BBB"):
        protocols[m.children[name].pid].processEnded(Failure(ProcessDone(0)))
    assert done == [None] and all(c.state == STOPPED for c in m.children.values())


def test_once_the_shutdown_began_no_model_is_spawned_while_the_gateway_drains(tmp_path):
    """A lifecycle probe: with the supervisor's SIGTERM in and the gateway still draining, an API start of a stopped
    model answered 200 and spawned it, a restart of a running one took it down (its requests with it) and spawned
    it, and a crash's back-off respawned one, each only to be stopped seconds later.  The models that run serve
    the drain until the gateway has exited."""
    m, reactor, probe, kills = manager(tmp_path, models=("AAA", "BBB", "CCC"))
    m.children["CCC"].spec.policy = "always"
    probe.ok = True
    m.start_all()
    reactor.advance(0.5)
    reactor.advance(0.5)
    results(m.children["BBB"].stop())
    protocols = {c.pid: p for p, _, _, _, _ in reactor.spawned for c in m.children.values() if c._protocol is p}
    protocols[m.children["BBB"].pid].processEnded(Failure(ProcessTerminated(0, None)))
    spawned = len(reactor.spawned)
    m.stop_all()  # the gateway drains: SIGTERM sent, not yet exited
    assert kills[-1] == (m.gateway.pid, signal.SIGTERM) and m.children["AAA"].state == RUNNING
    start, restart = results(m.children["BBB"].start()), results(m.children["AAA"].restart())
    assert [str(d.value) for d in start + restart] == [
        "BBB: the supervisor is shutting down", "AAA: the supervisor is shutting down"]
    protocols[m.children["CCC"].pid].processEnded(Failure(ProcessTerminated(1, None)))  # a crash
    reactor.advance(60)
    assert len(reactor.spawned) == spawned and m.children["AAA"].state == RUNNING  # serves the drain
    assert m.children["CCC"].state == STOPPED and m.children["BBB"].state == STOPPED
    said = [text for _, _, stream, text in m.children["CCC"].logs.ring if stream == "supervisor"]
    assert said[-1] == "stopped: exited (exit code 1); the supervisor is shutting down: not restarted"
    assert not any(line.startswith("backoff") for line in said)  # it said "restarting in 1 s", then did not


def test_status_view(tmp_path):
    m, reactor, probe, _ = manager(tmp_path)
    m.start_all()
    status = m.status_view()
    assert status["profile"] == "cpu" and status["gateway"]["id"] == GATEWAY
    assert status["gateway"]["url"] == "http://127.0.0.1:8080" and status["gateway"]["state"] == STARTING
    assert status["weights"] == "demo"
    first = status["servers"][0]
    assert {k: first[k] for k in ("id", "category", "task", "server_uri", "port", "async", "in_profile", "weights",
                                  "state", "ready", "pid", "restarts", "uptime_s", "last_error")} == {
        "id": "AAA", "category": "classification", "task": "t", "server_uri": "/aaa", "port": 9300, "async": False,
        "in_profile": True, "weights": {"kind": "demo", "variant": None}, "state": "stopped", "ready": False,
        "pid": None, "restarts": 0, "uptime_s": None, "last_error": None}
    assert [s["weights"] for s in status["servers"]] == [{"kind": "demo", "variant": None}] * 3
    assert m.catalog_view()[0]["weights"] == {"kind": "demo", "variant": None}


def test_the_catalog_says_async_as_the_ready_process_was_started(tmp_path):
    """An operator probe: a model restarted with ``async_enabled`` turned on served jobs while the catalog and the
    status API still said ``"async": false``, as read at the supervisor's start."""
    from twisted.internet.error import ProcessDone
    from twisted.python.failure import Failure

    m, reactor, probe, _ = manager(tmp_path)
    m.start_all()
    probe.ok = True
    reactor.advance(0.5)
    reactor.advance(0.5)
    assert m.children["AAA"].ready and next(s for s in m.catalog_view() if s["id"] == "AAA")["async"] is False
    path = tmp_path / "AAA.toml"
    path.write_text(path.read_text() + "async_enabled = true\n")
    child = m.children["AAA"]
    old = child._protocol
    child.restart()
    old.processEnded(Failure(ProcessDone(0)))
    assert next(s for s in m.catalog_view() if s["id"] == "AAA")["async"] is False  # not ready: the start's
    reactor.advance(0.5)
    assert child.ready and next(s for s in m.status_view()["servers"] if s["id"] == "AAA")["async"] is True


def weights_manager(tmp_path, profile_weights, demo=(), demo_models=()):
    """Three servers: AAA's config says random, BBB's pretrained:large, CCC's a local file; AAA and BBB
    declare variants (default "small"), CCC none."""
    configs = []
    for i, (mid, weights) in enumerate((("AAA", "random"), ("BBB", "pretrained:large"), ("CCC", "w.pth"))):
        path = tmp_path / f"{mid}.toml"
        path.write_text(f'id = "{mid}"\nport = {9300 + i}\nserver_uri = "/{mid.lower()}"\n[model]\nweights = "{weights}"\n')
        configs.append(load_model_server_config(str(path)))
    conf = tmp_path / "service.toml"
    conf.write_text(f'[supervisor]\nlog_dir = "{tmp_path / "logs"}"\n')
    reactor, probe = ProcessReactor(), Probe()
    probe.ok = True
    m = ChildManager(reactor=reactor, config=load_supervisor_config(str(conf)),
                     profile=Profile("cpu", "cpu", ("AAA", "BBB", "CCC"), profile_weights, demo), probe=probe, env=ENV,
                     demo_models=demo_models,
                     killer=lambda pid, sig: None, catalog=configs, port_free=lambda port: True,
                     default_variant=lambda mid: None if mid == "CCC" else "small", binder=FakeSocket.bind)
    m.start_all()
    reactor.advance(0.5)
    arguments = {}
    for _, _, args, _, _ in reactor.spawned[1:]:
        model_id = args[args.index("--server") + 1].rsplit("/", 1)[1][:-5]
        arguments[model_id] = args[args.index("--weights") + 1] if "--weights" in args else None
    return m, arguments


def test_a_demo_profile_runs_the_models_whose_config_says_nothing_on_demo_weights(tmp_path):
    """The profile is the default: BBB's explicit pretrained:large and CCC's file win over it."""
    m, arguments = weights_manager(tmp_path, "demo")
    status = m.status_view()
    assert status["weights"] == "demo"
    assert {s["id"]: s["weights"] for s in status["servers"]} == {
        "AAA": {"kind": "demo", "variant": None}, "BBB": {"kind": "pretrained", "variant": "large"},
        "CCC": {"kind": "file", "variant": None}}
    assert arguments == {"AAA": "demo", "BBB": "pretrained:large", "CCC": None}


def test_a_restart_runs_the_weights_its_config_file_names_now(tmp_path):
    """The config's header says to restart the model after a change: a [model] weights edited to a local file
    before the restart is what the restart runs, and the status API says so (the restart ran the weights chosen
    at the supervisor's start, demo, without a word)."""
    from twisted.internet.error import ProcessDone
    from twisted.python.failure import Failure

    m, arguments = weights_manager(tmp_path, "demo")
    assert arguments["AAA"] == "demo"
    path = tmp_path / "AAA.toml"
    path.write_text(path.read_text().replace('weights = "random"', 'weights = "new.pth"'))
    reactor = m.reactor
    child = m.children["AAA"]
    old = child._protocol
    child.restart()
    old.processEnded(Failure(ProcessDone(0)))
    args = reactor.spawned[-1][2]
    assert args[args.index("--server") + 1] == str(path) and "--weights" not in args  # its file, as the config says
    assert next(s for s in m.status_view()["servers"] if s["id"] == "AAA")["weights"] == {"kind": "file",
                                                                                          "variant": None}
    for broken in ("not toml [", None):  # a file that no longer loads, or is gone: a restart asked for is refused
        if broken is None:               # before anything stops, and the running process keeps serving
            path.unlink()
        else:
            path.write_text(broken)
        running, spawns, failures = child._protocol, len(reactor.spawned), []
        child.restart().addErrback(failures.append)
        assert "its config does not load" in failures[0].getErrorMessage(), failures
        assert "nothing was stopped" in failures[0].getErrorMessage()
        assert child._protocol is running and len(reactor.spawned) == spawns
        assert next(s for s in m.status_view()["servers"] if s["id"] == "AAA")["weights"]["kind"] == "file"


def test_a_pretrained_profile_runs_the_default_or_configured_variants(tmp_path):
    m, arguments = weights_manager(tmp_path, "pretrained")
    status = m.status_view()
    assert status["weights"] == "pretrained"
    assert {s["id"]: s["weights"] for s in status["servers"]} == {
        "AAA": {"kind": "pretrained", "variant": "small"}, "BBB": {"kind": "pretrained", "variant": "large"},
        "CCC": {"kind": "file", "variant": None}}
    assert {c["id"]: c["weights"] for c in m.catalog_view()} == {s["id"]: s["weights"] for s in status["servers"]}
    assert arguments == {"AAA": "pretrained:small", "BBB": "pretrained:large", "CCC": None}


def test_the_profiles_demo_list_and_the_quick_starts_demo_models(tmp_path):
    """The profile's demo list keeps AAA (config says nothing) on demo under pretrained; --demo-models puts BBB
    on demo though its config names a variant (the quick start could not get it); CCC's file stays."""
    m, arguments = weights_manager(tmp_path, "pretrained", demo=("AAA",), demo_models=("BBB",))
    assert {s["id"]: s["weights"] for s in m.status_view()["servers"]} == {
        "AAA": {"kind": "demo", "variant": None}, "BBB": {"kind": "demo", "variant": None},
        "CCC": {"kind": "file", "variant": None}}
    assert arguments == {"AAA": "demo", "BBB": "demo", "CCC": None}


@pytest.mark.parametrize("profile, table, default, expected", [
    ("demo", "random", "v", ("demo", {"kind": "demo", "variant": None})),
    ("demo", None, None, ("demo", {"kind": "demo", "variant": None})),
    ("pretrained", "random", "v", ("pretrained:v", {"kind": "pretrained", "variant": "v"})),
    ("pretrained", "pretrained", "v", ("pretrained:v", {"kind": "pretrained", "variant": "v"})),
    ("pretrained", "pretrained:w", "v", ("pretrained:w", {"kind": "pretrained", "variant": "w"})),
    ("pretrained", "random", None, ("pretrained", {"kind": "demo", "variant": None})),
    ("pretrained", "/x/y.pth", "v", (None, {"kind": "file", "variant": None})),
    ("demo", "weights", None, (None, {"kind": "file", "variant": None})),
    # A model's explicit pretrained choice wins over a demo profile.
    ("demo", "pretrained", "v", ("pretrained:v", {"kind": "pretrained", "variant": "v"})),
    ("demo", "pretrained:w", "v", ("pretrained:w", {"kind": "pretrained", "variant": "w"})),
    # No variants: the config goes to the model server as it is, which refuses it in one line.
    ("demo", "pretrained", None, (None, {"kind": "pretrained", "variant": None})),
])
def test_weights_choice(profile, table, default, expected):
    assert weights_choice(profile, table, default) == expected


def test_profiles_and_unknown_models(tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "cpu.toml").write_text('device = "cpu"\nmodels = ["AAA"]\n')
    (profiles / "bad.toml").write_text('device = "tpu"\n')
    (profiles / "real.toml").write_text('device = "gpu"\nmodels = ["AAA"]\nweights = "pretrained"\n')
    (profiles / "worse.toml").write_text('weights = "best"\n')
    (profiles / "stray.toml").write_text('models = ["AAA"]\ndemo = ["BBB"]\n')
    (profiles / "twice.toml").write_text('models = ["AAA", "BBB", "AAA"]\n')  # a slip for another id
    conf = tmp_path / "service.toml"
    conf.write_text(f'[supervisor]\nprofiles_dir = "{profiles}"\nprofile = "cpu"\n')
    config = load_supervisor_config(str(conf))
    assert load_profile(config) == Profile("cpu", "cpu", ("AAA",), "demo")
    from svc.config import ConfigError

    with pytest.raises(ConfigError, match="device: must be one of"):
        load_profile(config, "bad")
    assert load_profile(config, "real") == Profile("real", "gpu", ("AAA",), "pretrained")
    # A GPU profile on a machine without an NVIDIA driver is refused at start (a config probe: the supervisor
    # started, and each model refused alone, with advice the profile overrides).
    no_driver = "the 'real' profile runs its models on an NVIDIA GPU, but this machine shows none"
    with pytest.raises(ConfigError, match=f"^--profile: {no_driver}"):
        check_device(config, load_profile(config, "real"), "real", gpu_present=lambda: False)
    with pytest.raises(ConfigError, match=f"service.toml: supervisor.profile: {no_driver}"):
        check_device(config, load_profile(config, "real"), None, gpu_present=lambda: False)
    check_device(config, load_profile(config, "real"), "real", gpu_present=lambda: True)
    check_device(config, load_profile(config), None, gpu_present=lambda: False)  # cpu: no driver needed
    # WSL2 runs CUDA without the driver's /proc file (an upgrade probe): its GPU device is a sign too.
    from svc.supervisor import config as supervisor_config

    seen, real = [], load_profile(config, "real")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(supervisor_config, "nvidia_present", lambda: False)
        patch.setattr(supervisor_config.os.path, "exists", lambda path: seen.append(path) or path == "/dev/dxg")
        check_device(config, real, "real")
    assert seen[0] == "/dev/dxg"
    with pytest.raises(ConfigError, match="weights: must be one of"):
        load_profile(config, "worse")
    # demo naming a model that models leaves out (what trimming models gives): that model is simply not started
    assert load_profile(config, "stray") == Profile("stray", "cpu", ("AAA",), "demo", ("BBB",))
    with pytest.raises(ConfigError, match="twice.toml: models: names AAA more than once$"):
        load_profile(config, "twice")
    with pytest.raises(ValueError, match="names models without a config in .*: \\['ZZZ'\\]"):
        ChildManager(reactor=ProcessReactor(), config=config, profile=Profile("cpu", "cpu", ("ZZZ",)), probe=Probe(),
                     env=ENV, catalog=catalog(tmp_path))
    with pytest.raises(ValueError, match="names demo without a config in .*: \\['YYY'\\]"):  # a typo, not a model
        ChildManager(reactor=ProcessReactor(), config=config, profile=Profile("cpu", "cpu", ("AAA",), "demo", ("YYY",)),
                     probe=Probe(), env=ENV, catalog=catalog(tmp_path))


@pytest.mark.parametrize("initial, largest, refused", [(1000, 30000, False), (5000, 5000, False),
                                                      (60000, 30000, True), (1, 0, True)])
def test_a_first_restart_delay_above_the_largest_is_refused(tmp_path, initial, largest, refused):
    """The largest delay capped every restart, the first too: a back-off that never backs off."""
    from svc.config import ConfigError

    conf = tmp_path / "service.toml"
    conf.write_text(f"[supervisor]\nbackoff_initial_ms = {initial}\nbackoff_max_ms = {largest}\n")
    if not refused:
        assert load_supervisor_config(str(conf)).backoff_initial_ms == initial
        return
    with pytest.raises(ConfigError) as refusal:
        load_supervisor_config(str(conf))
    assert str(refusal.value) == (f"{conf}: supervisor.backoff_initial_ms: {initial} is above backoff_max_ms "
                                  f"({largest})")


@pytest.mark.parametrize("gpu, expected", [(True, Profile("gpu", "gpu", ("AAA",), "demo")),
                                           (False, Profile("cpu", "cpu", ("AAA",), "demo"))])
def test_profile_auto_is_gpu_only_where_a_gpu_is_present(tmp_path, gpu, expected):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "cpu.toml").write_text('device = "cpu"\nmodels = ["AAA"]\n')
    (profiles / "gpu.toml").write_text('device = "gpu"\nmodels = ["AAA"]\n')
    conf = tmp_path / "service.toml"
    conf.write_text(f'[supervisor]\nprofiles_dir = "{profiles}"\nprofile = "auto"\n')
    config = load_supervisor_config(str(conf))
    assert load_profile(config, gpu_present=lambda: gpu) == expected
    assert load_profile(config, "auto", gpu_present=lambda: gpu) == expected
    assert load_profile(config, "cpu", gpu_present=lambda: True).name == "cpu"  # a name chosen is kept


def test_nvidia_present_reads_the_driver_file(tmp_path):
    driver = tmp_path / "version"
    assert nvidia_present(str(driver)) is False
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
    assert nvidia_present(str(driver)) is True


def test_supervisor_config_is_strict(tmp_path):
    from svc.config import ConfigError

    conf = tmp_path / "service.toml"
    conf.write_text("[supervisor]\nport = \"8787\"\n")
    with pytest.raises(ConfigError, match="supervisor.port: must be an integer"):
        load_supervisor_config(str(conf))
    conf.write_text("[servers.X]\nrestart = \"sometimes\"\n")
    with pytest.raises(ConfigError, match="servers.X.restart"):
        load_supervisor_config(str(conf))
    conf.write_text("[extra]\n")
    with pytest.raises(ConfigError, match="extra: unknown table"):
        load_supervisor_config(str(conf))


def test_a_model_still_measuring_its_modes_at_the_start_timeout_is_no_warning(tmp_path):
    """"YOLOV8 not ready: ... did not become ready within 180 s (state starting)" was a warning for models that
    were only slow; a model still starting gets an info line with what it does, a failed one still a warning."""
    from twisted.logger import LogLevel, capturedLogs

    from svc.supervisor.probe import Probed

    m, reactor, probe, _ = manager(tmp_path)
    with capturedLogs() as events:
        m.start_all()
        probe.ok = True
        reactor.advance(0.5)  # the gateway is ready; the models start
        probe.ok = Probed(False, "the model is loading: measuring mode 1 of 2 (jit)")
        reactor.spawned[2][0].processEnded(Failure(ProcessTerminated(exitCode=1)))  # BBB (restart "no") fails
        reactor.advance(181)
    said = [(e["log_level"], e.get("name"), e.get("phase")) for e in events
            if "not ready" in e.get("log_format", "") or "still starting" in e.get("log_format", "")]
    assert said == [(LogLevel.info, "AAA", "the model is loading: measuring mode 1 of 2 (jit)"),
                    (LogLevel.warn, "BBB", None)]
    assert m.status_view()["servers"][0]["phase"] == "the model is loading: measuring mode 1 of 2 (jit)"


def test_a_model_killed_while_it_loads_is_a_warning_though_it_is_starting_again(tmp_path):
    """A measuring-lock probe: a model killed while it waited for another's measurement was respawned, and when the
    profile's starts ended it was logged "still starting after start_timeout_ms" at info, long before that time and
    without the kill. Only a start that timed out is "still starting"; a failed one is a warning with its error."""
    from twisted.logger import LogLevel, capturedLogs

    from svc.supervisor.probe import Probed

    m, reactor, probe, _ = manager(tmp_path)
    with capturedLogs() as events:
        m.start_all()
        probe.ok = True
        reactor.advance(0.5)  # the gateway is ready; the models start
        probe.ok = Probed(False, "the model is loading: waiting for BBB (pid 7) to finish measuring its modes")
        reactor.spawned[1][0].processEnded(Failure(ProcessTerminated(signal=9)))  # AAA killed as it loads
        reactor.advance(2)  # its backoff: spawned again, starting
        reactor.spawned[2][0].processEnded(Failure(ProcessTerminated(exitCode=1)))  # BBB (restart "no") fails
        reactor.advance(1)
    said = [(e["log_level"], e.get("name")) for e in events
            if "not ready" in e.get("log_format", "") or "still starting" in e.get("log_format", "")]
    assert said == [(LogLevel.warn, "AAA"), (LogLevel.warn, "BBB")]
    assert m.status_view()["servers"][0]["state"] == "starting"


def test_a_gateway_still_starting_at_the_start_timeout_is_no_warning_either(tmp_path):
    """"gateway not ready: __gateway did not become ready within 3 s (state starting)" was a warning for a gateway
    that was only slow on a loaded machine (a docs probe), where a model as slow got an info line."""
    from twisted.logger import LogLevel, capturedLogs

    m, reactor, probe, _ = manager(tmp_path)
    with capturedLogs() as events:
        m.start_all()
        probe.ok = False
        reactor.advance(181)
    said = [(e["log_level"], e.get("name")) for e in events
            if "not ready" in e.get("log_format", "") or "still starting" in e.get("log_format", "")]
    assert said[0] == (LogLevel.info, "__gateway")
    assert m.status_view()["gateway"]["state"] == "starting"


def test_a_stop_while_the_models_load_is_no_warning(tmp_path):
    """A fresh-install probe: Ctrl-C while the models loaded printed "X not ready: X could not start: stopped before
    it was ready" for each at warn, read as failures (docs/getting-started.md: only a real failure warns)."""
    from twisted.logger import LogLevel, capturedLogs

    m, reactor, probe, _ = manager(tmp_path)
    with capturedLogs() as events:
        started = m.start_all()
        probe.ok = True
        reactor.advance(0.5)  # the gateway is ready; the models load
        probe.ok = False
        stopped = m.stop_all()
        for index in range(len(reactor.spawned)):
            reactor.spawned[index][0].processEnded(Failure(ProcessTerminated(exitCode=0)))
        reactor.advance(1)
    assert started.called and stopped.called
    warned = [e.get("log_format") for e in events if e["log_level"] >= LogLevel.warn]
    assert not [f for f in warned if "not ready" in (f or "")], warned


def test_the_gateway_drains_for_its_own_receive_timeout_when_retired(tmp_path):
    m, *_ = manager(tmp_path)
    assert m.gateway.kill_grace == 182.0  # upstream_recv_timeout_ms 180000 + 2 s, beyond stop_grace_ms
    conf = tmp_path / "service.toml"
    conf.write_text(conf.read_text() + "[gateway]\nupstream_recv_timeout_ms = 30000\n")
    config = load_supervisor_config(str(conf))
    assert config.gateway_recv_timeout_ms == 30000


def test_children_run_without_the_working_directory_and_with_this_code_first(tmp_path):
    """A user's ``models/`` folder in the supervisor's working directory was first on every child's ``sys.path``
    (``python -m`` puts it there): the children run ``-P``, this checkout first on ``PYTHONPATH`` and the
    environment's own entries after it (a third-party plugin folder), its empty ones (the working directory) out."""
    import sys

    from tests.support.processes import REPO

    m, reactor, probe, _ = manager(tmp_path, env={**ENV, "PYTHONPATH": f"/plugins::{REPO}"})
    m.start_all()
    probe.ok = True
    reactor.advance(0.5)
    assert len(reactor.spawned) == 3
    for _, _, args, env, _ in reactor.spawned:
        assert args[4:8] == [sys.executable, "-P", "-m", "twisted"]
        assert env["PYTHONPATH"] == f"{REPO}:/plugins"
