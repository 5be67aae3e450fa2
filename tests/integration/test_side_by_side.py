"""A model server and a gateway started by hand with ``twistd -n`` from one folder run side by side.

Both used to write ``twistd.pid`` in the current directory, so the second
exited 1 with "Another twistd server is running".  The model is the test-only
TESTFAULTS (a real torch model, ready in a third of MOBILENETV2's start): what
is checked is the two programs, not the model.
"""

import base64
import io
import signal
import sys
from pathlib import Path

from PIL import Image

from tests.support.http import post
from tests.support.processes import Proc, child_env, free_port, spawn, wait_ready, write_config

TWISTD = str(Path(sys.executable).parent / "twistd")


def test_model_server_and_gateway_by_hand_from_one_folder(tmp_path):
    servers = tmp_path / "conf" / "server"
    servers.mkdir(parents=True)
    model_port, gateway_port = free_port(), free_port()
    write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=model_port)
    (tmp_path / "conf" / "service.toml").write_text(f'[gateway]\nport = {gateway_port}\n')
    env = child_env({"SERVICE_AUTH_TOKEN": "model-token", "SERVICE_UPSTREAM_TOKEN": "model-token",
                     "SERVICE_GATEWAY_AUTH_TOKEN": "inference-token", "SERVICE_METRICS_TOKEN": "metrics-token"})
    popen, log = spawn([TWISTD, "-n", "service-model", "--server", "conf/server/TESTFAULTS.toml"], env=env,
                       cwd=tmp_path, log_dir=tmp_path)
    model = Proc(popen, model_port, log, "model-token")
    popen, log = spawn([TWISTD, "-n", "service-gateway"], env=env, cwd=tmp_path, log_dir=tmp_path)
    gateway = Proc(popen, gateway_port, log)
    try:
        wait_ready(gateway, 60, path="/healthz")
        wait_ready(model, 120)
        assert not (tmp_path / "twistd.pid").exists()
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), (200, 120, 40)).save(buf, "JPEG")
        reply = post(f"{gateway.url}/v1/models/TESTFAULTS/infer",
                     {"images": [base64.b64encode(buf.getvalue()).decode()]},
                     headers={"Authorization": "Bearer inference-token"})
        assert reply.status == 200 and reply.json["status"] == 0, reply.body
        assert model.alive() and gateway.alive()
    finally:
        codes = (gateway.stop(signal.SIGTERM), model.stop(signal.SIGTERM))
    assert codes == (0, 0), gateway.output() + model.output()
