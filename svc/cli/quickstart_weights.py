"""The quick start's weights: look up what the service would run in the cache, pull only what is missing.

Split from ``svc.cli.quickstart`` (which imports these names): every
pretrained variant the profile (or ``--weights``) would run is looked up in
the weights cache; what is cached is served as it is, only what is missing
is pulled with ``svcctl weights pull`` (a child process: it prints sizes and
licences, asks on a terminal for a licence ``--accept-licence`` did not
name), and a model whose variant is still missing starts on demo weights
alone, with one line naming it and why.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 3.0
PULL_CLI = "svc.weightstore.cli"


def pretrained_pulls(root: str = ".", wanted: str = "pretrained", profile_name: str | None = None, *,
                     outside: bool = False) -> list[tuple[str, Any]]:
    """``(MODEL:VARIANT, Variant)`` of every pretrained variant the active profile would run with its
    ``weights`` set to ``wanted``, in profile order; ``outside``: those of the models with a config that
    the profile does not start (started later from the web UI or the API), by id.

    Read from the configs and the plugins' declarations (no torch): the same
    choice the supervisor makes (``svc.supervisor.config.weights_choice``):
    under ``demo``, only the models whose config names a pretrained variant;
    the profile's ``demo`` list stays on demo unless the config says otherwise.
    """
    from svc.config import model_server_configs
    from svc.model.api import factories
    from svc.supervisor.config import PRETRAINED, load_profile, load_supervisor_config, weights_choice
    from svc.weightstore.catalog import find_variant, variants_of

    config = load_supervisor_config(os.path.join(root, "conf", "service.toml"))
    config = _rooted(config, root)
    profile = load_profile(config, profile_name)
    servers = {c.id: c for c in model_server_configs(config.servers_dir)}
    found = factories()
    pulls = []
    for model_id in sorted(set(servers) - set(profile.models)) if outside else profile.models:
        factory = found.get(model_id)
        if factory is None or model_id not in servers or not variants_of(factory):
            continue
        flag, _ = weights_choice("demo" if model_id in profile.demo else wanted,
                                 servers[model_id].model.get("weights"), find_variant(factory, None).name)
        if flag and flag.startswith(PRETRAINED + ":"):
            name = flag.partition(":")[2]
            pulls.append((f"{model_id}:{name}", find_variant(factory, name)))
    return pulls


def _rooted(config: Any, root: str) -> Any:
    from dataclasses import replace

    def at(path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(root, path)

    return replace(config, servers_dir=at(config.servers_dir), profiles_dir=at(config.profiles_dir))


def source_hosts(variants: list[Any], env: dict[str, str]) -> list[tuple[str, int]]:
    """The (host, port) every variant is fetched from: the hub (``HF_ENDPOINT``), or the file's URL as a pull
    fetches it (through ``SERVICE_WEIGHTS_MIRROR`` when set); the proxy's when ``HTTPS_PROXY``/``HTTP_PROXY``
    applies to that URL (``NO_PROXY`` aside)."""
    from svc.weightstore.catalog import HubSource
    from svc.weightstore.fetch import mirrored
    from svc.weightstore.hub import HUB_URL
    from svc.weightstore.proxies import proxy_for

    hosts: list[tuple[str, int]] = []
    for variant in variants:
        source = variant.source
        url = (env.get("HF_ENDPOINT") or HUB_URL) if isinstance(source, HubSource) else mirrored(source.url, env)
        url = proxy_for(url, env) or url
        parts = urlsplit(url)
        host = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        if host not in hosts:
            hosts.append(host)
    return hosts


def can_connect(host: str, port: int) -> bool:
    """True when a TCP connection to ``host:port`` opens within ``CONNECT_TIMEOUT_S`` (DNS included)."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def run_pull(specs: list[str], accept: tuple[str, ...] = ()) -> int:
    """``svcctl weights pull ID[:VARIANT]...`` in a child process of this interpreter (its output goes to ours, and its
    licence question to this terminal)."""
    flags = [arg for name in accept for arg in ("--accept-licence", name)]
    return subprocess.call([sys.executable, "-m", "svc.cli", "weights", "pull", *specs, *flags])


def is_cached(spec: str, env: dict[str, str] | None = None) -> bool:
    """Whether ``MODEL:VARIANT`` is in the weights cache as its model server will accept it: its record, and
    every file it lists at its size (what the model server checks at start; ``svcctl weights verify`` the
    digests).  A damaged variant counted as cached: it was served, and its model failed to start, where a
    missing one is pulled or runs on demo weights (a weights probe)."""
    from svc.weightstore.cache import RecordError, read_record
    from svc.weightstore.check import record_problems

    model_id, _, name = spec.partition(":")
    try:
        record = read_record(model_id, name, env)
    except RecordError:
        return False
    return record is not None and not record_problems(record, env, digests=False)


def fetch_missing(
    pulls: list[tuple[str, Any]],
    env: dict[str, str],
    out: Any = sys.stdout,
    *,
    accept: tuple[str, ...] = (),
    connect: Callable[[str, int], bool] = can_connect,
    pull: Callable[[list[str], tuple[str, ...]], int] = run_pull,
    pull_available: Callable[[], bool] = lambda: importlib.util.find_spec(PULL_CLI) is not None,
    cached: Callable[[str], bool] | None = None,
) -> dict[str, str]:
    """Pull what ``pulls`` lacks in the cache; the models that stay on demo weights, each with why.

    What is cached is served as it is (nothing is dialled for it); only the
    missing variants are pulled, those whose source answers.  Each model
    that still lacks its variant falls back to demo alone, with one line
    naming it and why; the others run their pretrained weights.
    """
    from svc.weightstore.catalog import HubSource
    from svc.weightstore.hub import offline_variable
    from svc.weightstore.licences import permissive, spdx

    cached = cached or (lambda spec: is_cached(spec, env))
    missing = [(spec, variant) for spec, variant in pulls if not cached(spec)]
    if pulls and not missing:
        print(f"Pretrained weights: cached, nothing to pull ({' '.join(spec for spec, _ in pulls)}).",
              file=out, flush=True)
    if not missing:
        return {}
    why: dict[str, str] = {}
    if not pull_available():
        why = {spec: "svcctl weights pull is not available in this installation" for spec, _ in missing}
    else:
        # HF_HUB_OFFLINE keeps the hub's repositories alone: the files (GitHub, pytorch.org) are pulled as
        # svcctl weights pull pulls them (a weights probe: every model stayed on demo weights).
        offline = offline_variable(env)  # as huggingface_hub reads them (HF_HUB_OFFLINE=0 wins, a regression probe)
        if offline:  # named as set (TRANSFORMERS_OFFLINE alone was said to be HF_HUB_OFFLINE)
            why = {spec: f"not cached, and {offline} is set" for spec, variant in missing
                   if isinstance(variant.source, HubSource)}
        left = [(spec, variant) for spec, variant in missing if spec not in why]
        down = {f"{h}:{p}" for h, p in source_hosts([v for _, v in left], env) if not connect(h, p)}
        for spec, variant in left:
            host = "{}:{}".format(*source_hosts([variant], env)[0])
            if host in down:
                why[spec] = f"not cached, and {host} is not reachable"
        wanted = [spec for spec, _ in missing if spec not in why]
        if wanted:
            print(f"Pulling the pretrained weights of the profile: {' '.join(wanted)}", file=out, flush=True)
            code = pull(wanted, accept)
            for spec, variant in missing:
                if spec in wanted and not cached(spec):
                    licence = variant.license
                    if not permissive(licence) and spdx(licence) not in {spdx(a) for a in accept}:
                        why[spec] = f"its licence {licence} was not accepted (--accept-licence {licence})"
                    else:
                        why[spec] = f"svcctl weights pull exited with {code} (its error is above)"
    demo = {}
    for spec, _ in pulls:
        if spec in why:
            model_id = spec.partition(":")[0]
            demo[model_id] = why[spec]
            print(f"Pretrained weights: {model_id} starts on demo weights: {why[spec]}.", file=out, flush=True)
    if demo:
        print("  (svcctl weights pull, then restart the quick start, to switch: a model's own restart keeps "
              "its demo weights)", file=out, flush=True)
    return demo


def uncached_outside_profile(root: str, wanted: str, env: dict[str, str], out: Any = sys.stdout, *,
                             cached: Callable[[str], bool] | None = None) -> dict[str, str]:
    """The models outside the profile whose pretrained variant is not cached, each with why: they start on demo
    weights (``--demo-models``), said in one line.  Nothing is pulled for them (gigabytes for models that may
    never start); without this, each failed its start from the web UI ("not in the weights cache") while the
    status called it pretrained."""
    cached = cached or (lambda spec: is_cached(spec, env))
    missing = [spec.partition(":")[0] for spec, _ in pretrained_pulls(root, wanted, outside=True) if not cached(spec)]
    if missing:
        print(f"Pretrained weights: {', '.join(missing)} (not in the profile) not cached: started from the web UI "
              "or the API, they run on demo weights (svcctl weights pull MODEL, then restart the quick start, to "
              "switch).",
              file=out, flush=True)
    return {model_id: "not cached, and not in the profile" for model_id in missing}
