"""svcctl: the key tool and the gateway client in-process (an in-memory client on a fake clock), and the real
client as a process against real listeners: refused, silent and stalled."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from svc import version_line
from svc.auth import hash_key, load_key_file
from svc.cli import args as cli_args
from svc.cli import commands as cli
from svc.cli import gateway as cli_gateway
from svc.contract.protocol import http_url
from tests.support.fake_client import FakeClient, Reply

REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok-" + "5" * 60
ENVELOPE = {"status": 0, "status_str": "OK", "task_id": "r-1", "model": {"name": "M", "version": "1"},
            "results": [{"status": 0, "data": {"class_id": 3, "category": "cat", "scores": [0.9]}}]}
JOB = {"job_id": "job_1", "state": "pending", "poll_url": "/v1/models/M/jobs/job_1",
       "result_url": "/v1/models/M/jobs/job_1/result"}
CLEARED = (*cli_args.TOKEN_ENVS, cli_gateway.GATEWAY_ENV, "OTHER_TOKEN")


def start(*args: str, env: dict[str, str] | None = None, token: str | None = TOKEN,
          stdout: Any = subprocess.PIPE, entry: tuple[str, ...] = ("-m", "svc.cli")) -> subprocess.Popen:
    """Start ``python -m svc.cli`` as the console script would, with only the given credentials.

    SIGINT is reset to its default in the child, as a shell's foreground job
    has it: a process started in the background (a CI runner, ``cmd &``)
    inherits SIGINT ignored, and Python then installs no handler for it.
    ``stdout``: where the child writes (a pipe read here by default); ``entry``: how Python is told to run it.
    """
    full = {k: v for k, v in os.environ.items() if k not in CLEARED}
    full["PYTHONPATH"] = str(REPO)
    if token is not None:
        full["SERVICE_API_KEY"] = token
    full.update(env or {})
    return subprocess.Popen([sys.executable, *entry, *args], env=full, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def svcctl(*args: str, env: dict[str, str] | None = None, token: str | None = TOKEN,
           stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    """Run svcctl as a process and wait for it (several at once: start them, then finish each)."""
    return finish(start(*args, env=env, token=token, stdout=stdout))


GATEWAY = "http://gw.test:8080"


def fake_client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    """The in-memory client; the token in SERVICE_API_KEY, no other credential or gateway URL set."""
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SERVICE_API_KEY", TOKEN)
    return FakeClient()


@pytest.fixture
def gateway(monkeypatch):
    return fake_client(monkeypatch)


def run(client: FakeClient, *argv: str) -> int:
    """svcctl in-process with the in-memory client."""
    return cli.main(list(argv), client=client)


@pytest.fixture
def images(tmp_path):
    one, two = tmp_path / "one.jpg", tmp_path / "two.png"
    one.write_bytes(b"\xff\xd8\xff\xe0 fake jpeg \x00\x01")
    two.write_bytes(bytes(range(256)))
    return one, two


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- keygen, hash, version


def test_keygen_prints_the_key_once_and_an_entry_whose_hash_matches(capsys):
    assert cli.main(["keygen", "web"]) == 0
    out, err = capsys.readouterr()
    first, blank, *entry = out.split("\n")
    key = first.removeprefix("key: ")
    assert first == f"key: {key}" and re.fullmatch(r"[0-9a-f]{64}", key)
    assert blank == ""
    assert "\n".join(entry) == (f'[keys.web]\nhash = "{hash_key(key)}"\nscope = "inference"\n'
                                "rate_limit_qps = 0\nenabled = true\n")
    parsed = tomlkit.parse("\n".join(entry)).unwrap()
    assert parsed == {"keys": {"web": {"hash": hash_key(key), "scope": "inference", "rate_limit_qps": 0,
                                       "enabled": True}}}
    assert "shown once" in err and "conf/api_keys.toml" in err
    assert "POST /api/v1/servers/__gateway/restart" in err
    assert key not in err


def test_keygen_scope_and_qps_load_with_the_gateway_key_loader(capsys, tmp_path):
    assert cli.main(["keygen", "batch-1", "--scope", "all", "--qps", "25"]) == 0
    out = capsys.readouterr().out
    key = out.split("\n")[0].removeprefix("key: ")
    entry = out.split("\n", 2)[2]
    assert entry == f'[keys.batch-1]\nhash = "{hash_key(key)}"\nscope = "all"\nrate_limit_qps = 25\nenabled = true\n'
    path = tmp_path / "api_keys.toml"
    path.write_text(entry)
    [loaded] = load_key_file(str(path))
    assert (loaded.name, loaded.hash, loaded.scope, loaded.rate_limit_qps, loaded.enabled) == (
        "batch-1", hash_key(key), "all", 25, True)


def test_keygen_quotes_a_dotted_name_so_it_stays_one_table(capsys, tmp_path):
    assert cli.main(["keygen", "team.a", "--scope", "admin"]) == 0
    out = capsys.readouterr().out
    key = out.split("\n")[0].removeprefix("key: ")
    entry = out.split("\n", 2)[2]
    assert entry.split("\n")[0] == '[keys."team.a"]'
    path = tmp_path / "api_keys.toml"
    path.write_text(entry)
    [loaded] = load_key_file(str(path))
    assert (loaded.name, loaded.hash, loaded.scope) == ("team.a", hash_key(key), "admin")


@pytest.mark.parametrize("name", ["bad name", "_first", "static-token", "x" * 65, "é"])
def test_keygen_refuses_a_bad_name_with_status_2(capsys, name):
    assert cli.main(["keygen", name]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"svcctl: key name {name!r} ") and err.count("\n") == 1


@pytest.mark.parametrize("flags", [["--scope", "root"], ["--qps", "-1"], ["--qps", "1.5"], ["--qps", "x"]])
def test_keygen_refuses_a_bad_scope_or_qps_with_status_2(capsys, flags):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["keygen", "web", *flags])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and ("--scope" in err or "--qps" in err)


def test_hash_prints_the_sha256_of_the_argument_or_of_stdin(capsys, monkeypatch):
    assert cli.main(["hash", "abc"]) == 0
    assert capsys.readouterr().out == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc\n"))
    assert cli.main(["hash", "-"]) == 0
    assert capsys.readouterr().out == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"


def test_hash_of_an_empty_key_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert cli.main(["hash", "-"]) == 2
    assert capsys.readouterr() == ("", "svcctl: hash: the key is empty (nothing on stdin)\n")
    assert cli.main(["hash", ""]) == 2
    assert capsys.readouterr() == ("", "svcctl: hash: the key is empty\n")


ABC_HASH = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_hash_is_of_the_key_the_gateway_reads_and_refuses_one_no_bearer_token_carries(capsys, monkeypatch):
    """The gateway strips the whitespace around a bearer string, so the hash of " abc" could never match (it is
    of "abc" now); a key with a space inside, or a stdin of two lines (the second was dropped), is refused."""
    assert cli.main(["hash", " abc "]) == 0
    assert capsys.readouterr().out == ABC_HASH + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(" abc \r\n"))
    assert cli.main(["hash", "-"]) == 0
    assert capsys.readouterr().out == ABC_HASH + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("a\nb\n"))
    assert cli.main(["hash", "-"]) == 2
    assert capsys.readouterr() == ("", "svcctl: hash: stdin holds more than one line: give one key\n")
    for key in ("a b", "ab\u00e9"):
        assert cli.main(["hash", key]) == 2
        assert capsys.readouterr() == ("", "svcctl: hash: the key has a space or a character outside visible "
                                           "ASCII, which no bearer token carries\n")


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == version_line() + "\n"


def test_console_entry_as_a_process_runs_version_keygen_and_hash():
    version = svcctl("--version", token=None)
    assert (version.returncode, version.stdout) == (0, version_line() + "\n")
    made = svcctl("keygen", "ops", "--scope", "admin", "--qps", "3", token=None)
    assert made.returncode == 0
    key = made.stdout.split("\n")[0].removeprefix("key: ")
    parsed = tomlkit.parse(made.stdout.split("\n", 2)[2]).unwrap()
    assert parsed == {"keys": {"ops": {"hash": hash_key(key), "scope": "admin", "rate_limit_qps": 3, "enabled": True}}}
    assert "__gateway/restart" in made.stderr
    hashed = svcctl("hash", key, token=None)
    assert (hashed.returncode, hashed.stdout) == (0, hash_key(key) + "\n")


# ---------------------------------------------------------------- client pieces, in-process


def test_parse_value_is_json_when_it_parses_else_the_string():
    assert cli_args.parse_value("0.5") == 0.5
    assert cli_args.parse_value("3") == 3
    assert cli_args.parse_value("true") is True
    assert cli_args.parse_value("null") is None
    assert cli_args.parse_value("[1, 2]") == [1, 2]
    assert cli_args.parse_value('{"a": "b"}') == {"a": "b"}
    assert cli_args.parse_value('"5"') == "5"
    assert cli_args.parse_value("cat") == "cat"
    assert cli_args.parse_value("") == ""
    assert cli_args.parse_value("NaN") == "NaN"
    assert cli_args.parse_value("a=b") == "a=b"


def test_token_order_and_token_env():
    both = {"SERVICE_API_KEY": "k", "SERVICE_GATEWAY_AUTH_TOKEN": "g", "SERVICE_API_TOKEN": "m"}
    assert cli_args.find_token(both) == "m"  # the management token, as the contract has the client send it
    assert cli_args.find_token({**both, "SERVICE_API_TOKEN": ""}) == "k"
    assert cli_args.find_token({"SERVICE_GATEWAY_AUTH_TOKEN": "g"}) == "g"
    assert cli_args.find_token({**both, "OTHER_TOKEN": "o"}, "OTHER_TOKEN") == "o"
    with pytest.raises(cli_gateway.CliError, match="^no token: OTHER_TOKEN is not set"):
        cli_args.find_token(both, "OTHER_TOKEN")


@pytest.mark.parametrize("argv, url, timeout", [
    (["jobs", "wait", "M", "job_1"], "http://gw:1/v1/models/M/jobs/job_1/wait?timeout=30000", 60.0),
    (["jobs", "wait", "M", "job_1", "--timeout", "120000"], "http://gw:1/v1/models/M/jobs/job_1/wait?timeout=120000", 150.0),
    (["jobs", "wait", "M", "job_1", "--timeout", "1000", "--timeout-s", "500"],
     "http://gw:1/v1/models/M/jobs/job_1/wait?timeout=1000", 500.0),
    (["jobs", "wait", "M", "job_1", "--timeout", "100000", "--timeout-s", "5"],
     "http://gw:1/v1/models/M/jobs/job_1/wait?timeout=100000", 130.0),
    (["jobs", "get", "M", "job_1"], "http://gw:1/v1/models/M/jobs/job_1", 300.0),
    (["jobs", "result", "a/b", "job 1", "--timeout-s", "7"], "http://gw:1/v1/models/a%2Fb/jobs/job%201/result", 7.0),
])
def test_planned_urls_and_timeouts_keep_the_client_above_the_wait_budget(argv, url, timeout):
    call = cli_gateway.plan_call(cli.build_parser().parse_args([*argv, "--gateway", "http://gw:1/"]))
    assert (call.method, call.url, call.body, call.timeout) == ("GET", url, None, timeout)


@pytest.mark.parametrize("table, url, said", [
    ('[gateway]\nport = 18080\n', "http://127.0.0.1:18080/v1/models/M/jobs/job_1", ""),
    ('[gateway]\nhost = "::1"\nport = 18081\n', "http://[::1]:18081/v1/models/M/jobs/job_1", ""),
    ('[gateway]\nport = "x"\n', "http://127.0.0.1:8080/v1/models/M/jobs/job_1",  # refused by the gateway
     "svcctl: conf/service.toml: [gateway] host '127.0.0.1' and port 'x' are not an address: using "
     "http://127.0.0.1:8080\n"),
    ("[gateway\n", "http://127.0.0.1:8080/v1/models/M/jobs/job_1",
     "svcctl: conf/service.toml cannot be read (Unexpected character: '\\n' at line 1 col 8): using the default "
     "addresses and files\n"),
])
def test_without_a_flag_or_variable_the_gateway_is_where_this_folders_config_has_it(gateway, monkeypatch, tmp_path,
                                                                                    capsys, table, url, said):
    """svcctl read keys_file and max_body_bytes from conf/service.toml but sent to 127.0.0.1:8080 whatever its
    [gateway] port said: the key to another port's listener, if any (secrets probe); a file it cannot use is
    said once, not passed over in silence (regression probe)."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text(table)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_args, "_said", set())
    gateway.reply = Reply(200, {"job_id": "job_1", "state": "running"})
    run(gateway, "jobs", "get", "M", "job_1")
    assert [r.url for r in gateway.requests] == [url]
    assert capsys.readouterr().err == said


@pytest.mark.parametrize("wait_ms", ["180000", "300000", "999999"])
def test_a_wait_at_or_above_the_gateway_receive_timeout_is_refused_before_sending(capsys, monkeypatch, wait_ms):
    monkeypatch.setenv("SERVICE_API_KEY", "k")
    # docs/contract.md, Limits: the gateway answers 502 to a wait budget at or above upstream_recv_timeout_ms (180000).
    argv = ["jobs", "wait", "M", "job_1", "--timeout", wait_ms, "--gateway", "http://127.0.0.1:9/"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--timeout {wait_ms}:" in err and "179999" in err
    call = cli_gateway.plan_call(cli.build_parser().parse_args([*argv[:4], "--timeout", "179999"]))
    assert call.url.endswith("/wait?timeout=179999")


def test_the_wait_limit_is_the_gateways_configured_receive_timeout(capsys, monkeypatch, tmp_path):
    """docs/cli.md: refused at or above the gateway's upstream_recv_timeout_ms. It was 180000 whatever the gateway's
    config said (a docs probe: a gateway set to 250000 took a 200000 wait svcctl refused; one set to 60000 answered
    502 to a wait svcctl sent). The service config of the folder svcctl runs in says it."""
    monkeypatch.setenv("SERVICE_API_KEY", "k")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "service.toml"
    argv = ["jobs", "wait", "M", "job_1", "--gateway", "http://127.0.0.1:9/", "--timeout"]
    config.write_text("[gateway]\nupstream_recv_timeout_ms = 250000\n")
    assert cli_gateway.plan_call(cli.build_parser().parse_args([*argv, "200000"])).url.endswith("?timeout=200000")
    config.write_text("[gateway]\nupstream_recv_timeout_ms = 60000\n")
    assert cli.main([*argv, "100000"]) == 2
    assert capsys.readouterr().err == ("svcctl: --timeout 100000: a wait through the gateway must stay below its "
                                       "upstream_recv_timeout_ms (60000 ms); use at most 59999 and wait again to "
                                       "wait longer\n")
    with pytest.raises(SystemExit):
        cli.main(["jobs", "run", "M", "--poll-ms", "100000", "--gateway", "http://127.0.0.1:9/"])
    assert "upstream_recv_timeout_ms (60000 ms), got 100000" in capsys.readouterr().err


@pytest.mark.parametrize("value, problem", [
    ('"60000"', "must be an integer, got string '60000'"), ("0", "must be at least 1, got 0"),
    ("-5", "must be at least 1, got -5"), ("1.5", "must be an integer, got float 1.5"),
    ("true", "must be an integer, got boolean True"),
    ("10000000000000", "must be at most 1000000000000, got 10000000000000"),  # a regression probe: it was used
])
def test_a_receive_timeout_the_gateway_would_refuse_is_said_once_and_the_default_used(capsys, monkeypatch, tmp_path,
                                                                                      value, problem):
    """svcctl went on with 180000 without a word when conf/service.toml's upstream_recv_timeout_ms was no
    integer within the gateway's bounds (probes): the gateway refuses such a file, so the default is a guess worth
    saying."""
    monkeypatch.setenv("SERVICE_API_KEY", "k")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_args, "_said", set())
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text(f"[gateway]\nupstream_recv_timeout_ms = {value}\n")
    argv = ["jobs", "wait", "M", "job_1", "--gateway", "http://127.0.0.1:9/", "--timeout", "170000"]
    assert cli_gateway.plan_call(cli.build_parser().parse_args(argv)).url.endswith("?timeout=170000")
    assert cli_args.gateway_recv_timeout_ms() == 180000
    assert capsys.readouterr().err == (f"svcctl: conf/service.toml: [gateway] upstream_recv_timeout_ms {problem} (the "
                                       "gateway refuses it): using 180000\n")


@pytest.mark.parametrize("limit, sent", [(30000, 29999), (20000, 19999), (30001, 30000), (180000, 30000)])
def test_a_wait_without_timeout_stays_below_a_gateway_configured_under_the_default(capsys, monkeypatch, tmp_path,
                                                                                   limit, sent):
    """A plain ``jobs wait`` was refused, exit 2, naming ``--timeout 30000`` which the user never gave, where the
    gateway's upstream_recv_timeout_ms was 30000 or less. The default is kept below it; a given --timeout is not."""
    monkeypatch.setenv("SERVICE_API_KEY", "k")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text(f"[gateway]\nupstream_recv_timeout_ms = {limit}\n")
    client = fake_client(monkeypatch)
    client.reply = Reply(200, {"job_id": "job_1", "state": "running"})
    assert run(client, "jobs", "wait", "M", "job_1", "--gateway", GATEWAY) == 0
    assert [(r.path, r.timeout) for r in client.requests] == [(f"/v1/models/M/jobs/job_1/wait?timeout={sent}",
                                                               sent / 1000 + 30)]
    capsys.readouterr()
    assert run(client, "jobs", "wait", "M", "job_1", "--gateway", GATEWAY, "--timeout", str(limit)) == 2
    assert capsys.readouterr() == ("", f"svcctl: --timeout {limit}: a wait through the gateway must stay below its "
                                       f"upstream_recv_timeout_ms ({limit} ms); use at most {limit - 1} and wait "
                                       "again to wait longer\n")
    assert len(client.requests) == 1


@pytest.mark.parametrize("flags", [["--param", "novalue"], ["--param", "=1"], ["--timeout-s", "0"],
                                   ["--timeout-s", "x"]])
def test_bad_client_flags_exit_2(capsys, flags):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["infer", "M", "img.jpg", *flags])
    assert exit_.value.code == 2
    assert capsys.readouterr().out == ""


def test_a_gateway_that_is_not_an_http_url_exits_2(capsys, monkeypatch):
    monkeypatch.setenv("SERVICE_API_KEY", TOKEN)
    assert cli.main(["jobs", "get", "M", "job_1", "--gateway", "127.0.0.1:8080"]) == 2
    assert capsys.readouterr().err == "svcctl: --gateway must be an http:// or https:// URL, got '127.0.0.1:8080'\n"


@pytest.mark.parametrize("argv", [["jobs", "get", "M", "job_1"], ["jobs", "run", "M"], ["infer", "M", "x.jpg"]])
def test_a_bad_gateway_url_from_the_environment_names_the_variable(gateway, capsys, monkeypatch, argv):
    """``SERVICE_GATEWAY_URL=garbage`` was reported as "--gateway must be ..." when no --gateway was given (and
    ``jobs run`` did not check it at all before it sent)."""
    monkeypatch.setenv(cli_gateway.GATEWAY_ENV, "garbage")
    assert run(gateway, *argv) == 2
    assert capsys.readouterr() == ("", "svcctl: SERVICE_GATEWAY_URL (the default of --gateway) must be an http:// "
                                       "or https:// URL, got 'garbage'\n")
    assert run(gateway, *argv, "--gateway", "gw.test") == 2
    assert capsys.readouterr() == ("", "svcctl: --gateway must be an http:// or https:// URL, got 'gw.test'\n")
    assert gateway.requests == []


@pytest.mark.parametrize("url, why", [("http://[::1", "Invalid IPv6 URL"),
                                      ("http://gw.test:99999", "Port out of range 0-65535"),
                                      ("http://gw.test:80a", "Port could not be cast to integer value as '80a'")])
def test_a_gateway_url_that_cannot_be_parsed_is_one_line_exit_2(capsys, monkeypatch, url, why):
    monkeypatch.setenv("SERVICE_API_KEY", TOKEN)
    assert cli.main(["infer", "M", "x.jpg", "--gateway", url]) == 2
    assert capsys.readouterr() == ("", f"svcctl: --gateway must be an http:// or https:// URL, got {url!r} ({why})\n")


def test_a_gateway_url_with_credentials_is_refused_naming_the_variable_not_the_password(capsys, monkeypatch):
    monkeypatch.setenv("SERVICE_API_KEY", TOKEN)
    monkeypatch.setenv("SERVICE_GATEWAY_URL", "https://u:UrlPw-secret@gw.test:8443")
    assert cli.main(["infer", "M", "x.jpg"]) == 2
    # It read "must be an http:// or https:// URL, got 'https://gw.test:8443' without a user name or password", as
    # if the URL lacked them (a CLI probe).
    assert capsys.readouterr() == ("", "svcctl: SERVICE_GATEWAY_URL (the default of --gateway) must be a URL without "
                                       "a user name or password (svcctl sends its token in Authorization), got "
                                       "'https://gw.test:8443' with them (not shown)\n")


def test_openapi_check_outside_the_checkout_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["openapi", "check"]) == 2
    assert capsys.readouterr() == ("", "svcctl: openapi check: conf/server: the model-server config directory does "
                                       "not exist (run it in the checkout)\n")


# ---------------------------------------------------------------- the commands, in-process


def test_infer_posts_the_envelope_with_the_bearer_and_prints_the_reply(gateway, images, capsys):
    gateway.reply = Reply(200, ENVELOPE)
    one, two = images
    code = run(gateway, "infer", "MOBILENETV2", str(one), str(two), "--gateway", GATEWAY,
               "--param", "score_threshold=0.5", "--param", "top_k=3", "--param", "label=cat",
               "--option", 'extra={"a": [1, "x"]}', "--req-id", "r-1")
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out == json.dumps(ENVELOPE, indent=2) + "\n"
    [seen] = gateway.requests
    assert (seen.method, seen.url, seen.token, seen.timeout) == (
        "POST", f"{GATEWAY}/v1/models/MOBILENETV2/infer", TOKEN, 300.0)
    assert seen.json() == {"images": [b64(one), b64(two)],
                           "params": {"score_threshold": 0.5, "top_k": 3, "label": "cat"},
                           "options": {"extra": {"a": [1, "x"]}}, "req_id": "r-1"}
    assert TOKEN not in out + err


def test_infer_sends_only_images_when_nothing_else_is_given_and_reads_the_gateway_env(gateway, images,
                                                                                      monkeypatch):
    monkeypatch.setenv(cli_gateway.GATEWAY_ENV, GATEWAY + "/")
    gateway.reply = Reply(200, ENVELOPE)
    assert run(gateway, "infer", "M", str(images[0])) == 0
    [seen] = gateway.requests
    assert seen.url == f"{GATEWAY}/v1/models/M/infer"
    assert seen.json() == {"images": [b64(images[0])]}


@pytest.mark.parametrize("status, phrase", [(401, "Unauthorized"), (404, "Not Found"),
                                            (503, "Service Unavailable")])
def test_infer_exits_1_on_an_error_status_and_prints_the_error_envelope(gateway, images, capsys, status, phrase):
    body = {"status": 16, "status_str": "UNAUTHENTICATED", "task_id": "t", "results": []}
    gateway.reply = Reply(status, body)
    assert run(gateway, "infer", "M", str(images[0]), "--gateway", GATEWAY) == 1
    assert capsys.readouterr() == (json.dumps(body, indent=2) + "\n",
                                   f"svcctl: HTTP {status} {phrase} from POST {GATEWAY}/v1/models/M/infer\n")
    assert len(gateway.requests) == 1


def test_429_names_retry_after_and_a_non_json_body_is_printed_as_text(gateway, images, capsys):
    gateway.reply = Reply(429, b"slow down\n", retry_after="2")
    assert run(gateway, "infer", "M", str(images[0]), "--gateway", GATEWAY) == 1
    assert capsys.readouterr() == (
        "slow down\n", f"svcctl: HTTP 429 Too Many Requests (Retry-After: 2) from POST {GATEWAY}/v1/models/M/infer\n")


def test_jobs_submit_posts_to_jobs_and_202_exits_0(gateway, images, capsys):
    gateway.reply = Reply(202, JOB)
    assert run(gateway, "jobs", "submit", "M", str(images[1]), "--param", "timesteps=50", "--gateway", GATEWAY) == 0
    assert capsys.readouterr() == (json.dumps(JOB, indent=2) + "\n", "")
    [seen] = gateway.requests
    assert (seen.method, seen.path, seen.token) == ("POST", "/v1/models/M/jobs", TOKEN)
    assert seen.json() == {"images": [b64(images[1])], "params": {"timesteps": 50}}


@pytest.mark.parametrize("argv, path", [
    (["get", "M", "job_1"], "/v1/models/M/jobs/job_1"),
    (["wait", "M", "job_1", "--timeout", "1500"], "/v1/models/M/jobs/job_1/wait?timeout=1500"),
    (["wait", "M", "job_1"], "/v1/models/M/jobs/job_1/wait?timeout=30000"),
    (["result", "M", "job_1"], "/v1/models/M/jobs/job_1/result"),
])
def test_jobs_get_wait_result_paths(gateway, capsys, monkeypatch, argv, path):
    monkeypatch.delenv("SERVICE_API_KEY")
    monkeypatch.setenv("SERVICE_GATEWAY_AUTH_TOKEN", "t-gateway")
    reply = {**JOB, "state": "done", "elapsed_ms": 12.5}
    gateway.reply = Reply(200, reply)
    assert run(gateway, "jobs", *argv, "--gateway", GATEWAY) == 0
    assert capsys.readouterr() == (json.dumps(reply, indent=2) + "\n", "")
    assert [(r.method, r.path, r.body, r.token) for r in gateway.requests] == [("GET", path, None, "t-gateway")]


def test_jobs_result_not_done_exits_1(gateway, capsys):
    gateway.reply = Reply(409, {"job_id": "job_1", "state": "running", "error": "not done"})
    assert run(gateway, "jobs", "result", "M", "job_1", "--gateway", GATEWAY) == 1
    assert capsys.readouterr().err == f"svcctl: HTTP 409 Conflict from GET {GATEWAY}/v1/models/M/jobs/job_1/result\n"


def test_token_env_names_the_variable_to_read(gateway, monkeypatch):
    monkeypatch.setenv("OTHER_TOKEN", "other")
    gateway.reply = Reply(200, JOB)
    assert run(gateway, "jobs", "get", "M", "job_1", "--gateway", GATEWAY, "--token-env", "OTHER_TOKEN") == 0
    assert gateway.requests[0].token == "other"


def test_a_transport_failure_exits_2_with_one_line(gateway, capsys):
    from twisted.internet.error import ConnectionRefusedError, DNSLookupError

    gateway.script = [Reply(error=ConnectionRefusedError()), Reply(error=DNSLookupError())]
    assert run(gateway, "jobs", "get", "M", "job_1", "--gateway", GATEWAY) == 2
    assert run(gateway, "jobs", "get", "M", "job_2", "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", f"svcctl: GET {GATEWAY}/v1/models/M/jobs/job_1: connection refused (is the "
                                       "gateway running?)\n"
                                       f"svcctl: GET {GATEWAY}/v1/models/M/jobs/job_2: cannot resolve the host name\n")


def test_no_token_exits_2_naming_the_variables_and_sends_nothing(gateway, images, capsys, monkeypatch):
    monkeypatch.delenv("SERVICE_API_KEY")
    assert run(gateway, "infer", "M", str(images[0]), "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", "svcctl: no token: set SERVICE_API_TOKEN, SERVICE_API_KEY or "
                                       "SERVICE_GATEWAY_AUTH_TOKEN (or name another variable with --token-env)\n")
    assert gateway.requests == []


def test_missing_image_exits_2_and_sends_nothing(gateway, images, tmp_path, capsys):
    missing = tmp_path / "missing.jpg"
    assert run(gateway, "infer", "M", str(images[0]), str(missing), "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", f"svcctl: cannot read image {missing}: No such file or directory\n")
    assert gateway.requests == []


def test_images_over_the_gateways_max_body_bytes_are_refused_before_they_are_read(gateway, tmp_path, capsys,
                                                                               monkeypatch):
    """A 300 MB file was read and base64-encoded whole (1.3 GB of memory) to be answered 413 (a CLI probe). The
    limit is the gateway's ``max_body_bytes`` in conf/service.toml of this folder, else its default (64 MiB)."""
    monkeypatch.chdir(tmp_path)
    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as f:
        f.truncate(300 * 1024 * 1024)  # sparse: its size, without the disk
    assert run(gateway, "infer", "M", str(huge), "--gateway", GATEWAY) == 2
    assert capsys.readouterr() == ("", "svcctl: the images are 419430400 bytes as base64, more than the gateway "
                                       "takes in one request (max_body_bytes 67108864; it would answer 413): send "
                                       "fewer or smaller images\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text("[gateway]\nmax_body_bytes = 2048\n")
    small, over = tmp_path / "small.jpg", tmp_path / "over.jpg"
    small.write_bytes(b"x" * 1500)  # 2000 bytes as base64
    over.write_bytes(b"x" * 1540)  # 2056
    assert run(gateway, "infer", "M", str(over), "--gateway", GATEWAY) == 2
    assert "(max_body_bytes 2048; it would answer 413)" in capsys.readouterr().err
    assert gateway.requests == []
    gateway.reply = Reply(200, ENVELOPE)
    assert run(gateway, "infer", "M", str(small), "--gateway", GATEWAY) == 0
    assert len(gateway.requests) == 1


@pytest.mark.parametrize("stall", ["forever", "connecting", "resolving"])
def test_a_reply_that_never_comes_ends_at_the_deadline(gateway, images, capsys, stall):
    """Whatever the request was doing when the deadline passed (a short ``--timeout-s`` ends it while it
    connects or resolves the name), the line says the deadline, not what the cancellation raised."""
    gateway.reply = Reply(stall=stall)
    assert run(gateway, "infer", "M", str(images[0]), "--gateway", GATEWAY, "--timeout-s", "0.5") == 2
    assert capsys.readouterr() == ("", f"svcctl: POST {GATEWAY}/v1/models/M/infer: no complete reply within 0.5 s\n")
    assert gateway.reactor.seconds() == 0.5


@pytest.mark.parametrize("stall", ["own-timeout-connecting", "own-timeout-resolving", "own-timeout-sending"])
def test_a_deadline_that_the_clients_own_timeout_meets_first_is_still_the_deadline_line(gateway, images, capsys,
                                                                                        stall):
    """treq's timeout (and the agent's connect timeout) fire at the deadline's moment, before it: the agent's
    error of that phase was the line (``--timeout-s 0.005`` read "cannot resolve the host name" for an IP, or
    ``ConnectingCancelledError: HostnameAddress(...)``, or ``RequestGenerationFailed``)."""
    gateway.reply = Reply(stall=stall)
    assert run(gateway, "infer", "M", str(images[0]), "--gateway", GATEWAY, "--timeout-s", "0.5") == 2
    assert capsys.readouterr() == ("", f"svcctl: POST {GATEWAY}/v1/models/M/infer: no complete reply within 0.5 s\n")
    assert gateway.reactor.seconds() == 0.5


def test_an_interrupted_request_says_so_and_exits_130(gateway, capsys):
    gateway.reply = Reply(stall="interrupt")
    assert run(gateway, "jobs", "get", "M", "job_1", "--gateway", GATEWAY) == 130
    assert capsys.readouterr() == ("", "svcctl: interrupted\n")
    assert gateway.reactor.triggers == {}


# ---------------------------------------------------------------- the real client, as a process


@contextmanager
def listener(host: str = "127.0.0.1"):
    """A real listening socket on loopback (the kernel completes connections; the test answers by hand); ``::1``
    for IPv6 (the :func:`ipv6_loopback` fixture fails at once, saying why, where the machine lacks it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as server:
        server.bind((host, 0))
        server.listen(8)
        server.settimeout(10)
        yield server, http_url(host, server.getsockname()[1])


@pytest.fixture
def ipv6_loopback() -> None:
    """Fails a test at once, saying why, on a machine without IPv6 loopback (:func:`need_ipv6_loopback`)."""
    need_ipv6_loopback()


def need_ipv6_loopback() -> None:
    """Fail the calling test, saying why, on a machine without IPv6 loopback (no IPv6 in Python, or ``::1`` cannot
    be bound). Not a skip: the suite's machines have it (Linux's ``lo`` carries ``::1``), and a skipped check would
    pass where the feature is untested."""
    if not socket.has_ipv6:
        pytest.fail("no IPv6 support in this Python: these tests need ::1")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as e:
        pytest.fail(f"no IPv6 loopback on this machine (these tests need ::1): {e}")


def read_request_head(server: socket.socket) -> socket.socket:
    """Accept one connection and read its request line and headers; the connection."""
    return accept_request_head(server)[0]


def accept_request_head(server: socket.socket) -> tuple[socket.socket, bytes]:
    """Accept one connection and read its request line and headers: the connection, and what was read."""
    conn, _ = server.accept()
    conn.settimeout(10)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        assert chunk, head
        head += chunk
    return conn, head


def test_connection_refused_exits_2_with_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    done = svcctl("jobs", "get", "M", "job_1", "--gateway", url)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"svcctl: GET {url}/v1/models/M/jobs/job_1: connection refused (is the gateway running?)\n"


def test_one_deadline_covers_the_headers_and_the_body():
    """treq's timeout stops at the headers: a reply stalled in its body must hit the deadline too."""
    with listener() as (silent, silent_url), listener() as (halting, halting_url):
        procs = [(url, start("jobs", "get", "M", "job_1", "--gateway", url, "--timeout-s", "0.5"))
                 for url in (silent_url, halting_url)]
        conn = read_request_head(halting)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"job")
        with conn:
            for url, proc in procs:
                done = finish(proc)
                assert (done.returncode, done.stdout) == (2, "")
                assert done.stderr == f"svcctl: GET {url}/v1/models/M/jobs/job_1: no complete reply within 0.5 s\n"


def test_a_deadline_that_passes_while_connecting_is_the_deadline_line():
    """A listener whose backlog is full never completes the connection: ``--timeout-s`` ended it with
    ``ConnectingCancelledError: HostnameAddress(...)``; and a deadline shorter than a loopback connect read
    "cannot resolve the host name" for an IP address. Both are the documented deadline line, exit 2."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        fillers = [socket.socket() for _ in range(8)]  # the queue fills; later SYNs are dropped, never refused
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        with listener() as (_, quick_url):
            procs = [(f"http://127.0.0.1:{port}", "1", start("jobs", "get", "M", "job_1", "--gateway",
                                                              f"http://127.0.0.1:{port}", "--timeout-s", "1"))]
            procs += [(quick_url, "0.001", start("jobs", "get", "M", "job_1", "--gateway", quick_url,
                                                 "--timeout-s", "0.001")) for _ in range(4)]
            for url, seconds, proc in procs:
                done = finish(proc)
                assert (done.returncode, done.stdout) == (2, "")
                assert done.stderr == f"svcctl: GET {url}/v1/models/M/jobs/job_1: no complete reply within {seconds} s\n"
        for filler in fillers:
            filler.close()


@pytest.mark.parametrize("argv, method, path", [
    (["infer", "M", "IMAGE"], "POST", "/v1/models/M/infer"),
    (["jobs", "get", "M", "job_1"], "GET", "/v1/models/M/jobs/job_1"),
])
def test_a_redirect_is_not_followed_and_its_line_names_where_it_points(argv, method, path, images):
    """A POST's 307 was "the connection failed (307 ...)" naming the URL sent, not the Location; a GET's was
    followed without the token (the other host's 200 printed, exit 0): a CLI probe. Neither is followed now, and
    the line says where it points; the place pointed to gets no request."""
    argv = [str(images[0]) if a == "IMAGE" else a for a in argv]
    with listener() as (server, url), listener() as (elsewhere, elsewhere_url):
        location = f"{elsewhere_url}{path}"
        proc = start(*argv, "--gateway", url)
        conn, head = accept_request_head(server)
        with conn:
            conn.sendall(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\n"
                         "Connection: close\r\n\r\n".encode())
            done = finish(proc)
        elsewhere.settimeout(0.01)
        with pytest.raises(TimeoutError):
            elsewhere.accept()
    assert head.startswith(f"{method} {path} HTTP/1.1".encode())
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"svcctl: HTTP 307 Temporary Redirect from {method} {url}{path}: redirected to {location}; "
                           "svcctl follows no redirect (it would carry the token elsewhere): give --gateway the "
                           "address that answers\n")


def test_a_2xx_reply_that_is_not_the_gateways_is_exit_1_saying_what_it_lacked(gateway, images, capsys):
    """A proxy's page answered 200 exited 0 (infer, jobs submit), and ``jobs run``'s refusal of a 200 without a job
    id was the line "HTTP 200 OK from ...", as if that were the error: a CLI probe."""
    gateway.reply = Reply(200, b"<html>sign in</html>")
    assert run(gateway, "infer", "M", str(images[0]), "--gateway", GATEWAY) == 1
    assert capsys.readouterr() == ("<html>sign in</html>\n", f"svcctl: HTTP 200 OK from POST {GATEWAY}/v1/models/M/infer, "
                                   "but not a JSON reply: not the gateway's reply (a proxy's page?)\n")
    gateway.reply = Reply(200, {"ok": True})
    assert run(gateway, "jobs", "run", "M", "--gateway", GATEWAY) == 1
    assert capsys.readouterr() == ('{\n  "ok": true\n}\n', f"svcctl: HTTP 200 OK from POST {GATEWAY}/v1/models/M/jobs, "
                                   "but not a 202 with a job_id: not the gateway's reply (a proxy's page?)\n")


def test_an_ipv6_gateway_url_reaches_the_gateway_with_its_host_header(ipv6_loopback):
    """``--gateway http://[::1]:PORT`` failed before any connection: treq refuses an IPv6 literal host
    (``InvalidCodepoint: Codepoint U+003A ... '::1'``). The request goes to ::1, with the Host the URL names."""
    with listener("::1") as (server, url):
        assert url.startswith("http://[::1]:")
        proc = start("jobs", "get", "M", "job_x", "--gateway", url)
        conn, head = accept_request_head(server)
        with conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n"
                         b'{"state": "done"}')
            done = finish(proc)
    assert (done.returncode, done.stdout, done.stderr) == (0, '{\n  "state": "done"\n}\n', "")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == "GET /v1/models/M/jobs/job_x HTTP/1.1"
    assert f"Host: {url.removeprefix('http://')}" in lines


def test_an_interrupted_process_says_so_and_exits_130():
    with listener() as (server, url):
        proc = start("jobs", "get", "M", "job_1", "--gateway", url)
        with read_request_head(server):  # sent from the running reactor, whose signal handlers are installed
            proc.send_signal(signal.SIGINT)
            done = finish(proc)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "svcctl: interrupted\n")


def test_a_reader_that_goes_away_is_not_an_error():
    """``svcctl jobs get ... | head -1``: the rest of the reply is dropped, no traceback; a request that went well
    exits 141, as a writer the pipe killed (tests/unit/test_cli_entry.py: every command the same)."""
    big = json.dumps({"job_id": "job_1", "state": "done", "pad": ["x" * 100] * 10_000}).encode()  # 1 MB: past a pipe
    with listener() as (server, url):
        proc = start("jobs", "get", "M", "job_1", "--gateway", url)
        proc.stdout.close()  # the reader is gone before the reply comes
        with read_request_head(server) as conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(big) + big)
            with proc.stderr:
                err = proc.stderr.read()
            proc.wait(timeout=30)
    assert (proc.returncode, err) == (141, "")


DEMO_NOTE = ("svcctl: note: this reply came from demo weights (random init: the outputs are noise); docs/models.md, "
             "\"Real models in three commands\", serves the official ones\n")


@pytest.mark.parametrize("weights, note", [("demo", DEMO_NOTE), ("pretrained", ""), ("file", ""), (None, "")])
def test_a_reply_from_demo_weights_gets_one_line_on_stderr(gateway, images, capsys, weights, note):
    gateway.reply = Reply(200, ENVELOPE, weights=weights)
    assert run(gateway, "infer", "M", str(images[0]), "--gateway", GATEWAY) == 0
    assert capsys.readouterr() == (json.dumps(ENVELOPE, indent=2) + "\n", note)
    gateway.reply = Reply(200, JOB, weights=weights)
    assert run(gateway, "jobs", "get", "M", "job_1", "--gateway", GATEWAY) == 0
    assert capsys.readouterr() == (json.dumps(JOB, indent=2) + "\n", note)


def test_keygen_names_the_key_file_and_the_supervisor_that_keys_add_would_use(capsys, monkeypatch, tmp_path):
    """Its hint named conf/api_keys.toml and 127.0.0.1:8787 whatever the service's configuration said."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text('[gateway]\nkeys_file = "/etc/inference/keys.toml"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVICE_SUPERVISOR_URL", "http://10.0.0.7:18787")
    assert cli.main(["keygen", "web"]) == 0
    err = capsys.readouterr().err
    assert "Paste the entry into /etc/inference/keys.toml, then restart the gateway" in err
    assert err.endswith(' http://10.0.0.7:18787/api/v1/servers/__gateway/restart\n')
    monkeypatch.setenv("SERVICE_SUPERVISOR_URL", "not a url")  # the hint falls back; the key is still made
    assert cli.main(["keygen", "web"]) == 0
    assert capsys.readouterr().err.endswith(" http://127.0.0.1:8787/api/v1/servers/__gateway/restart\n")
