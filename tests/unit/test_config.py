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
        # finished jobs gone at once: every result route 404, as async_max_completed = 0 (refused) would do
        ("async_job_ttl = 0\n", "async_job_ttl", "must be at least 1, got 0"),
        ("async_enabled = 1\n", "async_enabled", "must be a boolean"),
        ("max_batch_size = true\n", "max_batch_size", "must be an integer, got boolean True"),
        ("colour = 1\n", "colour", "unknown key"),
        ('[backend]\ndevice = "tpu"\n', "backend.device", "must be one of 'cpu', 'gpu', got 'tpu'"),
        ("[backend]\nspeed = 1\n", "backend.speed", "unknown key"),
        # a misspelt table: "unknown key; known keys: async_enabled, ..." listed neither table (config probe)
        ("[backnd]\nworkers = 1\n", "backnd", "unknown table; known: backend, model"),
        ("[modle]\nseed = 1\n", "modle", "unknown table; known: backend, model"),
        ("backend = 3\n", "backend", "must be a table"),
        # TOML has nan and inf: a rate of nan or inf meant "unlimited" without a word
        ("rate_limit_qps = nan\n", "rate_limit_qps", "must be a finite number, got nan"),
        ("rate_limit_qps = inf\n", "rate_limit_qps", "must be a finite number, got inf"),
        # an integer key without a bound of its own: 2^63 ms killed the shutdown watchdog with OverflowError
        ("shutdown_grace_ms = 9223372036854775807\n", "shutdown_grace_ms", "must be at most 1000000000000"),
        ("async_timeout = 1000000000001\n", "async_timeout", "must be at most 1000000000000"),
        # a request of 9 to 16 images got 429 with Retry-After: 1 from an idle server, forever
        ("max_queue_depth = 8\n", "max_queue_depth", "8 is below max_request_items (16)"),
        ("max_queue_depth = 3\nmax_request_items = 4\n", "max_queue_depth", "3 is below max_request_items (4)"),
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


def test_a_byte_order_mark_that_an_editor_wrote_is_skipped(tmp_path):
    """It was refused as "not valid TOML: Empty key at line 1 col 0", naming nothing the user could see."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + b'id = "M"\r\nport = 1\r\nserver_uri = "/m"\r\n')
    config = load_model_server_config(str(path))
    assert (config.id, config.port, config.server_uri) == ("M", 1, "/m")


def test_a_fifo_or_a_device_is_refused_instead_of_read(tmp_path):
    """open() of a FIFO waits for a writer: every process hung at start, printing nothing."""
    import os

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as e:
        load_model_server_config(str(fifo))
    assert str(e.value) == f"{fifo}: cannot read: not a regular file (a FIFO, a device or a socket)"
    with pytest.raises(ConfigError, match="not a regular file"):
        load_model_server_config("/dev/zero")


def test_two_configs_of_one_id_or_one_server_uri_are_refused_naming_both(tmp_path):
    """The supervisor kept the second of two configs with one id, silently."""
    from svc.config import model_server_configs

    (tmp_path / "A.toml").write_text('id = "M1"\nport = 9001\nserver_uri = "/a/predict"\n')
    (tmp_path / "B.toml").write_text('id = "M1"\nport = 9002\nserver_uri = "/b/predict"\n')
    with pytest.raises(ConfigError) as e:
        model_server_configs(str(tmp_path))
    assert str(e.value) == f"{tmp_path / 'B.toml'}: id: 'M1' is the id of {tmp_path / 'A.toml'} too"
    (tmp_path / "B.toml").write_text('id = "M2"\nport = 9002\nserver_uri = "/a/predict"\n')
    with pytest.raises(ConfigError) as e:
        model_server_configs(str(tmp_path))
    assert str(e.value) == f"{tmp_path / 'B.toml'}: server_uri: '/a/predict' is the server_uri of {tmp_path / 'A.toml'} too"


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


def test_an_unclosed_array_is_the_end_of_the_file_not_a_nul_the_file_lacks(tmp_path):
    """tomlkit says "Unexpected character: '\\x00'" at the end of the text (logs probe); a real NUL keeps it."""
    from svc.config import read_toml

    path = tmp_path / "keys.toml"
    path.write_text("a = 1\nx = [\n")
    with pytest.raises(ConfigError) as e:
        read_toml(str(path))
    assert e.value.problem == "not valid TOML: Unexpected end of file at line 2 col 0"
    path.write_text("a = 1\nb = \x00\n")
    with pytest.raises(ConfigError) as e:
        read_toml(str(path))
    assert "\\x00" in e.value.problem
