"""What a start or restart through the management API checks before it stops anything (svc.supervisor.preflight)."""

from __future__ import annotations

import os
from pathlib import Path

from twisted.internet.error import ProcessDone
from twisted.python.failure import Failure

from svc.auth import key_entry
from svc.config import load_model_server_config
from svc.supervisor.config import load_supervisor_config
from svc.supervisor.preflight import GatewayKeyFile, key_file_problem, model_config_problem
from tests.unit.test_supervisor_manager import weights_manager


def model(tmp_path: Path, text: str = ""):
    path = tmp_path / "AAA.toml"
    path.write_text(f'id = "AAA"\nport = 9300\nserver_uri = "/aaa"\n{text}')
    return path, load_model_server_config(str(path))


def test_an_unchanged_config_and_other_edits_go_on(tmp_path):
    path, config = model(tmp_path)
    assert model_config_problem(config) is None
    path.write_text(path.read_text() + "max_batch_size = 4\n")  # a key the new process reads itself
    assert model_config_problem(config) is None


def test_a_config_that_no_longer_loads_is_refused_with_its_reason(tmp_path):
    path, config = model(tmp_path)
    path.write_text(path.read_text() + "max_batch_size = -3\n")
    assert model_config_problem(config) == (
        f"AAA: its config does not load ({path}: max_batch_size: must be at least 1, got -3): fix the file and try "
        "again")
    path.unlink()
    assert "its config does not load" in model_config_problem(config)


def test_a_port_or_server_uri_edit_needs_the_supervisor_restarted(tmp_path):
    path, config = model(tmp_path)
    path.write_text(path.read_text().replace("port = 9300", "port = 9311").replace('"/aaa"', '"/aaa2"'))
    assert model_config_problem(config) == (
        f"AAA: {path} changes port 9300 -> 9311, server_uri '/aaa' -> '/aaa2': the gateway and the supervisor "
        "route by what they read at the supervisor's start, so restart the supervisor to apply it")


def test_a_key_file_with_a_bad_entry_is_refused_a_missing_or_empty_one_is_not(tmp_path):
    keys = tmp_path / "api_keys.toml"
    assert key_file_problem(str(keys)) is None  # missing: the gateway decides (a token, or a refusal)
    keys.write_text("# no keys\n")
    assert key_file_problem(str(keys)) is None  # empty: zero keys, a warning of the gateway's
    keys.write_text(key_entry("alice", "a" * 64) + key_entry("bob", "b" * 64).replace("= 0", "= 0.5"))
    assert key_file_problem(str(keys)) == (
        f"the key file cannot be used ({keys}: keys.bob.rate_limit_qps: must be an integer, got float 0.5): a "
        "gateway started on it would run in static-token mode and refuse every API key, so none is started (a "
        "gateway still running, if any, keeps serving with the keys it loaded); fix the file (svcctl keys list "
        "checks its entries), or empty it to run on the static token alone, then start or restart the gateway "
        "(the web UI, or POST /api/v1/servers/__gateway/restart)")
    keys.write_text("[keys.alice\n")
    assert key_file_problem(str(keys)).startswith(f"the key file cannot be used ({keys}: ")
    # One that another user could write: the advice is its owner or mode (a regression probe: it said to empty
    # it, which left it refused, and that svcctl keys list checks it, which reads only its entries).
    keys.write_text("")
    os.chmod(keys, 0o664)
    assert key_file_problem(str(keys)) == (
        f"the key file cannot be used ({keys}: is writable by other users (mode 664): another user could add an "
        f"API key to it; give it to this user (uid {os.getuid()}) or root, writable by its owner only (chmod 600)): "
        "a gateway started on it would run in static-token mode and refuse every API key, so none is started (a "
        "gateway still running, if any, keeps serving with the keys it loaded); fix its owner or mode as said, then "
        "start or restart the gateway (the web UI, or POST /api/v1/servers/__gateway/restart)")
    os.chmod(keys, 0o600)
    assert key_file_problem(str(keys)) is None


def test_a_key_file_gone_since_a_gateway_started_on_it_is_refused_one_never_there_is_not(tmp_path):
    """A keys probe: the key file moved away (or ``keys_file`` edited to a name that is not there), and a restart
    of the gateway answered ``{ok: true}``: the new gateway ran in static-token mode and refused every API key,
    while a broken file is refused.  A file that was never there is the gateway's to judge, as before."""
    (tmp_path / "conf").mkdir()
    service = tmp_path / "conf" / "service.toml"
    service.write_text('[gateway]\nkeys_file = "conf/api_keys.toml"\n')
    keys = tmp_path / "conf" / "api_keys.toml"
    check = GatewayKeyFile(load_supervisor_config(str(service)), str(tmp_path))
    assert check.problem() is None and check.path == str(keys)  # never there: static tokens alone
    keys.write_text(key_entry("alice", "a" * 64))
    keys.chmod(0o600)
    assert check.problem() is None  # a gateway started on it
    keys.rename(tmp_path / "conf" / "moved.toml")
    assert check.problem() == (
        f"no key file at {keys}: the gateway last started read its API keys from {keys}, and a gateway started now "
        "would run in static-token mode and refuse every API key, so none is started (a gateway still running, if "
        "any, keeps serving with the keys it loaded); restore the file, or create an empty one to run on the static "
        "token alone, then start or restart the gateway (the web UI, or POST /api/v1/servers/__gateway/restart)")
    service.write_text('[gateway]\nkeys_file = "conf/typo.toml"\n')  # the config names a file that is not there
    assert check.problem().startswith(f"no key file at {tmp_path / 'conf' / 'typo.toml'}: the gateway last started "
                                      f"read its API keys from {keys}, ")
    service.write_text('[gateway]\nkeys_file = "conf/api_keys.toml"\n')
    keys.write_text("")  # the way the refusal names to run on the static token alone
    assert check.problem() is None and check.had_file
    keys.unlink()
    assert check.problem() is not None  # an empty file is a file too: its removal is refused the same way


def test_a_refused_restart_leaves_the_running_process_alone(tmp_path):
    m, _ = weights_manager(tmp_path, "demo")
    child, reactor = m.children["AAA"], m.reactor
    path = tmp_path / "AAA.toml"
    path.write_text(path.read_text().replace("port = 9300", "port = 9400"))
    running, spawns, failures = child._protocol, len(reactor.spawned), []
    child.restart().addErrback(failures.append)
    assert "changes port 9300 -> 9400" in failures[0].getErrorMessage()
    assert child._protocol is running and len(reactor.spawned) == spawns and child.restarts == 0
    failures.clear()
    child.stop()
    child._protocol.processEnded(Failure(ProcessDone(0)))
    child.start().addErrback(failures.append)  # a start after a stop is checked the same way
    assert "changes port 9300 -> 9400" in failures[0].getErrorMessage() and len(reactor.spawned) == spawns
    # and the status says why nothing runs (it read "stopped" with no error, for a gateway at the supervisor's start)
    assert child.snapshot()["state"] == "start_failed"
    assert child.snapshot()["last_error"] == failures[0].getErrorMessage()


def test_the_plugins_model_keys_are_checked_too(tmp_path):
    """The ``[model]`` table is the plugin's (its ``config_schema``): a bad key there took the model down too."""
    path = tmp_path / "TESTFAULTS.toml"
    path.write_text('id = "TESTFAULTS"\nport = 9300\nserver_uri = "/faults"\n[model]\nseed = 1\n')
    config = load_model_server_config(str(path))
    assert model_config_problem(config) is None
    path.write_text(path.read_text().replace("seed = 1", "seed = -1"))
    assert model_config_problem(config) == (
        f"TESTFAULTS: its config does not load ({path}: model.seed: -1 is less than the minimum of 0): fix the file and "
        "try again")


def test_an_edited_plugin_is_the_new_processs_to_judge(tmp_path, monkeypatch):
    """A plugin author's probe: a [model] key added to an edited plugin's schema was refused by the supervisor,
    which checked the config against the copy of the plugin it imported at its start ("unknown key"), while the
    model server it would start imports the file as it is now.  The check is left to that process then."""
    from svc.model import api

    path = tmp_path / "TESTFAULTS.toml"
    path.write_text('id = "TESTFAULTS"\nport = 9300\nserver_uri = "/faults"\n[model]\nseed = 1\n')
    config = load_model_server_config(str(path))
    path.write_text(path.read_text() + "new_key = 2\n")
    assert not api.plugin_edited() and "unknown key 'new_key'" in model_config_problem(config)
    monkeypatch.setattr(api, "_IMPORTED", ["the digest of the plugins as imported before an edit"])
    assert api.plugin_edited() and model_config_problem(config) is None


def test_a_plugin_is_edited_when_a_file_of_its_package_changes_not_when_it_is_touched(tmp_path, monkeypatch):
    """A regression probe: the plugin's own file alone was compared, by time and size, so an edit of a helper
    module it imports (where YOLOV8's scales are) went unseen, and a bare touch (a checkout) turned the check off."""
    import models
    from svc.model import api

    (tmp_path / "plugin.py").write_text("SCALES = helper.SCALES\n")
    (tmp_path / "helper.py").write_text('SCALES = ("n", "s")\n')
    monkeypatch.setattr(models, "__path__", [str(tmp_path)])
    imported = api._plugin_sources()
    os.utime(tmp_path / "plugin.py", (1, 1))
    assert api._plugin_sources() == imported
    (tmp_path / "helper.py").write_text('SCALES = ("n", "s", "t")\n')
    assert api._plugin_sources() != imported


def test_a_restart_checks_once_before_its_stop_not_again_at_its_start(tmp_path):
    m, _ = weights_manager(tmp_path, "demo")
    child, reactor = m.children["AAA"], m.reactor
    checks, check = [], child.spec.preflight
    child.spec.preflight = lambda: checks.append(1) or check()
    spawns, old = len(reactor.spawned), child._protocol
    child.restart()
    old.processEnded(Failure(ProcessDone(0)))
    assert len(reactor.spawned) == spawns + 1 and checks == [1]


def test_a_plugin_whose_declarations_break_is_the_new_processs_to_report(tmp_path, monkeypatch):
    """A config_schema that is no JSON schema raised jsonschema's SchemaError out of the restart (a traceback in
    the supervisor's log). This process keeps the plugin it imported at its start, and the new process imports
    it afresh (a fixed file included) and refuses in one line: the check leaves it to that process."""
    import svc.model.api
    from tests.unit.test_plugin_checks import Acme

    class Broken(Acme):
        catalog_id = "AAA"
        config_schema = {"type": "object", "properties": {"seed": {"type": "int"}}}

    monkeypatch.setattr(svc.model.api, "factories", lambda: {"AAA": Broken()})
    path, config = model(tmp_path, "[model]\nseed = 1\n")
    assert model_config_problem(config) is None
    path.write_text(path.read_text().replace("port = 9300", "port = 9311"))  # what it checks of its own still counts
    assert "changes port 9300 -> 9311" in model_config_problem(config)


def test_an_optimize_mode_the_new_process_would_refuse_is_refused_before_the_stop(tmp_path):
    """``backend.optimize = "bogus"``: the restart stopped the serving model, whose new process then refused the
    file (start_failed, every request 503). The mode is read for the profile's device, as the process reads it."""
    path, config = model(tmp_path, '[backend]\noptimize = "channels_last+jit"\n')
    assert model_config_problem(config) is None
    path.write_text(path.read_text().replace("channels_last+jit", "bogus"))
    assert model_config_problem(config) == (
        f"AAA: its config does not load ({path}: backend.optimize: unknown mode 'bogus' in 'bogus'; known: auto, "
        "eager, channels_last, bf16, jit, compile, openvino, onnxruntime (steps combine with '+', for example "
        "'channels_last+jit')): fix the file and try again")
    path.write_text(path.read_text().replace("bogus", "fp16"))
    assert model_config_problem(config, "gpu") is None
    assert "'fp16' needs backend.device" in model_config_problem(config, "cpu")


def test_a_refused_start_during_back_off_leaves_the_back_off_as_it_is(tmp_path):
    """A crashed child waits out its back-off and respawns by itself: a start asked meanwhile that the checks
    refuse fails with the reason, but does not mark it start_failed (the back-off is still its state)."""
    from twisted.internet.error import ProcessTerminated

    m, _ = weights_manager(tmp_path, "demo")
    child = m.children["AAA"]
    m.reactor.advance(5)  # ready: a crash now backs off (one while starting is start_failed)
    assert child.state == "running"
    child._protocol.processEnded(Failure(ProcessTerminated(1)))
    assert child.state == "backoff"
    path = tmp_path / "AAA.toml"
    path.write_text(path.read_text().replace("port = 9300", "port = 9400"))
    failures: list = []
    child.start().addErrback(failures.append)
    assert "changes port 9300 -> 9400" in failures[0].getErrorMessage()
    assert child.snapshot()["state"] == "backoff"


def test_a_crashed_child_whose_files_broke_since_its_start_is_not_respawned_on_them(tmp_path):
    """A respawn skipped the checks a start makes: a gateway killed (an OOM kill) after its key file broke came
    back in static-token mode and refused every API key, while its status said running with no error. The same
    check (the child's preflight) for a model whose config broke since its start."""
    from twisted.internet.error import ProcessTerminated

    m, _ = weights_manager(tmp_path, "demo")
    child = m.children["AAA"]
    m.reactor.advance(5)
    assert child.state == "running"
    path = tmp_path / "AAA.toml"
    path.write_text(path.read_text().replace("port = 9300", "port = 9400"))
    spawned = len(m.reactor.spawned)
    child._protocol.processEnded(Failure(ProcessTerminated(1)))
    assert child.state == "backoff"
    m.reactor.advance(60)  # the back-off is over: the respawn finds the file broken
    snapshot = child.snapshot()
    assert snapshot["state"] == "start_failed" and "changes port 9300 -> 9400" in snapshot["last_error"], snapshot
    # Its process had exited: "nothing was stopped", a restart's words, is not said here (an operator probe).
    assert snapshot["last_error"].startswith("AAA: ") and "nothing was stopped" not in snapshot[
        "last_error"]
    assert len(m.reactor.spawned) == spawned  # nothing was spawned on it
    path.write_text(path.read_text().replace("port = 9400", "port = 9300"))
    m.reactor.advance(1)
    assert child.state == "start_failed"  # until a start is asked, as for any start_failed
    child.start()
    assert child.state == "starting" and len(m.reactor.spawned) == spawned + 1
