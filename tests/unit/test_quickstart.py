"""First-run secrets of bin/quickstart."""

import hashlib
import io
import os
import stat

from svc.quickstart import KEY_FILE, SECRETS, next_steps, prepare, read_env_file, service_addresses, settled


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


# -- weights: demo or pretrained --------------------------------------------------------------


def _pulls():
    from models.diffusion import ddpm, ldm
    from svc.weightstore.catalog import FileSource, Variant, find_variant

    file_variant = Variant("n", FileSource("https://github.com/x/y/releases/download/v1/n.pt"), "AGPL-3.0")
    return [("DDPM:cifar10-32", find_variant(ddpm, None)), ("LDM:celebahq-256", find_variant(ldm, None)),
            ("YOLOV8:n", file_variant)]


def test_the_pulls_of_the_shipped_profile_are_its_default_variants():
    from svc.quickstart import pretrained_pulls

    pulls = [(spec, variant.source.repo_id) for spec, variant in pretrained_pulls(".")
             if spec.split(":")[0] in ("DDPM", "DDIM", "CLS_COND_DDIM", "LDM")]
    assert pulls == [("DDPM:cifar10-32", "google/ddpm-cifar10-32"), ("DDIM:cifar10-32", "google/ddpm-cifar10-32"),
                     ("CLS_COND_DDIM:dit-xl-2-256", "facebook/DiT-XL-2-256"),
                     ("LDM:celebahq-256", "CompVis/ldm-celebahq-256")]


def test_demo_pulls_nothing():
    from svc.quickstart import choose_weights

    out = io.StringIO()
    assert choose_weights("demo", _pulls(), {}, out, connect=pytest_fail, pull=pytest_fail) == "demo"
    assert out.getvalue() == ""


def pytest_fail(*args):
    raise AssertionError(f"not to be called: {args}")


def test_pretrained_pulls_when_the_sources_answer():
    from svc.quickstart import choose_weights

    out, dialled, pulled = io.StringIO(), [], []
    weights = choose_weights("pretrained", _pulls(), {"HF_ENDPOINT": "http://127.0.0.1:9999"}, out,
                             connect=lambda h, p: dialled.append((h, p)) or True,
                             pull=lambda specs: pulled.append(specs) or 0, pull_available=lambda: True)
    assert weights == "pretrained"
    assert dialled == [("127.0.0.1", 9999), ("github.com", 443)]
    assert pulled == [["DDPM:cifar10-32", "LDM:celebahq-256", "YOLOV8:n"]]
    assert out.getvalue() == "Pulling the pretrained weights of the profile: DDPM:cifar10-32 LDM:celebahq-256 YOLOV8:n\n"


FALLBACK = "starting on demo weights (svcctl weights pull, then restart, to switch).\n"


def test_unreachable_sources_start_on_demo_in_one_line():
    from svc.quickstart import choose_weights

    out = io.StringIO()
    weights = choose_weights("pretrained", _pulls(), {}, out, connect=lambda h, p: h == "github.com",
                             pull=pytest_fail, pull_available=lambda: True)
    assert weights == "demo"
    assert out.getvalue() == f"Pretrained weights: huggingface.co:443 not reachable; {FALLBACK}"


def test_a_failed_pull_offline_mode_or_no_pull_command_start_on_demo():
    from svc.quickstart import choose_weights

    out = io.StringIO()
    assert choose_weights("pretrained", _pulls(), {}, out, connect=lambda h, p: True, pull=lambda specs: 3,
                          pull_available=lambda: True) == "demo"
    assert out.getvalue().splitlines()[-1] + "\n" == f"Pretrained weights: svcctl weights pull exited with 3; {FALLBACK}"
    out = io.StringIO()
    assert choose_weights("pretrained", _pulls(), {"HF_HUB_OFFLINE": "1"}, out, connect=pytest_fail,
                          pull=pytest_fail, pull_available=lambda: True) == "demo"
    assert out.getvalue() == f"Pretrained weights: HF_HUB_OFFLINE is set; {FALLBACK}"
    out = io.StringIO()
    assert choose_weights("pretrained", _pulls(), {}, out, connect=pytest_fail, pull=pytest_fail,
                          pull_available=lambda: False) == "demo"
    assert out.getvalue() == ("Pretrained weights: svcctl weights pull is not available in this installation; "
                              + FALLBACK)


def test_on_this_machine_the_hub_is_not_reachable_and_demo_it_is():
    """No internet here: the real connection attempt fails (DNS or connect) and the service starts on demo."""
    from svc.quickstart import choose_weights

    out = io.StringIO()
    weights = choose_weights("pretrained", _pulls()[:2], {"HF_ENDPOINT": "http://127.0.0.1:9"}, out,
                             pull=pytest_fail, pull_available=lambda: True)
    assert (weights, out.getvalue()) == ("demo", f"Pretrained weights: 127.0.0.1:9 not reachable; {FALLBACK}")


def status(*servers, gateway_ready=True):
    return {"profile": "cpu", "device": "cpu", "gateway": {"id": "__gateway", "state": "running", "ready": gateway_ready},
            "servers": [{"id": i, "state": state, "ready": ready, "last_error": err} for i, state, ready, err in servers]}


def test_the_next_steps_block_after_the_first_run_shows_the_key_and_what_to_run():
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


def test_the_block_waits_until_every_child_has_settled():
    assert not settled(status(("MOBILENETV2", "starting", False, None)))
    assert not settled(status(("MOBILENETV2", "running", False, None)))  # loading, not ready yet
    assert not settled(status(("MOBILENETV2", "backoff", False, "exit 1")))
    assert not settled(status(("MOBILENETV2", "running", True, None), gateway_ready=False))
    assert settled(status(("MOBILENETV2", "running", True, None), ("DDPM", "failed", False, "crash loop")))


def test_service_addresses_come_from_the_service_config(tmp_path):
    assert service_addresses(str(tmp_path)) == ("http://127.0.0.1:8787/", "http://127.0.0.1:8080")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text("[gateway]\nport = 18080\n[supervisor]\nport = 18787\n")
    assert service_addresses(str(tmp_path)) == ("http://127.0.0.1:18787/", "http://127.0.0.1:18080")
