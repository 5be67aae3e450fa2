"""Job progress end to end: a real DDPM model server behind a real gateway, polled while it samples."""

from __future__ import annotations

import re
import time

import pytest

from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.http import get, post
from tests.support.processes import free_port, start_model_server, write_config
from tests.support.zoo import IGNORED_IMAGE

UPSTREAM_TOKEN = "upstream-secret"
STEPS = 100  # about 20 ms a step for this UNet on one core: a few seconds of sampling to poll
#: A small random-init DDPM (16x16 RGB): the shipped config with a smaller UNet.
MODEL = {"weights": "random", "sample_size": 16, "block_out_channels": [16, 32]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    servers = root / "server"
    servers.mkdir()
    config = write_config(servers, "DDPM", name="DDPM.toml", port=free_port(), model=MODEL)
    port = int(re.search(r"^port = (\d+)", config.read_text(), re.M).group(1))
    server = start_model_server(config, token=UPSTREAM_TOKEN, port=port)
    gateway = start_gateway(root, servers, None, env={"SERVICE_UPSTREAM_TOKEN": UPSTREAM_TOKEN})
    yield {"gateway": gateway, "server": server}
    gateway.stop()
    server.stop()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {GATEWAY_TOKENS['SERVICE_GATEWAY_AUTH_TOKEN']}"}


def test_polling_a_sampling_job_shows_increasing_steps_and_the_done_job_the_last_step(stack):
    base = stack["gateway"].url + "/v1/models/DDPM"
    submitted = post(base + "/jobs", {"images": [IGNORED_IMAGE], "params": {"timesteps": STEPS, "seed": 7}},
                     headers=auth())
    assert submitted.status == 202, submitted.body[:300]
    poll_url = submitted.json["poll_url"]
    assert poll_url.startswith("/v1/models/DDPM/jobs/")
    polls = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        reply = get(stack["gateway"].url + poll_url, headers=auth())
        assert reply.status == 200, reply.body[:300]
        polls.append(reply.json)
        if reply.json["state"] in ("done", "failed", "timeout"):
            break
        time.sleep(0.02)
    final = polls[-1]
    assert final["state"] == "done", final
    assert final["progress"] == {"step": STEPS, "steps": STEPS}
    assert final["poll_url"] == poll_url  # the gateway rewrote only the URLs; progress passed through
    running = [p["progress"] for p in polls if p["state"] == "running" and p["progress"] is not None]
    assert all(p["steps"] == STEPS and 1 <= p["step"] <= STEPS for p in running)
    steps = [p["step"] for p in running]
    assert steps == sorted(steps)  # never goes back
    assert len({s for s in steps if s < STEPS}) >= 2, polls  # seen moving while it sampled
    assert all(p["progress"] is None for p in polls if p["state"] == "pending")

    waited = get(stack["gateway"].url + poll_url + "/wait?timeout=0", headers=auth()).json
    assert waited["state"] == "done" and waited["progress"] == {"step": STEPS, "steps": STEPS}
