"""The quick start's first-run secrets: ``secrets/local.env`` and the first API key (``bin/quickstart``).

Why a module of its own: these files hold every token of a local service,
so how they are written matters.  Each is replaced in one rename, mode 0600
(``secrets/`` 0700 whatever the umask); a file that cannot be read or
written is one line, not a traceback; and a run whose secrets file was
removed replaces the first key in the key file instead of appending a
second ``[keys.local]``, which the gateway refused.
"""

from __future__ import annotations

import os
import secrets
import sys
from typing import TextIO

SECRETS = os.path.join("secrets", "local.env")
KEY_FILE = os.path.join("conf", "api_keys.toml")
FIRST_KEY_NAME = "local"


class QuickstartError(Exception):
    """One line saying why the quick start cannot go on (a secrets file it cannot read or write)."""


def _write_private(path: str, text: str) -> None:
    """``path`` replaced by ``text`` in one rename, mode 0600, in a folder of mode 0700 (whatever the umask:
    under ``umask 000`` the folder was 0777, and another user could swap in a secrets file of their own)."""
    from svc.cli.http import CliError
    from svc.cli.keyfile import write_atomically

    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        write_atomically(path, text)
    except OSError as e:
        raise QuickstartError(f"cannot write {path}: {e.strerror or e}") from None
    except CliError as e:
        raise QuickstartError(str(e)) from None


def read_env_file(path: str) -> dict[str, str]:
    values = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                name, _, value = line.partition("=")
                values[name.strip()] = value.strip()
    return values


#: What ``secrets/local.env`` holds.
SECRET_NAMES = ("SERVICE_API_TOKEN", "SERVICE_GATEWAY_AUTH_TOKEN", "SERVICE_METRICS_TOKEN", "SERVICE_API_KEY")


def read_secrets(path: str) -> dict[str, str]:
    """The secrets of an earlier run; QuickstartError (one line) for a file that cannot be read or lacks one."""
    try:
        values = read_env_file(path)
    except (OSError, UnicodeDecodeError) as e:
        raise QuickstartError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    missing = [name for name in SECRET_NAMES if not values.get(name)]
    if missing:
        raise QuickstartError(f"{path} has no {', '.join(missing)}: remove the file to generate new secrets "
                              f"(the key {FIRST_KEY_NAME!r} is then replaced by a new one)")
    return values


def key_file_of(root: str) -> str:
    """The key file the gateway of the checkout at ``root`` loads: ``[gateway] keys_file`` of its
    ``conf/service.toml`` (relative to ``root``), else ``conf/api_keys.toml``.  The first key went to
    ``conf/api_keys.toml`` whatever the file said, where no gateway read it."""
    from svc.cli.keyfile import default_keys_file

    return os.path.join(root, default_keys_file(os.path.join(root, "conf", "service.toml")))


def store_first_key(key_path: str, entry: str) -> bool:
    """Put ``[keys.local]`` (``entry``, svc.auth.issue_key's text) in the key file, replacing one an earlier
    run left (its secrets file removed): appended again, the duplicate table stopped the gateway.  True when
    it replaced one."""
    import tomlkit

    from svc.cli.http import CliError
    from svc.cli.keyfile import edit_lock, read_document, write_atomically

    try:
        with edit_lock(key_path):
            if os.path.exists(key_path):
                doc = read_document(key_path)
            else:
                doc = tomlkit.document()
                doc.add(tomlkit.comment("API keys of the gateway: [keys.<name>] with the SHA-256 of the key "
                                        "(svcctl keygen NAME)."))
                doc.add(tomlkit.nl())
            keys = doc.get("keys")
            replaced = keys is not None and FIRST_KEY_NAME in keys
            if keys is None:
                doc["keys"] = keys = tomlkit.table(is_super_table=True)
            keys[FIRST_KEY_NAME] = tomlkit.parse(entry)["keys"][FIRST_KEY_NAME]
            write_atomically(key_path, tomlkit.dumps(doc))
    except CliError as e:
        raise QuickstartError(str(e)) from None
    return replaced


def keep_private(secrets_path: str, out: TextIO) -> None:
    """The secrets of an earlier run made private again when others could reach them (one line): an install of
    0.12.0 or earlier made under ``umask 000`` kept a 0777 ``secrets/``, in which another user could swap in
    tokens of their own."""
    for path, private in ((os.path.dirname(secrets_path), 0o700), (secrets_path, 0o600)):
        try:
            info = os.stat(path)
            mode = info.st_mode & 0o777
            if info.st_uid != os.getuid() or not mode & 0o077:
                continue
            os.chmod(path, private)
        except OSError:
            continue  # not ours to change: reading it already worked
        print(f"quickstart: {path} was mode {mode:o}, open to other users: made {private:o}", file=out)


def check_first_key(api_key: str, key_path: str, secrets_path: str, out: TextIO) -> None:
    """Say (one line) when the first key of ``secrets_path`` is in no entry of the key file the gateway loads:
    an earlier version stored it in ``conf/api_keys.toml`` whatever ``[gateway] keys_file`` said, and the key
    the next-steps block names then gets 401.  It is not added behind the operator's back (they may have
    removed it on purpose)."""
    from svc.auth import hash_key, load_key_file
    from svc.config import ConfigError

    try:
        hashes = {entry.hash for entry in load_key_file(key_path)} if os.path.exists(key_path) else set()
    except ConfigError:
        return  # a key file that does not load: the gateway says so, in its own words
    if hash_key(api_key) not in hashes:
        print(f"quickstart: the SERVICE_API_KEY of {secrets_path} is in no entry of {key_path}, the key file the "
              f"gateway loads, so it gets 401: remove {secrets_path} to make new secrets and a key there, or add "
              f"one with svcctl keys add", file=out)


def running_supervisor(root: str) -> str | None:
    """The pid of a supervisor that holds the logs folder of the checkout at ``root`` (its lock,
    ``svc.supervisor.logsink``), or None.  Nothing is made: a folder or lock that is not there is no supervisor."""
    import fcntl

    from svc.supervisor.config import load_supervisor_config
    from svc.supervisor.logsink import LOCK_FILE

    try:
        log_dir = load_supervisor_config(os.path.join(root, "conf", "service.toml")).log_dir
        fd = os.open(os.path.join(root, log_dir, LOCK_FILE), os.O_RDONLY)
    except Exception:  # noqa: BLE001 - no readable config or lock: the supervisor's own start says what is wrong
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
    finally:
        os.close(fd)


def prepare(root: str = ".", out=sys.stdout, show_key: bool = True) -> dict[str, str]:
    """Create the secrets and the first key if there are none; the secrets as a dict.

    ``show_key`` False leaves the key to the next-steps block (the quick start
    shows it there, once); ``--prepare-only`` shows it here.  The key file
    is written before the secrets file: a run that fails between the two
    leaves no secrets, so the next run makes them again and replaces the key.
    """
    secrets_path = os.path.join(root, SECRETS)
    if os.path.lexists(secrets_path):
        values = read_secrets(secrets_path)
        keep_private(secrets_path, out)
        check_first_key(values["SERVICE_API_KEY"], key_file_of(root), secrets_path, out)
        return values
    if pid := running_supervisor(root):  # new secrets would replace the key it knows: both refused, the old gone
        raise QuickstartError(f"a service of this folder runs (its supervisor, pid {pid}, holds its logs folder): "
                              f"new secrets now would lock you out of it; stop it first (Ctrl-C in its terminal, or "
                              f"kill -TERM {pid}), then run this again to make them")
    from svc.auth import issue_key

    api_key, entry = issue_key(FIRST_KEY_NAME)
    values = {
        "SERVICE_API_TOKEN": secrets.token_hex(32),
        "SERVICE_GATEWAY_AUTH_TOKEN": secrets.token_hex(32),
        "SERVICE_METRICS_TOKEN": secrets.token_hex(32),
        "SERVICE_API_KEY": api_key,
    }
    key_path = key_file_of(root)
    replaced = store_first_key(key_path, entry)
    _write_private(
        secrets_path,
        "# Local secrets of the inference service (mode 0600). Generated by bin/quickstart.\n"
        + "".join(f"{name}={value}\n" for name, value in values.items()),
    )
    done = "replaced the key '{}' in {} (its old key no longer works)" if replaced else "added the key '{}' to {}"
    print(f"Generated {secrets_path} (mode 0600) and {done.format(FIRST_KEY_NAME, key_path)}.", file=out)
    if show_key:
        print("Your first API key (shown once; it is also in the secrets file):", file=out)
        print(f"  {values['SERVICE_API_KEY']}", file=out)
    return values
