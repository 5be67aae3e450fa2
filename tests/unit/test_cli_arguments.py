"""svcctl's arguments and variables that no request can carry: refused in one line, exit 2, before anything is sent.

Each case came from a black-box probe of svcctl, where it ended in a traceback or sent (or echoed) what it should not.
"""

from __future__ import annotations

import pytest

from svc import cli
from tests.unit.test_cli import GATEWAY, fake_client, svcctl


@pytest.mark.parametrize("argv, line", [
    (["infer", "MOBILE\udcff", "red.jpg"], "svcctl: MODEL MOBILE\\xff is not valid UTF-8 (nothing sent)\n"),
    (["jobs", "get", "DDPM", "job_\udcff"], "svcctl: JOB job_\\xff is not valid UTF-8 (nothing sent)\n"),
    (["jobs", "run", "D\udcc3\udca9\udcff"], "svcctl: MODEL D\\xc3\\xa9\\xff is not valid UTF-8 (nothing sent)\n"),
], ids=["infer", "jobs get", "jobs run"])
def test_a_model_or_job_that_is_not_utf8_is_one_line_and_exit_2(argv, line):
    """``svcctl infer $'MOBILE\\xff' red.jpg`` ended in a UnicodeEncodeError traceback, exit 1 (a process: the
    shell's bytes reach Python as surrogates)."""
    done = svcctl(*argv, "--gateway", "http://127.0.0.1:9")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line)


@pytest.mark.parametrize("value", ["\udce9t\udce9", "\u00e9t\u00e9", "a\x01b"], ids=["latin-1", "utf-8", "control"])
def test_a_token_no_header_carries_is_refused_naming_the_variable_not_the_value(monkeypatch, capsys, value):
    """``SERVICE_API_TOKEN=$'\\xe9t\\xe9'`` printed ``svcctl: POST ...: UnicodeEncodeError: ...`` once connected."""
    gateway = fake_client(monkeypatch)
    monkeypatch.setenv("SERVICE_API_TOKEN", value)
    assert cli.main(["jobs", "get", "M", "job_1", "--gateway", GATEWAY], client=gateway) == 2
    assert capsys.readouterr() == ("", "svcctl: SERVICE_API_TOKEN holds a character outside printable ASCII, which "
                                       "no bearer token carries (its value is not shown; nothing sent)\n")
    assert gateway.requests == []


def test_a_token_read_with_its_newline_is_still_sent(monkeypatch, capsys):
    gateway = fake_client(monkeypatch)
    monkeypatch.setenv("SERVICE_API_TOKEN", "tok-1\n")
    assert cli.main(["jobs", "get", "M", "job_1", "--gateway", GATEWAY], client=gateway) == 0
    assert [r.token for r in gateway.requests] == ["tok-1\n"]
