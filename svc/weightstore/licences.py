"""What a pull is about to fetch, and the licences it needs accepted first.

Why: a profile's ``pretrained`` once pulled about 5 GB without a word,
among them a non-commercial (CC-BY-NC-4.0) and an AGPL-3.0 model.  Before a
pull starts, ``svcctl weights pull`` prints the total size and every
licence of what it will fetch; a variant under a licence that is not in
:data:`PERMISSIVE` is pulled only once that licence was accepted, with
``--accept-licence NAME`` or by answering a question on a terminal, never
silently.  Licences compare by their SPDX id (the first word of the
declaration), without regard to case.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import IO, Any

#: Licences a pull needs no acceptance for (SPDX ids, compared case-insensitively).
PERMISSIVE = frozenset({"apache-2.0", "bsd-2-clause", "bsd-3-clause", "mit", "isc", "cc0-1.0", "cc-by-4.0"})


def spdx(licence: str) -> str:
    """The licence's SPDX id, casefolded: a declaration may add words after it ("BSD-3-Clause (torchvision)")."""
    words = licence.split("(", 1)[0].split()
    return words[0].casefold() if words else ""


def permissive(licence: str) -> bool:
    """True for a licence whose SPDX id is in :data:`PERMISSIVE`."""
    return spdx(licence) in PERMISSIVE


def size_text(n: float) -> str:
    """Bytes in MB below 1 GB, else GB."""
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def plan_lines(chosen: Iterable[tuple[Any, Any, bool]]) -> list[str]:
    """The lines printed before a pull: one per variant (size, licence, cached or not), then the total.

    ``chosen`` holds ``(factory, variant, cached)``; a cached variant is
    checked, not fetched, and counts for nothing in the total.
    """
    rows = list(chosen)
    lines = []
    total, unknown = 0, 0
    for factory, variant, cached in rows:
        size = variant.size
        if not cached:
            if size is None:
                unknown += 1
            else:
                total += size
        mark = "" if permissive(variant.license) else "  (needs acceptance)"
        state = "cached: checked, not fetched" if cached else (size_text(size) if size is not None else "size unpublished")
        lines.append(f"  {factory.catalog_id} {variant.name}: {state}; licence {variant.license}{mark}")
    fetched = sum(1 for *_, cached in rows if not cached)
    more = f", plus {unknown} of unpublished size" if unknown else ""
    licences = ", ".join(sorted({v.license for _, v, c in rows if not c}, key=str.casefold)) or "none"
    head = (f"Pull: {fetched} of {len(rows)} variant(s) to fetch, {size_text(total)} in all{more}; "
            f"licences: {licences}")
    return [head, *lines]


def accepted(variant: Any, names: Iterable[str], ask: Callable[[str], bool] | None) -> bool:
    """Whether ``variant`` may be pulled: a permissive licence, one named in ``names``, or a yes from ``ask``."""
    if permissive(variant.license) or spdx(variant.license) in {spdx(n) for n in names}:
        return True
    return ask is not None and ask(variant.license)


def terminal_question(stream_in: IO[str], stream_out: IO[str], label: str) -> Callable[[str], bool] | None:
    """A question on the terminal (``[y/N]``), or None when stdin or the output is not a terminal."""
    if not (getattr(stream_in, "isatty", lambda: False)() and getattr(stream_out, "isatty", lambda: False)()):
        return None

    def ask(licence: str) -> bool:
        stream_out.write(f"{label} is licensed {licence}, not a permissive licence: check what it allows you "
                         f"before serving it. Accept {licence} and pull? [y/N] ")
        stream_out.flush()
        return stream_in.readline().strip().casefold() in ("y", "yes")

    return ask
