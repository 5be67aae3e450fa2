"""The edits of one key of a key file (``svcctl keys disable|enable|remove``), each the text to write with the
file's comments and order kept; :mod:`svc.cli.keyfile` reads, locks and writes the file and restarts the gateway."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from typing import Any

import tomlkit

from svc.cli.http import CliError


def _keys_with(doc: tomlkit.TOMLDocument, name: str) -> Any:
    """The ``[keys]`` table of ``doc``, which has a key ``name`` (CliError: no such key)."""
    keys = doc.get("keys")
    if keys is None or name not in keys:
        raise CliError(f"no key named {name!r}")
    return keys


def disable_key(doc: tomlkit.TOMLDocument, name: str) -> bool:
    """Set ``enabled = false`` on ``[keys.<name>]``; False when it already was (CliError: no such key)."""
    table = _keys_with(doc, name)[name]
    if table.get("enabled", True) is False:
        return False
    if "enabled" in table:
        table["enabled"] = False  # replaced in place, its comment kept
        return True
    # A key appended to a table goes after its trailing comments and blank lines, which belong to
    # what follows (the next table's comment): insert it right after the table's last key instead.
    last = [key for key, _ in table.value.body if key is not None]
    try:
        table.value._insert_after(last[-1], "enabled", tomlkit.item(False))
    except (AttributeError, IndexError):  # another tomlkit, or an empty table: append
        table["enabled"] = False
    return True


def enable_key(doc: tomlkit.TOMLDocument, name: str) -> bool:
    """``[keys.<name>]`` enabled again (its ``enabled = false`` line removed); False when it was (CliError: no such
    key)."""
    keys = _keys_with(doc, name)
    if keys[name].get("enabled", True) is not False:
        return False
    del keys[name]["enabled"]
    return True


def remove_key(doc: tomlkit.TOMLDocument, name: str) -> str:
    """The file's text without ``[keys.<name>]`` (CliError: no such key): the end of a rotation, or of a key that
    may not stay even disabled (one equal to a static token is refused by the gateway either way).

    Cut from the text, not deleted in the document: tomlkit keeps a comment above a table as the trailing text of
    the table before it, so ``del`` took the next key's comment with the removed table and left the removed key's
    own comment above the next key (a probe's "billing: do NOT disable" note was lost, "ci: expires" moved onto
    billing).  The comment lines right above the header go with it (unless they open the file: its own header),
    the comments after its last value stay (they are the next table's).  Anything the cut cannot be checked by
    (an inline table, a header it cannot read) is removed by tomlkit instead."""
    keys = _keys_with(doc, name)
    text = tomlkit.dumps(doc)
    cut = _cut_table(text, ("keys", name))
    remaining = {k: v for k, v in keys.unwrap().items() if k != name}
    if cut is not None and tomllib.loads(cut).get("keys", {}) == remaining:
        return cut
    del keys[name]
    return tomlkit.dumps(doc)


def _cut_table(text: str, path: tuple[str, ...]) -> str | None:
    """``text`` without the table whose header names ``path`` (see :func:`remove_key`), or None without one."""
    lines = text.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if _HEADER.match(line)]
    found = [i for i in headers if _header_path(lines[i]) == path]
    if len(found) != 1:
        return None
    head = found[0]
    end = next((i for i in headers if i > head), len(lines))
    last = max(i for i in range(head, end) if lines[i].strip() and not lines[i].lstrip().startswith("#"))
    start = head
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1
    if start == 0:  # the comments that open the file are its own, not this key's
        start = head
    after = last + 1
    if start > 0 and not lines[start - 1].strip() and after < len(lines) and not lines[after].strip():
        after += 1  # one blank line of the two around it
    if after == len(lines):  # the last table: no blank lines left at the end of the file
        while start > 0 and not lines[start - 1].strip():
            start -= 1
    return "".join(lines[:start] + lines[after:])


_HEADER = re.compile(r"^\s*\[(?!\[)[^\]]+\]\s*(#.*)?$")


def _header_path(line: str) -> tuple[str, ...] | None:
    """The keys a ``[a.b]`` header names, read as TOML reads them (quotes, spaces), or None."""
    try:
        table: Any = tomllib.loads(line.split("#", 1)[0].strip() + "\n")
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(table, dict) and len(table) == 1:
        key, table = next(iter(table.items()))
        path.append(key)
    return tuple(path)


def _changed(edit: Callable[[tomlkit.TOMLDocument, str], bool]) -> Callable[[tomlkit.TOMLDocument, str], str | None]:
    """``edit`` as the text to write, or None when it changed nothing."""
    return lambda doc, name: tomlkit.dumps(doc) if edit(doc, name) else None


#: ``keys`` actions that change one key: the text to write (None: nothing changed), the words of "already ..."
#: and of the change made.
CHANGES: dict[str, tuple[Callable[[tomlkit.TOMLDocument, str], str | None], str, str]] = {
    "disable": (_changed(disable_key), "disabled", "disabled key {name!r} in {path}"),
    "enable": (_changed(enable_key), "enabled", "enabled key {name!r} in {path}"),
    "remove": (remove_key, "removed", "removed key {name!r} from {path}"),
}


