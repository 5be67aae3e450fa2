"""Hugging Face hub variants (``HubSource``): the fetcher ``svcctl weights pull`` calls.

Placeholder until the hub fetcher (``huggingface_hub.snapshot_download``
into ``dest_dir``, honouring ``HF_ENDPOINT``) lands: a hub variant fails its
pull with one line that says so, and ``svcctl weights import`` of a folder
already works for it.
"""

from __future__ import annotations

from typing import Any


class HubUnavailable(Exception):
    """Hub repositories cannot be pulled by this build."""


def fetch_hub(variant: Any, dest_dir: str, progress: Any) -> None:
    """Download the hub repository of ``variant`` into ``dest_dir`` (not implemented in this build)."""
    source = variant.source
    raise HubUnavailable(
        f"pulling hub repositories ({source.repo_id}) is not implemented in this build: download the repository "
        f"elsewhere and use `svcctl weights import <ID> <FOLDER> --variant {variant.name}`"
    )
