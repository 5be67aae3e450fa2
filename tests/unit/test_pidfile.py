"""Our twistd programs do not share twistd's default pidfile (svc.infra.process.own_pidfile)."""

import pytest
from twisted.scripts.twistd import ServerOptions

from svc.infra.process import TWISTD_DEFAULT_PIDFILE


def parsed(*argv: str) -> ServerOptions:
    options = ServerOptions()
    options.parseOptions(list(argv))
    return options


@pytest.mark.parametrize("command", [
    ["service-model", "--server", "conf/server/MOBILENETV2.toml"],
    ["service-gateway"],
    ["service-supervisor"],
])
def test_in_the_foreground_no_pidfile_is_written(command):
    assert parsed("-n", *command)["pidfile"] == ""


def test_as_a_daemon_each_program_has_its_own_pidfile():
    model = parsed("service-model", "--server", "conf/server/MOBILENETV2.toml")["pidfile"]
    gateway = parsed("service-gateway")["pidfile"]
    supervisor = parsed("service-supervisor")["pidfile"]
    assert model.endswith("/twistd-service-model-MOBILENETV2.pid")
    assert gateway.endswith("/twistd-service-gateway.pid")
    assert supervisor.endswith("/twistd-service-supervisor.pid")


def test_an_explicit_pidfile_is_kept():
    assert parsed("-n", "--pidfile", "mine.pid", "service-gateway")["pidfile"].endswith("/mine.pid")
    assert parsed("-n", "--pidfile=", "service-gateway")["pidfile"] == ""


def test_a_plain_twistd_program_keeps_the_default():
    assert parsed("-n", "portforward")["pidfile"].endswith("/" + TWISTD_DEFAULT_PIDFILE)
