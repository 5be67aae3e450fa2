"""The pretrained variants a model plugin declares.

A plugin's factory may carry ``variants``, a tuple of :class:`Variant`: each
names where the official file or hub repository is, how to check it, its
licence, and the ``[model]`` keys it implies (an architecture size, a
preprocessing preset).  Exactly one variant of a plugin is its ``default``.
Nothing here downloads: ``svc.weightstore`` fetchers and ``svcctl weights``
use these records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FileSource:
    """One file at a URL.

    ``sha256`` is the full digest where the source publishes one;
    ``hash_prefix`` is torch.hub's convention (the hex after the last ``-``
    of the file name is a prefix of the SHA-256).  With neither, the digest
    is recorded at the first pull and checked from then on.  ``convert``
    names a converter of the plugin (its factory's ``convert`` method) that
    turns the downloaded file into what ``build`` loads; None stores the
    file as it is.
    """

    url: str
    sha256: str | None = None
    hash_prefix: str | None = None
    size: int | None = None
    convert: str | None = None

    @property
    def filename(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class HubSource:
    """A Hugging Face hub repository, fetched with ``huggingface_hub`` (honours ``HF_ENDPOINT``)."""

    repo_id: str
    revision: str = "main"
    allow_patterns: tuple[str, ...] = ()
    size: int | None = None


@dataclass(frozen=True)
class Variant:
    """One pretrained variant of a catalog model."""

    name: str
    source: FileSource | HubSource
    license: str
    description: str = ""
    model: Mapping[str, Any] = field(default_factory=dict)
    default: bool = False

    @property
    def size(self) -> int | None:
        return self.source.size


def variants_of(factory: Any) -> tuple[Variant, ...]:
    """The variants a model factory declares (none for a plugin without pretrained weights)."""
    return tuple(getattr(factory, "variants", ()) or ())


def find_variant(factory: Any, name: str | None) -> Variant:
    """The variant called ``name``, or the factory's default for None; KeyError names the known ones."""
    found = variants_of(factory)
    if not found:
        raise KeyError(f"{factory.catalog_id} declares no pretrained variants")
    if name is None:
        defaults = [v for v in found if v.default]
        return defaults[0] if defaults else found[0]
    for variant in found:
        if variant.name == name:
            return variant
    raise KeyError(f"{factory.catalog_id} has no pretrained variant {name!r}; known: "
                   f"{', '.join(v.name for v in found)}")
