"""svc.infra.repeats: a failure's traceback once per interval per cause, with a bounded memory."""

from __future__ import annotations

from svc.infra.repeats import MAX_CAUSES, TracebackBudget


def test_a_cause_is_allowed_once_per_interval_and_each_cause_on_its_own():
    now = [100.0]
    budget = TracebackBudget(every_s=60.0, clock=lambda: now[0])
    assert budget.allows("KeyError: 'a'") is True
    assert budget.allows("KeyError: 'a'") is False
    assert budget.allows("ValueError: b") is True  # another cause has its own minute
    now[0] += 59.9
    assert budget.allows("KeyError: 'a'") is False
    now[0] += 0.1
    assert budget.allows("KeyError: 'a'") is True  # a minute on: its traceback again
    assert budget.allows("KeyError: 'a'") is False


def test_causes_that_name_varying_values_keep_the_memory_bounded():
    budget = TracebackBudget(clock=lambda: 0.0)
    for i in range(MAX_CAUSES * 3):
        assert budget.allows(f"shape mismatch {i}") is True
    assert len(budget._last) <= MAX_CAUSES
