"""Default step counts of the shipped diffusion configs (docs/contract.md, Requests: absent timesteps = the configured schedule length)."""

import tomllib

import pytest

from svc.model.api import find_factory, model_config


def shipped(model_id: str, **overrides) -> tuple:
    path = f"conf/server/{model_id}.toml"
    with open(path, "rb") as f:
        table = {**tomllib.load(f)["model"], **overrides}
    factory = find_factory(model_id)
    return factory, model_config(factory, table, path)


def timesteps_schema(model_id: str, **overrides) -> dict:
    factory, config = shipped(model_id, **overrides)
    return factory.params_schema(config)["properties"]["timesteps"]


@pytest.mark.parametrize("model_id", ["DDIM", "CLS_COND_DDIM", "LDM"])
def test_ddim_based_models_default_to_50_of_1000_steps(model_id):
    schema = timesteps_schema(model_id)
    assert (schema["default"], schema["minimum"], schema["maximum"]) == (50, 1, 1000)


def test_ddpm_samples_its_whole_schedule_by_default():
    factory, config = shipped("DDPM")
    assert "timesteps" not in config
    schema = factory.params_schema(config)["properties"]["timesteps"]
    assert (schema["default"], schema["maximum"]) == (1000, 1000)


def test_the_configured_steps_are_capped_at_the_schedule_length():
    assert timesteps_schema("DDIM", num_train_timesteps=20)["default"] == 20
    assert timesteps_schema("DDPM", timesteps=200)["default"] == 200
