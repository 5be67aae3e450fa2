"""Fail-closed startup of a real ``service-model`` process, and graceful stop."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tests.support.gateway import GATEWAY_TOKENS, LISTENING, gateway_args, start_gateway
from tests.support.http import get, post
from tests.support.images import image_b64
from tests.support.processes import (
    REPO,
    TEST_PLUGINS,
    Proc,
    child_env,
    free_port,
    metric,
    model_server_args,
    run_to_exit,
    spawn,
    spawn_model_server,
    start_model_server,
    until_all_ready,
    wait_bound_port,
    wait_until,
    write_config,
)

TOKEN = {"SERVICE_AUTH_TOKEN": "model-token"}


def refused(config, *extra, env=None, port=None):
    code, output = run_to_exit(model_server_args(config, port or 0, *extra), env=child_env(env or TOKEN))
    assert code == 1, output  # docs/processes.md: one line naming the file, the key and the problem, and exit 1
    lines = [line for line in output.splitlines() if line.strip()]
    return lines


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"max_batch_size": "8"}, ": max_batch_size: must be an integer, got string '8'"),
        ({"speed": 3}, ": speed: unknown key"),
        ({"backend": {"device": "tpu"}}, ": backend.device: must be one of 'cpu', 'gpu', got 'tpu'"),
        ({"async_enabled": "yes"}, ": async_enabled: must be a boolean"),
        ({"gpu_mem_limit_mb": -1}, ": gpu_mem_limit_mb: must be at least 0, got -1"),
        ({"gpu_mem_limit_mb": 1.5}, ": gpu_mem_limit_mb: must be an integer, got float 1.5"),
        ({"backend": {"worker_nice": 20}}, ": backend.worker_nice: must be at most 19, got 20"),
        ({"backend": {"workers": 0}}, ": backend.workers: must be at least 1, got 0"),
        ({"model": {"colour": "red"}}, ": model.colour: unknown key 'colour'"),
        ({"model": {"seed": -1}}, ": model.seed: -1 is less than the minimum of 0"),
        # Accepted, then a traceback from torch once the port listened (config probe).
        ({"model": {"seed": 2**64}}, ": model.seed: 18446744073709551616 is greater than the maximum of 4294967295"),
        # Served as a version that no /v2/models/{id}/versions/{version} path could name (an OIP probe).
        ({"model": {"version": "2024/rc1"}}, ": model.version: '2024/rc1' has a '/', which no "
                                             "/v2/models/{id}/versions/{version} path could name"),
        # Accepted, and its "ready" line was two lines in the log (a config probe); "$" passes a final newline.
        ({"model": {"version": "2024\nrc1"}}, ": model.version: '2024\\nrc1' has a control character (a newline, a "
                                               "tab, an escape, a Unicode line break, an invisible or direction "
                                               "mark), which would break or hide the log lines that name the version"),
        ({"model": {"version": "rc1\n"}}, ": model.version: 'rc1\\n' has a control character"),
        # A line break to Python's splitlines and log viewers, and a blank version (a regression probe).
        ({"model": {"version": "2024\u2028rc1"}}, ": model.version: '2024\\u2028rc1' has a control character"),
        ({"model": {"version": " "}}, ": model.version: ' ' is blank: a version names what is served"),
        ({"model": {"version": "\u200b"}}, ": model.version: '\\u200b' has a control character"),  # invisible
        ({"model": {"version": "a\u202eb"}}, ": model.version: 'a\\u202eb' has a control character"),  # bidi
        # It named neither the file nor the key (probe): "service-model: no model plugin serves ...".
        ({"id": "NOSUCHMODEL"}, ": id: no model plugin serves catalog id 'NOSUCHMODEL'; known: CLS_COND_DDIM, "),
    ],
)
def test_bad_config_refuses_with_one_line(tmp_path, overrides, expected):
    config = write_config(tmp_path, "MOBILENETV2", **overrides)
    lines = refused(config)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"service-model: {config}{expected}")


def test_servers_started_side_by_side_are_all_stopped_when_one_refuses(tmp_path):
    """tests/support/processes.until_all_ready: the refusal propagates, and the server still starting beside it
    is stopped with it instead of outliving the test run in its own session."""
    broken = spawn_model_server(write_config(tmp_path, "TESTFAULTS", max_batch_size=0))
    starting = spawn_model_server(write_config(tmp_path, "TESTFAULTS"))
    with pytest.raises(RuntimeError, match="process exited with 1"):
        until_all_ready(broken, starting)
    assert broken.popen.returncode == 1
    assert starting.popen.poll() is not None


def test_missing_token_refuses_unless_dev_flag(tmp_path):
    config = write_config(tmp_path, "TESTFAULTS")
    lines = refused(config, env={"SERVICE_AUTH_TOKEN": ""})
    assert lines == ["service-model: SERVICE_AUTH_TOKEN is not set: set it (the supervisor injects one) "
                     "or pass --dev-no-auth for local development"]
    server = start_model_server(config, token=None, extra_args=("--dev-no-auth",))
    try:
        reply = post(server.url + "/testfaults/predict", {"images": [image_b64()]})
        assert reply.status == 200 and reply.json["status"] == 0
        assert get(server.url + "/metrics").status == 200
    finally:
        server.stop()


def test_gpu_without_cuda_refuses_clearly(tmp_path):
    config = write_config(tmp_path, "TESTFAULTS", backend={"device": "gpu"})
    lines = refused(config, env={**TOKEN, "CUDA_VISIBLE_DEVICES": ""})
    assert len(lines) == 1
    assert "backend.device is 'gpu' but CUDA is not available on this machine" in lines[0]
    assert str(config) in lines[0]
    lines = refused(write_config(tmp_path, "TESTFAULTS"), "--device", "gpu", env={**TOKEN, "CUDA_VISIBLE_DEVICES": ""})
    assert "CUDA is not available" in lines[0]


def test_busy_port_refuses_with_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        lines = refused(write_config(tmp_path, "TESTFAULTS"), port=port)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"service-model: --port: cannot listen on 127.0.0.1:{port}: "), lines
        config = write_config(tmp_path, "TESTFAULTS", port=port)  # the file's port: the line names file and key
        code, output = run_to_exit([*model_server_args(config, port)[:-2]], env=child_env(TOKEN))
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, output
    assert lines[0].startswith(f"service-model: {config}: port: cannot listen on 127.0.0.1:{port}: "), lines


def test_missing_weights_file_refuses(tmp_path):
    config = write_config(tmp_path, "MOBILENETV2", model={"weights": "nowhere/mobilenet.pth"})
    lines = refused(config)
    assert len(lines) == 1 and "weights 'nowhere/mobilenet.pth'" in lines[0] and "no such file" in lines[0]


def load_refusal(config):
    """The one line a model server whose weights fail to load (after it listened) stops with, exit 1."""
    code, output = run_to_exit(model_server_args(config, 0), env=child_env(TOKEN))
    critical = [line.split("] ", 1)[1] for line in output.splitlines() if "#critical]" in line]
    assert code == 1 and len(critical) == 1, output
    return critical[0]


def test_mismatched_weights_stop_the_server_naming_the_tensor(tmp_path):
    """The line names the config file and the value of its ``[model] weights`` as a missing file's does (a config
    probe: it named the resolved file alone, and a relative value was not found in it)."""
    import torch
    from torchvision.models import mobilenet_v2

    state = mobilenet_v2(weights=None, num_classes=10).state_dict()
    path = tmp_path / "ten-classes.pth"
    torch.save(state, path)
    config = write_config(tmp_path, "MOBILENETV2", model={"weights": "ten-classes.pth"})  # next to the config
    assert load_refusal(config) == (f"service-model: weights 'ten-classes.pth' (from {config}): weights file {path}: "
                                    "tensor 'classifier.1.weight' has shape [10, 1280], the architecture expects "
                                    "[1000, 1280]")


def test_a_folder_as_the_weights_file_is_named_a_directory(tmp_path):
    """A config probe: ``weights = "/tmp"`` for MOBILENETV2 (which takes one file) was "not a regular file (a FIFO,
    a socket or a device)"."""
    folder = tmp_path / "weights"
    folder.mkdir()
    config = write_config(tmp_path, "MOBILENETV2", model={"weights": str(folder)})
    assert load_refusal(config) == (f"service-model: weights '{folder}' (from {config}): weights file {folder}: is a "
                                    "directory")


def test_sigterm_finishes_running_work_refuses_new_and_exits_0(tmp_path):
    config = write_config(tmp_path, "TESTFAULTS", max_batch_size=1)
    server = start_model_server(config)
    url = server.url + "/testfaults/predict"
    replies = {}

    def slow():
        replies["slow"] = post(url, {"images": [image_b64()], "params": {"sleep_ms": 1500}}, headers=server.auth)

    worker = threading.Thread(target=slow)
    worker.start()
    wait_until(lambda: metric(server, "service_batch_size_count") == 1, "the slow batch started")
    server.popen.send_signal(signal.SIGTERM)
    wait_until(lambda: get(server.url + "/ready").status == 503, "/ready says 503 after SIGTERM")
    during = post(url, {"images": [image_b64()]}, headers=server.auth)
    ready = get(server.url + "/ready")
    worker.join(30)
    assert server.popen.wait(30) == 0, server.output()
    assert replies["slow"].status == 200 and replies["slow"].json["status"] == 0
    assert during.status == 503 and during.json["status"] == 65
    assert ready.status == 503 and ready.json["status"] == 65


def test_a_loading_server_says_what_it_does_in_its_ready_reply(tmp_path):
    """/ready's 503 names the load's phase (the supervisor's status shows it, the quick start prints it)."""
    from tests.support.processes import wait_bound_port

    config = write_config(tmp_path, "TESTFAULTS", model={"load_delay_ms": 600000})
    proc = spawn_model_server(config)
    try:
        proc.port = wait_bound_port(proc, 60)

        def phase():
            reply = get(proc.url + "/ready", timeout=5)
            return reply if reply.json["error"] != "the model is loading" else None

        reply = wait_until(phase, "the load's first phase", timeout=60)
        assert (reply.status, reply.json["status"], reply.json["error"]) == (
            503, 65, "the model is loading: building the model and loading its weights")
    finally:
        proc.stop()


def test_weights_this_process_may_not_read_are_refused_before_it_listens(tmp_path):
    """A fail-closed probe: an unreadable weights file was found by the load, after the server listened (under a
    supervisor, a crash loop). Now the config is refused in one line, as a missing file is."""
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"not read")
    weights.chmod(0)
    config = write_config(tmp_path, "MOBILENETV2", model={"weights": str(weights)})
    args = model_server_args(config, 0)
    if os.geteuid() == 0:  # root reads any file: the process drops that power, as the probe's did
        caps = "-dac_override,-dac_read_search"
        args = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *args]
    code, output = run_to_exit(args, env=child_env(TOKEN))
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1 and lines[-1] == (f"service-model: weights '{weights}' (from {config}): this process may not "
                                       f"read {weights} (permission denied)"), output
    assert "listening on" not in output


def test_a_plugin_module_that_does_not_import_costs_one_line_and_only_its_models(tmp_path):
    """A third party's plugin module that fails to import (a dependency not installed): every process logged
    twisted's "Unhandled Error" traceback from the plugin scan, and a config for its model was refused with
    "no model plugin serves" and no word of why. Now one warning line names the module and the error, a config
    for its model is refused naming both, and the other models start."""
    vendor = tmp_path / "vendor" / "models"
    vendor.mkdir(parents=True)
    (vendor / "acme_broken.py").write_text("import acme_runtime_not_installed\n")
    env = {**TOKEN, "PYTHONPATH": os.pathsep.join([str(REPO), str(TEST_PLUGINS), str(tmp_path / "vendor")])}
    warning = ("model plugin module models.acme_broken did not import, so its models are not served: "
               "ModuleNotFoundError: No module named 'acme_runtime_not_installed'")
    config = write_config(tmp_path, "TESTFAULTS", name="ACME", id="ACME")
    lines = refused(config, env=env)
    assert lines[-1].startswith(f"service-model: {config}: id: no model plugin serves catalog id 'ACME'; known: "), lines
    assert lines[-1].endswith("; models.acme_broken did not import (ModuleNotFoundError: No module named "
                              "'acme_runtime_not_installed')"), lines
    assert not [line for line in lines if "Traceback" in line or "Unhandled Error" in line], lines
    server = start_model_server(write_config(tmp_path, "TESTFAULTS"), env=env)
    try:
        output = server.output()
        assert output.count(warning) == 1 and "Traceback" not in output and "Unhandled Error" not in output, output
    finally:
        server.stop()


def test_a_catalog_id_two_plugins_claim_refuses_that_model_alone(tmp_path):
    """A third party's plugin folder (``models/`` on the path, outside the repository) claims TESTFAULTS a
    second time: that model server refuses in one line naming both modules, while the gateway, which reads
    every plugin for its OpenAPI document, starts (it exited with a traceback, and so did the supervisor)."""
    vendor = tmp_path / "vendor" / "models"
    vendor.mkdir(parents=True)
    (vendor / "acme_dupe.py").write_text("from models.testfaults import FaultFactory\n\nagain = FaultFactory()\n")
    path = os.pathsep.join([str(REPO), str(TEST_PLUGINS), str(tmp_path / "vendor")])  # the vendor's folder last
    env = {**TOKEN, "PYTHONPATH": path}
    (tmp_path / "server").mkdir()
    config = write_config(tmp_path / "server", "TESTFAULTS")
    lines = refused(config, env=env)
    assert lines[-1] == (f"service-model: {config}: id: two model plugins serve catalog id 'TESTFAULTS': "
                         "models.acme_dupe and models.testfaults; remove one"), lines
    (tmp_path / "service.toml").write_text(f'[gateway]\nkeys_file = "{tmp_path / "none.toml"}"\n'
                                           f'servers_dir = "{tmp_path / "server"}"\n')
    popen, log = spawn(gateway_args("--config", str(tmp_path / "service.toml"), "--port", "0"),
                       env=child_env({**GATEWAY_TOKENS, "PYTHONPATH": path}))
    gateway = Proc(popen, 0, log)
    try:
        wait_bound_port(gateway, 60, LISTENING)
        # and says why the model is left out of its document, as for any other plugin it cannot use (it said nothing)
        assert ("two model plugins serve catalog id 'TESTFAULTS': models.acme_dupe and models.testfaults; remove "
                "one: TESTFAULTS is left out of the gateway's OpenAPI document, and its model server refuses to start "
                "(503 here)") in gateway.output()
    finally:
        gateway.stop()


BROKEN_DECLARATIONS = '''
from models.testfaults import FaultFactory


class UnknownOption(FaultFactory):
    catalog_id = "ACME_OPTION"
    options = ("max_results", "colour")


class ParamsRaise(FaultFactory):
    catalog_id = "ACME_PARAMS"

    def params_schema(self, config):
        return {"top_k": {"maximum": config["max_top_k"]}}


class DataSchema(FaultFactory):
    catalog_id = "ACME_DATA"
    data_schema = {"type": "objekt"}


class OpenConfig(FaultFactory):
    catalog_id = "ACME_CONFIG"
    config_schema = {"type": "object", "properties": dict(FaultFactory.config_schema["properties"])}


option, params, data, config = UnknownOption(), ParamsRaise(), DataSchema(), OpenConfig()
'''


def test_a_plugin_whose_declarations_break_costs_one_line_and_only_its_model(tmp_path):
    """A third party's factory that names an unknown option, or whose ``params_schema(config)`` raises: the
    gateway, which reads every plugin for its OpenAPI document, exited with a traceback (under the supervisor,
    ``__gateway`` start_failed and every model unreachable), and so did that model's server; so did a model
    server whose plugin's data_schema is no JSON schema, and one with an open config_schema served. Now the model
    server refuses in one line naming the model, the plugin module and the problem; the gateway starts with
    one warning line for each, leaves them out of its document and answers 503 for them, as for a model
    without a plugin, and serves the others."""
    vendor = tmp_path / "vendor" / "models"
    vendor.mkdir(parents=True)
    (vendor / "acme_declared.py").write_text(BROKEN_DECLARATIONS)
    path = os.pathsep.join([str(REPO), str(TEST_PLUGINS), str(tmp_path / "vendor")])
    (tmp_path / "server").mkdir()
    problems = {
        "ACME_OPTION": "ACME_OPTION: its plugin models.acme_declared declares unknown options 'colour'; known: "
                       "image_format, mask_format, max_results",
        "ACME_PARAMS": "ACME_PARAMS: its plugin models.acme_declared raised KeyError in params_schema(config): "
                       "'max_top_k'",
        # A jsonschema traceback as the model server compiled it, whose last line was the supervisor's last_error.
        "ACME_DATA": "ACME_DATA: its plugin models.acme_declared declares a data_schema that is not a valid JSON "
                     "schema: 'objekt' is not valid under any of the given schemas (at /type)",
        # Served before, with a misspelt [model] key ignored.
        "ACME_CONFIG": "ACME_CONFIG: its plugin models.acme_declared declares a config_schema that is not closed "
                       "(additionalProperties: false), so that a misspelt [model] key is refused instead of "
                       "ignored; svc.contract.schema.object_schema builds one",
    }
    for model in problems:
        write_config(tmp_path / "server", "TESTFAULTS", name=f"{model}.toml", id=model, port=free_port(),
                     server_uri=f"/{model.lower()}/predict")
        assert refused(tmp_path / "server" / f"{model}.toml", env={**TOKEN, "PYTHONPATH": path}) == [
            f"service-model: {problems[model]}"]
    write_config(tmp_path / "server", "TESTFAULTS", name="TESTFAULTS.toml", port=free_port())
    # and a [model] table the plugin refuses: the gateway served no /openapi.json at all (404) for it
    bad_table = tmp_path / "server" / "TESTCLASSES.toml"
    write_config(tmp_path / "server", "TESTCLASSES", name="TESTCLASSES.toml", port=free_port(), model={"seed": -1})
    problems["TESTCLASSES"] = f"{bad_table}: model.seed: -1 is less than the minimum of 0"
    gateway = start_gateway(tmp_path, tmp_path / "server", None, env={"PYTHONPATH": path})
    try:
        output = gateway.output()
        for model, problem in problems.items():
            assert output.count(problem) == 1, output
            assert f"{problem}: {model} is left out of the gateway's OpenAPI document, and its model server " \
                   "refuses to start (503 here)" in output
        assert "Traceback" not in output, output
        auth = {"Authorization": f"Bearer {gateway.token}"}
        paths = get(gateway.url + "/openapi.json", headers=auth).json["paths"]
        assert "/v1/models/TESTFAULTS/infer" in paths
        assert not [p for p in paths if "ACME" in p or "TESTCLASSES" in p], paths
        reply = post(gateway.url + "/v1/models/ACME_OPTION/infer", {"images": [image_b64()]}, headers=auth)
        assert (reply.status, reply.json["status"]) == (503, 65), reply.body
    finally:
        gateway.stop()
