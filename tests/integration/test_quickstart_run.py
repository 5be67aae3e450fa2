"""``python -m svc.cli.quickstart`` for real: the supervisor runs, and one next-steps block follows the models' readiness."""

import signal
import sys
import time

import pytest

from svc.cli.quickstart import read_env_file, svcctl_command
from tests.support.processes import child_env, free_port, spawn, write_config

TOKENS = ("SERVICE_API_TOKEN", "SERVICE_GATEWAY_AUTH_TOKEN", "SERVICE_METRICS_TOKEN", "SERVICE_API_KEY")


def quickstart_tree(root, model: str, profile_extra: str = "", others: tuple[str, ...] = ()) -> tuple[int, int]:
    """A checkout-like tree under ``root`` with one model (a copy of its shipped config, on a free port) in its
    profile, and the configs of ``others`` beside it, outside the profile.

    Returns (gateway port, supervisor port).
    """
    conf = root / "conf"
    (conf / "server").mkdir(parents=True)
    (conf / "profiles").mkdir()
    for name in (model, *others):
        write_config(conf / "server", name, name=f"{name}.toml", port=free_port())
    (conf / "profiles" / "cpu.toml").write_text(f'device = "cpu"\nmodels = ["{model}"]\n{profile_extra}')
    gateway_port, supervisor_port = free_port(), free_port()
    (conf / "service.toml").write_text(f'[gateway]\nport = {gateway_port}\n[supervisor]\nport = {supervisor_port}\n'
                                       'profile = "cpu"\n')
    return gateway_port, supervisor_port


def run_quickstart(root, env: dict | None = None, args: tuple[str, ...] = ()):
    """The quick start run in ``root``, once it printed its block: (process, log path)."""
    popen, log = spawn([sys.executable, "-m", "svc.cli.quickstart", "--root", str(root), *args],
                       env=child_env(env, drop=TOKENS), log_dir=root)
    deadline = time.monotonic() + 240
    while "Ctrl-C stops everything." not in log.read_text() and time.monotonic() < deadline:
        if popen.poll() is not None:
            raise AssertionError(log.read_text())
        time.sleep(0.5)
    return popen, log


def start_quickstart(root, model: str, profile_extra: str = "", env: dict | None = None,
                     others: tuple[str, ...] = ()):
    """:func:`quickstart_tree` and :func:`run_quickstart`: (process, log path, gateway port, supervisor port)."""
    gateway_port, supervisor_port = quickstart_tree(root, model, profile_extra, others)
    popen, log = run_quickstart(root, env)
    return popen, log, gateway_port, supervisor_port


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_block_comes_once_the_models_are_ready_and_a_stop_signal_stops_everything(tmp_path, stop):
    """A catalog model outside the profile (TESTFAULTS: a config beside it) is listed, not waited for. A SIGINT
    sent to the quick start alone (``kill -INT <pid>``, not Ctrl-C to the group) was ignored: it stops it too."""
    popen, log, gateway_port, supervisor_port = start_quickstart(tmp_path, "MOBILENETV2", others=("TESTFAULTS",))
    try:
        out = log.read_text()
        block = out[out.index("== All models ready"):].splitlines()[:8]
        key = (tmp_path / "secrets" / "local.env").read_text().split("SERVICE_API_KEY=")[1].split()[0]
        assert block[0] == (f"== All models ready: 1 on the cpu profile (cpu), gateway http://127.0.0.1:{gateway_port}")
        assert block[1] == "   Not in the profile, stopped (start one in the web UI): TESTFAULTS"
        assert block[2].split() == ["Web", "UI:", f"http://127.0.0.1:{supervisor_port}/", "(paste", "the",
                                    "management", "token)"]
        assert block[4].split() == ["First", "API", "key:", key]
        assert out.count(key) == 1  # "shown once"
        # the svcctl of the interpreter that ran it (this one), or python -m svc.cli where it has none
        assert f"; {svcctl_command(str(tmp_path))} infer MOBILENETV2 some.jpg" in block[6]
        assert out.count("== All models ready") == 1
        # the quick start's own once-a-second status poll is not in the terminal, nor "stopped" before a start
        assert "/api/v1/status" not in out and "MOBILENETV2: stopped" not in out
        assert "   MOBILENETV2: ready" in out
    finally:
        popen.send_signal(stop)
        code = popen.wait(60)
    assert code == 0, log.read_text()[-3000:]


def test_pretrained_profile_pulls_then_serves_the_variant(tmp_path):
    """The documented path to real models, end to end on loopback: a profile saying `weights = "pretrained"`
    makes the quick start pull the profile's variants (here TESTFAULTS's test-only `tiny`, from a fake source
    through SERVICE_WEIGHTS_MIRROR) into the cache, then run every model on them: the status names the variant
    and replies carry it as `model.version`."""
    import json

    from tests.support.http import get, post
    from tests.support.images import image_b64
    from tests.support.weight_source import FakeSource

    source = FakeSource()
    source.serve("https://weights.example.org/testfaults/tiny.bin", bytes(range(64)))
    cache = tmp_path / "cache"
    try:
        popen, log, gateway_port, supervisor_port = start_quickstart(
            tmp_path, "TESTFAULTS", 'weights = "pretrained"\n',
            env={"SERVICE_WEIGHTS_DIR": str(cache), "SERVICE_WEIGHTS_MIRROR": source.mirror})
    except BaseException:
        source.close()
        raise
    try:
        out = log.read_text()
        assert "Pulling the pretrained weights of the profile: TESTFAULTS:tiny" in out, out[-3000:]
        assert "Starting the supervisor (pretrained weights)" in out
        assert "== All models ready: 1 on the cpu profile" in out
        record = json.loads((cache / "TESTFAULTS" / "tiny" / "record.json").read_text())
        assert (record["source"], record["weights"], record["how"]) == (
            "https://weights.example.org/testfaults/tiny.bin", "tiny.bin", "pull")
        secrets = dict(line.split("=", 1) for line in (tmp_path / "secrets" / "local.env").read_text().split()
                       if "=" in line)
        status = get(f"http://127.0.0.1:{supervisor_port}/api/v1/status",
                     headers={"Authorization": f"Bearer {secrets['SERVICE_API_TOKEN']}"}).json
        assert status["servers"][0]["weights"] == {"kind": "pretrained", "variant": "tiny"}
        reply = post(f"http://127.0.0.1:{gateway_port}/v1/models/TESTFAULTS/infer", {"images": [image_b64()]},
                     headers={"Authorization": f"Bearer {secrets['SERVICE_API_KEY']}"})
        assert (reply.status, reply.json["status"], reply.json["model"]["version"]) == (200, 0, "tiny")
    finally:
        source.close()
        popen.send_signal(signal.SIGTERM)
        code = popen.wait(60)
    assert code == 0, log.read_text()[-3000:]


def test_offline_the_cached_variant_is_served_and_nothing_is_dialled(tmp_path, monkeypatch, capsys):
    """`--weights pretrained` on a machine whose sources do not answer: the variant already in the cache runs
    (one unreachable host used to put every model on demo weights)."""
    from svc.cli import commands as cli
    from tests.support.http import get
    from tests.support.weight_source import FakeSource

    cache = tmp_path / "cache"
    source = FakeSource()
    source.serve("https://weights.example.org/testfaults/tiny.bin", bytes(range(64)))
    monkeypatch.setenv("SERVICE_WEIGHTS_DIR", str(cache))
    monkeypatch.setenv("SERVICE_WEIGHTS_MIRROR", source.mirror)
    try:
        assert cli.main(["weights", "pull", "TESTFAULTS"]) == 0, capsys.readouterr().err
    finally:
        source.close()  # from here the mirror's port is closed: the machine is offline
    gateway_port, supervisor_port = quickstart_tree(tmp_path, "TESTFAULTS")
    popen, log = run_quickstart(tmp_path, {"SERVICE_WEIGHTS_DIR": str(cache), "SERVICE_WEIGHTS_MIRROR": source.mirror},
                                ("--weights", "pretrained"))
    try:
        out = log.read_text()
        assert "Pretrained weights: cached, nothing to pull (TESTFAULTS:tiny)." in out, out[-3000:]
        assert "starts on demo weights" not in out
        secrets = dict(line.split("=", 1) for line in (tmp_path / "secrets" / "local.env").read_text().split()
                       if "=" in line)
        status = get(f"http://127.0.0.1:{supervisor_port}/api/v1/status",
                     headers={"Authorization": f"Bearer {secrets['SERVICE_API_TOKEN']}"}).json
        assert status["servers"][0]["weights"] == {"kind": "pretrained", "variant": "tiny"}
        assert status["servers"][0]["ready"] is True
    finally:
        popen.send_signal(signal.SIGTERM)
        code = popen.wait(60)
    assert code == 0, log.read_text()[-3000:]


def test_a_bad_setting_is_one_line_and_exit_1_not_a_traceback(tmp_path):
    """A profile's setting that is not valid: the quick start read it before the supervisor and printed a 12-line
    traceback."""
    quickstart_tree(tmp_path, "TESTFAULTS", profile_extra='weights = "best"\n')
    popen, log = spawn([sys.executable, "-m", "svc.cli.quickstart", "--root", str(tmp_path)],
                       env=child_env(None, drop=TOKENS), log_dir=tmp_path)
    assert popen.wait(60) == 1
    out = log.read_text().splitlines()
    assert out[0].startswith("Generated ")  # the secrets, made before the configuration is read
    key = read_env_file(str(tmp_path / "secrets" / "local.env"))["SERVICE_API_KEY"]
    # the first run's key, shown although the run ends before its next-steps block (else it was never shown)
    assert out[1:] == ["Your first API key (shown once; it is also in the secrets file):", f"  {key}",
                       "quickstart: conf/profiles/cpu.toml: weights: must be one of 'demo', 'pretrained', got 'best'"]


def test_a_models_package_where_the_quick_start_runs_is_not_the_plugin_package(tmp_path):
    """The quick start runs in a folder of the user's, which may hold their own ``models/``: the supervisor it
    starts (and its children) must not import it.  It ran the ``twist`` beside the interpreter, which is not there
    after a ``pip install --user`` and, where it is ``python -m twisted``, put the folder first on ``sys.path``."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("raise SystemExit('the user models package was imported')\n")
    popen, log, gateway_port, _ = start_quickstart(tmp_path, "TESTFAULTS")
    try:
        out = log.read_text()
        assert out[out.index("== All models ready"):].splitlines()[0] == (
            f"== All models ready: 1 on the cpu profile (cpu), gateway http://127.0.0.1:{gateway_port}")
        assert "the user models package was imported" not in out
    finally:
        popen.send_signal(signal.SIGTERM)
        code = popen.wait(60)
    assert code == 0, log.read_text()[-3000:]


def test_a_second_quick_start_in_the_same_folder_starts_nothing_and_says_so(tmp_path):
    """A second run in the folder of a running service took the first supervisor's readiness for its own (the same
    port, the same token): it printed the whole next-steps block, then failed with its own supervisor's
    "cannot listen ... Address already in use"."""
    from tests.support.http import get

    popen, log, _, supervisor_port = start_quickstart(tmp_path, "TESTFAULTS")
    try:
        [pid] = map(int, open(f"/proc/{popen.pid}/task/{popen.pid}/children").read().split())  # its supervisor
        (tmp_path / "second").mkdir()
        second, second_log = spawn([sys.executable, "-m", "svc.cli.quickstart", "--root", str(tmp_path)],
                                   env=child_env(None, drop=TOKENS), log_dir=tmp_path / "second")
        assert second.wait(60) == 1
        assert second_log.read_text().splitlines() == [
            f"quickstart: a service of this folder already runs: its supervisor (pid {pid}) answers on "
            f"http://127.0.0.1:{supervisor_port}/; use it as it is, or stop it first (Ctrl-C in its terminal, or "
            f"kill -TERM {pid})"]
        assert popen.poll() is None  # the first runs on
        token = read_env_file(str(tmp_path / "secrets" / "local.env"))["SERVICE_API_TOKEN"]
        assert get(f"http://127.0.0.1:{supervisor_port}/api/v1/status",
                   headers={"Authorization": f"Bearer {token}"}).json["pid"] == pid  # whose status it is
    finally:
        popen.send_signal(signal.SIGTERM)
        code = popen.wait(60)
    assert code == 0, log.read_text()[-3000:]
