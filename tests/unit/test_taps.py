"""The twistd taps' wiring: each ``makeService`` built in-process from its Options on a memory reactor.

Nothing is started: the tests read the service tree (children, the listener's
port, backlog and interface, the config values that reached it) and check
that bad options and environments are refused with their one line (exit 1,
``svc.infra.process.refuse``) before anything listens.  The processes themselves
are started for real by the integration tests.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from twisted.application.internet import TCPServer
from twisted.application.service import IServiceMaker
from twisted.internet.testing import MemoryReactorClock
from twisted.plugin import getPlugins
from twisted.python import usage

from svc.gateway import tap as gateway_tap
from svc.modelserver import tap as model_tap
from svc.supervisor import tap as supervisor_tap

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / "conf" / "server"
PROFILES = REPO / "conf" / "profiles"
CATALOG = ["CLS_COND_DDIM", "DDIM", "DDPM", "LDM", "MOBILENETV2", "SAM_AMG", "YOLOV8"]
METRICS, INFERENCE, MANAGEMENT = "metrics-" + "1" * 20, "inference-" + "2" * 20, "management-" + "3" * 20
CREDENTIALS = ("SERVICE_METRICS_TOKEN", "SERVICE_GATEWAY_AUTH_TOKEN", "SERVICE_API_TOKEN", "SERVICE_EXPOSE",
               "SERVICE_AUTH_TOKEN", "SERVICE_UPSTREAM_TOKENS", "SERVICE_UPSTREAM_TOKEN", "SERVICE_UPSTREAM_PORTS",
               "SERVICE_CLUSTER_TOKEN", "SERVICE_JOB_SECRET", "SERVICE_HOST_ID", "SERVICE_REPLICA", "SERVICE_CPU_SHARE")


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    """No credential but those a test sets."""
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def build(tap, argv: list[str]):
    """``makeService`` of ``tap`` for ``argv`` on a memory reactor: (service, reactor)."""
    options = tap.Options()
    options.parseOptions(argv)
    reactor = MemoryReactorClock()
    return tap.makeService(options, reactor=reactor), reactor


def refusal(tap, argv: list[str]) -> str:
    """The one line ``makeService`` refuses with (a SystemExit whose message twistd prints; exit 1)."""
    with pytest.raises(SystemExit) as exit_:
        build(tap, argv)
    assert isinstance(exit_.value.code, str) and "\n" not in exit_.value.code
    return exit_.value.code


def listener_of(service) -> TCPServer:
    [listener] = [child for child in service if isinstance(child, TCPServer)]
    assert listener is service.listener
    return listener


def test_the_plugins_name_the_three_taps():
    makers = {maker.tapname: maker for maker in getPlugins(IServiceMaker)
              if maker.tapname in ("service-model", "service-gateway", "service-supervisor")}
    assert {name: maker.module for name, maker in makers.items()} == {
        "service-model": "svc.modelserver.tap", "service-gateway": "svc.gateway.tap",
        "service-supervisor": "svc.supervisor.tap"}
    assert makers["service-gateway"].options is gateway_tap.Options
    assert makers["service-model"].options is model_tap.Options
    assert makers["service-supervisor"].options is supervisor_tap.Options


# ---------------------------------------------------------------- gateway


@pytest.fixture
def gateway_config(tmp_path, environment):
    environment.setenv("SERVICE_METRICS_TOKEN", METRICS)
    environment.setenv("SERVICE_GATEWAY_AUTH_TOKEN", INFERENCE)
    config = tmp_path / "service.toml"
    config.write_text(f'[gateway]\nport = 18080\nservers_dir = "{SERVERS}"\nkeys_file = "{tmp_path / "none.toml"}"\n'
                      "listen_backlog = 77\nmax_body_bytes = 2048\n[supervisor]\nport = 18787\n")
    return config


def test_gateway_tree_from_the_config(gateway_config):
    service, reactor = build(gateway_tap, ["--config", str(gateway_config)])
    assert [type(child).__name__ for child in service] == ["TCPServer", "ReplicaProbe"]
    assert (service.probe.interval, service.probe.replicas) == (1.0, [])  # one replica each: nothing to probe
    assert (service.app.cluster.secret, service.app.cluster.host_id) == (None, "")
    listener = listener_of(service)
    assert listener.args == (18080, service.site)
    assert listener.kwargs == {"backlog": 77, "interface": "127.0.0.1"}
    assert (service.config.port, service.config.max_body_bytes, service.config.cors_origins) == (
        18080, 2048, ("http://127.0.0.1:18787", "http://localhost:18787"))
    assert service.reactor is reactor and service.program == "service-gateway" and not service.running
    assert (service.setup.mode, service.setup.gateway_token, service.setup.metrics_token) == (
        "static-token", INFERENCE, METRICS)
    assert [u.id for u in service.catalog] == CATALOG
    assert service.drain_timeout == 181.0
    assert (service.site.max_body_bytes, service.site.max_connections) == (2048, 1024)
    assert reactor.tcpServers == []  # nothing listens before the service starts


def test_gateway_options_override_the_config(gateway_config, tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[keys.a]\nhash = "{"a" * 64}"\n')
    servers = tmp_path / "servers"
    servers.mkdir()
    (servers / "M.toml").write_text('id = "M"\nport = 9999\nserver_uri = "/m"\n')
    service, _ = build(gateway_tap, ["--config", str(gateway_config), "--host", "127.0.0.2", "--port", "18081",
                                     "--keys", str(keys), "--servers", str(servers)])
    assert listener_of(service).args[0] == 18081
    assert listener_of(service).kwargs["interface"] == "127.0.0.2"
    assert (service.config.keys_file, service.config.servers_dir) == (str(keys), str(servers))
    assert (service.setup.mode, [k.name for k in service.setup.keys]) == ("api-keys", ["a"])
    assert [u.id for u in service.catalog] == ["M"]
    assert service.listen_address == "127.0.0.2:18081"


def test_a_model_deadline_the_gateway_would_cut_with_its_502_is_a_warning_at_start(gateway_config, tmp_path):
    """A deadlines probe: with ``upstream_recv_timeout_ms = 2000`` and a model's ``run_timeout_ms = 3000``, a
    request reaching its deadline got the gateway's 502 after 2 s, where the model would have answered 504 (or a
    partial 200), and nothing said so."""
    from twisted.logger import capturedLogs

    servers = tmp_path / "servers"
    servers.mkdir()
    (servers / "SLOW.toml").write_text('id = "SLOW"\nport = 9998\nserver_uri = "/slow"\nrun_timeout_ms = 3000\n')
    (servers / "FAST.toml").write_text('id = "FAST"\nport = 9999\nserver_uri = "/fast"\nrun_timeout_ms = 1999\n')
    gateway_config.write_text(gateway_config.read_text().replace("[gateway]\n", "[gateway]\n"
                                                                 "upstream_recv_timeout_ms = 2000\n"))
    with capturedLogs() as events:
        build(gateway_tap, ["--config", str(gateway_config), "--servers", str(servers)])
    said = [e["log_format"].format(**e) for e in events if "run_timeout_ms" in e["log_format"]]
    assert said == [f"SLOW: run_timeout_ms (3000 ms, {servers / 'SLOW.toml'}) is not below the gateway's "
                    "upstream_recv_timeout_ms (2000 ms): a synchronous request that reaches its deadline gets the "
                    "gateway's 502, not the model's 504 or partial 200"]


def test_gateway_replicas_job_secret_and_host_from_the_environment(gateway_config, environment):
    environment.setenv("SERVICE_UPSTREAM_PORTS", '{"MOBILENETV2": [9101, 9201, 9301]}')
    environment.setenv("SERVICE_UPSTREAM_TOKENS", '{"MOBILENETV2": ["a", "b", "c"], "YOLOV8": "y"}')
    environment.setenv("SERVICE_JOB_SECRET", "s" * 64)
    environment.setenv("SERVICE_HOST_ID", "host-2")
    gateway_config.write_text(gateway_config.read_text().replace("[supervisor]", "replica_probe_interval_ms = 250\n"
                                                                                 "[supervisor]")
                              + '\n[cluster]\nhost_id = "host-2"\n')
    service, _ = build(gateway_tap, ["--config", str(gateway_config)])
    mobilenet = service.catalog.by_id["MOBILENETV2"]
    assert [(r.index, r.port, r.token) for r in mobilenet.replicas] == [(0, 9101, "a"), (1, 9201, "b"), (2, 9301, "c")]
    assert [(r.port, r.token) for r in service.catalog.by_id["YOLOV8"].replicas] == [(9102, "y")]
    assert (service.app.cluster.secret, service.app.cluster.host_id) == ("s" * 64, "host-2")
    assert service.probe.interval == 0.25 and service.probe.replicas == list(mobilenet.replicas)
    assert service.app.balancer is service.balancer is service.probe.balancer


@pytest.mark.parametrize("ports, tokens, message", [
    ('{"MOBILENETV2": [9101, 9102]}', "", "port 9102 is used twice: by MOBILENETV2 replica 1 and by YOLOV8"),
    ('{"MOBILENETV2": [9101, 9201]}', '{"MOBILENETV2": ["a"]}',
     "SERVICE_UPSTREAM_TOKENS has 1 token(s) for MOBILENETV2, which runs 2 replica(s) (SERVICE_UPSTREAM_PORTS)"),
    ('{"MOBILENETV2": []}', "", "SERVICE_UPSTREAM_PORTS: MOBILENETV2 must have a list of 1 to 64 ports (1-65535)"),
    ("[9101]", "", "SERVICE_UPSTREAM_PORTS must be a JSON object by catalog id"),
    ("", '{"MOBILENETV2": 7}', "SERVICE_UPSTREAM_TOKENS: MOBILENETV2 must have a token string or a list of token "
                               "strings"),
])
def test_gateway_refuses_a_layout_it_cannot_route(gateway_config, environment, ports, tokens, message):
    environment.setenv("SERVICE_UPSTREAM_PORTS", ports)
    environment.setenv("SERVICE_UPSTREAM_TOKENS", tokens)
    assert refusal(gateway_tap, ["--config", str(gateway_config)]) == f"service-gateway: {message}"


def test_gateway_adopts_the_supervisors_socket(gateway_config):
    from svc.gateway.drain import AdoptedListener

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        fd = os.dup(held.fileno())
        try:
            service, _ = build(gateway_tap, ["--config", str(gateway_config), "--listen-fd", str(fd),
                                             "--ready-fd", "9"])
        finally:
            os.close(fd)
    assert [type(child).__name__ for child in service] == [AdoptedListener.__name__, "ReplicaProbe"]
    assert service.ready_fd == 9
    assert service.listen_address == f"127.0.0.1:18080 (socket on fd {fd} from the supervisor)"


def test_gateway_refusals(gateway_config, environment, tmp_path):
    config = str(gateway_config)
    typo = str(tmp_path / "servce.toml")  # a --config given that does not exist was every default, without a word
    assert refusal(gateway_tap, ["--config", typo]) == (
        f"service-gateway: {typo}: file not found (a --config that is given must exist; only the default "
        "conf/service.toml may be missing, meaning every default)")
    environment.setenv("SERVICE_EXPOSE", "no")
    assert refusal(gateway_tap, ["--config", config, "--host", "0.0.0.0"]) == (
        "service-gateway: refusing the wildcard bind '0.0.0.0': set SERVICE_EXPOSE=docker (in a container) or "
        "SERVICE_EXPOSE=unsafe to expose the gateway")
    environment.setenv("SERVICE_METRICS_TOKEN", INFERENCE)
    assert refusal(gateway_tap, ["--config", config]) == (
        "service-gateway: SERVICE_METRICS_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN: the metrics token must differ "
        "from the inference and management tokens")
    environment.delenv("SERVICE_METRICS_TOKEN")
    assert refusal(gateway_tap, ["--config", config]) == (
        "service-gateway: SERVICE_METRICS_TOKEN is not set: the gateway needs its own metrics token (also on loopback)")
    environment.setenv("SERVICE_METRICS_TOKEN", METRICS)
    environment.delenv("SERVICE_GATEWAY_AUTH_TOKEN")
    assert refusal(gateway_tap, ["--config", config]) == (
        f"service-gateway: no API key file at {tmp_path / 'none.toml'} and neither SERVICE_GATEWAY_AUTH_TOKEN or "
        "SERVICE_API_TOKEN is set: no credential would be accepted (there is no anonymous mode)")
    bad = tmp_path / "bad.toml"
    bad.write_text("[gateway]\nport = 0\n")
    assert refusal(gateway_tap, ["--config", str(bad)]) == (
        f"service-gateway: {bad}: gateway.port: must be at least 1, got 0")
    for key, kind in (("keys_file", "file"), ("servers_dir", "folder")):  # "" gave ": the model-server config ..."
        bad.write_text(f'[gateway]\n{key} = " "\n')
        assert refusal(gateway_tap, ["--config", str(bad)]) == (
            f"service-gateway: {bad}: gateway.{key}: must name a {kind}, got an empty string")
    environment.setenv("SERVICE_GATEWAY_AUTH_TOKEN", INFERENCE)
    misspelt = tmp_path / "misspelt.toml"
    misspelt.write_text("[gatway]\nport = 18080\n")
    assert refusal(gateway_tap, ["--config", str(misspelt)]) == (
        f"service-gateway: {misspelt}: gatway: unknown table; known: gateway, supervisor, servers, cluster")
    assert refusal(gateway_tap, ["--config", config, "--port", "9101"]) == (  # MOBILENETV2's port
        "service-gateway: --port: 9101 is also the port of MOBILENETV2")
    # the folder named by the option or the key that gave it (a config probe: the line named neither)
    assert refusal(gateway_tap, ["--config", config, "--servers", str(tmp_path / "nowhere")]) == (
        f"service-gateway: --servers: {tmp_path / 'nowhere'} does not exist (relative to {os.getcwd()})")
    bad.write_text(f'[gateway]\nservers_dir = "{bad}"\n')
    assert refusal(gateway_tap, ["--config", str(bad)]) == (
        f"service-gateway: {bad}: gateway.servers_dir: {bad} is not a folder")


# ---------------------------------------------------------------- supervisor


@pytest.fixture
def supervisor_config(tmp_path, environment):
    environment.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    environment.setenv("SERVICE_METRICS_TOKEN", METRICS)
    config = tmp_path / "service.toml"
    config.write_text(f'[supervisor]\nport = 18787\nservers_dir = "{SERVERS}"\nprofiles_dir = "{PROFILES}"\n'
                      f'log_dir = "{tmp_path / "logs"}"\nmax_connections = 12\nlisten_backlog = 33\n'
                      "[gateway]\nport = 18080\n[servers.DDPM]\nrestart = \"always\"\n")
    return config


def test_supervisor_tree_from_the_config(supervisor_config):
    service, reactor = build(supervisor_tap, ["--config", str(supervisor_config), "--profile", "cpu"])
    assert [type(child).__name__ for child in service] == ["TCPServer"]
    listener = listener_of(service)
    assert listener.args == (18787, service.site)
    assert listener.kwargs == {"backlog": 33, "interface": "127.0.0.1"}
    assert (service.site.max_connections, service.site.max_body_bytes) == (12, 64 * 1024)
    manager = service.manager
    assert (manager.profile.name, manager.profile.device, manager.profile.weights) == ("cpu", "cpu", "demo")
    assert (manager.config.gateway_port, manager.config.server_policies) == (18080, {"DDPM": "always"})
    assert sorted(c.id for c in manager.catalog) == CATALOG
    assert service.reactor is reactor and manager.reactor is reactor and not service.running
    assert reactor.tcpServers == []
    # The gateway and the profile's models, none spawned yet (a memory reactor cannot spawn).
    assert list(manager.children) == ["__gateway", *CATALOG]
    assert {(child.state, child.pid) for child in manager.children.values()} == {("stopped", None)}


@pytest.mark.parametrize("token, warned", [("m", True), ("m" * 16, False)])
def test_a_short_management_token_is_warned_of_when_the_supervisor_starts(supervisor_config, environment, token,
                                                                           warned):
    """A one-character SERVICE_API_TOKEN opened the supervisor without a word (a security probe); the supervisor
    warns of its own token (the gateway of the others) and starts."""
    from twisted.logger import capturedLogs

    environment.setenv("SERVICE_API_TOKEN", token)
    with capturedLogs() as events:
        service, _ = build(supervisor_tap, ["--config", str(supervisor_config), "--profile", "cpu"])
    said = [e["warning"] for e in events if "warning" in e]
    assert said == (["SERVICE_API_TOKEN has 1 character: a token that short can be guessed; use 32 random characters "
                     "or more (svcctl keygen makes 64)"] if warned else [])
    assert service.manager is not None


def test_supervisor_options_override_the_config_and_the_profile(supervisor_config, environment):
    from svc.supervisor import config

    environment.setattr(config, "nvidia_present", lambda: True)  # the gpu profile needs a driver (next test)
    service, _ = build(supervisor_tap, ["--config", str(supervisor_config), "--host", "127.0.0.3", "--port", "18788",
                                        "--profile", "gpu", "--weights", "pretrained"])
    assert listener_of(service).args[0] == 18788 and listener_of(service).kwargs["interface"] == "127.0.0.3"
    assert (service.manager.profile.name, service.manager.profile.device, service.manager.profile.weights) == (
        "gpu", "gpu", "pretrained")


def test_the_gpu_profile_on_a_machine_without_an_nvidia_driver_is_refused_with_one_line(supervisor_config,
                                                                                        environment):
    """A config probe: ``profile = "gpu"`` on a CPU machine started the supervisor; each model then refused alone,
    telling to set ``backend.device = "cpu"`` (which it said already) or to pass ``--device cpu``."""
    from svc.supervisor import config

    environment.setattr(config, "nvidia_present", lambda: False)
    with pytest.raises(SystemExit) as refused:
        build(supervisor_tap, ["--config", str(supervisor_config), "--profile", "gpu"])
    assert str(refused.value) == (
        "service-supervisor: --profile: the 'gpu' profile runs its models on an NVIDIA GPU, but this machine shows "
        "none (no /proc/driver/nvidia/version, nor /dev/dxg or /dev/nvhost-ctrl-gpu or /dev/nvidiactl): choose the "
        "cpu profile, or auto")


def test_a_supervisor_without_a_complete_ui_is_refused_with_one_line(supervisor_config, environment, tmp_path):
    """A partial copy of the UI (here, every file but one under the prefix) failed the start with a
    FileNotFoundError traceback; a working directory's complete ui/ was served as the management UI."""
    import shutil
    import sys

    from svc.infra import install

    site_packages = tmp_path / "base" / "lib" / "python3.11" / "site-packages"
    site_packages.mkdir(parents=True)
    shutil.copytree(REPO / "ui", tmp_path / "prefix" / "share" / "inference-service" / "ui")
    (tmp_path / "prefix" / "share" / "inference-service" / "ui" / "results.js").unlink()
    shutil.copytree(REPO / "ui", tmp_path / "work" / "ui")  # the user's own folder: never the service's UI
    environment.setattr(install, "source_root", lambda: site_packages)
    environment.setattr(sys, "prefix", str(tmp_path / "prefix"))
    environment.chdir(tmp_path / "work")
    assert refusal(supervisor_tap, ["--config", str(supervisor_config)]) == (
        "service-supervisor: the web UI's files are missing: no complete copy in the checkout's ui/, in "
        "share/inference-service/ui beside the installed package, or in "
        f"{tmp_path / 'prefix'}/share/inference-service/ui; reinstall the service")


def test_supervisor_refusals(supervisor_config, environment, tmp_path):
    config = str(supervisor_config)
    assert refusal(supervisor_tap, ["--config", config, "--host", "::"]) == (
        "service-supervisor: refusing the wildcard bind '::': set SERVICE_EXPOSE=docker (in a container) or "
        "SERVICE_EXPOSE=unsafe to expose the management API")
    bad = tmp_path / "bad.toml"
    bad.write_text("[supervisor]\nbackoff_max_ms = -1\n")
    assert refusal(supervisor_tap, ["--config", str(bad)]) == (
        f"service-supervisor: {bad}: supervisor.backoff_max_ms: must be at least 0, got -1")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[supervisors]\n")
    assert refusal(supervisor_tap, ["--config", str(unknown)]) == (
        f"service-supervisor: {unknown}: supervisors: unknown table; known: gateway, supervisor, servers, cluster")
    # the [gateway] keys it reads itself, checked as the gateway checks them (a bare int() gave a traceback for
    # "abc", and port = true bound port 1), before anything listens; the rest is the gateway's to check
    for line, problem in (('port = "abc"', "gateway.port: must be an integer, got string 'abc'"),
                          ("port = true", "gateway.port: must be an integer, got boolean True"),
                          ("port = 45080.9", "gateway.port: must be an integer, got float 45080.9"),
                          ("listen_backlog = [1]", "gateway.listen_backlog: must be an integer, got array [1]"),
                          ("replica_probe_interval_ms = 5", "gateway.replica_probe_interval_ms: must be at least "
                                                            "100, got 5")):
        wrong = tmp_path / "gateway.toml"
        wrong.write_text(f'[supervisor]\nservers_dir = "{SERVERS}"\nprofiles_dir = "{PROFILES}"\n[gateway]\n{line}\n'
                         "cors_origins = []\n")
        assert refusal(supervisor_tap, ["--config", str(wrong)]) == f"service-supervisor: {wrong}: {problem}"
    with pytest.raises(usage.UsageError, match=r"^--port must be 1\.\.65535, not 70000$"):  # exit 64, as the others
        build(supervisor_tap, ["--config", config, "--port", "70000"])
    # the folders, each named by its key (an empty log_dir gave "No such file or directory", an empty
    # profiles_dir "cpu.toml: file not found", an empty servers_dir ": the model-server config directory ...")
    folders = {"servers_dir": SERVERS, "profiles_dir": PROFILES, "log_dir": tmp_path / "logs"}
    for key, value, problem in (
            ("servers_dir", tmp_path / "none", f"{tmp_path / 'none'} does not exist (relative to {os.getcwd()})"),
            ("servers_dir", bad, f"{bad} is not a folder"),
            ("servers_dir", "", "must name a folder, got an empty string"),
            ("profiles_dir", tmp_path / "none", f"{tmp_path / 'none'} does not exist (relative to {os.getcwd()})"),
            ("profiles_dir", " ", "must name a folder, got an empty string"),
            ("log_dir", bad, f"{bad} is not a folder"),
            ("log_dir", "", "must name a folder, got an empty string")):
        elsewhere = tmp_path / "elsewhere.toml"
        elsewhere.write_text("[supervisor]\n" + "".join(f'{k} = "{value if k == key else v}"\n'
                                                        for k, v in folders.items()))
        assert refusal(supervisor_tap, ["--config", str(elsewhere)]) == (
            f"service-supervisor: {elsewhere}: supervisor.{key}: {problem}")
    # a profile without its file, and a log_dir that cannot be made, named by their keys (a config probe: the lines
    # were "profiles/gpu.toml: file not found" and "/proc/logs: No such file or directory")
    cpu_only = tmp_path / "cpu-only"
    cpu_only.mkdir()
    (cpu_only / "cpu.toml").write_text((PROFILES / "cpu.toml").read_text())
    gpu = tmp_path / "gpu.toml"
    gpu.write_text(f'[supervisor]\nservers_dir = "{SERVERS}"\nprofiles_dir = "{cpu_only}"\nprofile = "gpu"\n'
                   f'log_dir = "{tmp_path / "logs"}"\n')
    missing = f"'gpu' has no profile file: {cpu_only}/gpu.toml does not exist (relative to {os.getcwd()}; "
    assert refusal(supervisor_tap, ["--config", str(gpu)]) == (
        f"service-supervisor: {gpu}: supervisor.profile: {missing}supervisor.profiles_dir)")
    gpu.write_text(gpu.read_text().replace('profile = "gpu"', 'profile = "cpu"'))
    assert refusal(supervisor_tap, ["--config", str(gpu), "--profile", "gpu"]) == (
        f"service-supervisor: --profile: {missing}supervisor.profiles_dir)")
    proc = tmp_path / "proc.toml"
    proc.write_text(f'[supervisor]\nservers_dir = "{SERVERS}"\nprofiles_dir = "{PROFILES}"\nlog_dir = "/proc/logs"\n')
    assert refusal(supervisor_tap, ["--config", str(proc)]).startswith(
        f"service-supervisor: {proc}: supervisor.log_dir: /proc/logs: ")
    # --demo-models as the profile's demo: a misspelt id (here a lowercase one) was dropped without a word
    assert refusal(supervisor_tap, ["--config", config, "--demo-models", "MOBILENETV2, mobilenetv2,NOPE"]) == (
        f"service-supervisor: --demo-models names ids without a config in {SERVERS}: ['mobilenetv2', 'NOPE']")
    typo = str(tmp_path / "servce.toml")
    assert refusal(supervisor_tap, ["--config", typo]) == (
        f"service-supervisor: {typo}: file not found (a --config that is given must exist; only the default "
        "conf/service.toml may be missing, meaning every default)")
    # A fail-closed probe: a gateway host the gateway refuses started the supervisor and its models without it.
    wildcard = tmp_path / "wildcard.toml"
    wildcard.write_text(f'[supervisor]\nservers_dir = "{SERVERS}"\nprofiles_dir = "{PROFILES}"\n[gateway]\nhost = ""\n')
    assert refusal(supervisor_tap, ["--config", str(wildcard)]) == (
        "service-supervisor: [gateway] host: refusing the wildcard bind '': set SERVICE_EXPOSE=docker (in a "
        "container) or SERVICE_EXPOSE=unsafe to expose the gateway")
    # ... and tokens no client can send: its own, and those it hands the gateway.
    for name in ("SERVICE_API_TOKEN", "SERVICE_GATEWAY_AUTH_TOKEN"):
        with pytest.MonkeyPatch.context() as env:
            env.setenv(name, "   ")
            assert refusal(supervisor_tap, ["--config", config]) == (
                f"service-supervisor: {name} has only spaces: a token must be printable ASCII without spaces (a "
                "bearer token)")
    environment.setenv("SERVICE_METRICS_TOKEN", MANAGEMENT)
    assert refusal(supervisor_tap, ["--config", config]) == (
        "service-supervisor: SERVICE_METRICS_TOKEN equals SERVICE_API_TOKEN: the metrics token must differ from the "
        "inference and management tokens")
    environment.delenv("SERVICE_METRICS_TOKEN")
    assert refusal(supervisor_tap, ["--config", config]) == (
        "service-supervisor: SERVICE_METRICS_TOKEN is not set: the gateway needs its own metrics token (also on "
        "loopback)")
    environment.delenv("SERVICE_API_TOKEN")
    assert refusal(supervisor_tap, ["--config", config]) == (
        "service-supervisor: SERVICE_API_TOKEN is not set: the management API needs it (no anonymous mode)")


# ---------------------------------------------------------------- model server


@pytest.fixture
def torch_setup(monkeypatch):
    """``prepare_torch`` recorded instead of applied: it changes the whole test process."""
    seen = []

    def prepare(config, share):
        seen.append((config, share))
        return config.backend.device

    monkeypatch.setattr(model_tap, "prepare_torch", prepare)
    return seen


def test_model_server_tree_from_the_config_and_options(torch_setup, environment):
    environment.setenv("SERVICE_AUTH_TOKEN", "model-token")
    service, reactor = build(model_tap, ["--server", str(SERVERS / "MOBILENETV2.toml"), "--port", "19101",
                                         "--device", "cpu", "--weights", "demo"])
    assert [type(child).__name__ for child in service] == ["TCPServer", "ThreadPoolService", "ThreadPoolService",
                                                           "IdleTrim"]  # tune_malloc on, as shipped
    assert list(service)[1:3] == [service.decode, service.workers]
    listener = listener_of(service)
    assert listener.args == (19101, service.site)
    assert listener.kwargs == {"backlog": 1024, "interface": "127.0.0.1"}
    [(config, share)] = torch_setup
    assert config is service.config and share == 1  # SERVICE_CPU_SHARE unset: one process on these CPUs
    assert (config.id, config.port, config.backend.device, config.model["weights"]) == (
        "MOBILENETV2", 19101, "cpu", "random")
    assert (service.device, service.app.auth_token, service.jobs is None) == ("cpu", "model-token", True)
    assert service.reactor is reactor and not service.running
    assert reactor.tcpServers == []


@pytest.mark.parametrize("argv, origin", [([], str(SERVERS / "MOBILENETV2.toml")),
                                          (["--weights", "pretrained"], "--weights pretrained")])
def test_weights_that_fail_to_load_are_named_with_what_chose_them(torch_setup, environment, monkeypatch, argv,
                                                                 origin):
    """A load's refusal names the ``[model] weights`` value and the file (or the option) that chose it, as a
    missing file's does (a config probe: it named the resolved file alone)."""
    from twisted.logger import LogLevel, capturedLogs
    from twisted.python.failure import Failure

    from svc.model.weights import WeightsError

    # The cached variant stands in as random init here: only what chose the weights is looked at.
    monkeypatch.setattr("svc.model.weights.resolve_pretrained",
                        lambda factory, table, *args, **kwargs: {**table, "weights": "random"})
    environment.setenv("SERVICE_AUTH_TOKEN", "model-token")
    service, reactor = build(model_tap, ["--server", str(SERVERS / "MOBILENETV2.toml"), *argv])
    with capturedLogs() as events:
        service._load_failed(Failure(WeightsError("weights file /w/x.pth: missing tensor 'a' (shape [1])")))
    [critical] = [e for e in events if e["log_level"] == LogLevel.critical]
    chosen = "pretrained" if argv else "random"
    assert (critical["program"], critical["message"]) == (
        "service-model", f"weights '{chosen}' (from {origin}): weights file /w/x.pth: missing tensor 'a' (shape [1])")
    assert not reactor.running and service.app.not_ready_reason == "the model failed to load"


def test_model_server_refusals(torch_setup, environment, tmp_path):
    server = str(SERVERS / "MOBILENETV2.toml")
    assert refusal(model_tap, ["--server", server]) == (
        "service-model: SERVICE_AUTH_TOKEN is not set: set it (the supervisor injects one) or pass --dev-no-auth "
        "for local development")
    environment.setenv("SERVICE_AUTH_TOKEN", " \t ")  # started, and nothing could ever authenticate
    assert refusal(model_tap, ["--server", server]) == (
        "service-model: SERVICE_AUTH_TOKEN has only spaces: a token must be printable ASCII without spaces (a bearer "
        "token)")
    environment.delenv("SERVICE_AUTH_TOKEN")
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "MOBILENETV2"\nport = 9101\nserver_uri = "/healthz"\n')
    assert refusal(model_tap, ["--server", str(bad), "--dev-no-auth"]) == (
        f"service-model: {bad}: server_uri: '/healthz' collides with a path the server answers itself")
    assert refusal(model_tap, ["--server", str(tmp_path / "missing.toml"), "--dev-no-auth"]) == (
        f"service-model: {tmp_path / 'missing.toml'}: file not found")
    assert torch_setup == []  # refused before any process-wide setting


def test_a_file_as_a_diffusion_models_weights_is_named_with_its_config(torch_setup, environment, tmp_path):
    """A regression probe: a DDPM config naming a file (the diffusion models load a save_pretrained folder) was
    refused as "its plugin models.diffusion raised WeightsError in params_schema(config)": a plugin's crash, naming
    neither the config nor its key. It reads as every other weights refusal now."""
    environment.setenv("SERVICE_AUTH_TOKEN", "model-token")
    (tmp_path / "bad.pth").write_bytes(b"not a folder")
    config = tmp_path / "DDPM.toml"
    config.write_text((SERVERS / "DDPM.toml").read_text().replace('weights = "random"', 'weights = "bad.pth"', 1))
    assert refusal(model_tap, ["--server", str(config)]) == (
        f"service-model: weights 'bad.pth' (from {config}): weights {tmp_path / 'bad.pth'}: the diffusion models load "
        "a folder written by save_pretrained, not a file")


def test_every_program_refuses_a_job_secret_too_short_to_sign_with(torch_setup, gateway_config, environment, tmp_path):
    """A config probe: ``SERVICE_JOB_SECRET=x`` was taken by the model server, the gateway and the supervisor."""
    line = ("SERVICE_JOB_SECRET must be at least 16 printable ASCII characters without spaces (it signs job ids); "
            "`python3 -c 'import secrets; print(secrets.token_hex(32))'` makes one")
    environment.setenv("SERVICE_JOB_SECRET", "x")
    environment.setenv("SERVICE_AUTH_TOKEN", "model-token")
    assert refusal(model_tap, ["--server", str(SERVERS / "MOBILENETV2.toml")]) == f"service-model: {line}"
    assert refusal(gateway_tap, ["--config", str(gateway_config)]) == f"service-gateway: {line}"
    environment.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    assert refusal(supervisor_tap, ["--config", str(gateway_config)]) == f"service-supervisor: {line}"
    assert torch_setup == []


def test_model_server_replica_environment(torch_setup, environment):
    environment.setenv("SERVICE_AUTH_TOKEN", "model-token")
    environment.setenv("SERVICE_REPLICA", "3")
    environment.setenv("SERVICE_CPU_SHARE", "2")
    service, _ = build(model_tap, ["--server", str(SERVERS / "MOBILENETV2.toml"), "--port", "19401"])
    [(_, share)] = torch_setup
    assert share == 2 and service.replica == "3" and listener_of(service).args[0] == 19401
    from svc.infra.metrics import render

    assert 'service_model_info{device="cpu",model="MOBILENETV2",optimize="loading",replica="3",version="loading"} 1.0' in \
        render(service.registry).decode()
    for bad in ("0", "two", "-1", "65", "9" * 20, "\u00b2"):  # the last two: a config probe (taken; int() failed)
        environment.setenv("SERVICE_CPU_SHARE", bad)
        assert refusal(model_tap, ["--server", str(SERVERS / "MOBILENETV2.toml")]) == (
            f"service-model: SERVICE_CPU_SHARE must be a whole number from 1 to 64 (replicas sharing these CPUs), "
            f"not {bad!r}")


def test_model_server_device_refusal_names_the_file(environment, monkeypatch):
    from svc.model import torchenv

    def no_cuda(device, limit):
        raise torchenv.DeviceError("backend.device is 'gpu' but CUDA is not available")

    monkeypatch.setattr(torchenv, "tune_malloc", lambda: True)
    monkeypatch.setattr(torchenv, "configure_threads", lambda threads, workers, share: 1)
    monkeypatch.setattr(torchenv, "select_device", no_cuda)
    server = str(SERVERS / "MOBILENETV2.toml")
    assert refusal(model_tap, ["--server", server, "--device", "gpu", "--dev-no-auth"]) == (
        f"service-model: {server}: backend.device is 'gpu' but CUDA is not available")


@pytest.mark.parametrize("tap, argv, message", [
    (gateway_tap, ["--port", "-1"], "--port must be 0..65535, not -1"),  # 0: a free port (tests/support)
    (gateway_tap, ["--port", "65536"], "--port must be 0..65535, not 65536"),
    (gateway_tap, ["--listen-fd", "2"], "--listen-fd must be an inherited descriptor >= 3, not 2"),
    (gateway_tap, ["--ready-fd", "1"], "--ready-fd must be an inherited descriptor >= 3, not 1"),
    (supervisor_tap, ["--profile", "tpu"], "--profile must be cpu, gpu or auto, not 'tpu'"),
    (supervisor_tap, ["--weights", "random"], "--weights must be demo or pretrained, not 'random'"),
    (model_tap, [], "--server is required (for example --server conf/server/MOBILENETV2.toml)"),
    (model_tap, ["--server", "x.toml", "--device", "tpu"], "--device must be cpu or gpu, not 'tpu'"),
    (model_tap, ["--server", "x.toml", "--port", "70000"], "--port must be 0..65535, not 70000"),
])
def test_bad_options_are_refused_by_the_option_parser(tap, argv, message):
    """twistd prints these usage errors with the synopsis and exits before makeService runs."""
    with pytest.raises(usage.UsageError) as error:
        tap.Options().parseOptions(argv)
    assert str(error.value) == message


def test_the_gateway_keys_the_supervisor_reads_are_checked_as_the_gateway_checks_them():
    """The supervisor cannot import the gateway (the layers): its declarations of the keys it reads must agree."""
    from svc.gateway.config import GATEWAY_KEYS
    from svc.supervisor.config import GATEWAY_READ

    gateway = {k.name: k for k in GATEWAY_KEYS}
    assert {k.name for k in GATEWAY_READ} == {"host", "port", "listen_backlog", "replica_probe_interval_ms",
                                               "upstream_recv_timeout_ms", "keys_file"}
    for key in GATEWAY_READ:
        mine = gateway[key.name]
        assert (key.type, key.default, key.minimum, key.maximum, key.choices, key.pattern) == (
            mine.type, mine.default, mine.minimum, mine.maximum, mine.choices, mine.pattern), key.name
