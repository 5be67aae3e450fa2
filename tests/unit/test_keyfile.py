"""``svcctl keys add|disable|enable|remove|list``: exact file edits, mode 0600, atomic writes, the gateway restart."""

from __future__ import annotations

import os
import stat
from http import HTTPStatus

import pytest

from svc.auth import UntrustedKeyFile, hash_key, key_entry, load_key_file, load_trusted_key_file
from svc.cli import commands as cli
from svc.cli import keyfile
from tests.support.fake_client import FakeClient, Reply
from tests.unit.test_cli import free_port, svcctl

ORIGINAL = """\
# The gateway's API keys.
# Keep this comment.

[keys.tenant-a]   # the first tenant
hash = "{a}"
scope = "admin"     # it manages too
rate_limit_qps = 10

# a retired one, kept for the record
[keys.old]
hash = "{b}"
enabled = false
""".format(a="a" * 64, b="b" * 64)
MANAGEMENT = "management-" + "7" * 40
RESTART = "/api/v1/servers/__gateway/restart"


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "conf" / "api_keys.toml"
    path.parent.mkdir()
    path.write_text(ORIGINAL)
    path.chmod(0o644)
    return path


def in_checkout(monkeypatch, keys) -> None:
    """Run from the folder above ``keys``'s, whose ``conf/service.toml`` names it as the gateway's key file."""
    (keys.parent / "service.toml").write_text(f'[gateway]\nkeys_file = "conf/{keys.name}"\n')
    monkeypatch.chdir(keys.parent.parent)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_add_appends_the_keygen_entry_keeps_comments_and_order_and_prints_the_key_once(keys, capsys, monkeypatch):
    in_checkout(monkeypatch, keys)
    code = cli.main(["keys", "add", "tenant-b", "--scope", "all", "--qps", "3", "--keys-file", str(keys),
                     "--no-restart"])
    out, err = capsys.readouterr()
    assert code == 0
    key = out.strip()
    assert out == key + "\n" and len(key) == 64
    assert keys.read_text() == ORIGINAL + "\n" + key_entry("tenant-b", hash_key(key), "all", 3)
    assert key not in keys.read_text() and key not in err
    assert err == (f"svcctl: added key 'tenant-b' to {keys}; it is shown once and cannot be recovered: give it "
                   "to the client now\n"
                   "svcctl: not restarted (--no-restart): the gateway applies the change when it next starts\n")
    assert mode(keys) == 0o600
    assert [e.name for e in load_key_file(str(keys))] == ["tenant-a", "old", "tenant-b"]
    assert sorted(os.listdir(keys.parent)) == ["api_keys.toml", "service.toml"]  # no temporary file left


@pytest.mark.parametrize("action", [["add", "k2"], ["disable", "tenant-a"]])
def test_an_edit_by_root_keeps_the_service_users_owner_and_group(keys, capsys, action):
    """``sudo svcctl keys add`` replaced a probe user's key file by one of root's (0600), which that user's
    gateway could then not read (the restart failed with Permission denied).  The suite runs as root (CI
    does), so it can hand the file to another user; ``nobody`` (65534) stands for the service's user."""
    assert os.geteuid() == 0, "this test gives the key file to another user: run the suite as root, as CI does"
    os.chown(keys, 65534, 65534)
    assert cli.main(["keys", *action, "--keys-file", str(keys), "--no-restart"]) == 0
    capsys.readouterr()
    found = os.stat(keys)
    assert (found.st_uid, found.st_gid, mode(keys)) == (65534, 65534, 0o600)
    assert keys.read_text() != ORIGINAL


def test_add_creates_a_missing_file_with_mode_0600(tmp_path, capsys):
    path = tmp_path / "new" / "keys.toml"
    path.parent.mkdir()
    assert cli.main(["keys", "add", "a.b", "--keys-file", str(path), "--no-restart"]) == 0
    key = capsys.readouterr().out.strip()
    text = path.read_text()
    assert text.startswith("# The gateway's API keys") and text.endswith(key_entry("a.b", hash_key(key)))
    assert '[keys."a.b"]' in text and mode(path) == 0o600
    [entry] = load_key_file(str(path))
    assert (entry.name, entry.hash, entry.scope, entry.rate_limit_qps, entry.enabled) == \
        ("a.b", hash_key(key), "inference", 0, True)


def test_add_outside_the_checkout_refuses_to_make_a_key_file_no_gateway_reads(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no conf/ here, and no --keys-file
    assert cli.main(["keys", "add", "zz", "--no-restart"]) == 2
    assert capsys.readouterr() == ("", "svcctl: conf/api_keys.toml: no conf/ folder here: run svcctl keys in the "
                                       "checkout, or pass --keys-file\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, message", [
    ("tenant-a", "svcctl: a key named 'tenant-a' already exists (disable it, or choose another name)\n"),
    ("no spaces", "svcctl: key name 'no spaces' must be 1 to 64 letters, digits, '_', '.' or '-', starting with a "
                  "letter or digit\n"),
    ("static-token", "svcctl: key name 'static-token' is reserved for a static token (cluster-token, "
                     "management-token, metrics-token, static-token)\n"),
    ("cluster-token", "svcctl: key name 'cluster-token' is reserved for a static token (cluster-token, "
                      "management-token, metrics-token, static-token)\n"),
])
def test_add_refuses_a_duplicate_or_invalid_name_in_one_line_and_changes_nothing(keys, capsys, name, message):
    assert cli.main(["keys", "add", name, "--keys-file", str(keys), "--no-restart"]) == 2
    assert capsys.readouterr() == ("", message)
    assert keys.read_text() == ORIGINAL and mode(keys) == 0o644


def test_disable_sets_enabled_false_in_place(keys, capsys):
    assert cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys), "--no-restart"]) == 0
    assert keys.read_text() == ORIGINAL.replace("rate_limit_qps = 10\n", "rate_limit_qps = 10\nenabled = false\n")
    assert mode(keys) == 0o600
    assert capsys.readouterr().err.startswith(f"svcctl: disabled key 'tenant-a' in {keys}\n")


def test_disable_of_a_disabled_key_changes_nothing_and_of_an_unknown_key_is_refused(keys, capsys):
    assert cli.main(["keys", "disable", "old", "--keys-file", str(keys), "--no-restart"]) == 0
    assert capsys.readouterr().err == f"svcctl: key 'old' is already disabled in {keys}: nothing changed\n"
    assert cli.main(["keys", "disable", "nobody", "--keys-file", str(keys), "--no-restart"]) == 2
    assert capsys.readouterr().err == "svcctl: no key named 'nobody'\n"
    assert keys.read_text() == ORIGINAL and mode(keys) == 0o644


def test_enable_takes_a_disabled_key_back_and_remove_deletes_an_entry_with_its_comments_kept(keys, capsys,
                                                                                            monkeypatch):
    """Key changes the contract lists beside add and disable: re-enable and delete.  Without delete, a key the
    gateway refuses even disabled (one equal to its static token) could not be undone with svcctl (a regression
    probe)."""
    in_checkout(monkeypatch, keys)
    assert cli.main(["keys", "enable", "old", "--keys-file", str(keys), "--no-restart"]) == 0
    assert keys.read_text() == ORIGINAL.replace(f'hash = "{"b" * 64}"\nenabled = false\n', f'hash = "{"b" * 64}"\n')
    assert capsys.readouterr().err.startswith(f"svcctl: enabled key 'old' in {keys}\n")
    assert cli.main(["keys", "enable", "old", "--keys-file", str(keys), "--no-restart"]) == 0
    assert capsys.readouterr().err == f"svcctl: key 'old' is already enabled in {keys}: nothing changed\n"
    assert cli.main(["keys", "remove", "tenant-a", "--keys-file", str(keys), "--no-restart"]) == 0
    assert capsys.readouterr().err.startswith(f"svcctl: removed key 'tenant-a' from {keys}\n")
    text = keys.read_text()
    assert "tenant-a" not in text and "a" * 64 not in text and text.startswith("# The gateway's API keys.\n")
    assert [k.name for k in load_key_file(str(keys))] == ["old"] and mode(keys) == 0o600
    for action in ("remove", "enable"):
        assert cli.main(["keys", action, "nobody", "--keys-file", str(keys), "--no-restart"]) == 2
        assert capsys.readouterr().err == "svcctl: no key named 'nobody'\n"
    # The last enabled key gone: every client's next request is 401, which a line says (a regression probe).
    assert cli.main(["keys", "disable", "old", "--keys-file", str(keys), "--no-restart"]) == 0
    assert capsys.readouterr().err.splitlines()[:2] == [
        f"svcctl: disabled key 'old' in {keys}",
        f"svcctl: {keys} has no enabled key left: a gateway that reads it accepts only its static tokens from its restart"]


def test_list_prints_name_scope_qps_enabled_and_never_a_hash(keys, capsys):
    assert cli.main(["keys", "list", "--keys-file", str(keys)]) == 0
    out, err = capsys.readouterr()
    assert out == ("NAME      SCOPE      QPS        ENABLED\n"
                   "tenant-a  admin      10         yes\n"
                   "old       inference  unlimited  no\n")
    assert err == "" and "a" * 64 not in out


LISTED = ("NAME      SCOPE      QPS        ENABLED\n"
          "tenant-a  admin      10         yes\n"
          "old       inference  unlimited  no\n")


def refused(path, problem: str, uid: int) -> str:
    return (f"svcctl: the gateway will refuse this key file (and every key in it): {path}: {problem}: another user "
            f"could add an API key to it; give it to this user (uid {uid}) or root, writable by its owner only "
            "(chmod 600)\n")


@pytest.mark.parametrize("file_mode", [0o666, 0o620], ids=["others", "group"])
def test_list_of_a_file_others_can_write_says_the_gateways_refusal_and_exits_1(keys, capsys, file_mode):
    """The supervisor's refusal to start a gateway on such a file points to ``keys list`` as the check, which
    listed it with exit 0 and no word."""
    keys.chmod(file_mode)
    assert cli.main(["keys", "list", "--keys-file", str(keys)]) == 1
    out, err = capsys.readouterr()
    assert out == LISTED
    assert err == refused(keys, f"is writable by other users (mode {file_mode:o})", os.getuid())
    with pytest.raises(UntrustedKeyFile) as gateway:  # the gateway's own words
        load_trusted_key_file(str(keys))
    assert err.endswith(f": {gateway.value}\n")


def test_list_of_a_file_another_user_owns_says_the_gateways_refusal_and_exits_1(keys, capsys, monkeypatch):
    """As the service's user 1000 (injected: the suite runs as root), a key file of ``nobody``'s."""
    os.chown(keys, 65534, 65534)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    assert cli.main(["keys", "list", "--keys-file", str(keys)]) == 1
    assert capsys.readouterr() == (LISTED, refused(keys, "is owned by another user (uid 65534)", 1000))


def test_list_by_root_judges_the_file_for_its_owner_the_service_user(keys, capsys):
    """``sudo svcctl keys list``: the service user's file is what that user's gateway reads, not refused for
    being another user's than root's; its mode still is.  A line says that a gateway running as root refuses it
    (a regression probe: listed with no word, then refused by the root-run service's restart)."""
    assert os.getuid() == 0, "this test gives the key file to another user: run the suite as root, as CI does"
    os.chown(keys, 65534, 65534)
    assert cli.main(["keys", "list", "--keys-file", str(keys)]) == 0
    assert capsys.readouterr() == (LISTED, f"svcctl: {keys} is owned by uid 65534: a gateway running as that user "
                                           "accepts it; one running as root refuses it (owned by another user): give "
                                           "it to the user the gateway runs as\n")
    keys.chmod(0o646)
    assert cli.main(["keys", "list", "--keys-file", str(keys)]) == 1
    assert capsys.readouterr() == (LISTED, refused(keys, "is writable by other users (mode 646)", 65534))


def test_the_default_key_file_is_the_gateway_keys_file_of_the_service_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert keyfile.default_keys_file() == "conf/api_keys.toml"
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "service.toml").write_text('[gateway]\nkeys_file = "conf/other.toml"\n')
    (tmp_path / "conf" / "other.toml").write_text('[keys.x]\nhash = "' + "c" * 64 + '"\n')
    assert keyfile.default_keys_file() == "conf/other.toml"
    assert cli.main(["keys", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "x     inference  unlimited  yes"


def test_an_invalid_key_file_is_refused_before_any_change(keys, capsys):
    keys.write_text(ORIGINAL + "[keys.bad]\nscope = \"inference\"\n")
    broken = keys.read_text()
    assert cli.main(["keys", "add", "new", "--keys-file", str(keys), "--no-restart"]) == 2
    assert capsys.readouterr().err == f"svcctl: {keys}: keys.bad.hash: required key is missing\n"
    assert keys.read_text() == broken


def test_the_write_is_a_rename_of_a_0600_temporary_in_the_same_folder(keys, monkeypatch):
    renames = []
    real_replace = os.replace

    def replace(source, target):
        renames.append((os.path.dirname(source), os.path.basename(source), mode(source), target))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    keyfile.write_atomically(str(keys), "# new\n")
    [(folder, name, temporary_mode, target)] = renames
    assert folder == str(keys.parent) and name.startswith(".api_keys.toml.") and name.endswith(".tmp")
    assert temporary_mode == 0o600 and target == str(keys)
    assert keys.read_text() == "# new\n"


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(keys, monkeypatch, capsys):
    def broken(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    assert cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys), "--no-restart"]) == 2
    assert capsys.readouterr().err == f"svcctl: cannot write {keys}: No space left on device\n"
    assert keys.read_text() == ORIGINAL and sorted(os.listdir(keys.parent)) == ["api_keys.toml"]


def test_without_the_management_token_nothing_changes(keys, capsys, monkeypatch):
    monkeypatch.delenv("SERVICE_API_TOKEN", raising=False)
    assert cli.main(["keys", "add", "new", "--keys-file", str(keys)]) == 2
    assert capsys.readouterr() == ("", "svcctl: no management token: set SERVICE_API_TOKEN to restart the gateway, "
                                       "or pass --no-restart (the file is not changed)\n")
    assert keys.read_text() == ORIGINAL


@pytest.mark.parametrize("action", [["add", "new"], ["disable", "tenant-a"]])
def test_a_management_token_no_header_carries_changes_nothing(keys, capsys, monkeypatch, action):
    """It changed the key file, then failed inside the restart request (``UnicodeEncodeError``)."""
    monkeypatch.setenv("SERVICE_API_TOKEN", "\xe9t\xe9")
    assert cli.main(["keys", *action, "--keys-file", str(keys)]) == 2
    assert capsys.readouterr() == ("", "svcctl: SERVICE_API_TOKEN holds a character outside printable ASCII, which "
                                       "no bearer token carries (its value is not shown; nothing sent)\n")
    assert keys.read_text() == ORIGINAL


# -- the restart: in-process with the in-memory client, and one real process ----------------------------------


SUPERVISOR = "http://supervisor.test:8787"


def test_add_then_restarts_the_gateway_with_the_management_token(keys, capsys, monkeypatch):
    in_checkout(monkeypatch, keys)
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.script = [Reply(200, {"ok": True}), Reply(200, {"gateway": {"keys_file": str(keys)}})]
    code = cli.main(["keys", "add", "tenant-b", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor)
    out, err = capsys.readouterr()
    assert code == 0, err
    restart, status = supervisor.requests  # then which key file the gateway reads
    assert (restart.method, restart.url, restart.body, restart.token, restart.timeout) == (
        "POST", SUPERVISOR + RESTART, None, MANAGEMENT, 60.0)
    assert (status.method, status.url, status.token) == ("GET", SUPERVISOR + "/api/v1/status", MANAGEMENT)
    key = out.strip()
    assert keys.read_text() == ORIGINAL + "\n" + key_entry("tenant-b", hash_key(key))
    assert err.endswith("svcctl: the gateway restarted and applies the change\n")


def test_remove_takes_the_keys_own_comment_and_leaves_the_next_keys(tmp_path, capsys):
    """A regression probe: ``remove ci`` left "ci: ... expires 2027-01" above ``[keys.billing]`` and deleted the
    billing key's own "do NOT disable" note (tomlkit keeps a comment above a table as the table before it)."""
    keys = tmp_path / "keys.toml"
    keys.write_text(f'# Team keys\n\n# ci: the CI runner, expires 2027-01\n[keys.ci]\nhash = "{"a" * 64}"\n\n'
                    f'# billing: do NOT disable without finance sign-off\n[keys.billing]\nhash = "{"b" * 64}"  # b\n\n'
                    f'# the last one\n[keys."dotted.name"]\nhash = "{"c" * 64}"\nenabled = false\n')
    keys.chmod(0o600)
    assert cli.main(["keys", "remove", "ci", "--keys-file", str(keys), "--no-restart"]) == 0
    assert keys.read_text() == (f'# Team keys\n\n# billing: do NOT disable without finance sign-off\n[keys.billing]\n'
                                f'hash = "{"b" * 64}"  # b\n\n# the last one\n[keys."dotted.name"]\n'
                                f'hash = "{"c" * 64}"\nenabled = false\n')
    assert cli.main(["keys", "remove", "dotted.name", "--keys-file", str(keys), "--no-restart"]) == 0
    assert keys.read_text() == (f'# Team keys\n\n# billing: do NOT disable without finance sign-off\n[keys.billing]\n'
                                f'hash = "{"b" * 64}"  # b\n')
    assert [k.name for k in load_key_file(str(keys))] == ["billing"]
    capsys.readouterr()


def test_remove_of_a_key_the_text_cut_cannot_check_is_removed_by_tomlkit(tmp_path, capsys):
    """An inline table has no header to cut from the text: the key is removed from the document instead, the
    others kept."""
    keys = tmp_path / "keys.toml"
    keys.write_text(f'# inline\nkeys = {{ a = {{ hash = "{"a" * 64}" }}, b = {{ hash = "{"b" * 64}" }} }}\n')
    keys.chmod(0o600)
    assert cli.main(["keys", "remove", "a", "--keys-file", str(keys), "--no-restart"]) == 0
    assert keys.read_text().startswith("# inline\nkeys = {") and "a" * 64 not in keys.read_text()
    assert [k.name for k in load_key_file(str(keys))] == ["b"]
    capsys.readouterr()


@pytest.mark.parametrize("action", [["enable", "old"], ["remove", "tenant-a"]])
def test_enable_and_remove_restart_the_gateway_too(keys, capsys, monkeypatch, action):
    in_checkout(monkeypatch, keys)
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.script = [Reply(200, {"ok": True}), Reply(200, {"gateway": {"keys_file": str(keys)}})]
    assert cli.main(["keys", *action, "--keys-file", str(keys), "--supervisor", SUPERVISOR], client=supervisor) == 0
    assert [(r.method, r.url) for r in supervisor.requests] == [("POST", SUPERVISOR + RESTART),
                                                               ("GET", SUPERVISOR + "/api/v1/status")]
    assert capsys.readouterr().err.endswith("svcctl: the gateway restarted and applies the change\n")


def test_a_restart_refused_by_the_supervisor_exits_1_and_the_file_stays_changed(keys, capsys, monkeypatch):
    """The line says why, from the supervisor's JSON ``error`` (it said only "HTTP 500 Internal Server Error")."""
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.reply = Reply(500, {"error": "restart failed"})
    code = cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor)
    assert code == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "svcctl: the key file is changed but the gateway was not restarted: "
        f"HTTP 500 Internal Server Error from POST {SUPERVISOR}{RESTART}: restart failed")
    assert "enabled = false\n\n# a retired one" in keys.read_text()
    supervisor.reply = Reply(502, b"<html>bad gateway</html>")  # no JSON error to tell: the status alone
    assert cli.main(["keys", "disable", "old", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor) == 0  # already disabled: nothing to restart
    assert cli.main(["keys", "add", "k2", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "svcctl: the key file is changed but the gateway was not restarted: "
        f"HTTP 502 Bad Gateway from POST {SUPERVISOR}{RESTART}")


@pytest.mark.parametrize(("reply", "end"), [
    (Reply(200, b"<html>proxy page</html>"), "but not the supervisor's {\"ok\": true}: not the supervisor's reply "
                                             "(a proxy's page?)"),
    (Reply(200, {"ok": False, "error": "nope"}), "but not the supervisor's {\"ok\": true}: not the supervisor's "
                                                "reply (a proxy's page?)"),
    (Reply(200, b'{"ok": tr'), "but not the supervisor's {\"ok\": true}: not the supervisor's reply "
                               "(a proxy's page?)"),
    (Reply(302, b"", location="https://login.example/"), ": redirected to https://login.example/; svcctl follows no "
                                                        "redirect (it would carry the token elsewhere): give "
                                                        "--supervisor the address that answers"),
])
def test_a_restart_answered_by_something_else_is_not_called_a_restart(keys, capsys, monkeypatch, reply, end):
    """A probe's stand-in for the supervisor answered a proxy's page, ``{"ok": false}`` or cut JSON with 200: each
    was "the gateway restarted and applies the change", exit 0, for a key change no gateway applied."""
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.reply = reply
    code = cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor)
    assert code == 1
    status = f"{reply.status} {HTTPStatus(reply.status).phrase}"
    assert capsys.readouterr().err.splitlines()[-1] == (
        "svcctl: the key file is changed but the gateway was not restarted: "
        f"HTTP {status} from POST {SUPERVISOR}{RESTART}" + ("" if end.startswith(":") else ", ") + end)
    assert len(supervisor.requests) == 1 and "enabled = false\n\n# a retired one" in keys.read_text()


def test_a_servers_words_in_the_line_are_shown_not_acted_on(keys, capsys, monkeypatch):
    """A regression probe: a stand-in supervisor's ``error`` and a redirect's ``Location`` holding escape sequences
    set the terminal's title and cleared its screen through svcctl's line. They are written as ``\\xNN`` now."""
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.reply = Reply(500, {"ok": False, "error": "boom \x1b]0;pwned\x07 \x1b[2J end\u2028"})
    assert cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "svcctl: the key file is changed but the gateway was not restarted: "
        f"HTTP 500 Internal Server Error from POST {SUPERVISOR}{RESTART}: boom \\x1b]0;pwned\\x07 \\x1b[2J end\\u2028")
    supervisor.reply = Reply(302, b"", location="http://evil/\x1b[2Jx")
    assert cli.main(["keys", "enable", "tenant-a", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor) == 1
    assert "redirected to http://evil/\\x1b[2Jx;" in capsys.readouterr().err


def test_an_interrupted_restart_says_the_file_is_changed(keys, capsys, monkeypatch):
    in_checkout(monkeypatch, keys)
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.react = lambda main: None  # the reactor stopped before the request was made
    code = cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor)
    assert code == 130
    assert capsys.readouterr().err == (f"svcctl: disabled key 'tenant-a' in {keys}\n"
                                       f"svcctl: {keys} has no enabled key left: a gateway that reads it accepts only its static tokens from its restart\n"
                                       "svcctl: interrupted: the key file is changed; the gateway restart may not "
                                       "have happened\n")
    assert supervisor.requests == []


def test_a_restart_interrupted_while_the_supervisor_is_silent_exits_130(keys, capsys, monkeypatch):
    """Ctrl-C during the restart request: "interrupted", not the connection the interrupt cut."""
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.reply = Reply(stall="interrupt")
    code = cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor)
    assert code == 130
    assert capsys.readouterr().err.splitlines()[-1] == ("svcctl: interrupted: the key file is changed; the gateway "
                                                        "restart may not have happened")
    assert len(supervisor.requests) == 1 and "enabled = false" in keys.read_text()


def test_an_unreachable_supervisor_is_one_line_exit_2_and_the_file_stays_changed(keys):
    url = f"http://127.0.0.1:{free_port()}"
    done = svcctl("keys", "disable", "tenant-a", "--keys-file", str(keys), "--supervisor", url,
                  env={"SERVICE_API_TOKEN": MANAGEMENT})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"svcctl: disabled key 'tenant-a' in {keys}\n"
                           f"svcctl: {keys} has no enabled key left: a gateway that reads it accepts only its static "
                           "tokens from its restart\n"
                           "svcctl: the key file is changed but the gateway was not restarted: "
                           f"POST {url}{RESTART}: connection refused (is the supervisor running?)\n")
    assert "enabled = false\n\n# a retired one" in keys.read_text() and mode(keys) == 0o600


def test_edits_made_at_the_same_time_all_land(keys):
    """A probe ran six ``svcctl keys add`` at once: all said "added", two keys were not in the file (their holders
    got 401), and a ``disable`` run beside an ``add`` said "disabled" while the key stayed enabled. Each edit now
    takes the file's lock for its read, change and write: eight real processes at once, every edit is kept."""
    import subprocess
    import sys

    from tests.support.processes import REPO, child_env

    def svcctl_process(*args):
        return subprocess.Popen([sys.executable, "-m", "svc.cli", "keys", *args, "--no-restart", "--keys-file",
                                 str(keys)], cwd=REPO, env=child_env({}), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    runs = [svcctl_process("add", f"k{i}") for i in range(7)] + [svcctl_process("disable", "tenant-a")]
    results = [(run.wait(120), run.stderr.read().decode()) for run in runs]
    assert [code for code, _ in results] == [0] * 8, results
    entries = {entry.name: entry for entry in load_key_file(str(keys))}
    assert sorted(entries) == sorted(["tenant-a", "old"] + [f"k{i}" for i in range(7)])
    assert entries["tenant-a"].enabled is False
    assert "Keep this comment." in keys.read_text()


def test_a_folder_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    blocker = tmp_path / "conf"
    blocker.write_text("a file where the folder should be")
    path = blocker / "api_keys.toml"
    assert cli.main(["keys", "add", "k1", "--keys-file", str(path), "--no-restart"]) == 2
    assert capsys.readouterr() == ("", f"svcctl: {path}: no folder {blocker} (nothing written): create it, or check "
                                       "the path\n")


@pytest.mark.parametrize("action", [["add", "k1"], ["disable", "tenant-a"]])
def test_a_keys_file_in_a_missing_folder_is_refused_and_nothing_is_made(tmp_path, capsys, monkeypatch, action):
    """``--keys-file /path/typo/api_keys.toml`` made the missing folders, wrote a new file there, restarted the
    gateway and said it applied the change, exit 0: the gateway read another file and answered the key 401."""
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    path = tmp_path / "typo" / "conf" / "api_keys.toml"
    assert cli.main(["keys", *action, "--keys-file", str(path), "--supervisor", SUPERVISOR], client=supervisor) == 2
    assert capsys.readouterr() == ("", f"svcctl: {path}: no folder {path.parent} (nothing written): create it, or "
                                       "check the path\n")
    assert list(tmp_path.iterdir()) == [] and supervisor.requests == []


def test_a_keys_file_that_is_a_loop_of_symbolic_links_is_refused_and_stays_a_link(tmp_path, capsys):
    """A ``--keys-file`` that is a symbolic link loop was replaced by a regular file holding the new key."""
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    one.symlink_to(two)
    two.symlink_to(one)
    for action in (["add", "k1"], ["disable", "k1"], ["list"]):
        extra = ["--no-restart"] if action[0] != "list" else []
        assert cli.main(["keys", *action, "--keys-file", str(one), *extra]) == 2
        assert capsys.readouterr() == ("", f"svcctl: {one}: a loop of symbolic links (nothing written): give the "
                                           "key file itself\n")
    assert one.is_symlink() and two.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["one.toml",
                                                                                                    "two.toml"]


def test_a_keys_file_that_the_gateway_does_not_read_is_not_said_to_apply(keys, tmp_path, capsys, monkeypatch):
    """An edit of another file than the gateway's ``[gateway] keys_file`` said "the gateway restarted and applies
    the change": it names the file the gateway reads instead."""
    in_checkout(monkeypatch, keys)
    other = tmp_path / "other.toml"
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.reply = Reply(200, {"ok": True})
    assert cli.main(["keys", "add", "k1", "--keys-file", str(other), "--supervisor", SUPERVISOR],
                    client=supervisor) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (f"svcctl: the gateway restarted, but it reads "
                                                        f"conf/api_keys.toml, not {other}: the change does not apply "
                                                        "to it")
    assert cli.main(["keys", "disable", "k1", "--keys-file", str(other), "--no-restart"]) == 0
    assert capsys.readouterr().err == (f"svcctl: disabled key 'k1' in {other}\nsvcctl: {other} has no enabled key left: "
                                       "a gateway that reads it accepts only its static tokens from its restart\n"
                                       "svcctl: not restarted (--no-restart); "
                                       f"the gateway reads conf/api_keys.toml, not {other}: the change does not "
                                       "apply to it\n")
    assert keys.read_text() == ORIGINAL and len(supervisor.requests) == 2  # the restart, then the status


def test_the_key_file_the_supervisor_names_decides_not_a_configuration_here(keys, tmp_path, capsys, monkeypatch):
    """An upgrade probe: a supervisor run with ``--config`` elsewhere, and ``svcctl keys add --keys-file <its key
    file>`` run in the checkout, whose conf/service.toml names conf/api_keys.toml: "the gateway restarted, but it
    reads conf/api_keys.toml ... does not apply", while the key worked.  The supervisor's status names the file its
    gateway reads; that decides, either way."""
    in_checkout(monkeypatch, keys)  # this folder's configuration names ``keys``
    deployed = tmp_path / "deploy" / "api_keys.toml"
    deployed.parent.mkdir()
    deployed.write_text(ORIGINAL)
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    supervisor = FakeClient()
    supervisor.script = [Reply(200, {"ok": True}), Reply(200, {"gateway": {"keys_file": str(deployed)}})]
    assert cli.main(["keys", "add", "k1", "--keys-file", str(deployed), "--supervisor", SUPERVISOR],
                    client=supervisor) == 0
    assert capsys.readouterr().err.splitlines()[-1] == "svcctl: the gateway restarted and applies the change"
    supervisor.script = [Reply(200, {"ok": True}), Reply(200, {"gateway": {"keys_file": str(deployed)}})]
    assert cli.main(["keys", "add", "k2", "--keys-file", str(keys), "--supervisor", SUPERVISOR],
                    client=supervisor) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (f"svcctl: the gateway restarted, but it reads {deployed}, "
                                                        f"not {keys}: the change does not apply to it")


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_a_key_that_cannot_be_printed_is_not_added(keys, unbuffered):
    """``keys add`` wrote the entry first and printed the key after: with its stdout gone (``| true``) or full, the
    file held a working key whose secret nobody had. The key is printed and flushed first; a failure writes nothing."""
    from tests.unit.test_cli_entry import FULL, no_reader, run_to

    with no_reader() as stdout:
        assert run_to(stdout, "keys", "add", "lost", "--keys-file", str(keys), "--no-restart",
                      unbuffered=unbuffered) == (141, "")
    with open("/dev/full", "w") as full:
        assert run_to(full.fileno(), "keys", "add", "lost", "--keys-file", str(keys), "--no-restart",
                      unbuffered=unbuffered) == (2, FULL)
    assert keys.read_text() == ORIGINAL and sorted(os.listdir(keys.parent)) == ["api_keys.toml"]


@pytest.mark.parametrize("command", [["keys", "add", "big"], ["keygen", "big"]])
def test_a_qps_the_key_file_refuses_is_refused_before_anything_is_made(keys, capsys, command):
    """``--qps 2000000000000`` was taken: the entry was written, the gateway's restart answered 500 and every
    ``keys`` command failed on the file after it. The key-file loader's bound is the argument's, at parse time."""
    from svc.config import INT_MAXIMUM

    where = ["--keys-file", str(keys), "--no-restart"] if command[0] == "keys" else []
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--qps", str(INT_MAXIMUM + 1), *where])
    out, err = capsys.readouterr()
    assert (exit_.value.code, out) == (2, "")
    assert err.endswith(f"error: argument --qps: a key's rate_limit_qps must be at most {INT_MAXIMUM}, "
                        f"got {INT_MAXIMUM + 1}\n")
    assert keys.read_text() == ORIGINAL
    assert cli.main([*command, "--qps", str(INT_MAXIMUM), *where]) == 0  # the most the file takes
    if command[0] == "keys":
        assert load_key_file(str(keys))[-1].rate_limit_qps == INT_MAXIMUM


def test_the_restart_reaches_a_supervisor_on_an_ipv6_address(keys, monkeypatch):
    """``keys add --supervisor http://[::1]:PORT`` changed the file and then failed to ask for the restart (treq
    refuses an IPv6 literal host): the supervisor on ::1 gets the request, with its management token."""
    from tests.unit.test_cli import accept_request_head, finish, listener, need_ipv6_loopback, start

    need_ipv6_loopback()
    in_checkout(monkeypatch, keys)  # the process runs there too
    with listener("::1") as (server, url):
        proc = start("keys", "disable", "tenant-a", "--keys-file", str(keys), "--supervisor", url,
                     env={"SERVICE_API_TOKEN": MANAGEMENT})
        conn, head = accept_request_head(server)
        with conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n"
                         b'{"ok": true}')
            done = finish(proc)
    assert (done.returncode, done.stderr.splitlines()[-1]) == (0, "svcctl: the gateway restarted and applies the "
                                                                  "change")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0] == f"POST {RESTART} HTTP/1.1" and f"Authorization: Bearer {MANAGEMENT}" in lines


def test_a_key_file_that_is_a_symbolic_link_is_written_through_it(keys, tmp_path, monkeypatch, capsys):
    """``--keys-file LINK`` replaced the link by a regular file (the rename), and the file it named, which the
    gateway may read, kept the old keys. The file it names is replaced, by a rename in its own folder."""
    link = tmp_path / "elsewhere" / "keys.toml"
    link.parent.mkdir()
    link.symlink_to(keys)
    renames = []
    real_replace = os.replace

    def replace(source, target):
        renames.append((os.path.dirname(source), target))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    assert cli.main(["keys", "add", "via-link", "--keys-file", str(link), "--no-restart"]) == 0
    key = capsys.readouterr().out.strip()
    assert link.is_symlink() and os.readlink(link) == str(keys)
    assert keys.read_text() == ORIGINAL + "\n" + key_entry("via-link", hash_key(key)) and mode(keys) == 0o600
    assert renames == [(str(keys.parent), str(keys))]
    assert sorted(os.listdir(keys.parent)) == ["api_keys.toml"] and os.listdir(link.parent) == ["keys.toml"]


def test_a_bad_supervisor_url_from_the_environment_names_the_variable(keys, capsys, monkeypatch):
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    monkeypatch.setenv("SERVICE_SUPERVISOR_URL", "supervisor:8787")
    assert cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys)]) == 2
    assert capsys.readouterr() == ("", "svcctl: SERVICE_SUPERVISOR_URL (the default of --supervisor) must be an "
                                       "http:// or https:// URL, got 'supervisor:8787'\n")
    assert keys.read_text() == ORIGINAL


@pytest.mark.parametrize("url", ["http://admin:hunter2secret@127.0.0.1:8787", "http://admin@127.0.0.1:8787/x"])
def test_a_supervisor_url_with_credentials_is_refused_without_them_and_the_file_unchanged(keys, capsys, monkeypatch,
                                                                                          url):
    """svcctl sends its token in Authorization; ``user:password@`` in the URL failed inside the HTTP client
    ("ValueError: invalid hostname") with the password in the line, after the key file had changed."""
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    assert cli.main(["keys", "add", "k9", "--keys-file", str(keys), "--supervisor", url]) == 2
    shown = url.replace("admin:hunter2secret@", "").replace("admin@", "")
    assert capsys.readouterr() == ("", "svcctl: --supervisor must be a URL without a user name or password (svcctl "
                                       f"sends its token in Authorization), got {shown!r} with them (not shown)\n")
    assert keys.read_text() == ORIGINAL


def test_without_a_flag_or_variable_the_restart_goes_to_the_supervisor_this_folders_config_names(keys, capsys,
                                                                                                 monkeypatch):
    """With the supervisor on 18787 in conf/service.toml, ``keys add`` sent the management token to
    127.0.0.1:8787, whatever listened there (secrets probe)."""
    (keys.parent / "service.toml").write_text('[supervisor]\nport = 18787\n')
    monkeypatch.chdir(keys.parent.parent)
    monkeypatch.delenv("SERVICE_SUPERVISOR_URL", raising=False)
    monkeypatch.setenv("SERVICE_API_TOKEN", MANAGEMENT)
    client = FakeClient()
    client.reply = Reply(200, {"ok": True})
    assert cli.main(["keys", "disable", "tenant-a", "--keys-file", str(keys)], client=client) == 0
    assert [(r.method, r.url) for r in client.requests] == [("POST", f"http://127.0.0.1:18787{RESTART}"),
                                                            ("GET", "http://127.0.0.1:18787/api/v1/status")]


def test_add_into_a_folder_it_cannot_write_shows_no_key(capsys, monkeypatch):
    """The key was printed, then "cannot write": a key handed out that is stored nowhere (non-root probe, a folder
    not the user's).  /proc is a folder where no file can be made, for root too."""
    monkeypatch.delenv("SERVICE_API_TOKEN", raising=False)
    assert cli.main(["keys", "add", "k3", "--keys-file", "/proc/svc-test-keys.toml", "--no-restart"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("svcctl: cannot write /proc/svc-test-keys.toml: ") and err.count("\n") == 1
