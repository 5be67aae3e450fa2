"""Each process raises its open-file limit to the hard one, and says when its connections may not fit.

A soft limit of 1024 (systemd's and most shells' default) sat below what the
gateway's ``max_connections`` (1024) admits at two descriptors per proxied
request: past it, connections were closed with no reply and the gateway's own
upstream sockets failed (svc.infra.process.open_file_limit).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.gateway import GATEWAY_TOKENS, LISTENING, gateway_args
from tests.support.processes import Proc, child_env, free_port, spawn, wait_bound_port, write_config

WARNING = re.compile(r"gateway\.max_connections admits about 2048 open connections, and this process may open "
                     r"(\d+) files")


def open_files(pid: int) -> tuple[int, int]:
    """The soft and hard ``Max open files`` of process ``pid``."""
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


@pytest.mark.parametrize(("limits", "soft", "warned"), [("64:8192", 8192, False), ("512:512", 512, True)])
def test_the_gateway_raises_its_soft_limit_to_the_hard_one(tmp_path, limits, soft, warned):
    servers = tmp_path / "server"
    servers.mkdir()
    write_config(servers, "TESTFAULTS", name="TESTFAULTS.toml", port=free_port())
    config = tmp_path / "service.toml"
    config.write_text(f'[gateway]\nkeys_file = "{tmp_path / "none.toml"}"\nservers_dir = "{servers}"\n')
    popen, log = spawn(["prlimit", f"--nofile={limits}", "--", *gateway_args("--config", str(config), "--port", "0")],
                       env=child_env(GATEWAY_TOKENS))
    proc = Proc(popen, 0, log)
    try:
        wait_bound_port(proc, 60, LISTENING)
        assert open_files(popen.pid) == (soft, int(limits.split(":")[1]))
        found = WARNING.search(proc.output())
        assert (found is not None) == warned, proc.output()[-2000:]
        if warned:
            assert found.group(1) == "512" and "raise the limit (LimitNOFILE= in a systemd unit)" in proc.output()
    finally:
        proc.stop()
