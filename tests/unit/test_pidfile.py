"""Our twistd programs do not share twistd's default pidfile or log file (svc.infra.process.own_pidfile)."""

import pytest
from twisted.scripts.twistd import ServerOptions

from svc.infra.twistd import TWISTD_DEFAULT_PIDFILE


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


def test_as_a_daemon_each_program_has_its_own_log_file_and_it_is_the_owners_only(tmp_path, monkeypatch):
    """Two daemons of one folder shared twistd.log, each writing at its own offset (lines overwritten, a
    rotation followed by one only), and it was 0644 with the access lines' job ids in it."""
    import os
    import stat

    from svc.infra.twistd import private_daemon_log

    monkeypatch.chdir(tmp_path)
    gateway = parsed("service-gateway")
    assert gateway["logfile"].endswith("/twistd-service-gateway.log")
    assert parsed("service-supervisor")["logfile"].endswith("/twistd-service-supervisor.log")
    assert parsed("service-model", "--server", "conf/server/DDPM.toml")["logfile"].endswith(
        "/twistd-service-model-DDPM.log")
    assert parsed("--logfile", "mine.log", "service-gateway")["logfile"] == "mine.log"  # an explicit one is kept
    assert parsed("-n", "service-gateway")["logfile"] is None  # the foreground writes to stdout
    old = os.umask(0o022)
    try:
        private_daemon_log(gateway.subOptions)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "twistd-service-gateway.log").st_mode) == 0o600


@pytest.mark.parametrize("argv, ignored", [((), True), (("-n", "--logfile", "fg.log"), True), (("-n",), False)],
                         ids=["daemon", "foreground-logfile", "foreground-stdout"])
def test_sigusr1_does_not_rotate_twistds_own_log(tmp_path, monkeypatch, argv, ignored):
    """twistd makes SIGUSR1 rotate the log file it writes where the signal still has its default action when
    it opens the file, which it does after makeService (private_daemon_log): ``twistd service-supervisor``
    renamed its log to ``.1`` on logrotate's usual signal, which docs/operations.md says every process ignores.
    Writing to stdout, twistd installs nothing: the default stays until the reactor runs
    (svc.infra.process.exit_zero_on_signals ignores it then)."""
    import signal

    from twisted.scripts._twistd_unix import UnixAppLogger

    from svc.infra.twistd import private_daemon_log

    monkeypatch.chdir(tmp_path)
    previous = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        options = parsed(*argv, "service-gateway")
        private_daemon_log(options.subOptions)
        UnixAppLogger(options)._getLogObserver()  # what twistd does as it starts its log, after makeService
        installed = signal.getsignal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert installed == (signal.SIG_IGN if ignored else signal.SIG_DFL)


@pytest.mark.parametrize("named, removed", [("own", True), ("other", False), ("garbage", False), ("empty", False)])
def test_an_exit_past_twistd_removes_only_its_own_pidfile(tmp_path, monkeypatch, named, removed):
    """svc.infra.twistd.remove_own_pidfile (a daemon's exit through os._exit, which twistd's own removal never sees):
    a file naming another pid (a second daemon's, written after ours) or anything else is left alone."""
    import os

    from svc.infra import twistd

    pidfile = tmp_path / "d.pid"
    pidfile.write_text({"own": f"{os.getpid()}\n", "other": f"{os.getpid() + 1}\n", "garbage": "x\n", "empty": ""}[named])
    monkeypatch.setattr(twistd, "_launcher", {"pidfile": str(pidfile)})
    twistd.remove_own_pidfile()
    assert pidfile.exists() is not removed
    monkeypatch.setattr(twistd, "_launcher", None)  # under twist, or twistd -n without --pidfile: nothing to do
    twistd.remove_own_pidfile()
