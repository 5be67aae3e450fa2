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


def test_a_batch_larger_than_a_request_is_no_preferred_size():
    """Triton refuses a preferred batch size above max_batch_size (the rows of a request here): a server that
    batches 32 items of requests of at most 8 rows states its window only (a regression probe); its batch size is
    in the parameters the model server adds."""
    serving = Serving(max_rows=8, batch_size=32, batch_delay_ms=7, device="cpu", workers=3,
                      parameters={"batch_size": "32"})
    config = model_config("X", shape_of(GENERATION), serving)
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 7000}
    assert config["parameters"]["batch_size"] == {"string_value": "32"}
