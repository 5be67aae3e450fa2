"""Gateway credentials: the key file, the startup mode and its refusals, the per-request check."""

from __future__ import annotations

import os

import pytest

from svc.auth import (
    MANAGEMENT_TOKEN_NAME,
    STATIC_TOKEN_NAME,
    Refused,
    decide,
    hash_key,
    load_key_file,
    load_trusted_key_file,
)
from svc.config import ConfigError
from svc.gateway.credentials import Authenticator, Principal, Unauthorized
from svc.infra.binds import bind_problem

KEY_A, KEY_B = "a" * 64, "b" * 64
ENV = {"SERVICE_METRICS_TOKEN": "metrics-token-" + "m" * 16}


def keys_file(tmp_path, text):
    path = tmp_path / "api_keys.toml"
    path.write_text(text)
    return str(path)


def entry(name, key, extra=""):
    return f'[keys.{name}]\nhash = "{hash_key(key)}"\n{extra}\n'


def test_hash_is_lowercase_sha256_hex():
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_key_file_defaults_and_fields(tmp_path):
    path = keys_file(tmp_path, entry("a", KEY_A) + entry("b", KEY_B, 'scope = "all"\nrate_limit_qps = 5\nenabled = false'))
    a, b = load_key_file(path)
    assert (a.name, a.hash, a.scope, a.rate_limit_qps, a.enabled) == ("a", hash_key(KEY_A), "inference", 0, True)
    assert (b.name, b.scope, b.rate_limit_qps, b.enabled) == ("b", "all", 5, False)


@pytest.mark.parametrize("text, key, problem", [
    ('[keys.a]\nscope = "inference"\n', "keys.a.hash", "required key is missing"),
    ('[keys.a]\nhash = "ABC"\n', "keys.a.hash", "must match [0-9a-f]{64}"),
    (f'[keys.a]\nhash = "{"A" * 64}"\n', "keys.a.hash", "must match"),
    (entry("a", KEY_A, 'scope = "root"'), "keys.a.scope", "must be one of 'inference', 'admin', 'all'"),
    (entry("a", KEY_A, "rate_limit_qps = -1"), "keys.a.rate_limit_qps", "must be at least 0"),
    (entry("a", KEY_A, 'rate_limit_qps = "5"'), "keys.a.rate_limit_qps", "must be an integer"),
    (entry("a", KEY_A, 'enabled = "yes"'), "keys.a.enabled", "must be a boolean"),
    (entry("a", KEY_A, 'owner = "bob"'), "keys.a.owner", "unknown key"),
    (entry("a", KEY_A) + entry("b", KEY_A), "keys.b.hash", "the same hash as keys.a"),
    (entry('"static-token"', KEY_A), "keys.static-token", "reserved"),
    (entry('"bad name"', KEY_A), "keys.bad name", "key name must be"),
    ('title = "x"\n', "title", "unknown table or key"),
    ("keys = 3\n", "keys", "must be a table"),
])
def test_key_file_errors_name_the_key(tmp_path, text, key, problem):
    with pytest.raises(ConfigError) as e:
        load_key_file(keys_file(tmp_path, text))
    assert e.value.key == key and problem in e.value.problem


def test_a_bad_hash_is_refused_without_echoing_it(tmp_path):
    """A raw key pasted as ``hash`` was echoed whole (``got 'sk-live-...'``) into the restart's 500, the
    supervisor's log and the gateway's last_error: the line gives its length only."""
    pasted = "sk-live-" + "Q" * 40
    with pytest.raises(ConfigError) as e:
        load_key_file(keys_file(tmp_path, f'[keys.eve]\nhash = "{pasted}"\n'))
    assert (e.value.key, e.value.problem) == ("keys.eve.hash",
                                              "must match [0-9a-f]{64}, got a value of 48 characters (not shown)")
    assert "QQQQ" not in str(e.value)


def test_key_file_parse_error_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_key_file(keys_file(tmp_path, "[keys.a\n"))
    with pytest.raises(ConfigError, match="file not found"):
        load_key_file(str(tmp_path / "nope.toml"))


def test_a_key_file_that_is_a_dangling_link_is_named_as_one(tmp_path):
    """It was "no key file: static-token mode", as if no file had been configured (non-root probe)."""
    link = tmp_path / "api_keys.toml"
    link.symlink_to(tmp_path / "moved" / "keys.toml")
    with pytest.raises(ConfigError) as e:
        load_key_file(str(link))
    assert e.value.problem == f"a symbolic link to {tmp_path / 'moved' / 'keys.toml'}, which does not exist"
    setup = decide({"SERVICE_GATEWAY_AUTH_TOKEN": "g" * 32, "SERVICE_METRICS_TOKEN": "m" * 32}, str(link))
    assert setup.mode == "static-token"
    assert setup.warnings == (f"the key file cannot be used ({e.value}): static-token mode, only "
                              "SERVICE_GATEWAY_AUTH_TOKEN or SERVICE_API_TOKEN is accepted",)


@pytest.mark.parametrize("change, problem", [
    (lambda path: os.chmod(path, 0o666), "is writable by other users (mode 666)"),
    (lambda path: os.chmod(path, 0o620), "is writable by other users (mode 620)"),
    (lambda path: os.chown(path, 65534, 65534), "is owned by another user (uid 65534)"),
], ids=["others", "group", "owner"])
def test_a_key_file_another_user_could_write_is_not_used(tmp_path, change, problem):
    """A security probe: a key file owned by nobody and mode 666 was loaded without a word, so any local user could
    add an API key. It cannot be used, as a compiled package so placed is not loaded: static-token mode with the
    reason, as for any key file that cannot be used (and the supervisor starts no gateway on it)."""
    path = keys_file(tmp_path, entry("a", KEY_A))
    os.chmod(path, 0o600)
    assert [k.name for k in load_trusted_key_file(path)] == ["a"]
    change(path)
    assert [k.name for k in load_key_file(path)] == ["a"]  # svcctl keys edits it (root edits the service user's)
    with pytest.raises(ConfigError) as e:
        load_trusted_key_file(path)
    assert e.value.problem == (f"{problem}: another user could add an API key to it; give it to this user (uid "
                               f"{os.getuid()}) or root, writable by its owner only (chmod 600)")
    setup = decide({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": "tok"}, path)
    assert setup.mode == "static-token" and setup.warnings[0].startswith(f"the key file cannot be used ({e.value})")
    link = tmp_path / "link.toml"  # a link to it is judged by its target too
    link.symlink_to(path)
    with pytest.raises(ConfigError, match="another user could add an API key"):
        load_trusted_key_file(str(link))


def test_a_key_name_with_control_characters_is_named_escaped(tmp_path):
    """A security probe: ``[keys."evil\u001b[2J..."]`` reached the gateway's text log with raw escape bytes (the
    terminal cleared, a fake line written) in its warning."""
    path = keys_file(tmp_path, '[keys."evil\\u001b[2J\\nFAKE"]\nhash = "' + "a" * 64 + '"\n')
    with pytest.raises(ConfigError) as e:
        load_key_file(path)
    assert str(e.value).startswith(f"{path}: keys.evil\\x1b[2J\\nFAKE: key name must be ")
    assert str(e.value).isprintable()
    odd = tmp_path / "keys\x1b[31m.toml"  # a path with them (the regression probe's doubt)
    odd.write_text("[keys.a\n")
    with pytest.raises(ConfigError) as e:
        load_key_file(str(odd))
    assert str(e.value).startswith(f"{tmp_path}/keys\\x1b[31m.toml: not valid TOML") and str(e.value).isprintable()


def test_comment_only_file_is_zero_keys(tmp_path):
    assert load_key_file(keys_file(tmp_path, "# nothing yet\n\n")) == []


# -- startup mode (docs/contract.md, Authentication) ----------------------------------------


def test_api_keys_mode_when_the_file_has_keys(tmp_path):
    setup = decide(ENV, keys_file(tmp_path, entry("a", KEY_A)))
    assert setup.mode == "api-keys" and [k.name for k in setup.keys] == ["a"] and setup.warnings == ()
    assert setup.gateway_token is None and setup.api_token is None


def test_static_token_mode_without_a_key_file(tmp_path):
    setup = decide({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": "tok"}, str(tmp_path / "missing.toml"))
    assert setup.mode == "static-token" and setup.keys == () and "no key file" in setup.warnings[0]


def test_management_token_alone_is_a_static_token(tmp_path):
    setup = decide({**ENV, "SERVICE_API_TOKEN": "mgmt"}, str(tmp_path / "missing.toml"))
    assert setup.mode == "static-token" and setup.api_token == "mgmt"


def test_empty_key_file_with_a_token_warns(tmp_path):
    setup = decide({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": "tok"}, keys_file(tmp_path, "# none\n"))
    assert setup.mode == "static-token" and "has no keys" in setup.warnings[0]


def test_broken_key_file_with_a_token_falls_back_with_a_warning(tmp_path):
    setup = decide({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": "tok"}, keys_file(tmp_path, "[keys.a\n"))
    assert setup.mode == "static-token" and "cannot be used" in setup.warnings[0]


@pytest.mark.parametrize("env, text, reason", [
    (ENV, None, "no API key file at"),
    (ENV, "# comments only\n", "has no keys and neither SERVICE_GATEWAY_AUTH_TOKEN or SERVICE_API_TOKEN is set"),
    (ENV, "[keys.a\n", "the key file cannot be used and no static token is set"),
    (ENV, '[keys.a]\nhash = "x"\n', "the key file cannot be used and no static token is set"),
    ({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": ""}, None, "no API key file at"),
    ({}, 'ok', "SERVICE_METRICS_TOKEN is not set"),
    ({"SERVICE_METRICS_TOKEN": "same", "SERVICE_GATEWAY_AUTH_TOKEN": "same"}, None,
     "SERVICE_METRICS_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN"),
    ({"SERVICE_METRICS_TOKEN": "same", "SERVICE_API_TOKEN": "same"}, None, "SERVICE_METRICS_TOKEN equals SERVICE_API_TOKEN"),
    # A security probe: the inference token equal to the management token opened the supervisor to its holders.
    ({**ENV, "SERVICE_API_TOKEN": "same", "SERVICE_GATEWAY_AUTH_TOKEN": "same"}, "ok",
     "SERVICE_API_TOKEN equals SERVICE_GATEWAY_AUTH_TOKEN: the management token opens the supervisor and must differ "
     "from the inference token"),
    # A fail-closed probe: a token no client can send was taken, and every request was then 401.
    ({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": "   "}, None,
     "SERVICE_GATEWAY_AUTH_TOKEN has only spaces: a token must be printable ASCII without spaces"),
    ({**ENV, "SERVICE_API_TOKEN": "two words"}, None, "SERVICE_API_TOKEN has a space, a control or a non-ASCII"),
    ({**ENV, "SERVICE_API_TOKEN": "tökén-abc"}, None, "SERVICE_API_TOKEN has a space, a control or a non-ASCII"),
    ({"SERVICE_METRICS_TOKEN": "  "}, "ok", "SERVICE_METRICS_TOKEN has only spaces"),
    ({**ENV, "SERVICE_CLUSTER_TOKEN": "\tx"}, "ok", "SERVICE_CLUSTER_TOKEN has a space, a control or a non-ASCII"),
    # Every key of the file disabled and no static token: no credential would be accepted.
    (ENV, "disabled", "has no enabled key and neither SERVICE_GATEWAY_AUTH_TOKEN or SERVICE_API_TOKEN is set"),
])
def test_startup_refusals(tmp_path, env, text, reason):
    text = {"ok": entry("a", KEY_A), "disabled": entry("a", KEY_A) + "enabled = false\n"}.get(text, text)
    path = keys_file(tmp_path, text) if text is not None else str(tmp_path / "x.toml")
    with pytest.raises(Refused) as e:
        decide(env, path)
    assert reason in str(e.value)
    assert "\n" not in str(e.value)


def test_the_management_token_cannot_be_an_api_key(tmp_path):
    """A security probe: ``SERVICE_API_TOKEN`` equal to an inference key was accepted, and that key then opened the
    supervisor, where docs/processes.md says no key ever does.  The gateway refuses to start (a restart with such a
    key file is refused, and the running gateway stays)."""
    path = keys_file(tmp_path, entry("a", KEY_A) + entry("b", KEY_B))
    with pytest.raises(Refused) as e:
        decide({**ENV, "SERVICE_API_TOKEN": KEY_A}, path)
    assert str(e.value) == (f"SERVICE_API_TOKEN is the API key a of {path}: the management token opens the "
                            "supervisor, which no key may")
    assert decide({**ENV, "SERVICE_API_TOKEN": "another"}, path).mode == "api-keys"


def test_the_metrics_token_cannot_be_an_api_key(tmp_path):
    """One string must not both call the models and read /metrics: a key is an inference credential too."""
    path = keys_file(tmp_path, entry("a", KEY_A) + entry("b", KEY_B))
    with pytest.raises(Refused) as e:
        decide({"SERVICE_METRICS_TOKEN": KEY_B}, path)
    assert str(e.value) == (f"SERVICE_METRICS_TOKEN is the API key b of {path}: the metrics token must differ from "
                            "every inference credential")
    assert decide(ENV, path).mode == "api-keys"


def test_the_static_token_cannot_be_an_api_key(tmp_path):
    """A config probe: ``SERVICE_GATEWAY_AUTH_TOKEN`` equal to a disabled key was accepted without a word, and every
    request with it was then 401 (keys are checked first); equal to an enabled key it was that key, with its
    limits.  The gateway refuses to start, as for the management and metrics tokens."""
    path = keys_file(tmp_path, entry("a", KEY_A) + entry("b", KEY_B) + "enabled = false\n")
    for key, name in ((KEY_B, "b"), (KEY_A, "a")):
        with pytest.raises(Refused) as e:
            decide({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": key}, path)
        assert str(e.value) == (f"SERVICE_GATEWAY_AUTH_TOKEN is the API key {name} of {path}: a key is checked "
                                "first, so the static token would be that key (refused while it is disabled, and "
                                "limited as it is): remove the key (svcctl keys remove), or change the token")
    assert decide({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": "another"}, path).mode == "api-keys"


@pytest.mark.parametrize("host, expose, refused", [
    ("0.0.0.0", None, True), ("::", None, True), ("0.0.0.0", "yes", True), ("0.0.0.0", "docker", False),
    ("::", "unsafe", False), ("127.0.0.1", None, False), ("::1", None, False),
    # the other spellings the socket layer binds to every address
    ("0", None, True), ("0.0", None, True), ("0x0", None, True), ("::0", None, True), ("[::0]", None, True),
    ("0:0:0:0:0:0:0:0", None, True), ("::ffff:0.0.0.0", None, True), (" 0.0.0.0 ", None, True), ("*", None, True),
    ("0", "docker", False), ("::0", "unsafe", False),
    # addresses and names that are not a wildcard
    ("127.0.0.2", None, False), ("[::1]", None, False), ("::ffff:127.0.0.1", None, False), ("1", None, False),
    ("localhost", None, False), ("no-such-host.invalid", None, False),
])
def test_wildcard_bind_needs_service_expose(host, expose, refused):
    env = {"SERVICE_EXPOSE": expose} if expose else {}
    assert (bind_problem(host, env, "the gateway") is not None) is refused


# -- per request ---------------------------------------------------------------------------------


def authenticator(tmp_path, text, **tokens):
    return Authenticator(decide({**ENV, **tokens}, keys_file(tmp_path, text)))


def test_keys_first_then_static_tokens(tmp_path):
    auth = authenticator(tmp_path, entry("tenant", KEY_A, "rate_limit_qps = 3"),
                         SERVICE_GATEWAY_AUTH_TOKEN="static", SERVICE_API_TOKEN="mgmt")
    assert auth.authenticate(KEY_A) == Principal("tenant", 3)
    assert auth.authenticate("static") == Principal(STATIC_TOKEN_NAME)
    assert auth.authenticate("mgmt") == Principal(MANAGEMENT_TOKEN_NAME)


@pytest.mark.parametrize("scope", ["inference", "admin", "all"])
def test_every_scope_is_accepted_for_inference(tmp_path, scope):
    auth = authenticator(tmp_path, entry("k", KEY_A, f'scope = "{scope}"'))
    assert auth.authenticate(KEY_A).name == "k"


def test_wrong_missing_and_disabled_credentials(tmp_path):
    auth = authenticator(tmp_path, entry("on", KEY_A) + entry("off", KEY_B, "enabled = false"))
    for bearer, reason in ((None, "missing"), ("", "missing"), ("nope", "wrong"), (KEY_A.upper(), "wrong"),
                           ("metrics-tok", "wrong")):
        with pytest.raises(Unauthorized, match=reason) as e:
            auth.authenticate(bearer)
        assert e.value.key is None
    with pytest.raises(Unauthorized, match="disabled") as e:
        auth.authenticate(KEY_B)
    assert e.value.key == "off"


def test_unset_static_tokens_never_authorize(tmp_path):
    auth = authenticator(tmp_path, entry("on", KEY_A), SERVICE_GATEWAY_AUTH_TOKEN="")
    for bearer in ("", " ", "None", "null"):
        with pytest.raises(Unauthorized):
            auth.authenticate(bearer)


@pytest.mark.parametrize("token, warned", [("a", True), ("a" * 15, True), ("a" * 16, False)])
def test_a_static_token_under_16_characters_is_warned_of_at_start(tmp_path, token, warned):
    """A one-character SERVICE_GATEWAY_AUTH_TOKEN started the gateway without a word (a security probe): a warning
    per short token, among the setup's (the gateway logs them); the gateway still starts."""
    setup = decide({**ENV, "SERVICE_GATEWAY_AUTH_TOKEN": token}, keys_file(tmp_path, entry("a", KEY_A)))
    expected = (f"SERVICE_GATEWAY_AUTH_TOKEN has {len(token)} character{'s' if len(token) > 1 else ''}: a token that "
                "short can be guessed; use 32 random characters or more (svcctl keygen makes 64)",)
    assert (setup.mode, setup.warnings) == ("api-keys", expected if warned else ())


def test_only_the_metrics_token_reads_metrics(tmp_path):
    auth = authenticator(tmp_path, entry("on", KEY_A), SERVICE_GATEWAY_AUTH_TOKEN="static", SERVICE_API_TOKEN="mgmt")
    assert auth.is_metrics(ENV["SERVICE_METRICS_TOKEN"])
    assert not any(auth.is_metrics(t) for t in (None, "", "static", "mgmt", KEY_A, ENV["SERVICE_METRICS_TOKEN"][:-1]))


def test_pool_idle_timeout_stays_below_every_model():
    from svc.gateway.catalog import Catalog, Upstream

    catalog = Catalog([Upstream("A", 1, "/a", False, None, 600), Upstream("B", 2, "/b", False, None, 20)])
    assert catalog.pool_idle_timeout(30) == 10.0
    assert catalog.pool_idle_timeout(5) == 5
    assert Catalog([]).pool_idle_timeout(30) == 30


def test_models_whose_connections_the_gateway_alone_can_fill_are_named():
    from svc.gateway.catalog import Catalog, Upstream

    catalog = Catalog([Upstream("A", 1, "/a", False, None, max_connections=1024),
                       Upstream("B", 2, "/b", False, None, max_connections=40)])
    assert catalog.connection_problems(64, 512) == [
        "B: max_connections 40 is not above the gateway's upstream_max_connections 64: its idle pooled connections "
        "can fill the model server",
        "B: max_connections 40 is not above key_max_in_flight 512: one key's requests can take every connection"]
    assert catalog.connection_problems(16, 32) == []
    assert [p.split(":")[0] for p in catalog.connection_problems(16, 0)] == ["A", "B"]  # no limit: any key can
