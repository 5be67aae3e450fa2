"""A model's configuration in Triton's shape (svc.contract.oip.model_config): the branches the shipped configs
served in tests/integration/test_gateway_oip.py do not take."""

from __future__ import annotations

from svc.contract.oip import GENERATION, Serving, model_config, shape_of


def test_without_batching_there_is_no_dynamic_batching_and_a_gpu_is_kind_gpu():
    serving = Serving(max_rows=3, batch_size=1, batch_delay_ms=0, device="gpu", workers=4,
                      parameters={"optimize": "fp16"})
    config = model_config("DDPM", shape_of(GENERATION), serving)
    assert config == {
        "name": "DDPM", "platform": "inference-service", "backend": "", "max_batch_size": 3,
        "input": [{"name": "IMAGE", "data_type": "TYPE_STRING", "format": "FORMAT_NONE", "dims": [1]}],
        "output": [{"name": "GENERATED", "data_type": "TYPE_STRING", "dims": []}],
        "instance_group": [{"name": "DDPM", "kind": "KIND_GPU", "count": 4}],
        "parameters": {"optimize": {"string_value": "fp16"}}}


def test_a_batching_server_states_its_batch_and_window():
    serving = Serving(max_rows=16, batch_size=2, batch_delay_ms=12, device="cpu", workers=1, parameters={})
    config = model_config("X", shape_of(GENERATION), serving)
    assert config["dynamic_batching"] == {"preferred_batch_size": [2], "max_queue_delay_microseconds": 12000}
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
