"""svcctl's arguments and variables that no request can carry: refused in one line, exit 2, before anything is sent.

Each case came from a black-box probe of svcctl, where it ended in a traceback or sent (or echoed) what it should not.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from svc import cli
from svc.cli import commands
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


@pytest.mark.parametrize("argv, line", [
    (["jobs", "get", "DDPM", ""], "svcctl: JOB is empty (nothing sent)\n"),
    (["jobs", "wait", "DDPM", " "], "svcctl: JOB is empty (nothing sent)\n"),
    (["infer", "", "red.jpg"], "svcctl: MODEL is empty (nothing sent)\n"),
], ids=["jobs get", "jobs wait", "infer"])
def test_an_empty_model_or_job_is_one_line_and_exit_2(argv, line):
    """``svcctl jobs get DDPM ""`` (an unset ``$JOB``) sent ``GET /v1/models/DDPM/jobs/`` and printed the
    gateway's 404 "no route", exit 1, as if the service had no such route (a jobs probe)."""
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


@pytest.fixture
def small_limit(monkeypatch, tmp_path):
    """This folder's gateway takes 2048 bytes of base64 at most (1536 bytes of image)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text("[gateway]\nmax_body_bytes = 2048\n")


@contextmanager
def pipe_holding(data: bytes) -> Iterator[str]:
    """A pipe that holds ``data`` and whose writer is gone, by its path (as ``/dev/stdin`` or ``<(cat x)`` name one)."""
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    try:
        yield f"/dev/fd/{read}"
    finally:
        os.close(read)


def test_an_image_from_a_pipe_is_read_up_to_the_limit_and_refused_past_it(monkeypatch, capsys, small_limit):
    """``head -c 100000000 /dev/urandom | svcctl infer M /dev/stdin`` read 100 MB, then met the gateway's 413 (and
    ``/dev/zero`` grew to a MemoryError): a pipe's size is known once read, so it is read up to the limit + 1 byte."""
    gateway = fake_client(monkeypatch)
    with pipe_holding(b"x" * 1537) as path:
        assert cli.main(["infer", "M", path, "--gateway", GATEWAY], client=gateway) == 2
    assert capsys.readouterr() == ("", "svcctl: the images are at least 2052 bytes as base64, more than the gateway "
                                       "takes in one request (max_body_bytes 2048; it would answer 413): send fewer "
                                       "or smaller images\n")
    assert gateway.requests == []
    with pipe_holding(b"x" * 1536) as path:  # 2048 bytes as base64: all it takes
        assert cli.main(["infer", "M", path, "--gateway", GATEWAY], client=gateway) == 0
    assert json.loads(gateway.requests[0].body) == {"images": [base64.b64encode(b"x" * 1536).decode()]}


def test_a_device_is_read_up_to_the_limit_left_by_the_files(monkeypatch, capsys, small_limit, tmp_path):
    gateway = fake_client(monkeypatch)
    image = tmp_path / "a.jpg"
    image.write_bytes(b"x" * 1500)  # 2000 bytes as base64: 36 bytes left
    assert cli.main(["infer", "M", str(image), "/dev/zero", "--gateway", GATEWAY], client=gateway) == 2
    assert capsys.readouterr().err.startswith("svcctl: the images are at least 2052 bytes as base64, more than")
    assert gateway.requests == []


@pytest.mark.parametrize("command", [["infer"], ["jobs", "submit"], ["jobs", "run"]])
def test_a_fifo_that_no_one_writes_ends_at_the_timeout(monkeypatch, capsys, tmp_path, command):
    """``svcctl infer M fifo`` waited forever for a writer, whatever ``--timeout-s`` said; ``jobs run`` then
    waited 300 s (its read did not get ``--timeout-s``)."""
    gateway = fake_client(monkeypatch)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert cli.main([*command, "M", str(fifo), "--gateway", GATEWAY, "--timeout-s", "0.2"], client=gateway) == 2
    assert capsys.readouterr() == ("", f"svcctl: cannot read image {fifo}: it did not all come within 0.2 s "
                                       "(--timeout-s; nothing sent)\n")
    assert gateway.requests == []


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


def test_no_parser_of_svcctl_takes_an_abbreviated_option():
    every = list(parsers(commands.build_parser()))
    assert len(every) > 20  # keys add, jobs wait, weights pull, ...: all of them
    assert [p.prog for p in every if p.allow_abbrev] == []


@pytest.mark.parametrize("argv", [["infer", "M", "red.jpg", "--token", "s3cr3t"],
                                  ["jobs", "get", "M", "job_1", "--token=s3cr3t"],
                                  ["keys", "list", "--token", "s3cr3t"]], ids=["infer", "jobs get", "keys list"])
def test_a_token_flag_is_refused_in_one_line_that_never_shows_it(argv):
    """``--token s3cr3t`` was taken as ``--token-env`` (a prefix) and the secret echoed:
    ``svcctl: no token: s3cr3t is not set (named by --token-env)``."""
    done = svcctl(*argv, "--gateway", "http://127.0.0.1:9")
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "svcctl: there is no --token flag (a token on the command line shows in the process list; its value "
               "is not shown): set SERVICE_API_TOKEN, SERVICE_API_KEY, SERVICE_GATEWAY_AUTH_TOKEN, or name another "
               "variable with --token-env\n")


@pytest.mark.parametrize("argv, usage, said", [
    (["jobs", "get", "M", "job_1", "--gateway", GATEWAY, "--timeout", "5"], "svcctl jobs get",
     "--timeout ... (options are taken by their whole name: did you mean --timeout-s?)"),
    (["keys", "list", "--keys", "k.toml"], "svcctl keys list",
     "--keys ... (options are taken by their whole name: did you mean --keys-file?)"),
    (["jobs", "run", "DDPM", "--poll", "500"], "svcctl jobs run",
     "--poll ... (options are taken by their whole name: did you mean --poll-ms?)"),
    (["infer", "M", "a.jpg", "--json"], "svcctl infer", "--json"),
])
def test_a_prefix_of_an_option_is_not_taken_and_the_whole_name_is_said(capsys, argv, usage, said):
    """An upgrade probe: prefixes that 0.13.0 took (``--keys``, ``--timeout``, ``--poll``) were refused with the top
    level's usage and no word of the whole name.  The subcommand's usage, and the whole names the prefix begins."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {usage} [-h]") and err.endswith(f"{usage}: error: unrecognized arguments: {said}\n")


@pytest.mark.parametrize("argv, images", [
    (["jobs", "run", "DDIM", "--param", "timesteps=2", "a.png"], ["a.png"]),
    (["jobs", "run", "DDIM", "a.png", "--out", "d", "b.png", "c.png"], ["a.png", "b.png", "c.png"]),
    (["jobs", "run", "DDIM", "--poll-ms", "500"], []),
    (["jobs", "run", "--gateway", "http://g", "DDIM", "--param", "t=5", "--", "a.png"], ["a.png"]),
    (["jobs", "run", "DDIM", "--param", "t=5", "a.png", "--", "-b.png"], ["a.png", "-b.png"]),
    (["infer", "M", "--param", "k=1", "a.png", "b.png"], ["a.png", "b.png"]),
], ids=["jobs run after an option", "jobs run around options", "jobs run none", "jobs run --", "jobs run -- -b",
        "infer after an option"])
def test_images_after_the_options_are_the_commands_images(argv, images):
    """``svcctl jobs run DDIM --param timesteps=2 x.png`` was refused, "unrecognized arguments: x.png", exit 2,
    where ``infer`` and ``jobs submit`` take images after their options (argparse gave ``jobs run``'s optional
    IMAGE... its empty share at MODEL; diffusion probe)."""
    assert commands.build_parser().parse_args(argv).images == images


@pytest.mark.parametrize("argv, shown", [
    (["infer", "M", "red.jpg", "--tok", "SECRETX"], "--tok ..."),
    (["infer", "M", "red.jpg", "--toke=SECRETX"], "--toke=..."),
    (["jobs", "get", "M", "job_1", "--tokn", "SECRETX", "extra"], "--tokn ... extra"),
    (["hash", "a", "b"], "b"),
    # Before the command (an operator probe): the value was taken as the command, "invalid choice: 'SECRETX'".
    (["--tok", "SECRETX", "keys", "list"], "--tok ... (options go after the command: svcctl COMMAND [options])"),
    (["--gateway=SECRETX", "keys", "list"], "--gateway=... (options go after the command: svcctl COMMAND [options])"),
    (["--version", "--foo", "SECRETX"], "--version --foo ... (options go after the command: svcctl COMMAND [options])"),
])
def test_an_unknown_options_value_is_not_shown(capsys, argv, shown):
    """``--tok SECRET``, a token mistyped for the refused ``--token``: argparse echoed
    ``unrecognized arguments: --tok SECRET``; an argument that follows no option is still shown."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "SECRETX" not in err
    assert re.search(rf"^svcctl[a-z ]*: error: unrecognized arguments: {re.escape(shown)}( \(options .*\))?\n\Z",
                     err, re.M), err


def test_a_token_env_that_is_no_variable_name_is_not_shown(monkeypatch, capsys):
    gateway = fake_client(monkeypatch)
    assert cli.main(["jobs", "get", "M", "job_1", "--gateway", GATEWAY, "--token-env", "s3cr3t-!"],
                    client=gateway) == 2
    assert capsys.readouterr() == ("", "svcctl: --token-env takes the name of a variable (letters, digits and '_'), "
                                       "and what it was given is not one (not shown: it may be a token)\n")
    assert gateway.requests == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:22080?x=1", "http://127.0.0.1:22080/#top", "http://gw.test?"])
def test_a_gateway_url_with_a_query_or_fragment_is_refused(monkeypatch, capsys, url):
    """``--gateway 'http://127.0.0.1:22080?x=1'`` sent its requests to ``...22080?x=1/v1/models/...``."""
    gateway = fake_client(monkeypatch)
    assert cli.main(["jobs", "get", "M", "job_1", "--gateway", url], client=gateway) == 2
    assert capsys.readouterr() == ("", "svcctl: --gateway must be an http:// or https:// URL without a query or "
                                       f"fragment (a path is kept, as a prefix of the routes), got {url!r}\n")
    assert gateway.requests == []


def test_a_supervisor_url_with_a_query_is_refused_naming_the_variable(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SERVICE_SUPERVISOR_URL", "http://127.0.0.1:8787?x=1")
    monkeypatch.setenv("SERVICE_API_TOKEN", "management")
    keys = tmp_path / "keys.toml"
    assert cli.main(["keys", "add", "bob", "--keys-file", str(keys)], client=fake_client(monkeypatch)) == 2
    assert capsys.readouterr() == ("", "svcctl: SERVICE_SUPERVISOR_URL (the default of --supervisor) must be an "
                                       "http:// or https:// URL without a query or fragment (a path is kept, as a "
                                       "prefix of the routes), got 'http://127.0.0.1:8787?x=1'\n")
    assert not keys.exists()


def test_a_gateway_url_with_a_path_keeps_it_as_a_prefix(monkeypatch):
    gateway = fake_client(monkeypatch)
    assert cli.main(["jobs", "get", "M", "job_1", "--gateway", "http://proxy.test/svc/"], client=gateway) == 0
    assert [r.url for r in gateway.requests] == ["http://proxy.test/svc/v1/models/M/jobs/job_1"]


def test_svcctl_without_a_command_is_a_usage_error_on_stderr(capsys):
    """A CLI probe: its help went to stdout with exit 2, so ``svcctl | cmd`` fed the help to ``cmd``."""
    assert cli.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: svcctl [-h] [--version] COMMAND ...") and "keys" in err
