"""First-run secrets of bin/quickstart."""

import hashlib
import io
import os
import stat

from svc.quickstart import KEY_FILE, SECRETS, prepare, read_env_file


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
    assert f'hash = "{digest}"' in key_path.read_text()
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
