"""First-run secrets of bin/quickstart."""

import hashlib
import io
import os
import stat

from svc.quickstart import KEY_FILE, SECRETS, prepare, read_env_file


def test_prepare_creates_private_distinct_secrets_and_a_first_key_once(tmp_path):
    out = io.StringIO()
    values = prepare(str(tmp_path), out)
    secrets_path, key_path = tmp_path / SECRETS, tmp_path / KEY_FILE
    for path in (secrets_path, key_path):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_env_file(str(secrets_path)) == values
    tokens = [values[k] for k in ("SERVICE_API_TOKEN", "SERVICE_GATEWAY_AUTH_TOKEN", "SERVICE_METRICS_TOKEN", "SERVICE_API_KEY")]
    assert len(set(tokens)) == 4 and all(len(t) == 64 for t in tokens)
    digest = hashlib.sha256(values["SERVICE_API_KEY"].encode()).hexdigest()
    assert f'hash = "{digest}"' in key_path.read_text()
    printed = out.getvalue()
    assert values["SERVICE_API_KEY"] in printed and str(secrets_path) in printed
    again = io.StringIO()
    assert prepare(str(tmp_path), again) == values and again.getvalue() == ""
    assert key_path.read_text().count("[keys.local]") == 1
