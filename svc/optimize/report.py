"""What the optimisation of one model load reports: each candidate's outcome, the mode in use, one line.

Kept apart from :mod:`svc.optimize.select`, which fills it in; the service
logs :attr:`Report.line` when the model is ready.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from svc.optimize.modes import EAGER_MODE, Mode

if TYPE_CHECKING:
    from svc.optimize.choices import Recorded


@dataclass
class Outcome:
    """What happened to one candidate mode."""

    mode: Mode
    ms: float | None = None  # per call of every target (the best of the timed calls)
    gate: str = ""  # the gate's figure
    problem: str | None = None  # why it was dropped
    detail: str = ""  # the traceback of an exception that dropped it

    def describe(self, eager_ms: float | None) -> str:
        if self.problem:
            return f"{self.mode} dropped ({self.problem})"
        speed = f" {eager_ms / self.ms:.2f}x" if eager_ms and self.ms else ""
        timing = f" {self.ms:.1f} ms{speed}" if self.ms is not None else ""
        return f"{self.mode}{timing} [{self.gate}]" if self.gate else f"{self.mode}{timing}"


@dataclass
class Report:
    """The optimisation of one model load: the mode in use and one line saying why."""

    setting: str
    chosen: Mode = EAGER_MODE
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    line: str = ""
    fell_back: bool = False  # an explicit mode failed: running eager
    cache: dict[str, int] = field(default_factory=dict)  # compiled packages built and loaded by this load
    recorded: Recorded | None = None  # the record the mode was applied from (nothing was measured)
    notes: list[str] = field(default_factory=list)  # what the line adds: records ignored or not written

    @property
    def mode(self) -> str:
        return self.chosen.name


def cache_counters(compiling: bool, converting: bool = False) -> dict[str, int]:
    """Packages built and loaded (``svc.optimize.aot``), models converted and read (``svc.optimize.runtimes``) so far.

    Only the counters of what a candidate does: a load that neither compiles nor converts shows none.
    """
    counters: dict[str, int] = {}
    if compiling:
        from svc.optimize.aot import STATS

        counters.update(built=STATS["built"], loaded=STATS["loaded"], broken_packages=STATS["unusable"])
    if converting:
        from svc.optimize.runtimes import STATS as CONVERSIONS

        counters.update(converted=CONVERSIONS["converted"], read=CONVERSIONS["loaded"],
                        broken_conversions=CONVERSIONS["unusable"])
    return counters


def cache_delta(before: dict[str, int], compiling: bool, converting: bool = False) -> dict[str, int]:
    after = cache_counters(compiling, converting)
    return {k: v - before.get(k, 0) for k, v in after.items()}


def describe_cache(delta: dict[str, int]) -> str:
    parts = []
    if "built" in delta:
        parts.append(f"; compiled packages: {delta['built']} built, {delta['loaded']} loaded from the cache"
                     + _unusable(delta.get("broken_packages", 0)))
    if "converted" in delta:
        parts.append(f"; converted models: {delta['converted']} converted, {delta['read']} read from the cache"
                     + _unusable(delta.get("broken_conversions", 0)))
    return "".join(parts)


def _unusable(count: int) -> str:
    """The cached artefacts that were there but could not be used, and were made again (svc.optimize.cache)."""
    return f" ({count} in the cache unusable: made again)" if count else ""
