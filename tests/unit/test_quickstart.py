"""First-run secrets of bin/quickstart."""

import hashlib
import io
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from svc.cli.quickstart import (
    KEY_FILE,
    SECRETS,
    next_steps,
    prepare,
    read_env_file,
    service_addresses,
    settled,
    weights_said,
)


def test_prepare_creates_private_distinct_secrets_and_a_first_key_once(tmp_path):
    out = io.StringIO()
    values = prepare(str(tmp_path), out)
    secrets_path, key_path = tmp_path / SECRETS, tmp_path / KEY_FILE
    for path in (secrets_path, key_path):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_env_file(str(secrets_path)) == values
    tokens = [values[k] for k in ("SERVICE_API_TOKEN", "SERVICE_GATEWAY_AUTH_TOKEN", "SERVICE_METRICS_TOKEN", "SERVICE_API_KEY")]
    assert len(set(tokens)) == 4 and all(len(t) == 64 for t in tokens)
    digest = hashlib.sha256(values["SERVICE_API_KEY"].encode()).hexdigest()
    assert key_path.read_text() == (
        "# API keys of the gateway: [keys.<name>] with the SHA-256 of the key (svcctl keygen NAME).\n\n"
        f'[keys.local]\nhash = "{digest}"\nscope = "inference"\nrate_limit_qps = 0\nenabled = true\n')
    printed = out.getvalue()
    assert values["SERVICE_API_KEY"] in printed and str(secrets_path) in printed
    again = io.StringIO()
    assert prepare(str(tmp_path), again) == values and again.getvalue() == ""
    assert key_path.read_text().count("[keys.local]") == 1


def test_the_quick_start_leaves_the_key_to_its_next_steps_block(tmp_path):
    """The "shown once" key was printed twice: by prepare and in the next-steps block."""
    out = io.StringIO()
    values = prepare(str(tmp_path), out, show_key=False)
    assert values["SERVICE_API_KEY"] not in out.getvalue()
    assert out.getvalue() == (f"Generated {tmp_path / SECRETS} (mode 0600) and added the key 'local' to "
                              f"{tmp_path / KEY_FILE}.\n")


# -- weights: demo or pretrained --------------------------------------------------------------


def _pulls():
    from models.diffusion import ddpm, ldm
    from svc.weightstore.catalog import FileSource, Variant, find_variant

    file_variant = Variant("n", FileSource("https://github.com/x/y/releases/download/v1/n.pt"), "AGPL-3.0")
    return [("DDPM:cifar10-32", find_variant(ddpm, None)), ("LDM:celebahq-256", find_variant(ldm, None)),
            ("YOLOV8:n", file_variant)]


def test_the_pulls_of_the_shipped_profile_are_its_default_variants_but_its_demo_list():
    """The shipped cpu profile's list and its comment agree: CLS_COND_DDIM (DiT-XL, 3 GB, CC-BY-NC-4.0) stays
    on demo under pretrained."""
    from svc.cli.quickstart import pretrained_pulls

    pulls = [(spec, variant.source.repo_id) for spec, variant in pretrained_pulls(".", profile_name="cpu")
             if spec.split(":")[0] in ("DDPM", "DDIM", "CLS_COND_DDIM", "LDM")]
    assert pulls == [("DDPM:cifar10-32", "google/ddpm-cifar10-32"), ("DDIM:cifar10-32", "google/ddpm-cifar10-32"),
                     ("LDM:celebahq-256", "CompVis/ldm-celebahq-256")]
    comment = open("conf/profiles/cpu.toml").read()
    assert 'demo = ["CLS_COND_DDIM"]' in comment and "CLS_COND_DDIM's only variant is DiT-XL/2" in comment
    assert pretrained_pulls(".", "demo", profile_name="cpu") == []  # as shipped, every config says random


def test_models_outside_the_profile_without_their_cached_variant_start_on_demo_weights(tmp_path):
    """A docs probe: under ``--weights pretrained`` with a profile of two models, the status called the others
    pretrained, and each failed its start from the web UI ("not in the weights cache"), where docs/models.md has a
    model whose variant is missing start on demo weights with one line. Nothing is pulled for them."""
    from svc.cli.quickstart import pretrained_pulls, uncached_outside_profile

    shutil.copytree("conf", tmp_path / "conf")
    profile = tmp_path / "conf" / "profiles" / "cpu.toml"
    profile.write_text(re.sub(r"(?m)^models = .*$", 'models = ["MOBILENETV2", "DDPM"]', profile.read_text()))
    root = str(tmp_path)
    assert [spec for spec, _ in pretrained_pulls(root, profile_name="cpu")] == ["MOBILENETV2:IMAGENET1K_V2",
                                                                                "DDPM:cifar10-32"]
    assert [spec for spec, _ in pretrained_pulls(root, profile_name="cpu", outside=True)] == [
        "DDIM:cifar10-32", "LDM:celebahq-256", "SAM_AMG:sam_vit_b", "YOLOV8:yolov8n"]  # CLS_COND_DDIM: its demo list
    out = io.StringIO()
    demo = uncached_outside_profile(root, "pretrained", {}, out, cached=lambda spec: spec == "LDM:celebahq-256")
    assert demo == dict.fromkeys(["DDIM", "SAM_AMG", "YOLOV8"], "not cached, and not in the profile")
    assert out.getvalue() == ("Pretrained weights: DDIM, SAM_AMG, YOLOV8 (not in the profile) not cached: started "
                              "from the web UI or the API, they run on demo weights (svcctl weights pull MODEL, then "
                              "restart the quick start, to switch).\n")
    assert uncached_outside_profile(root, "demo", {}, out, cached=pytest_fail) == {}


def pytest_fail(*args):
    raise AssertionError(f"not to be called: {args}")


def fetch(pulls, env, *, cached=(), connect=pytest_fail, pull=pytest_fail, available=True, accept=()):
    """fetch_missing with fakes: (the models on demo with why, what it printed)."""
    from svc.cli.quickstart import fetch_missing

    out = io.StringIO()
    demo = fetch_missing(pulls, env, out, accept=accept, connect=connect, pull=pull,
                         pull_available=lambda: available, cached=lambda spec: spec in cached)
    return demo, out.getvalue()


def test_nothing_to_run_pretrained_pulls_nothing():
    assert fetch([], {}) == ({}, "")


def test_what_is_cached_is_served_without_dialling_anything():
    pulls = _pulls()
    assert fetch(pulls, {"HF_HUB_OFFLINE": "1"}, cached={spec for spec, _ in pulls}) == (
        {}, "Pretrained weights: cached, nothing to pull (DDPM:cifar10-32 LDM:celebahq-256 YOLOV8:n).\n")


def test_only_the_missing_variants_are_pulled_when_their_sources_answer():
    dialled, pulled = [], []
    now_cached = {"DDPM:cifar10-32"}

    def pull(specs, accept):
        pulled.append((specs, accept))
        now_cached.update(specs)
        return 0

    demo, out = fetch(_pulls(), {"HF_ENDPOINT": "http://127.0.0.1:9999"}, cached=now_cached,
                      connect=lambda h, p: dialled.append((h, p)) or True, pull=pull, accept=("AGPL-3.0",))
    assert demo == {}
    assert dialled == [("127.0.0.1", 9999), ("github.com", 443)]
    assert pulled == [(["LDM:celebahq-256", "YOLOV8:n"], ("AGPL-3.0",))]
    assert out == "Pulling the pretrained weights of the profile: LDM:celebahq-256 YOLOV8:n\n"


# Which restart (a weights probe: a model's restart from the UI kept its demo weights, --demo-models stays).
SWITCH = "  (svcctl weights pull, then restart the quick start, to switch: a model's own restart keeps its demo weights)\n"


def test_offline_each_missing_model_falls_back_alone_with_why():
    """One unreachable host no longer puts every model on demo: the cached one runs pretrained, the one whose
    source answers is pulled, the one whose host does not answer falls back, named with its reason."""
    now_cached = {"DDPM:cifar10-32"}

    def pull(specs, accept):
        now_cached.update(specs)
        return 0

    demo, out = fetch(_pulls(), {}, cached=now_cached, connect=lambda h, p: h == "github.com", pull=pull)
    assert demo == {"LDM": "not cached, and huggingface.co:443 is not reachable"}
    assert out == ("Pulling the pretrained weights of the profile: YOLOV8:n\n"
                   "Pretrained weights: LDM starts on demo weights: not cached, and huggingface.co:443 is not "
                   "reachable.\n" + SWITCH)


def test_a_refused_licence_a_failed_pull_offline_mode_or_no_pull_command_fall_back_per_model():
    demo, out = fetch(_pulls(), {}, connect=lambda h, p: True, pull=lambda specs, accept: 1)
    assert demo == {"DDPM": "svcctl weights pull exited with 1 (its error is above)",
                    "LDM": "svcctl weights pull exited with 1 (its error is above)",
                    "YOLOV8": "its licence AGPL-3.0 was not accepted (--accept-licence AGPL-3.0)"}
    assert out.splitlines()[-2] == ("Pretrained weights: YOLOV8 starts on demo weights: its licence AGPL-3.0 was not "
                                    "accepted (--accept-licence AGPL-3.0).")
    # HF_HUB_OFFLINE keeps the hub's repositories alone (a weights probe: YOLOV8's file from GitHub stayed on demo
    # while svcctl weights pull fetched it): the file is pulled, the hub's DDPM falls back.
    pulled = []
    demo, out = fetch(_pulls(), {"HF_HUB_OFFLINE": "1"}, cached={"LDM:celebahq-256"}, connect=lambda h, p: True,
                      pull=lambda specs, accept: pulled.append(specs) or 1, accept=("AGPL-3.0",))
    assert pulled == [["YOLOV8:n"]]
    assert demo == {"DDPM": "not cached, and HF_HUB_OFFLINE is set",
                    "YOLOV8": "svcctl weights pull exited with 1 (its error is above)"}
    demo, out = fetch(_pulls()[:1], {"TRANSFORMERS_OFFLINE": "1"})  # named as set, not as HF_HUB_OFFLINE
    assert demo == {"DDPM": "not cached, and TRANSFORMERS_OFFLINE is set"}
    # As huggingface_hub reads them, HF_HUB_OFFLINE set at all wins: "0" pulls (a regression probe: the quick start
    # left DDPM on demo weights, saying TRANSFORMERS_OFFLINE, where svcctl weights pull went online).
    pulled.clear()
    demo, out = fetch(_pulls()[:1], {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, connect=lambda h, p: True,
                      pull=lambda specs, accept: pulled.append(specs) or 0)
    assert pulled == [["DDPM:cifar10-32"]] and "OFFLINE" not in out  # pulled (the fake caches nothing)
    demo, out = fetch(_pulls()[:1], {}, available=False)
    assert out == ("Pretrained weights: DDPM starts on demo weights: svcctl weights pull is not available in this "
                   "installation.\n" + SWITCH)


def test_on_this_machine_the_hub_is_not_reachable_and_demo_it_is(tmp_path):
    """No internet here: the real connection attempt fails (DNS or connect); the real cache lookup finds nothing."""
    from svc.cli.quickstart import fetch_missing

    out = io.StringIO()
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "SERVICE_WEIGHTS_DIR": str(tmp_path)}
    demo = fetch_missing(_pulls()[:2], env, out, pull=pytest_fail)
    assert demo == {"DDPM": "not cached, and 127.0.0.1:9 is not reachable",
                    "LDM": "not cached, and 127.0.0.1:9 is not reachable"}


def status(*servers, gateway_ready=True):
    return {"profile": "cpu", "device": "cpu", "gateway": {"id": "__gateway", "state": "running", "ready": gateway_ready},
            "servers": [{"id": i, "state": state, "ready": ready, "last_error": err} for i, state, ready, err in servers]}


def test_the_next_steps_block_after_the_first_run_shows_the_key_and_what_to_run(tmp_path, monkeypatch):
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "svcctl").write_text("")
    monkeypatch.setattr(sys, "executable", str(tmp_path / ".venv" / "bin" / "python"))  # bin/quickstart's
    monkeypatch.chdir(tmp_path)
    ready = status(("MOBILENETV2", "running", True, None), ("DDPM", "running", True, None))
    block = next_steps(ready, ui_url="http://127.0.0.1:8787/", gateway_url="http://127.0.0.1:8080", api_key="k" * 64)
    assert block == (
        "== All models ready: 2 on the cpu profile (cpu), gateway http://127.0.0.1:8080\n"
        "   Web UI:            http://127.0.0.1:8787/  (paste the management token)\n"
        f"   Management token:  SERVICE_API_TOKEN in {SECRETS} (mode 0600)\n"
        f"   First API key:     {'k' * 64}\n"
        "   Try it from another shell in this folder (some.jpg: any photo of yours):\n"
        f"     set -a; . {SECRETS}; set +a; .venv/bin/svcctl infer MOBILENETV2 some.jpg --param top_k=3\n"
        '   More in README.md, "Try it". Ctrl-C stops everything.\n'
    )


def test_a_run_in_another_folder_names_its_secrets_whole(tmp_path):
    """A new-user probe: ``bin/quickstart --root DIR`` said "SERVICE_API_TOKEN in secrets/local.env" and "Try it
    from another shell in this folder: set -a; . secrets/local.env ...", which in the shell's folder (the checkout)
    read the checkout's own secrets: 401.  The block takes the path main gives it, whole for another folder."""
    ready = status(("MOBILENETV2", "running", True, None))
    whole = str(tmp_path / SECRETS)
    lines = next_steps(ready, ui_url="u", gateway_url="g", api_key=None, secrets_path=whole,
                       svcctl="svcctl").splitlines()
    assert f"   Management token:  SERVICE_API_TOKEN in {whole} (mode 0600)" in lines
    assert "   Try it from another shell (some.jpg: any photo of yours):" in lines
    assert f"     set -a; . {whole}; set +a; svcctl infer MOBILENETV2 some.jpg --param top_k=3" in lines


def test_later_runs_say_where_the_key_is_and_name_the_models_that_are_not_ready():
    mixed = status(("MOBILENETV2", "running", True, None), ("SAM_AMG", "start_failed", False, "port 9107 busy"))
    block = next_steps(mixed, ui_url="http://127.0.0.1:8787/", gateway_url="http://127.0.0.1:8080", api_key=None)
    lines = block.splitlines()
    assert lines[0] == "== 1 of 2 models ready on the cpu profile; not ready:"
    assert lines[1] == "     SAM_AMG (start_failed: port 9107 busy; its log: logs/SAM_AMG.log)"
    assert f"   First API key:     SERVICE_API_KEY in {SECRETS}" in lines


def test_a_gateway_that_is_not_ready_is_named():
    down = status(("MOBILENETV2", "running", True, None), gateway_ready=False)
    down["gateway"].update(state="failed", last_error="SERVICE_METRICS_TOKEN is not set")
    lines = next_steps(down, ui_url="u", gateway_url="g", api_key=None).splitlines()
    assert lines[1] == ("   The gateway is not ready (failed: SERVICE_METRICS_TOKEN is not set; "
                        "its log: logs/__gateway.log)")


def test_a_gateway_whose_port_another_program_holds_gets_no_first_command():
    """A fresh-install probe: with another program on 8080 the block began "All models ready ... gateway
    http://127.0.0.1:8080" and offered a first svcctl command, which sent the management token to that program."""
    down = status(("MOBILENETV2", "running", True, None), gateway_ready=False)
    down["gateway"].update(state="start_failed", last_error="port 8080 is in use; still in use after waiting 60 s")
    lines = next_steps(down, ui_url="u", gateway_url="http://127.0.0.1:8080", api_key=None).splitlines()
    assert lines[:3] == [
        "== All models ready: 1 on the cpu profile (cpu), but not the gateway:",
        "   The gateway is not ready (start_failed: port 8080 is in use; still in use after waiting 60 s; its log: "
        "logs/__gateway.log)",
        "   Another program holds http://127.0.0.1:8080: stop it, or set [gateway] port in conf/service.toml and run "
        "this again; Start in the web UI retries the same port."]
    assert not any("svcctl" in line or "Try it from" in line for line in lines), lines
    assert lines[-1] == '   More in README.md, "Try it". Ctrl-C stops everything.'


def test_the_block_waits_until_every_child_has_settled():
    assert not settled(status(("MOBILENETV2", "starting", False, None)))
    assert not settled(status(("MOBILENETV2", "running", False, None)))  # loading, not ready yet
    assert not settled(status(("MOBILENETV2", "backoff", False, "exit 1")))
    assert not settled(status(("MOBILENETV2", "running", True, None), gateway_ready=False))
    assert settled(status(("MOBILENETV2", "running", True, None), ("DDPM", "failed", False, "crash loop")))


def test_a_child_not_spawned_yet_is_on_its_way_not_stopped():
    """The supervisor spawns the profile's children one after the other: until then they are "stopped", with no
    exit behind them. The quick start neither prints that (it read as seven failures) nor settles on it."""
    from svc.cli.quickstart import progress_lines

    waiting = status(("MOBILENETV2", "running", True, None), ("DDPM", "stopped", False, None))
    assert not settled(waiting)
    seen: dict[str, str] = {}
    assert progress_lines(seen, waiting) == ["   MOBILENETV2: ready"]
    waiting["servers"][1].update(last_exit="exit code 0")  # stopped after it ran: settled, and said
    assert settled(waiting)
    assert progress_lines(seen, waiting) == ["   DDPM: stopped"]


def test_service_addresses_come_from_the_service_config(tmp_path):
    assert service_addresses(str(tmp_path)) == ("http://127.0.0.1:8787/", "http://127.0.0.1:8080")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text("[gateway]\nport = 18080\n[supervisor]\nport = 18787\n")
    assert service_addresses(str(tmp_path)) == ("http://127.0.0.1:18787/", "http://127.0.0.1:18080")


def test_behind_a_proxy_the_proxy_is_what_is_dialled():
    from svc.cli.quickstart import source_hosts

    variants = [variant for _, variant in _pulls()]
    env = {"HTTPS_PROXY": "http://proxy.internal:3128", "no_proxy": "github.com"}
    assert source_hosts(variants, env) == [("proxy.internal", 3128), ("github.com", 443)]


def test_one_line_per_change_of_what_each_model_does():
    from svc.cli.quickstart import progress_lines

    def servers(*rows):
        return {"servers": [{"id": i, "state": state, "ready": ready, "phase": phase} for i, state, ready, phase in rows]}

    seen: dict[str, str] = {}
    assert progress_lines(seen, {}) == []  # no status yet
    assert progress_lines(seen, servers(("YOLOV8", "starting", False, None), ("DDPM", "starting", False, None))) == [
        "   YOLOV8: starting", "   DDPM: starting"]
    loading = "the model is loading: measuring mode 2 of 4 (compile)"
    assert progress_lines(seen, servers(("YOLOV8", "starting", False, loading),
                                        ("DDPM", "starting", False, None))) == ["   YOLOV8: measuring mode 2 of 4 (compile)"]
    assert progress_lines(seen, servers(("YOLOV8", "starting", False, loading),
                                        ("DDPM", "starting", False, None))) == []  # the same: nothing printed
    assert progress_lines(seen, servers(("YOLOV8", "running", True, None), ("DDPM", "failed", False, None))) == [
        "   YOLOV8: ready", "   DDPM: failed"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_supervisor_killed_by_a_signal_exits_128_plus_it_with_a_line(capsys, sig):
    """A supervisor killed with ``kill -9`` made the quick start exit 247 (``sys.exit(-9)``) without a word."""
    from svc.cli.quickstart import exit_status

    child = subprocess.Popen(["sleep", "30"])
    child.send_signal(sig)
    assert exit_status(child.wait()) == 128 + sig
    err = capsys.readouterr().err
    assert err.startswith(f"quickstart: the supervisor was killed by {sig.name} ({int(sig)})"), err
    assert ("OOM killer" in err) == (sig == signal.SIGKILL), err


def test_a_supervisor_that_exits_keeps_its_status(capsys):
    from svc.cli.quickstart import exit_status

    assert (exit_status(0), exit_status(1)) == (0, 1)
    assert capsys.readouterr().err == ""


def test_the_catalog_models_outside_the_profile_are_neither_waited_for_nor_counted():
    """A profile of two models beside the seven shipped configs: the other five are listed stopped with
    ``in_profile`` false. The block came once they had "started" (never: no block, and no first key)."""
    from svc.cli.quickstart import progress_lines

    trimmed = status(("MOBILENETV2", "running", True, None), ("DDPM", "running", True, None),
                     ("YOLOV8", "stopped", False, None), ("SAM_AMG", "stopped", False, None))
    for server in trimmed["servers"]:
        server["in_profile"] = server["id"] in ("MOBILENETV2", "DDPM")
    assert settled(trimmed)
    assert progress_lines({}, trimmed) == ["   MOBILENETV2: ready", "   DDPM: ready"]
    lines = next_steps(trimmed, ui_url="u", gateway_url="g", api_key=None).splitlines()
    assert lines[0] == "== All models ready: 2 on the cpu profile (cpu), gateway g"
    assert lines[1] == "   Not in the profile, stopped (start one in the web UI): YOLOV8, SAM_AMG"
    trimmed["servers"][1].update(state="starting", ready=False)
    assert not settled(trimmed)


def test_the_block_names_the_svcctl_of_the_running_interpreter(tmp_path, monkeypatch):
    """An installed package has no .venv in the folder it runs in: the block said ``.venv/bin/svcctl`` anyway."""
    for env in ("work/env", "service env"):
        (tmp_path / env / "bin").mkdir(parents=True)
        (tmp_path / env / "bin" / "svcctl").write_text("")
    monkeypatch.chdir(tmp_path / "work")
    ready = status(("MOBILENETV2", "running", True, None))
    for executable, shown in ((tmp_path / "work" / "env" / "bin" / "python3", "env/bin/svcctl"),
                              (tmp_path / "service env" / "bin" / "python", f"'{tmp_path}/service env/bin/svcctl'"),
                              # pip install --user: the interpreter's folder holds no svcctl
                              (tmp_path / "usr" / "bin" / "python3", f"{tmp_path}/usr/bin/python3 -m svc.cli")):
        monkeypatch.setattr(sys, "executable", str(executable))
        lines = next_steps(ready, ui_url="u", gateway_url="g", api_key=None).splitlines()
        assert lines[5] == f"     set -a; . {SECRETS}; set +a; {shown} infer MOBILENETV2 some.jpg --param top_k=3"


def fake_install(tmp_path, monkeypatch, *, conf: bool):
    """The code in ``<tmp>/base/lib/python3.11/site-packages``, its data in ``<tmp>/base/share/inference-service``
    (the default configuration when ``conf``, and a key file that must never be copied); ``sys.prefix`` empty."""
    from svc import __version__
    from svc.infra import install

    site_packages = tmp_path / "base" / "lib" / "python3.11" / "site-packages"
    site_packages.mkdir(parents=True)
    shared = tmp_path / "base" / "share" / "inference-service" / "conf"
    if conf:
        for name in ("service.toml", "api_keys.example.toml", "profiles/cpu.toml", "profiles/gpu.toml",
                     "server/MOBILENETV2.toml", "api_keys.toml"):
            (shared / name).parent.mkdir(parents=True, exist_ok=True)
            (shared / name).write_text(f"# {name}\n")
        (shared.parent / "VERSION").write_text(f"{__version__}\n")  # setup.py's install_data
    monkeypatch.setattr(install, "source_root", lambda: site_packages)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    return shared


def test_in_a_folder_without_conf_the_installed_defaults_are_copied_first(tmp_path, monkeypatch, capsys):
    """An installed user could not run the quick start: "not a checkout of the service (no conf/ folder)"."""
    from svc.cli.quickstart import main

    shared = fake_install(tmp_path, monkeypatch, conf=True)
    work = tmp_path / "work"
    work.mkdir()
    assert main(["--root", str(work), "--prepare-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"quickstart: no conf/ folder in {work}: copied the default configuration from {shared}"
    copied = sorted(str(p.relative_to(work / "conf")) for p in (work / "conf").rglob("*") if p.is_file())
    assert copied == ["api_keys.example.toml", "api_keys.toml", "profiles/cpu.toml", "profiles/gpu.toml",
                      "server/MOBILENETV2.toml", "service.toml"]
    assert (work / "conf" / "service.toml").read_text() == "# service.toml\n"
    assert "[keys.local]" in (work / "conf" / "api_keys.toml").read_text()  # the quick start's own, not the copy's
    assert (work / SECRETS).is_file()


def test_without_installed_defaults_a_folder_without_conf_is_still_refused(tmp_path, monkeypatch, capsys):
    from svc.cli.quickstart import main

    fake_install(tmp_path, monkeypatch, conf=False)
    work = tmp_path / "work"
    work.mkdir()
    assert main(["--root", str(work), "--prepare-only"]) == 1
    # it said "run it in the checkout or give --root", --root given (a regression probe)
    assert capsys.readouterr().err == (f"quickstart: {work} has no conf/ folder, and no installed default "
                                       "configuration of this version was found to copy there: run it in a checkout "
                                       "of the service (or give --root one), or reinstall the service\n")
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("defaults", [True, False], ids=["installed defaults", "none installed"])
def test_a_conf_folder_holding_only_a_key_file_gets_the_defaults_it_lacks(tmp_path, monkeypatch, capsys, defaults):
    """A folder whose conf/ held only the key file of an earlier ``svcctl keys add`` got no defaults copied, and the
    run then failed with "conf/profiles/cpu.toml does not exist"."""
    from svc.cli.quickstart import main

    shared = fake_install(tmp_path, monkeypatch, conf=defaults)
    conf = tmp_path / "work" / "conf"
    conf.mkdir(parents=True)
    (conf / "api_keys.toml").write_text('[keys.bob]\nhash = "' + "0" * 64 + '"\n')
    (conf / "profiles").mkdir()
    (conf / "profiles" / "cpu.toml").write_text("# the user's own\n")
    code = main(["--root", str(tmp_path / "work"), "--prepare-only"])
    out, err = capsys.readouterr()
    if not defaults:
        assert (code, out) == (1, "")
        assert err == (f"quickstart: {conf} lacks service.toml, profiles/gpu.toml, and no installed default "
                       "configuration was found to copy them from: copy them from the service's conf/ (a checkout's), "
                       "or reinstall the service\n")
        assert sorted(p.name for p in conf.rglob("*")) == ["api_keys.toml", "cpu.toml", "profiles"]
        return
    assert code == 0, err
    assert out.splitlines()[0] == (f"quickstart: {conf} lacked service.toml, profiles/gpu.toml: copied the 4 default "
                                   f"files it did not have from {shared}, none of its own replaced")
    copied = sorted(str(p.relative_to(conf)) for p in conf.rglob("*") if p.is_file())
    assert copied == ["api_keys.example.toml", "api_keys.toml", "profiles/cpu.toml", "profiles/gpu.toml",
                      "server/MOBILENETV2.toml", "service.toml"]
    assert (conf / "profiles" / "cpu.toml").read_text() == "# the user's own\n"
    assert (conf / "api_keys.toml").read_text().startswith("[keys.bob]\n")  # kept, the quick start's key added
    assert "[keys.local]" in (conf / "api_keys.toml").read_text()


@pytest.mark.parametrize("make, said", [(None, "does not exist: make the folder first, or give --root an existing one"),
                                        ("file", "is not a folder: give --root a folder")])
def test_a_root_that_is_no_folder_is_named_so_and_nothing_is_made(tmp_path, capsys, make, said):
    """``--root /nonexistent`` said "is not a checkout of the service (no conf/ folder); run it in the checkout or
    give --root", --root given.  (Before that, ``--prepare-only`` made the folder, with secrets and a key file.)"""
    from svc.cli.quickstart import main

    root = tmp_path / "nowhere"
    if make:
        root.write_text("")
    assert main(["--root", str(root), "--prepare-only"]) == 1
    assert capsys.readouterr() == ("", f"quickstart: {root} {said}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if make is None else ["nowhere"])


@pytest.mark.parametrize("argv, said", [(["--help"], "usage: python -m svc.cli.quickstart [-h] [--version]"),
                                        (["--version"], "inference-service ")])
def test_python_m_quickstart_names_itself_and_has_a_version(argv, said):
    """``python -m svc.cli.quickstart --help`` said ``usage: bin/quickstart`` and "Install the service into .venv
    and run it", though it installs nothing; its --version was "unrecognized arguments", as no other program's."""
    from svc import __version__
    from tests.support.processes import REPO

    done = subprocess.run([sys.executable, "-m", "svc.cli.quickstart", *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(said)
    if argv == ["--version"]:
        assert done.stdout == f"inference-service {__version__}\n"
    else:
        assert "Installs nothing" in done.stdout and ".venv" not in done.stdout


# -- the secrets file: replaced, unreadable, unwritable ----------------------------------------------


def test_no_new_secrets_while_a_supervisor_of_the_folder_runs(tmp_path):
    """A fresh-install probe removed secrets/local.env while the service ran (the README's way to new secrets) and
    ran the quick start: it replaced the key 'local' and wrote new tokens, then was refused as a second supervisor;
    the running service refused both the new secrets and the old ones, gone from disk. Now nothing is written."""
    from svc.cli.quickstart_secrets import QuickstartError
    from svc.supervisor.logsink import LogDirLock

    prepare(str(tmp_path), io.StringIO())
    (tmp_path / SECRETS).unlink()
    keys = (tmp_path / KEY_FILE).read_text()
    lock = LogDirLock(str(tmp_path / "logs"))  # what a running supervisor of the folder holds
    assert lock.acquire() is None
    try:
        with pytest.raises(QuickstartError) as refused:
            prepare(str(tmp_path), io.StringIO())
    finally:
        lock.release()
    assert str(refused.value) == (
        f"a service of this folder runs (its supervisor, pid {os.getpid()}, holds its logs folder): new secrets now "
        f"would lock you out of it; stop it first (Ctrl-C in its terminal, or kill -TERM {os.getpid()}), then run "
        "this again to make them")
    assert not (tmp_path / SECRETS).exists() and (tmp_path / KEY_FILE).read_text() == keys
    assert prepare(str(tmp_path), io.StringIO())["SERVICE_API_KEY"]  # once it stopped


def test_a_removed_secrets_file_gets_new_secrets_and_the_first_key_replaced_not_added_twice(tmp_path):
    """A probe removed secrets/local.env and ran the quick start again: a second [keys.local] was appended, and
    the gateway refused the key file ("Key "local" already exists")."""
    from svc.auth import load_key_file

    first = prepare(str(tmp_path), io.StringIO())
    (tmp_path / SECRETS).unlink()
    out = io.StringIO()
    second = prepare(str(tmp_path), out, show_key=False)
    assert second["SERVICE_API_KEY"] != first["SERVICE_API_KEY"]
    assert out.getvalue() == (f"Generated {tmp_path / SECRETS} (mode 0600) and replaced the key 'local' in "
                              f"{tmp_path / KEY_FILE} (its old key no longer works).\n")
    entries = load_key_file(str(tmp_path / KEY_FILE))
    assert [(e.name, e.hash) for e in entries] == [
        ("local", hashlib.sha256(second["SERVICE_API_KEY"].encode()).hexdigest())]
    assert read_env_file(str(tmp_path / SECRETS)) == second


def test_other_keys_of_the_key_file_stay_when_the_first_key_is_replaced(tmp_path):
    from svc.auth import issue_key, load_key_file

    prepare(str(tmp_path), io.StringIO())
    with open(tmp_path / KEY_FILE, "a") as f:
        f.write("\n" + issue_key("tenant-b", "all", 5)[1])
    (tmp_path / SECRETS).unlink()
    prepare(str(tmp_path), io.StringIO())
    assert [(e.name, e.scope, e.rate_limit_qps) for e in load_key_file(str(tmp_path / KEY_FILE))] == [
        ("local", "inference", 0), ("tenant-b", "all", 5)]


def own_conf(root: Path) -> None:
    """A ``conf/`` of the user's in ``root`` holding the files a run needs (empty: no defaults are copied into it)."""
    from svc.cli.quickstart import REQUIRED_CONF

    for name in REQUIRED_CONF:
        (root / "conf" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "conf" / name).write_text("")


@pytest.mark.parametrize("content, problem", [
    ("", "has no SERVICE_API_TOKEN, SERVICE_GATEWAY_AUTH_TOKEN, SERVICE_METRICS_TOKEN, SERVICE_API_KEY: remove the "
         "file to generate new secrets (the key 'local' is then replaced by a new one)"),
    ("SERVICE_API_TOKEN=a\nSERVICE_GATEWAY_AUTH_TOKEN=b\nSERVICE_METRICS_TOKEN=c\n",
     "has no SERVICE_API_KEY: remove the file to generate new secrets (the key 'local' is then replaced by a new "
     "one)"),
    (None, "cannot read {path}: Is a directory"),
])
def test_a_secrets_file_that_cannot_be_used_is_one_line_exit_1(tmp_path, capsys, content, problem):
    """An empty file (left by a write that failed), one lacking a secret, or a folder in its place: a traceback
    (KeyError, IsADirectoryError) on every run before."""
    from svc.cli.quickstart import main

    own_conf(tmp_path)
    path = tmp_path / SECRETS
    path.parent.mkdir()
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    assert main(["--root", str(tmp_path), "--prepare-only"]) == 1
    shown = f"{path} {problem}" if not problem.startswith("cannot") else problem.format(path=path)
    assert capsys.readouterr() == ("", f"quickstart: {shown}\n")
    assert not (tmp_path / KEY_FILE).exists()


def test_a_secrets_write_that_fails_leaves_no_secrets_and_the_next_run_recovers(tmp_path, capsys, monkeypatch):
    """A full disk: a traceback, an empty secrets/local.env, and every later run failed with KeyError.  Now one
    line, no secrets file (each file is replaced in one rename), and the next run makes them and replaces the key."""
    import errno

    from svc.auth import load_key_file
    from svc.cli.quickstart import main

    own_conf(tmp_path)
    real_fsync = os.fsync

    def full(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "secrets")):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    assert main(["--root", str(tmp_path), "--prepare-only"]) == 1
    assert capsys.readouterr() == ("", f"quickstart: cannot write {tmp_path / SECRETS}: No space left on device\n")
    assert os.listdir(tmp_path / "secrets") == []
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert main(["--root", str(tmp_path), "--prepare-only"]) == 0
    values = read_env_file(str(tmp_path / SECRETS))
    assert [e.hash for e in load_key_file(str(tmp_path / KEY_FILE))] == [
        hashlib.sha256(values["SERVICE_API_KEY"].encode()).hexdigest()]
    capsys.readouterr()
    # Again: the secrets are there. It said nothing at all (a new-user probe); it says so, naming the file whole.
    assert main(["--root", str(tmp_path), "--prepare-only"]) == 0
    assert capsys.readouterr() == (f"{tmp_path / SECRETS} exists: nothing to prepare (the first API key is its "
                                   "SERVICE_API_KEY)\n", "")


def test_the_secrets_folder_is_private_under_any_umask(tmp_path):
    """Under umask 000 secrets/ was 0777: another user could move local.env away and put their own tokens in."""
    old = os.umask(0)
    try:
        prepare(str(tmp_path), io.StringIO())
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "secrets").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / SECRETS).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / KEY_FILE).st_mode) == 0o600


def test_the_first_key_goes_to_the_key_file_the_gateway_loads(tmp_path):
    """With ``[gateway] keys_file`` set, the first key was still added to conf/api_keys.toml, where no gateway read
    it (regression probe)."""
    from svc.auth import load_key_file

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text('[gateway]\nkeys_file = "conf/prod_keys.toml"\n')
    out = io.StringIO()
    values = prepare(str(tmp_path), out, show_key=False)
    assert not (tmp_path / KEY_FILE).exists()
    assert [e.hash for e in load_key_file(str(tmp_path / "conf" / "prod_keys.toml"))] == [
        hashlib.sha256(values["SERVICE_API_KEY"].encode()).hexdigest()]
    assert f"added the key 'local' to {tmp_path / 'conf' / 'prod_keys.toml'}." in out.getvalue()


def test_secrets_an_older_run_left_open_to_other_users_are_made_private_again(tmp_path):
    """An install of 0.12.0 made under umask 000 kept a 0777 secrets/ after the upgrade (only new ones were
    0700), in which another user could swap in their own tokens."""
    values = prepare(str(tmp_path), io.StringIO())
    os.chmod(tmp_path / "secrets", 0o777)
    os.chmod(tmp_path / SECRETS, 0o666)
    out = io.StringIO()
    assert prepare(str(tmp_path), out) == values
    assert stat.S_IMODE(os.stat(tmp_path / "secrets").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / SECRETS).st_mode) == 0o600
    assert out.getvalue() == (f"quickstart: {tmp_path / 'secrets'} was mode 777, open to other users: made 700\n"
                              f"quickstart: {tmp_path / SECRETS} was mode 666, open to other users: made 600\n")
    again = io.StringIO()
    prepare(str(tmp_path), again)
    assert again.getvalue() == ""


def test_a_first_key_the_gateways_key_file_lacks_is_named_in_one_line(tmp_path):
    """0.12.0 stored the first key in conf/api_keys.toml whatever [gateway] keys_file said; after the upgrade the
    quick start said nothing and its next-steps block named a key that gets 401. It is not added behind the
    operator's back (they may have removed it on purpose), but said."""
    prepare(str(tmp_path), io.StringIO())  # the key in conf/api_keys.toml
    (tmp_path / "conf").mkdir(exist_ok=True)
    (tmp_path / "conf" / "service.toml").write_text('[gateway]\nkeys_file = "conf/prod_keys.toml"\n')
    out = io.StringIO()
    prepare(str(tmp_path), out)
    assert out.getvalue() == (
        f"quickstart: the SERVICE_API_KEY of {tmp_path / SECRETS} is in no entry of "
        f"{tmp_path / 'conf' / 'prod_keys.toml'}, the key file the gateway loads, so it gets 401: remove "
        f"{tmp_path / SECRETS} to make new secrets and a key there, or add one with svcctl keys add\n")
    (tmp_path / "conf" / "service.toml").write_text("")  # back to conf/api_keys.toml, which holds it
    quiet = io.StringIO()
    prepare(str(tmp_path), quiet)
    assert quiet.getvalue() == ""


def test_only_the_quick_starts_own_supervisor_is_trusted():
    """While its supervisor still imported, another one on the same port (the same folder's, with the same token)
    answered, and the quick start printed that one's readiness as its own block before its own supervisor failed."""
    from svc.cli.quickstart import own_status

    theirs = {"pid": 4242, "gateway": {"ready": True}, "servers": []}
    assert own_status(theirs, 4243) is None
    assert own_status({"gateway": {"ready": True}, "servers": []}, 4243) is None  # a status that names no pid
    assert own_status(None, 4242) is None
    assert own_status(theirs, 4242) is theirs


def test_the_start_line_names_the_models_their_configs_put_on_pretrained_weights():
    """An upgrade probe: "Starting the supervisor (demo weights)" right after "Pretrained weights: cached, nothing to
    pull (YOLOV8:yolov8n DDIM:cifar10-32)", while those two served their variants."""
    pulled = ["YOLOV8:yolov8n", "DDIM:cifar10-32"]
    assert weights_said("demo", pulled, {}) == "demo weights; pretrained by their configs: YOLOV8:yolov8n, DDIM:cifar10-32"
    assert weights_said("demo", pulled, {"DDIM": "not cached"}) == (
        "demo weights; pretrained by their configs: YOLOV8:yolov8n")  # one left on demo is not named
    assert weights_said("demo", [], {}) == "demo weights"
    assert weights_said("pretrained", pulled, {}) == "pretrained weights"
    # A probe: offline, every model fell back to demo while this said "pretrained weights".
    assert weights_said("pretrained", pulled, {"YOLOV8": "x", "DDIM": "y"}) == (
        "pretrained weights asked, none to be had: demo weights")
    assert weights_said("pretrained", pulled, {"DDIM": "y"}) == "pretrained weights; demo for DDIM"


@pytest.mark.parametrize("argv, code, said", [(["--help"], 0, "usage: bin/quickstart [-h]"),
                                              (["--version"], 0, "inference-service "),
                                              (["--prep"], 2, "error: unrecognized arguments: --prep"),  # as written
                                              (["--weigths", "x"], 2, "error: unrecognized arguments: --weigths x"),
                                              (["--weights", "real"], 2, "argument --weights: invalid choice")])
def test_help_and_a_mistyped_option_are_answered_before_anything_is_installed(argv, code, said):
    """A probe: ``bin/quickstart --help`` started installing PyTorch into .venv (minutes, 6 GB) before its parser
    said anything; so did a mistyped option.  The script reads them first, with the system's python3."""
    from tests.support.processes import REPO

    done = subprocess.run(["sh", str(REPO / "bin" / "quickstart"), *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert said in (done.stdout + done.stderr) and "==>" not in done.stdout + done.stderr


def script_tree(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of bin/quickstart's checkout whose .venv is this interpreter and whose pip takes 1.5 s and logs its
    run: the pip log, and the environment to run the script in."""
    from tests.support.processes import REPO

    (tmp_path / "bin").mkdir()
    shutil.copy(REPO / "bin" / "quickstart", tmp_path / "bin" / "quickstart")
    shutil.copy(REPO / "setup.py", tmp_path / "setup.py")
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    shutil.copytree(REPO / "svc", tmp_path / "svc", ignore=shutil.ignore_patterns("__pycache__"))  # the script reads
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # this environment's site-packages
    (venv / "python").chmod(0o755)
    log = tmp_path / "pip.log"
    (venv / "pip").write_text(f'#!/bin/sh\necho "start $$" >> {log}\nsleep 1.5\necho "end $$" >> {log}\n')
    (venv / "pip").chmod(0o755)
    return log, {**os.environ, "PYTHONPATH": str(REPO)}


def test_two_quick_starts_at_once_install_one_after_the_other(tmp_path):
    """A new-user probe: a second ``bin/quickstart`` begun while the first installed ran a second ``pip install``
    into the same .venv, which died with a pip traceback.  The second waits for the first's lock, saying so."""
    from tests.support.processes import wait_until

    log, env = script_tree(tmp_path)
    first = subprocess.Popen(["sh", "bin/quickstart", "--prepare-only"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until(log.exists, "the first pip run", timeout=30)  # the first holds the lock before the second begins
    second = subprocess.run(["sh", "bin/quickstart", "--prepare-only"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=60)
    assert first.wait(timeout=60) == 0 and second.returncode == 0, (first.stdout.read(), second.stderr)
    runs = log.read_text().split()[::2]
    assert runs in (["start", "end"], ["start", "end", "start", "end"]), log.read_text()  # never two at once
    assert "==> Another bin/quickstart (pid " in second.stdout and "is installing into .venv: waiting" in second.stdout
    assert not (tmp_path / ".venv-install.lock").exists()


def test_a_lock_left_by_a_quick_start_that_is_gone_is_taken_over(tmp_path):
    """A quick start killed while it installed (kill -9: no trap ran) leaves its lock: the next one takes it over
    at once, as its owner's pid is gone, instead of waiting for good."""
    log, env = script_tree(tmp_path)
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()  # an ended pid
    (tmp_path / ".venv-install.lock").mkdir()
    (tmp_path / ".venv-install.lock" / "pid").write_text(gone + "\n")
    done = subprocess.run(["sh", "bin/quickstart", "--prepare-only"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Another bin/quickstart" not in done.stdout and log.read_text().split()[::2] == ["start", "end"]
    assert not (tmp_path / ".venv-install.lock").exists()


def test_python_m_quickstart_imports_no_models_folder_of_the_working_directory(tmp_path):
    """``python -m svc.cli.quickstart`` (an installed user's quick start) imported the working directory's
    ``models/*.py`` as model plugins when it looked up the profile's weights: ``-m`` put that folder first on
    sys.path.  Run here up to the supervisor, which refuses its wildcard address at once."""
    from tests.support.processes import REPO, free_port

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.py").write_text('print("IMPORTED", flush=True)\n')
    shutil.copytree(REPO / "conf", tmp_path / "root" / "conf", ignore=shutil.ignore_patterns("api_keys.toml"))
    (tmp_path / "root" / "conf" / "service.toml").write_text(
        f'[supervisor]\nhost = "0.0.0.0"\nport = {free_port()}\nprofile = "cpu"\n[gateway]\nport = {free_port()}\n')
    env = {k: v for k, v in os.environ.items() if k != "SERVICE_EXPOSE"}  # else the supervisor would start
    done = subprocess.run([sys.executable, "-m", "svc.cli.quickstart", "--root", "root"], cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert "IMPORTED" not in done.stdout + done.stderr
    assert done.stdout.splitlines()[1].startswith("Starting the supervisor (demo weights)")
    assert done.stderr == ("service-supervisor: refusing the wildcard bind '0.0.0.0': set SERVICE_EXPOSE=docker (in "
                           "a container) or SERVICE_EXPOSE=unsafe to expose the management API\n")
    assert done.returncode == 1
