"""The committed copies under ``openapi/``: ``python -m svc.openapi --check`` and ``--write``.

``--check`` (run by tox and the tests) fails when a committed copy differs
from what the code generates; ``--write`` regenerates them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import svc.openapi
from svc.config import model_server_configs
from svc.model.api import PluginError, factories
from svc.openapi.gateway import gateway_document
from svc.openapi.modelserver import model_server_document

OPENAPI_DIR = "openapi"


def documents(conf_dir: str = "conf/server") -> dict[str, dict]:
    """Every committed document by file name, generated from code and shipped configs."""
    found = factories()
    configs = model_server_configs(conf_dir)
    docs: dict[str, dict] = {"gateway.json": gateway_document(configs, found)}
    for config in configs:
        if config.id in found:
            docs[f"model-{config.id}.json"] = model_server_document(config, found[config.id])
    return docs


def serialise(doc: dict) -> str:
    """A document as committed: two-space indent, keys in the order the builders give them."""
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def check(directory: str = OPENAPI_DIR, conf_dir: str = "conf/server") -> list[str]:
    """Names of committed documents that are missing, stale or extra."""
    problems = []
    docs = documents(conf_dir)
    for name, doc in docs.items():
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                committed = f.read()
        except FileNotFoundError:
            problems.append(f"{path}: missing")
            continue
        if committed != serialise(doc):
            problems.append(f"{path}: differs from what the code generates")
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json") and name not in docs:
                problems.append(f"{os.path.join(directory, name)}: no longer generated")
    return problems


def write(directory: str = OPENAPI_DIR, conf_dir: str = "conf/server") -> list[str]:
    """Regenerate every committed document; the paths written."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, doc in documents(conf_dir).items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(serialise(doc))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m svc.openapi", description=svc.openapi.__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="fail when a committed document is stale")
    group.add_argument("--write", action="store_true", help="regenerate the committed documents")
    args = parser.parse_args(argv)
    try:
        if args.write:
            for path in write():
                print(f"wrote {path}")
            return 0
        problems = check()
    except PluginError as e:  # a plugin of a documented config declares what cannot be used (svc.model.plugincheck)
        print(f"python -m svc.openapi: {e}", file=sys.stderr)
        return 1
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print("run: python -m svc.openapi --write", file=sys.stderr)
        return 1
    print("openapi documents are current")
    return 0
