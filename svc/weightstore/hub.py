"""Fetch a pretrained variant that lives in a Hugging Face hub repository.

``fetch_hub`` is what ``svcctl weights pull`` calls for a variant whose
source is a :class:`~svc.weightstore.catalog.HubSource`.  It uses
``huggingface_hub`` (``repo_info``, ``list_repo_tree``, ``snapshot_download``)
and honours ``HF_ENDPOINT`` (a mirror, or the fake hub of the tests) and
``HF_HUB_OFFLINE``, both read at call time: huggingface_hub itself reads them
once at import, which would ignore a value set later in the same process.

Nothing goes to huggingface's own cache in the user's home: the snapshot is
written with ``local_dir`` (and a ``cache_dir``) inside a temporary sibling of
``dest_dir``, checked file by file against the listing, and only then renamed
into place, so a failed or interrupted fetch never leaves a folder that looks
complete.  huggingface_hub's bookkeeping (``.cache/huggingface``) is removed
before the rename: the model version is a digest of the folder's files.

Of a folder holding both ``X.safetensors`` and ``X.bin`` (the hub's older
diffusers repositories often carry both), only the safetensors file is
fetched: same tensors, half the download.
"""

from __future__ import annotations

import fnmatch
import os
import secrets
import shutil
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from svc.infra.process import pid_running
from svc.weightstore.catalog import HubSource, Variant
from svc.weightstore.fetch import unsupported_proxy, without_credentials
from svc.weightstore.proxies import proxy_for, proxy_variable

Progress = Callable[[int, "int | None"], None]
POLL_S = 0.25
#: How long the hub may leave a connection, a request or a reply silent (huggingface_hub's client has no limit of
#: its own: a hub endpoint that accepted and never answered held ``svcctl weights pull`` forever).  The file pulls'
#: limit (svc.weightstore.fetch.SOCKET_TIMEOUT_S); huggingface_hub tries its file listing six times.
SILENCE_TIMEOUT_S = 60.0
#: Where huggingface_hub fetches from without ``HF_ENDPOINT``.
HUB_URL = "https://huggingface.co"


class HubError(Exception):
    """A hub fetch that failed; ``str()`` is one line naming the repository and the cause."""


def offline_variable(env: dict[str, str] | os._Environ) -> str | None:
    """The variable that keeps hub pulls offline, or None, read as huggingface_hub reads them: ``HF_HUB_OFFLINE``
    when it is set at all (``0`` included), else ``TRANSFORMERS_OFFLINE``; on at 1, ON, YES or TRUE."""
    name = "HF_HUB_OFFLINE" if env.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    return name if env.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE") else None


def _offline(env: dict[str, str] | os._Environ) -> bool:
    return offline_variable(env) is not None


def _cause(error: BaseException) -> str:
    """One line saying why: the exception's class and the first line of its message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def select_files(sizes: Mapping[str, int | None], allow_patterns: tuple[str, ...]) -> dict[str, int | None]:
    """The repository files to fetch: those matching ``allow_patterns`` (all when empty), without a ``.bin``
    whose ``.safetensors`` twin is also selected."""
    chosen = {path: size for path, size in sizes.items()
              if not allow_patterns or any(fnmatch.fnmatch(path, p) for p in allow_patterns)}
    return {path: size for path, size in chosen.items()
            if not (path.endswith(".bin") and path[: -len(".bin")] + ".safetensors" in chosen)}


def folder_name(source: HubSource) -> str:
    """The folder ``build`` loads, inside ``dest_dir``: the repository's name (it appears in the model version)."""
    return source.repo_id.rstrip("/").rsplit("/", 1)[-1]


def _size_under(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass  # a temporary file renamed meanwhile
    return total


def remove_leftovers(dest_dir: Path) -> None:
    """Remove the temporary siblings of ``dest_dir`` that a killed fetch left (their pid is gone)."""
    if not dest_dir.parent.is_dir():
        return
    for prefix in (f".{dest_dir.name}.partial-", f".{dest_dir.name}.old-"):
        for path in dest_dir.parent.glob(prefix + "*"):
            pid = path.name[len(prefix):].split("-", 1)[0]
            if prefix.endswith("old-") or (pid.isdigit() and not pid_running(int(pid))):
                shutil.rmtree(path, ignore_errors=True)


def fetch_hub(variant: Variant, dest_dir: Path, progress: Progress | None = None) -> str:
    """Download the variant's hub repository into ``dest_dir``; the path ``build`` loads, relative to ``dest_dir``.

    ``dest_dir`` is replaced only once every selected file arrived with the
    size the hub listed.  ``progress(done_bytes, total_bytes)`` is called from
    the calling thread about four times a second and once at the end.
    Raises :class:`HubError` (one line: repository and cause) on any failure,
    leaving ``dest_dir`` as it was.
    """
    source = variant.source
    if not isinstance(source, HubSource):
        raise TypeError(f"variant {variant.name!r} is not a hub variant")
    where = f"hub repository {source.repo_id}@{source.revision}"
    env = os.environ
    if _offline(env):
        raise HubError(f"{where}: HF_HUB_OFFLINE is set, nothing downloaded (unset it to pull)")
    endpoint = (env.get("HF_ENDPOINT") or "").rstrip("/") or None
    dest_dir = Path(dest_dir)
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(dest_dir)
    tmp = dest_dir.parent / f".{dest_dir.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    name = folder_name(source)
    try:
        files = _download(source, endpoint, tmp, name, progress)
        target = tmp / name
        shutil.rmtree(target / ".cache", ignore_errors=True)
        shutil.rmtree(tmp / ".hf-cache", ignore_errors=True)
        for path, size in files.items():
            file = target / path
            if not file.is_file():
                raise HubError(f"{where}: {path} is missing after the download")
            if size is not None and file.stat().st_size != size:
                raise HubError(f"{where}: {path} has {file.stat().st_size} bytes, the hub listed {size}")
        if dest_dir.exists():
            old = dest_dir.parent / f".{dest_dir.name}.old-{secrets.token_hex(4)}"
            os.replace(dest_dir, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, dest_dir)
    except HubError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as e:  # noqa: BLE001 - every cause becomes one line naming the repository
        shutil.rmtree(tmp, ignore_errors=True)
        raise HubError(f"{where}: {_hub_cause(e, endpoint or HUB_URL, env)}") from None
    return name


def _hub_cause(error: BaseException, url: str, env: Mapping[str, str]) -> str:
    """:func:`_cause`, naming the proxy when a connection failed with one set for the hub's URL: httpx reaches
    the hub through a proxy it could connect to (a CONNECT the proxy refuses is another error), so the failed
    connection was the proxy's, where the line read as the hub refusing (a weights probe; a file pull's line
    names the proxy too)."""
    proxy = proxy_for(url, env)
    if proxy is not None and not proxy.startswith(("http://", "https://")):  # httpx's ImportError of socksio
        return unsupported_proxy(proxy, proxy_variable(env, urlsplit(url).scheme, "all"))
    if "socksio" in _cause(error) or "Unknown scheme for proxy URL" in _cause(error):
        # httpx makes a transport for every proxy variable, used or not: a SOCKS ALL_PROXY beside an http
        # HTTPS_PROXY failed the pull too (a regression probe); name the one it could not make
        for name in ("all_proxy", "ALL_PROXY", "https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
            value = (env.get(name) or "").strip()
            if value and not value.startswith(("http://", "https://")) and "://" in value:
                return unsupported_proxy(value, name)
    if proxy is None or not _connect_failed(error):
        return _cause(error)
    return f"the proxy {without_credentials(proxy)} could not be reached: {_cause(error)}"


def _connect_failed(error: BaseException) -> bool:
    """Whether ``error``, or one it was raised from (huggingface_hub wraps httpx's error in its own), is a failed
    connection."""
    chain: BaseException | None = error
    for _ in range(8):
        if chain is None:
            return False
        if type(chain).__name__ in ("ConnectError", "ConnectTimeout") or isinstance(chain, ConnectionError):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def _limit_silence() -> None:
    """huggingface_hub's shared HTTP client, every request of it bounded by :data:`SILENCE_TIMEOUT_S` where it asks
    for no bound: its listing passes ``timeout=None`` itself, which lifts a client's default, so a request hook
    sets it (its factory's client otherwise as it is: hooks, proxies).  Made again if one was made before."""
    import httpx2
    from huggingface_hub.utils import _http, close_session, set_client_factory

    def bounded(request: Any) -> None:
        timeout = request.extensions.get("timeout") or {}
        if all(value is None for value in timeout.values()):
            request.extensions["timeout"] = httpx2.Timeout(SILENCE_TIMEOUT_S).as_dict()

    def factory() -> Any:
        client = _http.default_client_factory()
        client.event_hooks = {**client.event_hooks, "request": [*client.event_hooks["request"], bounded]}
        return client

    set_client_factory(factory)
    close_session()


def _download(source: HubSource, endpoint: str | None, tmp: Path, name: str,
              progress: Progress | None) -> dict[str, int | None]:
    """The listing, then the snapshot of the selected files under ``tmp/name``; the selected files and sizes."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import disable_progress_bars

    where = f"hub repository {source.repo_id}@{source.revision}"
    _limit_silence()
    api = HfApi(endpoint=endpoint)
    commit = api.repo_info(source.repo_id, revision=source.revision, timeout=SILENCE_TIMEOUT_S).sha  # None: none
    if not commit:
        raise HubError(f"{where}: the hub gave no commit for the revision")
    listing = {f.path: f.size for f in api.list_repo_tree(source.repo_id, revision=commit, recursive=True)
               if isinstance(f, RepoFile)}
    files = select_files(listing, source.allow_patterns)
    if not files:
        raise HubError(f"{where}: no file matches {', '.join(source.allow_patterns) or '*'}")
    total = sum(s for s in files.values() if s is not None) if all(s is not None for s in files.values()) else None
    tmp.mkdir(parents=True)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            snapshot_download(source.repo_id, revision=commit, allow_patterns=sorted(files), local_dir=tmp / name,
                              cache_dir=tmp / ".hf-cache", endpoint=endpoint, max_workers=4)
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            outcome["error"] = e

    # Our caller reports progress (the callback): huggingface_hub's own bars stay off meanwhile.
    with disable_progress_bars():
        worker = threading.Thread(target=run, name=f"fetch {source.repo_id}", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(POLL_S)
            if progress is not None and worker.is_alive():
                progress(min(_size_under(tmp), total) if total is not None else _size_under(tmp), total)
    if "error" in outcome:
        raise outcome["error"]
    if progress is not None:
        progress(total if total is not None else _size_under(tmp / name), total)
    return files
