"""The committed copies under ``openapi/``: ``python -m svc.openapi --check`` and ``--write``.

``--check`` (run by tox and the tests) fails when a committed copy differs
from what the code generates, is missing, or is no longer generated;
``--write`` regenerates them and removes those no longer generated (files
named as generated ones only: ``gateway.json``, ``model-<ID>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import svc.openapi
from svc.config import ConfigError, model_server_configs, read_toml, sub_table
from svc.contract.protocol import GATEWAY_PORT
from svc.model.api import PluginError, factories, find_factory
from svc.openapi.gateway import gateway_document
from svc.openapi.modelserver import model_server_document

OPENAPI_DIR = "openapi"
#: The service config whose ``[gateway] port`` the committed gateway document names.
SERVICE_CONFIG = "conf/service.toml"


def documents(conf_dir: str = "conf/server", service_config: str = SERVICE_CONFIG) -> dict[str, dict]:
    """Every committed document by file name, generated from code and shipped configs (the gateway's port from
    ``service_config``'s ``[gateway]``, as a model server's from its config: an edited port is a difference).

    PluginError when a shipped config's model has no plugin to serve it (two claim its id, or its module did
    not import): the model was left out, so ``--write`` removed its committed document as no longer generated
    and exited 0 (a plugin probe)."""
    found = factories()
    configs = model_server_configs(conf_dir)
    plugins = {c.id: found[c.id] if c.id in found else find_factory(c.id) for c in configs}  # it raises, naming why
    port = gateway_port(service_config)
    docs: dict[str, dict] = {"gateway.json": gateway_document(configs, found, port=port)}
    for config in configs:
        docs[f"model-{config.id}.json"] = model_server_document(config, plugins[config.id])
    return docs


def gateway_port(service_config: str) -> int:
    """``[gateway] port`` of ``service_config``: the default when the file or the key is absent, ConfigError when it
    is no port (the gateway's own checks are the gateway's: this names a URL only)."""
    if not os.path.exists(service_config):
        return GATEWAY_PORT
    port = sub_table(service_config, read_toml(service_config), "gateway").get("port", GATEWAY_PORT)
    if type(port) is not int or not 1 <= port <= 65535:
        raise ConfigError(service_config, "gateway.port", f"must be a port number from 1 to 65535, got {port!r}")
    return port


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
    for path in stale(directory, docs):
        problems.append(f"{path}: no longer generated")
    if os.path.isdir(directory):  # what --write leaves alone: said apart from the documents it removes
        problems += [f"{os.path.join(directory, name)}: not a generated document (remove it by hand)"
                     for name in sorted(os.listdir(directory)) if name.endswith(".json") and not is_generated_name(name)]
    return problems


def is_generated_name(name: str) -> bool:
    """Whether ``name`` is one that :func:`documents` gives (``gateway.json``, ``model-<ID>.json``): the only files
    of the folder that :func:`write` may remove."""
    return name == "gateway.json" or (name.startswith("model-") and name.endswith(".json"))


def stale(directory: str, docs: dict[str, dict]) -> list[str]:
    """The paths of documents under ``directory`` named as generated ones that are no longer generated (the
    config of a model removed)."""
    if not os.path.isdir(directory):
        return []
    return [os.path.join(directory, name) for name in sorted(os.listdir(directory))
            if is_generated_name(name) and name not in docs]


def write(directory: str = OPENAPI_DIR, conf_dir: str = "conf/server") -> tuple[list[str], list[str]]:
    """Regenerate every committed document and remove those no longer generated: the paths written, and removed.

    The documents are made before anything is written, so that a refusal (no ``conf/server`` here: run outside
    the checkout) creates nothing, not even the folder; and a stale ``model-<ID>.json`` that ``--check``
    reports is removed, or the check kept failing after the ``--write`` it advises."""
    docs = documents(conf_dir)
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, doc in docs.items():
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(serialise(doc))
        written.append(path)
    removed = stale(directory, docs)
    for path in removed:
        os.remove(path)
    return written, removed


def main(argv: list[str] | None = None, *, prog: str = "python -m svc.openapi",
         write_command: str = "python -m svc.openapi --write") -> int:
    """``--check`` or ``--write``; ``prog`` and ``write_command`` name the command as its user typed it
    (``svcctl openapi`` passes its own)."""
    parser = argparse.ArgumentParser(prog=prog, description=svc.openapi.__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="fail when a committed document is stale")
    group.add_argument("--write", action="store_true", help="regenerate the committed documents")
    args = parser.parse_args(argv)
    try:
        if args.write:
            written, removed = write()
            for path in written:
                print(f"wrote {path}")
            for path in removed:
                print(f"removed {path} (no longer generated)")
            return 0
        problems = check()
    except PluginError as e:  # a plugin of a documented config declares what cannot be used (svc.model.plugincheck)
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"run: {write_command}", file=sys.stderr)
        return 1
    print("openapi documents are current")
    return 0
