"""``svcctl keys add|disable|enable|remove|list``: edit the gateway's key file, then have the gateway reload it.

Why it exists: issuing a key used to be ``svcctl keygen``, pasting its entry
into ``conf/api_keys.toml`` by hand, and a ``curl`` to the supervisor.  These
commands do the three steps:

* the file is edited with tomlkit, so its comments, order and layout stay as
  they were; the new entry is the one ``svcctl keygen`` prints
  (:func:`svc.auth.issue_key`), and the name is checked by
  :func:`svc.auth.check_key_name`;
* the file is checked with the gateway's own loader before it is changed,
  under a lock that concurrent ``svcctl keys`` runs take in turn, and written atomically (a temporary file in the same folder, flushed,
  then renamed over it) with mode 0600, so the gateway never reads half a
  file and other users never read the hashes;
* then the supervisor restarts the gateway (``POST
  /api/v1/servers/__gateway/restart`` with the management token
  ``SERVICE_API_TOKEN``, svc.cli.gateway_restart), which loads the file at
  startup, and says whether that is the file edited.  With ``--no-restart``
  the change waits for the next restart.

Exit status: 0 on success; 1 when the supervisor answers the restart with an
error status; 2 for a refused change (bad or duplicate name, unknown key,
unreadable or invalid file) and when the restart cannot be asked for (no
token, supervisor unreachable): the file then stays changed, and one line
says so.  ``keys list`` prints name, scope, qps and enabled, never a hash; it exits 1, with the gateway's
reason in one line, for a file the gateway refuses (another user could write it).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tomlkit

from svc.auth import (
    API_TOKEN_ENV,
    SCOPES,
    KeyEntry,
    UntrustedKeyFile,
    check_key_name,
    issue_key,
    load_key_file,
    load_trusted_key_file,
)
from svc.cli.args import checked_token, gateway_table, key_qps
from svc.cli.gateway_restart import DEFAULT_SUPERVISOR, SUPERVISOR_ENV, restart_call, restart_gateway
from svc.cli.http import EXIT_OK, EXIT_USAGE, Client, CliError, fail
from svc.cli.keyedits import CHANGES
from svc.config import ConfigError
from svc.contract.protocol import SERVICE_CONFIG

DEFAULT_KEYS_FILE = "conf/api_keys.toml"
#: ``keys list`` of a file the gateway refuses (:func:`gateway_refusal`): its keys are listed, but none works.
EXIT_REFUSED = 1
#: The first lines of a key file that ``keys add`` creates.
NEW_FILE_HEADER = ("The gateway's API keys, one [keys.<name>] table per key "
                   "(svcctl keys add|disable|enable|remove|list).",
                   "Changes take effect when the gateway restarts: POST /api/v1/servers/__gateway/restart.")


def default_keys_file(service_config: str = SERVICE_CONFIG) -> str:
    """The gateway's ``keys_file`` from ``[gateway]`` of the service configuration, else ``conf/api_keys.toml``.

    The same file the gateway loads when started from the same folder; an
    unreadable service configuration falls back to the default (the
    gateway would refuse to start with it anyway).
    """
    value = gateway_table(service_config).get("keys_file")
    return value if isinstance(value, str) and value else DEFAULT_KEYS_FILE


# ---------------------------------------------------------------- the file


def read_document(path: str, *, missing_ok: bool = False) -> tomlkit.TOMLDocument:
    """The key file as a tomlkit document, checked with the gateway's loader.

    Raises :class:`CliError` for a file that the gateway would refuse (so
    that no edit builds on it).  A missing file is an empty document when
    ``missing_ok`` (``keys add`` creates the file).
    """
    if missing_ok and not os.path.exists(path):
        doc = tomlkit.document()
        for line in NEW_FILE_HEADER:
            doc.add(tomlkit.comment(line))
        return doc
    try:
        load_key_file(path)
    except ConfigError as e:
        raise CliError(str(e)) from None
    with open(path, encoding="utf-8") as f:
        return tomlkit.parse(f.read())


@contextmanager
def edit_lock(path: str) -> Iterator[None]:
    """Hold the key file's edit lock (``flock`` on its folder) while it is read, changed and written.

    Each edit reads the whole file and renames a new one over it: two at once
    (scripts issuing keys, an operator disabling one) each wrote what they
    had read, and one edit was lost while both said it was made: a key handed
    out that the gateway refused, or a disabled key still enabled.  The
    folder, not the file, is locked: the rename replaces the file, and a lock
    file would be one more file in ``conf/``.  The folder of the file a
    symbolic link names, which is the folder the write renames in."""
    directory = os.path.dirname(os.path.realpath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_atomically(path: str, text: str) -> None:
    """Replace ``path`` by ``text`` in one rename, mode 0600.

    The temporary file is created in the same folder (so the rename stays
    on one file system), with mode 0600 from its creation, flushed to disk
    before the rename, with the old file's owner and group where this process
    may (:func:`_keep_owner`); on any failure it is removed and the old file is
    left as it was.  A ``path`` that is a symbolic link is written through:
    the file it names is replaced, in its own folder, and the link stays (the
    rename replaced the link by a file, and the file it named kept the old keys).
    """
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            _keep_owner(f.fileno(), target)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except OSError as e:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None


def check_writable(path: str) -> None:
    """CliError (as :func:`write_atomically` words it) when no file can be made in ``path``'s folder; the
    key of a ``keys add`` was printed, then the write failed, and the key worked nowhere."""
    directory = os.path.dirname(os.path.realpath(path))
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None


def _keep_owner(fd: int, target: str) -> None:
    """Give the new file the owner and group of the one it replaces, where this process may: ``sudo svcctl keys
    add`` replaced the service user's key file by root's own, which the gateway could then not read."""
    try:
        old = os.stat(target)
    except OSError:
        return
    if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.fchown(fd, old.st_uid if os.geteuid() == 0 else -1, old.st_gid)
        except OSError:  # not root, and not in that group: the file is ours, as any new file
            pass


def add_key(doc: tomlkit.TOMLDocument, name: str, scope: str, qps: int) -> str:
    """Append ``[keys.<name>]`` for a new key to ``doc``; the plaintext key.

    The entry is :func:`svc.auth.issue_key`'s text, parsed, so that it reads
    exactly as ``svcctl keygen`` prints it.  Raises :class:`CliError` for a
    bad or taken name.
    """
    problem = check_key_name(name)
    if problem:
        raise CliError(f"key name {name!r} {problem}")
    keys = doc.get("keys")
    if keys is not None and name in keys:
        raise CliError(f"a key named {name!r} already exists (disable it, or choose another name)")
    key, text = issue_key(name, scope, qps)
    entry = tomlkit.parse(text)["keys"][name]
    if keys is None:
        doc["keys"] = keys = tomlkit.table(is_super_table=True)
    keys[name] = entry
    return key


def list_lines(entries: list[KeyEntry]) -> list[str]:
    """The ``keys list`` table: NAME, SCOPE, QPS (``unlimited`` for 0), ENABLED; no hash, ever."""
    rows = [("NAME", "SCOPE", "QPS", "ENABLED")]
    rows += [(e.name, e.scope, str(e.rate_limit_qps) if e.rate_limit_qps else "unlimited",
              "yes" if e.enabled else "no") for e in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]


# ---------------------------------------------------------------- the commands


def run(args: argparse.Namespace, client: Client) -> int:
    """``svcctl keys ...``: the exit status (``client`` makes the restart request)."""
    path = args.keys_file or default_keys_file()
    try:
        check_path(path, args.keys_file is not None, args.keys_action)
        if args.keys_action == "list":
            refusal = gateway_refusal(path)  # first: a file also invalid is refused for both
            if refusal:
                fail(refusal)
            elif note := owner_note(path):
                fail(note)
            try:
                entries = load_key_file(path)
            except ConfigError as e:
                raise CliError(str(e)) from None
            print("\n".join(list_lines(entries)))
            return EXIT_REFUSED if refusal else EXIT_OK
        token = None
        if not args.no_restart:
            restart_call(args.supervisor)  # a bad URL is refused before the file changes
            token = os.environ.get(API_TOKEN_ENV)
            if not token:
                raise CliError(f"no management token: set {API_TOKEN_ENV} to restart the gateway, or pass "
                               "--no-restart (the file is not changed)")
            token = checked_token(API_TOKEN_ENV, token)  # refused before the file changes
        with edit_lock(path):
            doc = read_document(path, missing_ok=args.keys_action == "add")
            if args.keys_action == "add":
                key = add_key(doc, args.name, args.scope, args.qps)
                check_writable(path)  # a folder it cannot write: no key shown that is stored nowhere
                # The key reaches stdout before its entry reaches the file: written first, a failed print left
                # a working key whose secret nobody had.  A stdout that fails raises (svc.cli.output) past the write.
                print(key)
                sys.stdout.flush()
                write_atomically(path, tomlkit.dumps(doc))
            elif (text := CHANGES[args.keys_action][0](doc, args.name)) is None:
                fail(f"key {args.name!r} is already {CHANGES[args.keys_action][1]} in {path}: nothing changed")
                return EXIT_OK
            else:
                write_atomically(path, text)
        if args.keys_action == "add":
            fail(f"added key {args.name!r} to {path}; it is shown once and cannot be recovered: give it to the "
                  "client now")
        else:
            fail(CHANGES[args.keys_action][2].format(name=args.name, path=path))
            if not any(entry.enabled for entry in load_key_file(path)):  # every client's next request is 401
                # Said of a gateway that reads it: which file the gateway reads, the next lines say (the
                # supervisor's answer, else this folder's configuration), and a guess here was wrong both ways.
                fail(f"{path} has no enabled key left: a gateway that reads it accepts only its static tokens from "
                     "its restart")
    except CliError as e:
        fail(str(e))
        return EXIT_USAGE
    if token is None:
        other = gateway_reads(path)  # the gateway reads another file: never say that it applies this one
        fail(f"not restarted (--no-restart); the gateway reads {other}, not {path}: the change does not apply to it"
             if other else "not restarted (--no-restart): the gateway applies the change when it next starts")
        return EXIT_OK
    code, named = restart_gateway(args.supervisor, token, client)
    if code == EXIT_OK:  # the file the supervisor says the gateway reads; a configuration here only without it
        other = gateway_reads(path) if named is None else (
            None if os.path.realpath(named) == os.path.realpath(path) else named)
        fail(f"the gateway restarted, but it reads {other}, not {path}: the change does not apply to it" if other
             else "the gateway restarted and applies the change")
    return code


def gateway_refusal(path: str) -> str | None:
    """The line saying why the gateway refuses the key file ``path`` although its entries load (another user could
    write it: :func:`svc.auth.load_trusted_key_file`, the gateway's own check); None when it would not.

    The supervisor's refusal to start a gateway points to ``keys list`` as the check, which listed such a file
    with exit 0.  Run by root (``sudo``, as root edits the service user's file), it judges for the file's owner:
    the gateway runs as the service's user, which root cannot know, and a root edit keeps that owner."""
    try:
        load_trusted_key_file(path, os.stat(path).st_uid if os.getuid() == 0 else None)
    except UntrustedKeyFile as e:
        return f"the gateway will refuse this key file (and every key in it): {e}"
    except (ConfigError, OSError):  # missing or invalid: load_key_file's error says it
        return None
    return None


def owner_note(path: str) -> str | None:
    """Run by root, the line saying that a file another user owns is accepted only by a gateway of that user: root
    judges for the owner (:func:`gateway_refusal`), and a gateway running as root refuses it (a regression probe:
    listed with no word, then refused by the root-run service's restart)."""
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return None
    if os.getuid() != 0 or owner == 0:
        return None
    return (f"{path} is owned by uid {owner}: a gateway running as that user accepts it; one running as root refuses "
            "it (owned by another user): give it to the user the gateway runs as")


def check_path(path: str, explicit: bool, action: str) -> None:
    """CliError (one line, nothing written) for a key file that no edit should make: in a folder that does not
    exist (a typo in ``--keys-file`` made its folders, and the gateway, reading another file, answered the new
    key 401; without ``--keys-file``, run outside the checkout), or a loop of symbolic links (replaced by a
    regular file)."""
    folder = os.path.dirname(os.path.realpath(path))
    if action != "list" and not os.path.isdir(folder):
        if not explicit:  # a key file made here would be one no gateway reads
            raise CliError(f"{path}: no {os.path.dirname(path) or '.'}/ folder here: run svcctl keys in the "
                           "checkout, or pass --keys-file")
        raise CliError(f"{path}: no folder {folder} (nothing written): create it, or check the path")
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CliError(f"{path}: a loop of symbolic links (nothing written): give the key file itself") from None


def gateway_reads(path: str) -> str | None:
    """The key file the gateway would read by this folder's service configuration (``keys_file`` of
    ``[gateway]``) when ``path`` is another file; None when it is that one, or when no configuration here says
    (run outside the checkout).  A guess, for when the supervisor does not say (svc.cli.gateway_restart)."""
    if not os.path.isfile(SERVICE_CONFIG):
        return None
    configured = default_keys_file()
    return None if os.path.realpath(configured) == os.path.realpath(path) else configured


def add_parser(sub: Any) -> None:
    """Register ``keys add|disable|enable|remove|list`` on the ``svcctl`` subcommands."""
    keys = sub.add_parser("keys", help="add, disable, enable, remove and list the gateway's API keys (edits the "
                                       "key file)",
                          description="Edit the gateway's key file (comments and order are kept; written "
                                      "atomically, mode 0600), then restart the gateway through the supervisor "
                                      f"with the management token ${API_TOKEN_ENV} so that the change applies.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--keys-file", metavar="PATH",
                        help=f"the key file (default: keys_file of [gateway] in {SERVICE_CONFIG}, else "
                             f"{DEFAULT_KEYS_FILE})")
    changing = argparse.ArgumentParser(add_help=False)
    changing.add_argument("--supervisor", metavar="URL",
                          help=f"supervisor base URL (default: ${SUPERVISOR_ENV}, else [supervisor] host and port of "
                               f"{SERVICE_CONFIG}, else {DEFAULT_SUPERVISOR})")
    changing.add_argument("--no-restart", action="store_true",
                          help="only edit the file; the gateway applies it when it next starts")
    actions = keys.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    add = actions.add_parser("add", parents=[common, changing], help="issue a key: print it once, store its hash")
    add.add_argument("name", metavar="NAME", help="key name (the X-Service-Key header of its replies)")
    add.add_argument("--scope", choices=SCOPES, default="inference", help="default: inference")
    add.add_argument("--qps", type=key_qps, default=0, metavar="N",
                     help="requests per second for this key; 0 = unlimited (default)")
    for action, says in (("disable", "set enabled = false on a key"), ("enable", "enable a disabled key again"),
                         ("remove", "remove a key's entry (the end of a rotation)")):
        actions.add_parser(action, parents=[common, changing], help=says).add_argument(
            "name", metavar="NAME", help="key name")
    actions.add_parser("list", parents=[common], help="name, scope, qps and enabled of every key (no hashes)")
    keys.set_defaults(handler=run, uses_client=True)
