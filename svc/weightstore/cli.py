"""``svcctl weights``: list, pull, import and verify the pretrained weights of the catalog models.

Why a command of its own: a model server never touches the network (its
``weights = "pretrained[:VARIANT]"`` reads the cache only), so the official
files are fetched ahead of time, checked, and recorded here:

* ``svcctl weights list [--json]``: every model's variants, their source,
  size, checksum, licence and whether each is cached;
* ``svcctl weights pull ID[:VARIANT]... | --all [--variant NAME] [--accept-licence L]...``:
  download into the cache (``$SERVICE_WEIGHTS_DIR``) with a progress bar on
  stderr, resumable and atomic (``svc.weightstore.store``);
  ``$SERVICE_WEIGHTS_MIRROR`` replaces the scheme and host of the official
  URLs.  The total size and every licence are printed first, and a
  non-permissive licence is pulled only once accepted
  (``svc.weightstore.licences``);
* ``svcctl weights import ID PATH [--variant NAME] [--replace]``: the
  air-gapped path, a copied-in file or folder stored exactly as a pull stores
  it, once the model builds on it (other content than a cached record's
  needs ``--replace``);
* ``svcctl weights verify``: recheck every cached file against its record,
  and report files no record lists.

Exit status: 0 when everything asked for is cached and verified, 1 with one
line per failure on stderr otherwise, 2 for a usage error (unknown model or
variant), 130 when interrupted (a download keeps its ``.part`` to resume).
Runs no reactor and imports no torch: the download uses ``http.client``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: The variant a pull is fetching now ((model id, variant name); None: none), for the interrupt's line.
_fetching: tuple[str, str] | None = None


def _fail(message: str) -> None:
    """One line on stderr: what it names (a user's file name, a stray file in the cache) may hold a newline or a
    terminal escape, which broke the line or cleared the screen (a weights probe): shown escaped."""
    print(f"svcctl: {_escaped(message)}", file=sys.stderr)


def _escaped(text: str) -> str:
    """``text`` with each character that is not printable written as Python writes it in a string (``\\n``)."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def add_parser(sub: Any) -> None:
    """Add ``weights`` and its actions to the ``svcctl`` subcommands ``sub``."""
    from svc.weightstore.cache import WEIGHTS_DIR_ENV
    from svc.weightstore.fetch import MIRROR_ENV

    weights = sub.add_parser(
        "weights", help="list, pull, import and verify pretrained weights",
        description=f"Pretrained weights of the catalog models, in the cache ${WEIGHTS_DIR_ENV} "
                    f"(downloads through ${MIRROR_ENV} when set).")
    weights.set_defaults(handler=main)
    actions = weights.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every model's variants and whether each is cached")
    listing.add_argument("--json", action="store_true", help="one JSON array of objects")
    pull = actions.add_parser("pull", help="download variants into the cache (resumable, checked)")
    pull.add_argument("ids", metavar="ID[:VARIANT]", nargs="*",
                      help="catalog model id, optionally with a variant (ID:VARIANT overrides --variant)")
    pull.add_argument("--all", action="store_true", help="every model that declares variants")
    pull.add_argument("--variant", metavar="NAME", help="this variant (default: each model's default variant)")
    pull.add_argument("--accept-licence", "--accept-license", metavar="LICENCE", action="append", default=[],
                      dest="accept", help="pull variants under this non-permissive licence (e.g. AGPL-3.0); "
                      "repeatable; without it, a terminal is asked and anything else refuses them")
    importing = actions.add_parser("import", help="store a copied-in file or folder as a pull would")
    importing.add_argument("id", metavar="ID", help="catalog model id")
    importing.add_argument("path", metavar="PATH", help="the official file (or hub repository folder)")
    importing.add_argument("--variant", metavar="NAME", help="default: the model's default variant")
    importing.add_argument("--replace", action="store_true",
                           help="replace a cached variant whose record says other content")
    actions.add_parser("verify", help="recheck every cached file against its record")


def main(args: argparse.Namespace) -> int:
    """Run ``svcctl weights <action>``; the exit status."""
    try:
        if args.action == "list":
            return _list(args)
        if args.action == "pull":
            return _pull(args)
        if args.action == "import":
            return _import(args)
        return _verify()
    except KeyboardInterrupt:
        print(file=sys.stderr)
        pull = ("interrupted (a partial download is kept as .part: pull again to resume)" if _part_kept()
                else "interrupted (nothing fetched)")
        _fail({"pull": pull, "import": "interrupted (nothing kept)"}.get(args.action, "interrupted"))
        return EXIT_INTERRUPTED


def _part_kept() -> bool:
    """Whether the pull interrupted left a ``.part`` download of the variant it was fetching (Ctrl-C at the licence
    question said one was kept: nothing had been fetched)."""
    from svc.weightstore.cache import variant_dir

    if _fetching is None:
        return False
    folder = variant_dir(*_fetching)
    return folder.is_dir() and any(path.name.endswith(".part") for path in folder.rglob("*"))


def describe(factory: Any, variant: Any) -> dict[str, Any]:
    """One row of ``weights list --json``: the variant as declared, and its state in the cache."""
    from svc.weightstore.cache import RecordError, cached_weights, read_record
    from svc.weightstore.catalog import FileSource
    from svc.weightstore.store import source_text

    source = variant.source
    try:
        record = read_record(factory.catalog_id, variant.name)
        path = cached_weights(factory.catalog_id, variant.name)
    except RecordError:  # listed as not cached; verify names the record
        record, path = None, None
    row: dict[str, Any] = {
        "model": factory.catalog_id,
        "variant": variant.name,
        "default": variant.default,
        "source": source_text(variant),
        "kind": "file" if isinstance(source, FileSource) else "hub",
        "size": variant.size,
        "sha256": getattr(source, "sha256", None),
        "hash_prefix": getattr(source, "hash_prefix", None),
        "license": variant.license,
        "description": variant.description,
        "model_keys": dict(variant.model),
        "cached": path is not None,
        "path": str(path) if path is not None else None,
        "recorded_sha256": None,
        "recorded_files": len(record.files) if record is not None else None,
        "how": record.how if record is not None else None,
    }
    if record is not None and isinstance(source, FileSource) and source.filename in record.files:
        row["recorded_sha256"] = record.files[source.filename].get("sha256")
    return row


def _rows() -> list[dict[str, Any]]:
    from svc.model.api import factories
    from svc.weightstore.catalog import variants_of

    found = factories()
    return [describe(found[mid], v) for mid in sorted(found) for v in variants_of(found[mid])]


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def _list(args: argparse.Namespace) -> int:
    from svc.weightstore.cache import weights_dir

    rows = _rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    header = ("MODEL", "VARIANT", "SIZE", "CHECKSUM", "LICENSE", "CACHED", "SOURCE")
    table = [header]
    for row in rows:
        # A hub variant's check is the sha256 of each file its record lists: "first pull" until there is one.
        check = (f"sha256:{row['sha256'][:12]}" if row["sha256"] else
                 f"prefix:{row['hash_prefix']}" if row["hash_prefix"] else
                 f"recorded:{row['recorded_sha256'][:12]}" if row["recorded_sha256"] else
                 f"recorded:{row['recorded_files']} files" if row["kind"] == "hub" and row["recorded_files"] else
                 "first pull")
        table.append((row["model"], row["variant"] + (" (default)" if row["default"] else ""), _size(row["size"]),
                      check, row["license"], "yes" if row["cached"] else "no", row["source"]))
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    print(f"\ncache: {weights_dir()}")
    return EXIT_OK


def _selected(args: argparse.Namespace) -> list[tuple[Any, Any]] | None:
    """The (factory, variant) pairs a ``pull`` names; None after a usage error (reported)."""
    from svc.model.api import factories
    from svc.weightstore.catalog import find_variant, variants_of

    if args.all == bool(args.ids):
        _fail("weights pull: name model ids or --all (not both)")
        return None
    if args.all:
        found = factories()
        chosen = []
        for mid in sorted(found):
            names = [v.name for v in variants_of(found[mid])]
            if names and (args.variant is None or args.variant in names):
                chosen.append((found[mid], find_variant(found[mid], args.variant)))
        if not chosen:
            _fail(f"weights pull --all: no model declares a variant {args.variant!r}")
            return None
        return chosen
    picked: dict[tuple[str, str], tuple[Any, Any]] = {}
    for spec in args.ids:
        mid, _, named = spec.partition(":")
        pair = _model_variant(mid, named or args.variant)
        if pair is None:
            return None
        # Once however it is named ("YOLOV8" and "YOLOV8:yolov8n"): the plan counted its size twice (a probe).
        picked.setdefault((pair[0].catalog_id, pair[1].name), pair)
    return list(picked.values())


def _model_variant(model_id: str, name: str | None) -> tuple[Any, Any] | None:
    """The factory of ``model_id`` and its variant ``name`` (None: the default); None after a reported usage error."""
    from svc.model.api import PluginError, find_factory
    from svc.weightstore.catalog import find_variant

    try:
        factory = find_factory(model_id)
        return factory, find_variant(factory, name)
    except PluginError as e:
        _fail(str(e))
    except KeyError as e:
        _fail(e.args[0])
    return None


def _cached(factory: Any, variant: Any) -> Any:
    """``variant``'s record when it is cached from its source with every file matching its digest, else None: a
    damaged variant is fetched again, so it is not cached, and it is in the plan and under the licence question
    as a fetch.  (Sizes alone said a file with a flipped byte was cached: the plan said nothing would be
    fetched, and the pull then fetched an AGPL-3.0 file that no one had accepted, a weights probe.)  Read once:
    a cached variant is not pulled (nor read) again."""
    from svc.weightstore.store import already

    record, ok = already(factory.catalog_id, variant, None)
    return record if ok else None


def _pull(args: argparse.Namespace) -> int:
    from svc.weightstore.fetch import mirror_problem
    from svc.weightstore.licences import accepted, plan_lines, terminal_question
    from svc.weightstore.store import StoreError, pull

    global _fetching
    if problem := mirror_problem():
        _fail(problem)
        return EXIT_USAGE
    chosen = _selected(args)
    if chosen is None:
        return EXIT_USAGE
    failures = 0
    cached = [_cached(f, v) for f, v in chosen]  # once: it reads every cached file
    for line in plan_lines((f, v, c is not None) for (f, v), c in zip(chosen, cached, strict=True)):
        print(line, file=sys.stderr)  # stdout says what is cached where; this is what is about to happen
    sys.stderr.flush()
    for (factory, variant), record in zip(chosen, cached, strict=True):
        name = f"{factory.catalog_id} {variant.name}"
        if record is not None:  # verified by the plan's reading: nothing to fetch
            print(f"{name}: already cached and verified: {_weights_path(record)}")
            sys.stdout.flush()
            continue
        if not accepted(
                variant, args.accept, terminal_question(sys.stdin, sys.stderr, name)):
            _fail(f"{name}: licence {variant.license} not accepted, nothing pulled: pass --accept-licence "
                  f"{variant.license} to pull it")
            failures += 1
            continue
        _fetching = (factory.catalog_id, variant.name)  # left set by an interrupt, for its line (main)
        try:
            stored = pull(factory, variant)
        except StoreError as e:
            _fetching = None
            _fail(f"{name}: {e}")
            failures += 1
            continue
        _fetching = None
        for note in stored.notes:
            print(note)
        state = "cached" if stored.fetched else "already cached and verified"
        print(f"{name}: {state}: {_weights_path(stored.record)}")
        sys.stdout.flush()
    return EXIT_FAILED if failures else EXIT_OK


def _weights_path(record: Any) -> str:
    from svc.weightstore.cache import variant_dir

    return str(variant_dir(record.model, record.variant) / record.weights)


def _import(args: argparse.Namespace) -> int:
    from svc.weightstore.store import StoreError, import_path

    found = _model_variant(args.id, args.variant)
    if found is None:
        return EXIT_USAGE
    factory, variant = found
    try:
        stored = import_path(factory, variant, args.path, replace=args.replace)
    except StoreError as e:
        _fail(f"{factory.catalog_id} {variant.name}: {e}")
        return EXIT_FAILED
    except OSError as e:  # not worded by the store: the path the error names (the user's or the cache's)
        _fail(f"{factory.catalog_id} {variant.name}: {e.filename or args.path}: {e.strerror or e} (nothing kept)")
        return EXIT_FAILED
    for note in stored.notes:
        print(note)
    print(_escaped(f"{factory.catalog_id} {variant.name}: imported: {_weights_path(stored.record)}"))
    return EXIT_OK


def _verify() -> int:
    from svc.weightstore.cache import weights_dir
    from svc.weightstore.store import verify

    root = weights_dir()
    if root.exists() and not root.is_dir():
        _fail(f"the weights cache {root} is not a directory (SERVICE_WEIGHTS_DIR)")
        return EXIT_FAILED
    records, problems = verify()
    for problem in problems:
        _fail(problem)
    bad = {line.split(":", 1)[0] for line in problems}
    for record in records:
        if f"{record.model} {record.variant}" not in bad:
            print(_escaped(f"{record.model} {record.variant}: ok ({len(record.files)} files)"))
    if not records:
        print(f"no cached variants in {root}")
    return EXIT_FAILED if problems else EXIT_OK
