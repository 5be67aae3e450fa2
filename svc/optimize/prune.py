"""``svcctl cache``: what the compiled cache holds, and removing what no start has used for a while.

Why a command: every new key of an artefact (new weights, a torch or runtime
upgrade, another CPU sharing the state directory) makes new files in
``<state dir>/compiled`` (:mod:`svc.optimize.cache`), and nothing removed the
old ones: about 13.5 MB per weights change of the cpu profile's models, for
good.  A model server refreshes the modification time of an artefact's record
(its ``.json``) each time a start reads it (:func:`svc.optimize.cache.read_cached`),
so the record's age is the time since a start last used the artefact:

* ``svcctl cache list [--json]``: each artefact, its size, when a start
  last used it (or made it) and the model it was made for, oldest first,
  and the total;
* ``svcctl cache prune [--unused-days N] [--dry-run]``: remove the artefacts
  that no start has used for N days (default 30; 0 removes every one).

What a prune removes is only time: a start that needs an artefact no longer
there converts or compiles it again (docs/optimize.md), and a running model
server keeps what it loaded.  Files that no record names (a record removed as
unusable, a cache older than 0.12's digests, an artefact being made at this
moment: its record is written last) count by their own age and are never
removed under an hour old.  ``auto``'s recorded choices (``compiled/choices``,
a few hundred bytes each) and the temporary files of a build
(:func:`svc.optimize.cache.sweep_leftovers`) are not this command's.

Exit status: 0, 1 when a file could not be removed (one line each), 2 for a
usage error or a cache folder that cannot be read (one line naming the path:
a file where the state directory or its ``compiled`` should be).  Torch-free: it reads file names, sizes and times only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from svc.optimize.cache import STATE_DIR_ENV, compiled_dir, is_temporary, state_dir

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_UNUSED_DAYS = 30
#: Files no record names are kept this long whatever ``--unused-days`` says: an artefact is made before its record.
UNRECORDED_GRACE_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True)
class Artefact:
    """One artefact of the cache: its record and the files it names (or, without a record, files of one stem)."""

    name: str
    files: tuple[Path, ...]
    size: int
    used: float
    recorded: bool
    made_for: str = ""  # the model whose start made it, as its record says ("" before 0.15)

    def summary(self) -> dict[str, Any]:
        """The ``--json`` form: names, bytes, the last use as UTC text and the model it was made for (or null)."""
        return {"name": self.name, "files": [f.name for f in self.files], "bytes": self.size,
                "last_used": _when(self.used), "recorded": self.recorded, "made_for": self.made_for or None}


def artefacts(directory: Path) -> list[Artefact]:
    """The artefacts in ``directory`` (its files only, no subfolder, no temporary file), least recently used first.

    A record's files are those its ``sha256`` names; files of the same stem
    that no readable record names form an unrecorded artefact of their own.
    """
    try:
        entries = {e.name: e for e in os.scandir(directory)
                   if e.is_file(follow_symlinks=False) and not is_temporary(e.name)}
    except FileNotFoundError:
        return []
    found, claimed = [], set()
    for name, entry in sorted(entries.items()):
        if not name.endswith(".json"):
            continue
        record = _record(Path(entry.path))
        if record is None:
            continue
        named, made_for = record
        members = [n for n in named if n in entries and n != name] + [name]
        claimed.update(members)
        found.append(_artefact(name[:-len(".json")], [entries[n] for n in members], entry.stat().st_mtime, True,
                               made_for))
    by_stem: dict[str, list[os.DirEntry]] = {}
    for name, entry in entries.items():
        if name not in claimed:
            by_stem.setdefault(name.split(".", 1)[0], []).append(entry)
    for stem, group in by_stem.items():
        newest = max(m.stat().st_mtime for m in group)
        found.append(_artefact(stem, sorted(group, key=lambda m: m.name), newest, False))
    return sorted(found, key=lambda a: (a.used, a.name))


def _record(meta: Path) -> tuple[list[str], str] | None:
    """The file names an artefact's record lists and the model it was made for ("" when it does not say), or None
    when it is not a readable record with digests."""
    try:
        record = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    digests = record.get("sha256") if isinstance(record, dict) else None
    if not isinstance(digests, dict) or not all(isinstance(n, str) and "/" not in n for n in digests):
        return None
    made_for = record.get("made_for")
    return list(digests), made_for if isinstance(made_for, str) and made_for.isprintable() else ""


def _artefact(name: str, members: list[os.DirEntry], used: float, recorded: bool, made_for: str = "") -> Artefact:
    return Artefact(name, tuple(Path(m.path) for m in members), sum(m.stat().st_size for m in members), used,
                    recorded, made_for[:100])


def stale(found: list[Artefact], unused_days: float, now: float) -> list[Artefact]:
    """The artefacts of ``found`` unused for ``unused_days`` or more at ``now``; an unrecorded one also needs to
    be older than :data:`UNRECORDED_GRACE_S` (it may be an artefact whose record is not written yet)."""
    limit = unused_days * DAY_S
    return [a for a in found
            if now - a.used >= limit and (a.recorded or now - a.used >= UNRECORDED_GRACE_S)]


def remove(artefact: Artefact) -> list[str]:
    """Delete ``artefact``'s files, its record first (so that nothing left looks cached); the errors, one each."""
    problems = []
    for path in sorted(artefact.files, key=lambda p: p.suffix != ".json"):
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            problems.append(f"cannot remove {path}: {e.strerror or e}")
    return problems


# ---------------------------------------------------------------- the command


def add_parser(sub: Any) -> None:
    """Add ``cache`` and its actions to the ``svcctl`` subcommands ``sub``."""
    cache = sub.add_parser(
        "cache", help="list or prune the compiled cache (converted models and packages)",
        description=f"The compiled cache, <state dir>/compiled (${STATE_DIR_ENV}, default "
                    "$XDG_STATE_HOME/inference-service or ~/.local/state/inference-service).")
    cache.set_defaults(handler=main)
    actions = cache.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="each artefact, its size and when a start last used it")
    listing.add_argument("--json", action="store_true", help="one JSON object: the folder, artefacts and total")
    prune = actions.add_parser("prune", help="remove the artefacts no start has used for a while")
    prune.add_argument("--unused-days", type=_days, default=DEFAULT_UNUSED_DAYS, metavar="N",
                       help=f"remove what no start has used for N days or more (default {DEFAULT_UNUSED_DAYS}; "
                            "0: everything)")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not 0 <= value < 100000:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of days from 0 up")
    return value


def main(args: argparse.Namespace, env: Mapping[str, str] | None = None, now: float | None = None) -> int:
    """Run ``svcctl cache ACTION``; the exit status."""
    env = dict(os.environ if env is None else env)
    directory = compiled_dir(env)
    try:
        found = artefacts(directory)
    except OSError as e:  # a file where a folder should be was a NotADirectoryError traceback, exit 1
        print(f"svcctl: cache {args.action}: {_unreadable(directory, state_dir(env), e)}", file=sys.stderr)
        return EXIT_USAGE
    if args.action == "list":
        return _list(directory, found, args.json)
    return _prune(directory, found, args.unused_days, args.dry_run, time.time() if now is None else now)


def _unreadable(directory: Path, state: Path, error: OSError) -> str:
    """Why the compiled cache ``directory`` (in the state directory ``state``) cannot be read: the path that is
    not a folder (the cache itself, the state directory or one above it), else ``error``'s reason."""
    culprit = next((p for p in (directory, *directory.parents) if p.exists()), directory)
    if culprit.is_dir():
        return f"cannot read the compiled cache {directory}: {error.strerror or error}"
    if culprit == directory:
        return f"the compiled cache {directory} is not a folder (a file is in its place)"
    what = "the state directory " if culprit == state else ""
    return (f"{what}{culprit} is not a folder, so there is no compiled cache {directory} under it (set "
            f"${STATE_DIR_ENV} to a folder)")


def _list(directory: Path, found: list[Artefact], as_json: bool) -> int:
    total = sum(a.size for a in found)
    if as_json:
        print(json.dumps({"directory": str(directory), "artefacts": [a.summary() for a in found],
                          "bytes": total}, indent=2))
        return EXIT_OK
    for a in found:
        made = f"  ({a.made_for})" if a.made_for else "" if a.recorded else "  (no record)"
        print(f"{_size(a.size):>10}  {_when(a.used)}  {a.name}{made}")
    print(f"{len(found)} artefact{'' if len(found) == 1 else 's'}, {_size(total)} in {directory}")
    return EXIT_OK


def _prune(directory: Path, found: list[Artefact], unused_days: float, dry_run: bool, now: float) -> int:
    chosen = stale(found, unused_days, now)
    problems = []
    for a in chosen:
        print(f"{'would remove' if dry_run else 'removed'} {a.name} ({_size(a.size)}, last used {_when(a.used)})")
        if not dry_run:
            problems += remove(a)
    for line in problems:
        print(f"svcctl: cache prune: {line}", file=sys.stderr)
    freed = sum(a.size for a in chosen)
    print(f"{'would free' if dry_run else 'freed'} {_size(freed)} in {directory}: {len(chosen)} of "
          f"{len(found)} artefacts unused for {unused_days:g} days or more")
    return EXIT_FAILED if problems else EXIT_OK


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
