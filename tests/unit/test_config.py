"""Model-server TOML: defaults, strict types, unknown keys, one-line errors."""

from pathlib import Path

import pytest

from svc.config import MODEL_SERVER_KEYS, ConfigError, load_model_server_config

MINIMAL = 'id = "M1"\nport = 9000\nserver_uri = "/m1/predict"\n'


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "m.toml"
    path.write_text(text)
    return str(path)


def test_defaults_are_spec_values(tmp_path):
    c = load_model_server_config(write(tmp_path, MINIMAL))
    assert (c.async_enabled, c.async_timeout, c.async_max_queue, c.async_job_ttl, c.async_max_completed) == (
        False, 600000, 8, 300000, 100)
    assert (c.max_queue_depth, c.max_batch_size, c.max_request_items, c.peer_resp_timeout) == (0, 1, 16, 600)
    assert (c.backend.device, c.gpu_mem_limit_mb, c.max_batch_delay_ms, c.run_timeout_ms) == ("gpu", 2048, 5, 30000)
    assert c.model == {}


def test_every_documented_key_is_accepted(tmp_path):
    body = MINIMAL + "".join(
        f"{k.name} = {str(k.default).lower() if isinstance(k.default, bool) else k.default}\n"
        for k in MODEL_SERVER_KEYS
        if k.name not in ("id", "port", "server_uri")
    )
    load_model_server_config(write(tmp_path, body + '[backend]\ndevice = "cpu"\n'))


@pytest.mark.parametrize(
    "extra, key, problem",
    [
        ('max_batch_size = "8"\n', "max_batch_size", "must be an integer, got string '8'"),
        ("max_batch_size = 0\n", "max_batch_size", "must be at least 1"),
        ("async_enabled = 1\n", "async_enabled", "must be a boolean"),
        ("max_batch_size = true\n", "max_batch_size", "must be an integer, got boolean True"),
        ("colour = 1\n", "colour", "unknown key"),
        ('[backend]\ndevice = "tpu"\n', "backend.device", "must be one of 'cpu', 'gpu', got 'tpu'"),
        ("[backend]\nspeed = 1\n", "backend.speed", "unknown key"),
        ("backend = 3\n", "backend", "must be a table"),
    ],
)
def test_problems_name_file_key_and_problem_in_one_line(tmp_path, extra, key, problem):
    path = write(tmp_path, MINIMAL + extra)
    with pytest.raises(ConfigError) as e:
        load_model_server_config(path)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: {key}: ")
    assert problem in text


def test_required_keys(tmp_path):
    with pytest.raises(ConfigError, match="port: required key is missing"):
        load_model_server_config(write(tmp_path, 'id = "M"\nserver_uri = "/x"\n'))


@pytest.mark.parametrize("uri", ["/healthz", "/jobs", "/jobs/x", "/v1/models/X/infer", "/metrics", "/v2",
                                 "/v2/models/X/infer"])
def test_server_uri_must_not_shadow_own_routes(tmp_path, uri):
    with pytest.raises(ConfigError, match="server_uri"):
        load_model_server_config(write(tmp_path, f'id = "M"\nport = 1\nserver_uri = "{uri}"\n'))


def test_broken_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_model_server_config(write(tmp_path, "id = \n"))
    with pytest.raises(ConfigError, match="file not found"):
        load_model_server_config(str(tmp_path / "nope.toml"))


def test_shipped_configs_load():
    from svc.config import model_server_configs

    ids = [c.id for c in model_server_configs("conf/server")]
    assert "MOBILENETV2" in ids


#: The contract's rule: diffusion-type and segmentation models have jobs on by default, classification and
#: detection models off; the shipped configs give the jobs' limits the contract's values.
JOBS_ON = ("DDPM", "DDIM", "CLS_COND_DDIM", "LDM", "SAM_AMG")
JOBS_OFF = ("MOBILENETV2", "YOLOV8")


def test_shipped_configs_have_jobs_on_exactly_for_diffusion_and_segmentation():
    from svc.config import model_server_configs

    configs = {c.id: c for c in model_server_configs("conf/server")}
    assert sorted(configs) == sorted(JOBS_ON + JOBS_OFF)
    for model_id in JOBS_ON:
        c = configs[model_id]
        assert c.async_enabled is True, model_id
        assert (c.async_timeout, c.async_max_queue, c.async_job_ttl, c.async_max_completed, c.peer_resp_timeout) == \
            (600000, 8, 300000, 100, 600), model_id
    for model_id in JOBS_OFF:
        assert configs[model_id].async_enabled is False, model_id
