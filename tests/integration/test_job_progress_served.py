"""Job progress end to end: a real DDPM model server behind a real gateway, polled while it samples."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from PIL import Image

from svc.cli import http as cli_http
from svc.cli.args import TOKEN_ENVS
from svc.cli.gateway import GATEWAY_ENV
from tests.support.gateway import GATEWAY_TOKENS, start_gateway
from tests.support.http import get, post
from tests.support.processes import REPO, free_port, start_model_server, wait_until, write_config
from tests.support.zoo import IGNORED_IMAGE

UPSTREAM_TOKEN = "upstream-secret"
CALIBRATION_STEPS = 30  # a first job times this UNet's steps on the machine running the suite
SAMPLING_MS = 800  # the measured job samples about this long: several 100 ms progress reports to poll
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


def sample(stack, steps: int) -> tuple[str, list[dict]]:
    """Submit a DDPM job of ``steps`` steps, poll it every 20 ms until it ends: its poll URL and every status."""
    base = stack["gateway"].url + "/v1/models/DDPM"
    submitted = post(base + "/jobs", {"images": [IGNORED_IMAGE], "params": {"timesteps": steps, "seed": 7}},
                     headers=auth())
    assert submitted.status == 202, submitted.body[:300]
    poll_url = submitted.json["poll_url"]
    assert poll_url.startswith("/v1/models/DDPM/jobs/")
    polls = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        reply = get(stack["gateway"].url + poll_url, headers=auth())
        assert reply.status == 200, reply.body[:300]
        polls.append(reply.json)
        if reply.json["state"] in ("done", "failed", "timeout"):
            break
        time.sleep(0.02)
    return poll_url, polls


def steps_for_sampling_time(stack) -> int:
    """How many steps sample for about SAMPLING_MS here: a step costs 3 ms on a fast machine, 20 ms on a slow one."""
    started = time.monotonic()
    _, polls = sample(stack, CALIBRATION_STEPS)
    assert polls[-1]["state"] == "done", polls[-1]
    per_step_ms = (time.monotonic() - started) * 1000 / CALIBRATION_STEPS
    return max(CALIBRATION_STEPS, min(2000, math.ceil(SAMPLING_MS / per_step_ms)))


def test_polling_a_sampling_job_shows_increasing_steps_and_the_done_job_the_last_step(stack):
    steps_total = steps_for_sampling_time(stack)
    poll_url, polls = sample(stack, steps_total)
    final = polls[-1]
    assert final["state"] == "done", final
    assert final["progress"] == {"step": steps_total, "steps": steps_total}
    assert final["poll_url"] == poll_url  # the gateway rewrote only the URLs; progress passed through
    running = [p["progress"] for p in polls if p["state"] == "running" and p["progress"] is not None]
    assert all(p["steps"] == steps_total and 1 <= p["step"] <= steps_total for p in running)
    steps = [p["step"] for p in running]
    assert steps == sorted(steps)  # never goes back
    assert len({s for s in steps if s < steps_total}) >= 2, polls  # seen moving while it sampled
    assert all(p["progress"] is None for p in polls if p["state"] == "pending")

    waited = get(stack["gateway"].url + poll_url + "/wait?timeout=0", headers=auth()).json
    assert waited["state"] == "done" and waited["progress"] == {"step": steps_total, "steps": steps_total}


def test_svcctl_jobs_run_shows_the_bar_and_writes_the_sample_and_the_envelope(stack, tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in (*TOKEN_ENVS, GATEWAY_ENV)}
    env.update(PYTHONPATH=str(REPO), SERVICE_GATEWAY_AUTH_TOKEN=GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"])
    done = subprocess.run([sys.executable, "-m", "svc.cli", "jobs", "run", "DDPM", "--param", "timesteps=5",
                           "--param", "seed=3", "--req-id", "r1", "--out", str(out), "--poll-ms", "200",
                           "--gateway", stack["gateway"].url], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["status"] == 0 and envelope["task_id"] == "r1" and envelope["results"][0]["data"]["seed"] == 3
    assert sorted(p.name for p in out.iterdir()) == ["r1.json", "r1_0.png"]
    assert json.loads((out / "r1.json").read_text()) == envelope
    image = Image.open(out / "r1_0.png")
    assert (image.format, image.size) == ("PNG", (16, 16))
    assert (out / "r1_0.png").read_bytes() == base64.b64decode(envelope["results"][0]["data"]["image"])
    lines = done.stderr.splitlines()
    assert re.fullmatch(r"job_[0-9a-f]{42} pending", lines[0])
    assert re.fullmatch(r"job_[0-9a-f]{42} done \[#{30}\] 5/5", lines[-3])
    assert lines[-2] == f"svcctl: {cli_http.DEMO_NOTE}"  # the stack serves demo weights
    assert lines[-1] == f"svcctl: wrote 2 files under {out}"


def test_a_sampling_request_whose_client_went_away_stops_at_its_next_step(stack):
    """A soak probe: a synchronous DDPM run whose client closed its connection (499) sampled on to its deadline
    (120 s here) or its last step, holding a worker.  Through the gateway, the client gone mid-sampling: the model
    server stops the batch at its next step and says so (docs/api.md, "Work that nobody waits for stops")."""
    from bench.threadcpu import process_cpu_ms

    server = stack["server"]
    body = json.dumps({"images": [IGNORED_IMAGE], "params": {"timesteps": 1000, "seed": 1}}).encode()
    cpu_before = process_cpu_ms(server.popen.pid)
    with socket.create_connection(("127.0.0.1", stack["gateway"].port), timeout=10) as sock:
        sock.sendall(b"POST /v1/models/DDPM/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + GATEWAY_TOKENS["SERVICE_GATEWAY_AUTH_TOKEN"].encode()
                     + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        # Sampling: the model server has spent CPU on the run (a tiny body decodes in microseconds).
        wait_until(lambda: process_cpu_ms(server.popen.pid) - cpu_before >= 300, "the sampling started", 60)
    line = wait_until(lambda: re.search(r"a batch of 1 stopped: every item of the batch is past its deadline or its "
                                        r"client went away \(reported step (\d+) of 1000\)", server.output()),
                      "the model server stopped the batch of the client gone", 30)
    assert 1 <= int(line.group(1)) < 1000
    assert "POST /ddpm/predict 499 " in server.output(), server.output()[-2000:]  # its access line: client gone
