"""``service-model --weights``: the supervisor's profile choice overriding ``[model] weights``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from twisted.logger import capturedLogs
from twisted.python import usage

from models.diffusion import ddpm
from svc.model.api import find_factory, model_config
from svc.modelserver.tap import Options, weights_override

SHIPPED = Path(__file__).resolve().parents[2] / "conf" / "server"


@pytest.mark.parametrize("value", ["demo", "pretrained", "pretrained:cifar10-32"])
def test_the_accepted_values(value):
    options = Options()
    options.parseOptions(["--server", "x.toml", "--weights", value])
    assert options["weights"] == value


@pytest.mark.parametrize("value", ["random", "pretrainedx", "file.pth"])
def test_other_values_are_refused(value):
    with pytest.raises(usage.UsageError, match="--weights must be demo, pretrained or pretrained:VARIANT"):
        Options().parseOptions(["--server", "x.toml", "--weights", value])


def test_demo_is_random_init_and_pretrained_is_passed_on():
    assert weights_override(ddpm, "demo") == "random"
    assert weights_override(ddpm, "pretrained") == "pretrained"
    assert weights_override(ddpm, "pretrained:celebahq-256") == "pretrained:celebahq-256"


class NoVariants:
    catalog_id = "PLAIN"


def test_a_model_without_variants_stays_on_demo_and_says_so():
    with capturedLogs() as events:
        assert weights_override(NoVariants(), "pretrained") == "random"
    assert [e["log_format"].format(**e) for e in events] == [
        "PLAIN: no pretrained variants are declared for this model: demo weights (random init)"]


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.toml")), ids=lambda p: p.stem)
def test_each_shipped_config_runs_its_default_variant_under_the_pretrained_profile(path):
    """``--weights pretrained`` (bin/quickstart's, a profile's) on a shipped config as it is: no key it sets may
    conflict with the default variant's (SAM_AMG's ``arch = "tiny"`` did, so a pulled sam_vit_b never started)."""
    table = tomllib.loads(path.read_text())
    factory = find_factory(table["id"])
    model = {**table.get("model", {}), "weights": weights_override(factory, "pretrained")}
    config = model_config(factory, model, str(path), files=False)
    default = next((v for v in factory.variants if v.default), None) if factory.variants else None
    if default is None:
        assert model["weights"] == "random"
    else:
        assert config["version"] == default.name
        assert {k: config[k] for k in default.model} == default.model
