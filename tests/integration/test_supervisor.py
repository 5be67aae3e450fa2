"""The supervisor with real children: the gateway and two model servers."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest

from tests.support.http import get, post, request
from tests.support.images import image_b64
from tests.support.processes import child_env, free_port, run_to_exit
from tests.support.stack import TOKENS, build_stack, key_entry, stop_stack

MODELS = {"MOBILENETV2": {}, "TESTFAULTS": {"async_enabled": True, "max_batch_size": 1}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = build_stack(tmp_path_factory.mktemp("stack"), MODELS, supervisor_extra="port_wait_ms = 2000\n")
    for name in ("__gateway", *MODELS):
        s.wait_for(name, lambda c: c["state"] == "running" and c["ready"])
    yield s
    code, survivors = stop_stack(s)
    assert code == 0, s.supervisor.output()[-3000:]
    assert survivors == [], f"children left behind: {survivors}"


def api(stack, method, path, **kw):
    # A start or restart answers once the model is ready: up to start_timeout_ms (180 s), longer than a
    # cold start on a loaded 2-core machine can take.
    kw.setdefault("timeout", 200.0)
    return request(method, stack.url + path, headers={**stack.auth, **kw.pop("headers", {})}, **kw)


def assert_error(reply, code):
    assert reply.status == code, reply.body
    assert reply.header("Content-Type") == "application/json; charset=utf-8"
    assert reply.json["ok"] is False and reply.json["error"]


# -- reading ---------------------------------------------------------------------------------


def test_health_needs_no_token(stack):
    reply = get(stack.url + "/api/v1/health")
    assert reply.status == 200 and reply.json["ok"] is True and reply.json["version"]


def test_catalog_and_status_bodies(stack):
    catalog = api(stack, "GET", "/api/v1/catalog").json
    assert catalog["ok"] is True and catalog["profile"] == "cpu"
    mobilenet = next(m for m in catalog["models"] if m["id"] == "MOBILENETV2")
    assert mobilenet == {"id": "MOBILENETV2", "category": "classification", "task": "image-classification",
                         "needs_image": True,
                         "server_uri": "/mobilenetv2/predict", "infer_path": "/v1/models/MOBILENETV2/infer",
                         "port": stack.model_ports["MOBILENETV2"], "async": False, "in_profile": True,
                         "weights": {"kind": "demo", "variant": None}}
    status = api(stack, "GET", "/api/v1/status").json
    assert status["ok"] is True and status["profile"] == "cpu" and status["device"] == "cpu"
    assert status["pid"] == stack.supervisor.popen.pid  # whose status it is (the quick start trusts only its own)
    assert status["gateway"]["state"] == "running" and status["gateway"]["port"] == stack.gateway_port
    assert status["gateway"]["keys_file"] == str(stack.keys_file)  # absolute: what svcctl keys compares with
    faults = next(s for s in status["servers"] if s["id"] == "TESTFAULTS")
    assert faults["async"] is True and faults["state"] == "running" and faults["ready"] is True
    assert isinstance(faults["pid"], int) and faults["uptime_s"] > 0 and faults["last_error"] is None
    assert faults["policy"] == "on-failure"
    assert status["weights"] == "demo" and faults["weights"] == {"kind": "demo", "variant": None}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}])
def test_management_routes_need_the_management_token(stack, headers):
    for method, path in (("GET", "/api/v1/catalog"), ("GET", "/api/v1/status"), ("GET", "/api/v1/metrics"),
                         ("POST", "/api/v1/servers/MOBILENETV2/restart"), ("GET", "/api/v1/servers/MOBILENETV2/logs")):
        assert_error(request(method, stack.url + path, headers=headers), 401)


def test_an_api_key_never_authorizes_the_management_api(stack):
    for token in (stack.key, stack.env["SERVICE_GATEWAY_AUTH_TOKEN"], stack.env["SERVICE_METRICS_TOKEN"]):
        assert_error(get(stack.url + "/api/v1/status", headers={"Authorization": f"Bearer {token}"}), 401)


@pytest.mark.parametrize("path", ["/api/v1/infer", "/api/v1/jobs", "/api/v1/jobs/job_1", "/api/v1/pipelines",
                                  "/api/v1/pipelines/x/run", "/api/v1/keys", "/api/v1/keys/reload", "/api/v2/status",
                                  "/api/v1/servers/MOBILENETV2/explode", "/nope"])
def test_removed_and_unknown_paths_are_404(stack, path):
    assert_error(api(stack, "GET", path), 404)
    assert_error(api(stack, "POST", path), 404)


def test_unknown_server_is_404_and_wrong_method_405(stack):
    assert_error(api(stack, "POST", "/api/v1/servers/NOSUCH/start"), 404)
    assert_error(api(stack, "GET", "/api/v1/servers/NOSUCH/logs"), 404)
    reply = api(stack, "GET", "/api/v1/servers/MOBILENETV2/start")
    assert_error(reply, 405)
    assert reply.header("Allow") == "POST"
    assert_error(api(stack, "DELETE", "/api/v1/status"), 405)


def test_logs_are_paged(stack):
    page = api(stack, "GET", "/api/v1/servers/MOBILENETV2/logs?limit=5").json
    assert page["ok"] is True and page["id"] == "MOBILENETV2" and 1 <= len(page["lines"]) <= 5
    assert page["next_offset"] == page["lines"][-1]["seq"] + 1 == page["end_offset"]
    first = api(stack, "GET", f"/api/v1/servers/MOBILENETV2/logs?offset={page['first_offset']}&limit=3").json
    assert [line["seq"] for line in first["lines"]] == list(range(page["first_offset"], page["first_offset"] + 3))
    assert any("ready" in line["line"] for line in api(stack, "GET", "/api/v1/servers/MOBILENETV2/logs?offset=0&limit=2000").json["lines"])
    for bad in ("limit=0", "limit=99999", "offset=-1", "offset=x"):
        assert_error(api(stack, "GET", f"/api/v1/servers/MOBILENETV2/logs?{bad}"), 400)
    assert (stack.root / "logs" / "MOBILENETV2.log").read_text().count("\n") > 3


def uptimes(stack) -> dict[str, float]:
    status = api(stack, "GET", "/api/v1/status").json
    return {c["id"] if "id" in c else "__gateway": c["uptime_s"] for c in [status["gateway"], *status["servers"]]}


def test_supervisor_metrics(stack):
    before = uptimes(stack)
    reply = api(stack, "GET", "/api/v1/metrics")
    after = uptimes(stack)
    gauge = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^service_supervisor_child_uptime_seconds\{child="([^"]+)",replica="0"\} (\S+)$', reply.body.decode(), re.M)}
    assert set(gauge) == {"__gateway", *MODELS} == set(before)
    for child, value in gauge.items():  # read between two status calls: the same clock, in between
        assert 0 < before[child] <= value <= after[child], (child, before, value, after)
    assert reply.status == 200 and reply.header("Content-Type").startswith("text/plain")
    text = reply.body.decode()
    assert 'service_supervisor_child_state{child="MOBILENETV2",replica="0",state="running"} 1.0' in text
    assert 'service_supervisor_child_ready{child="__gateway",replica="0"} 1.0' in text
    assert 'service_supervisor_child_restarts_total{child="TESTFAULTS",replica="0"}' in text
    frozen = re.search(r"^service_gc_frozen_objects (\S+)$", text, re.M)
    assert frozen and float(frozen.group(1)) > 10_000  # svc.infra.process.freeze_heap ran at startup


# -- actions ------------------------------------------------------------------------------------
# Done to TESTFAULTS: the supervisor treats every model server alike, and TESTFAULTS (no torchvision) is
# ready in about a third of MOBILENETV2's start.


def test_stop_start_restart_each_done_once_its_state_is_reached(stack):
    """docs/processes.md: a start of a running model and a stop of a stopped one are 200 (they were 500, and two
    scripts that make sure a model runs failed each other)."""
    before = stack.child("TESTFAULTS")
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/start").json == {"ok": True}
    assert stack.child("TESTFAULTS")["pid"] == before["pid"]  # running: nothing was started again
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/stop").json == {"ok": True}
    stopped = stack.child("TESTFAULTS")
    assert (stopped["state"], stopped["pid"], stopped["ready"]) == ("stopped", None, False)
    with pytest.raises(ProcessLookupError):
        os.kill(before["pid"], 0)
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/stop").json == {"ok": True}
    assert stack.child("TESTFAULTS")["state"] == "stopped"
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/start").json == {"ok": True}
    started = stack.child("TESTFAULTS")
    assert started["state"] == "running" and started["ready"] and started["pid"] != before["pid"]
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/restart").json == {"ok": True}
    restarted = stack.child("TESTFAULTS")
    assert restarted["restarts"] == started["restarts"] + 1 and restarted["ready"]


def test_sigkilled_model_server_is_restarted_and_counted(stack):
    before = stack.child("TESTFAULTS")
    os.kill(before["pid"], signal.SIGKILL)
    after = stack.wait_for("TESTFAULTS", lambda c: c["state"] == "running" and c["ready"] and c["pid"] != before["pid"])
    assert after["restarts"] == before["restarts"] + 1
    # the exit stays the reason shown after the restart (with the child's last log lines, when it printed any)
    assert after["last_error"] == "killed by signal 9" or after["last_error"].startswith("killed by signal 9: ")
    assert "killed by signal 9" == after["last_exit"]


def test_busy_port_is_waited_for_then_gives_start_failed(stack):
    """A port still busy after port_wait_ms (2 s here) is start_failed, shown by the status view."""
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/stop").status == 200
    port = stack.model_ports["TESTFAULTS"]
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may be in TIME_WAIT
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        started = time.monotonic()
        reply = api(stack, "POST", "/api/v1/servers/TESTFAULTS/start")
        assert time.monotonic() - started >= 2.0
        assert_error(reply, 500)
        assert f"port {port} is in use" in reply.json["error"]
        child = stack.child("TESTFAULTS")
        assert child["state"] == "start_failed" and "still in use after waiting 2 s" in child["last_error"]
        assert child["pid"] is None
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/start").status == 200


def test_busy_port_freed_during_the_wait_starts_the_child(stack):
    """A port freed within port_wait_ms: the start answers 200 once the child is ready."""
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/stop").status == 200
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("127.0.0.1", stack.model_ports["TESTFAULTS"]))
    blocker.listen()
    threading.Timer(0.8, blocker.close).start()
    reply = api(stack, "POST", "/api/v1/servers/TESTFAULTS/start")
    assert reply.status == 200, reply.body
    child = stack.child("TESTFAULTS")
    assert (child["state"], child["ready"], child["last_error"]) == ("running", True, None)


# -- through the gateway ---------------------------------------------------------------------------


def test_the_gateway_reaches_the_models_with_injected_tokens(stack):
    reply = post(stack.gateway + "/v1/models/MOBILENETV2/infer", {"images": [image_b64()]},
                 headers={"Authorization": f"Bearer {stack.key}"})
    assert reply.status == 200 and reply.json["status"] == 0
    assert reply.header("X-Service-Key") == "tenant-a"


def test_restarting_a_model_loses_its_jobs(stack):
    headers = {"Authorization": f"Bearer {stack.key}"}
    job = post(stack.gateway + "/v1/models/TESTFAULTS/jobs", {"images": [image_b64()]}, headers=headers).json
    done = get(stack.gateway + job["poll_url"] + "/wait?timeout=20000", headers=headers).json
    assert done["state"] == "done"
    assert api(stack, "POST", "/api/v1/servers/TESTFAULTS/restart").status == 200
    for suffix in ("", "/result"):
        reply = get(stack.gateway + job["poll_url"] + suffix, headers=headers)
        assert reply.status == 404 and "job not found" in reply.json["error"]


def test_gateway_restart_picks_up_a_new_key(stack):
    new_key = os.urandom(32).hex()
    headers = {"Authorization": f"Bearer {new_key}"}
    body = {"images": [image_b64()]}
    assert post(stack.gateway + "/v1/models/MOBILENETV2/infer", body, headers=headers).status == 401
    stack.keys_file.write_text(stack.keys_file.read_text() + "\n" + key_entry("tenant-b", new_key))
    assert post(stack.gateway + "/v1/models/MOBILENETV2/infer", body, headers=headers).status == 401  # no hot reload
    assert api(stack, "POST", "/api/v1/servers/__gateway/restart").json == {"ok": True}
    reply = post(stack.gateway + "/v1/models/MOBILENETV2/infer", body, headers=headers)
    assert reply.status == 200 and reply.header("X-Service-Key") == "tenant-b"


def test_a_restart_that_could_not_start_stops_nothing(stack):
    """A model whose edited config no longer loads, or moves its port or path, and a key file with a bad
    entry: the restart answers 500 with the reason, and the running process keeps serving as it was."""
    path = stack.root / "server" / "TESTFAULTS.toml"
    keys = stack.keys_file
    config, key_file = path.read_text(), keys.read_text()
    pid = stack.child("TESTFAULTS")["pid"]
    body, headers = {"images": [image_b64()]}, {"Authorization": f"Bearer {stack.key}"}
    port = re.search(r"^port = (\d+)$", config, re.M).group(1)
    try:
        for edited, reason in ((re.sub(r"^max_batch_size = \d+$", "max_batch_size = -3", config, flags=re.M),
                                "its config does not load"),
                               (config.replace(f"port = {port}", "port = 1"), f"changes port {port} -> 1"),
                               (re.sub(r'^server_uri = ".*"$', 'server_uri = "/elsewhere"', config, flags=re.M),
                                "changes server_uri")):
            path.write_text(edited)
            reply = api(stack, "POST", "/api/v1/servers/TESTFAULTS/restart")
            assert_error(reply, 500)
            assert reply.json["error"].startswith("TESTFAULTS: ") and reason in reply.json["error"], reply.json
            assert "nothing was stopped" in reply.json["error"]
            assert stack.child("TESTFAULTS")["pid"] == pid and stack.child("TESTFAULTS")["state"] == "running"
            assert post(stack.gateway + "/v1/models/TESTFAULTS/infer", body, headers=headers).status == 200
        path.write_text(config)
        keys.write_text(key_file + key_entry("typo", "c" * 64).replace("rate_limit_qps = 0", "rate_limit_qps = 0.5"))
        gateway = stack.child("__gateway")["pid"]
        reply = api(stack, "POST", "/api/v1/servers/__gateway/restart")
        assert_error(reply, 500)
        assert reply.json["error"].startswith("the key file cannot be used (") and "static-token" in reply.json["error"]
        assert stack.child("__gateway")["pid"] == gateway
        reply = post(stack.gateway + "/v1/models/TESTFAULTS/infer", body, headers=headers)
        assert reply.status == 200 and reply.header("X-Service-Key") == "tenant-a"  # the keys it had loaded
        # A security probe: a key file any local user can write was loaded without a word.
        keys.write_text(key_file)
        os.chmod(keys, 0o666)
        try:
            reply = api(stack, "POST", "/api/v1/servers/__gateway/restart")
        finally:
            os.chmod(keys, 0o600)
        assert_error(reply, 500)
        assert reply.json["error"].startswith(f"the key file cannot be used ({keys}: is writable by other users "
                                              "(mode 666): another user could add an API key to it;")
        assert stack.child("__gateway")["pid"] == gateway
        # A config probe: the gateway's port edited, its restart answered {ok: true} and it stayed where it was.
        keys.write_text(key_file)
        service = stack.root / "service.toml"
        settings = service.read_text()
        gateway_port = urlsplit(stack.gateway).port
        service.write_text(settings.replace(f"port = {gateway_port}\n", f"port = {gateway_port + 1}\n", 1))
        try:
            reply = api(stack, "POST", "/api/v1/servers/__gateway/restart")
        finally:
            service.write_text(settings)
        assert_error(reply, 500)
        assert reply.json["error"] == (f"{service} changes [gateway] port {gateway_port} -> {gateway_port + 1}: the "
                                       "supervisor holds the gateway's socket, bound at its start, so restart the "
                                       "supervisor to move it (nothing was stopped)")
        assert stack.child("__gateway")["pid"] == gateway
        assert post(stack.gateway + "/v1/models/TESTFAULTS/infer", body, headers=headers).status == 200
    finally:
        path.write_text(config)
        keys.write_text(key_file)


def test_a_key_file_named_anew_in_the_config_is_the_one_checked_and_reported(stack):
    """``[gateway] keys_file`` edited while the supervisor runs: the restart's gateway reads the new file, so that
    is the file checked before it starts and the status's ``keys_file`` (an operator probe: the file read at the
    supervisor's start was checked instead, a broken new file passed, and the gateway it started refused every
    API key after ``{ok: true}``; the status named the old file, and svcctl keys said its edit did not apply)."""
    service = stack.root / "service.toml"
    settings = service.read_text()
    new_keys = stack.root / "keys-two.toml"
    new_key = os.urandom(32).hex()
    new_keys.write_text(stack.keys_file.read_text() + key_entry("tenant-two", new_key))
    body = {"images": [image_b64()]}
    try:
        service.write_text(settings.replace(f'keys_file = "{stack.keys_file}"', f'keys_file = "{new_keys}"'))
        assert api(stack, "POST", "/api/v1/servers/__gateway/restart").json == {"ok": True}
        assert api(stack, "GET", "/api/v1/status").json["gateway"]["keys_file"] == str(new_keys)
        reply = post(stack.gateway + "/v1/models/TESTFAULTS/infer", body, headers={"Authorization": f"Bearer {new_key}"})
        assert reply.status == 200 and reply.header("X-Service-Key") == "tenant-two"
        gateway = stack.child("__gateway")["pid"]
        new_keys.write_text(new_keys.read_text() + "broken [\n")
        reply = api(stack, "POST", "/api/v1/servers/__gateway/restart")
        assert_error(reply, 500)
        assert reply.json["error"].startswith(f"the key file cannot be used ({new_keys}: ")
        assert stack.child("__gateway")["pid"] == gateway
        reply = post(stack.gateway + "/v1/models/TESTFAULTS/infer", body, headers={"Authorization": f"Bearer {new_key}"})
        assert reply.status == 200 and reply.header("X-Service-Key") == "tenant-two"  # the keys it had loaded
    finally:
        service.write_text(settings)
    assert api(stack, "POST", "/api/v1/servers/__gateway/restart").json == {"ok": True}
    assert api(stack, "GET", "/api/v1/status").json["gateway"]["keys_file"] == str(stack.keys_file)


# -- startup ---------------------------------------------------------------------------------------


def supervisor_args(*extra):
    return [sys.executable, "-m", "twisted", "--log-format", "text", "service-supervisor", *extra]


def test_refuses_without_the_management_token(tmp_path):
    code, output = run_to_exit(supervisor_args("--port", str(free_port())),
                               env=child_env({"SERVICE_API_TOKEN": ""}))
    assert code == 1
    assert output.strip().splitlines() == [
        "service-supervisor: SERVICE_API_TOKEN is not set: the management API needs it (no anonymous mode)"]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "::0", "0"])  # "0" and "::0": every address too
def test_refuses_a_wildcard_bind_without_service_expose(host):
    code, output = run_to_exit(supervisor_args("--host", host, "--port", str(free_port())),
                               env=child_env({**TOKENS, "SERVICE_EXPOSE": ""}))
    assert code == 1 and "refusing the wildcard bind" in output and len(output.strip().splitlines()) == 1


@pytest.mark.parametrize("metrics, message", [
    ("", "SERVICE_METRICS_TOKEN is not set: the gateway needs its own metrics token (also on loopback)"),
    (TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"], "SERVICE_METRICS_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN: the metrics "
                                           "token must differ from the inference and management tokens"),
], ids=["unset", "equal-to-the-inference-token"])  # the tokens are random: ids of their own, the same in every worker
def test_refuses_to_start_without_a_separate_metrics_token(metrics, message):
    """The supervisor itself refuses, with one line and exit 1, before anything listens or is spawned."""
    port = free_port()
    code, output = run_to_exit(supervisor_args("--port", str(port)),
                               env=child_env({**TOKENS, "SERVICE_METRICS_TOKEN": metrics}))
    assert code == 1
    assert output.strip().splitlines() == [f"service-supervisor: {message}"]
    with socket.socket() as probe:  # nothing listened: the port is still free
        probe.bind(("127.0.0.1", port))


def test_refuses_to_start_when_the_management_token_is_the_inference_token():
    """A security probe: with ``SERVICE_API_TOKEN`` equal to ``SERVICE_GATEWAY_AUTH_TOKEN`` every holder of the
    inference token could manage the service.  One line and exit 1, before anything listens."""
    port = free_port()
    code, output = run_to_exit(supervisor_args("--port", str(port)), env=child_env(
        {**TOKENS, "SERVICE_API_TOKEN": TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"]}))
    assert code == 1
    assert output.strip().splitlines() == ["service-supervisor: SERVICE_API_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN: "
                                           "the management token opens the supervisor and must differ from the "
                                           "inference token"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


@pytest.mark.parametrize(("token", "why"), [
    ("SERVICE_API_TOKEN", "the management token opens the supervisor, which no key may"),
    ("SERVICE_METRICS_TOKEN", "the metrics token must differ from every inference credential"),
    ("SERVICE_GATEWAY_AUTH_TOKEN", "a key is checked first, so the static token would be that key (refused while it "
                                   "is disabled, and limited as it is): remove the key (svcctl keys remove), or "
                                   "change the token"),
])
def test_refuses_to_start_when_a_token_is_an_api_key(tmp_path, token, why):
    """An upgrade probe: with ``SERVICE_API_TOKEN`` an API key of the key file, only the gateway refused; the
    supervisor and the models came up, the status said ok, and every inference was refused.  A config probe found
    the same for the metrics and static tokens, which the supervisor hands the gateway.  The supervisor refuses at
    start, one line naming the key and the file (the gateway's own check), before anything listens."""
    built = build_stack(tmp_path, {}, start=False)
    built.keys_file.write_text(built.keys_file.read_text() + key_entry("ops", TOKENS[token]))
    port = built.extra["supervisor_port"]
    code, output = run_to_exit(supervisor_args("--config", str(tmp_path / "service.toml")),
                               env=child_env(built.env))
    assert code == 1
    assert output.strip().splitlines() == [f"service-supervisor: {token} is the API key ops of {built.keys_file}: "
                                           f"{why}"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_a_second_supervisor_on_the_same_logs_folder_is_refused(stack):
    """A second supervisor of one folder on other ports (the same model configs and logs folder) started, its
    models ended start_failed (their ports in use), and its lines went into the first one's logs/__gateway.log and
    logs/<id>.log, which both would rotate.  It is refused with one line naming the folder and the running
    supervisor's pid, before anything listens."""
    first = (stack.root / "service.toml").read_text()
    gateway_port, supervisor_port = free_port(), free_port()
    second = stack.root / "service2.toml"
    second.write_text(first.replace(f"port = {stack.gateway_port}\n", f"port = {gateway_port}\n")
                      .replace(f"port = {stack.extra['supervisor_port']}\n", f"port = {supervisor_port}\n"))
    assert second.read_text() != first
    code, output = run_to_exit(supervisor_args("--config", str(second)), env=child_env(stack.env), timeout=60)
    logs = stack.root / "logs"
    assert code == 1
    assert output.strip().splitlines() == [
        f"service-supervisor: {logs} ({logs}) is in use by another supervisor (pid {stack.supervisor.popen.pid}), "
        "which writes and rotates the log files there: stop it, or give this one another [supervisor] log_dir"]
    for port in (gateway_port, supervisor_port):  # nothing listened
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
    assert stack.child("__gateway")["state"] == "running"
