"""A converted model answers as eager does whichever of its forms a batch runs in (svc/optimize/runtime_calls.py).

OpenVINO compiles a model several times: the dynamic batch form, a form for
a batch of one on the stream a lone request takes, and a form for the
warm-up batch on the workers' streams.  A real MOBILENETV2 model server in
``openvino`` (float32: within about 1e-6 of eager) answers lone requests
and concurrent requests of the warm-up batch's size, and every score
matches what an eager server answered for the same image.
"""

from __future__ import annotations

import threading

import pytest

from tests.support.http import get
from tests.support.images import b64, image_bytes
from tests.support.processes import start_model_server, write_config
from tests.support.zoo import assert_ok, infer

URI = "/mobilenetv2/predict"
IMAGES = [b64(image_bytes(96, 64, "JPEG", seed=seed)) for seed in range(8)]
BATCH = 4


def scores(server, images: list[str]) -> list[list[float]]:
    return [data["scores"] for data in assert_ok(infer(server, URI, {"images": images, "params": {"top_k": 5}}),
                                                 len(images))]


def side_by_side(server, rounds: int = 3) -> list[tuple[list[str], list[list[float]]]]:
    """Two requests of the warm-up batch's size at once, ``rounds`` times: (images, their scores) per request."""
    replies: list[tuple[list[str], list[list[float]]]] = []

    def send(images: list[str]) -> None:
        replies.append((images, scores(server, images)))

    for _ in range(rounds):
        callers = [threading.Thread(target=send, args=(IMAGES[i:i + BATCH],)) for i in (0, BATCH)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
    return replies


def test_openvino_answers_as_eager_alone_and_in_batches_of_the_warm_up_size(tmp_path):
    lone: dict[str, dict[str, list[float]]] = {}
    busy: list[tuple[list[str], list[list[float]]]] = []
    for mode in ("eager", "openvino"):
        config = write_config(tmp_path, "MOBILENETV2", backend={"optimize": mode, "workers": 2},
                              max_batch_size=BATCH)
        server = start_model_server(config, env={"SERVICE_STATE_DIR": str(tmp_path / "state")}, ready_timeout=300)
        try:
            lone[mode] = {image: scores(server, [image])[0] for image in IMAGES}  # one client: batches of one
            if mode == "openvino":
                busy = side_by_side(server)
            output = server.output()
            metrics = get(server.url + "/metrics", headers=server.auth).body.decode()
            # The mode in use, where an operator (and the supervisor's web UI, through its series) reads it.
            assert f'service_model_info{{device="cpu",model="MOBILENETV2",optimize="{mode}",replica="0",' in metrics
        finally:
            assert server.stop() == 0
        assert f"optimize {mode}; warm-up batch of {BATCH}" in output
    for image in IMAGES:
        assert lone["openvino"][image] == pytest.approx(lone["eager"][image], abs=1e-4)
    assert len(busy) == 6
    for images, got in busy:
        for image, values in zip(images, got):
            assert values == pytest.approx(lone["eager"][image], abs=1e-4)
