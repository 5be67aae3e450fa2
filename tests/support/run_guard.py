"""A pytest plugin that fails a run in which fewer (or more) tests ran than were collected.

Why: under xdist the controller schedules tests by node id.  When two items
share one node id (pytest 9 builds an item's id from ``originalname`` and its
callspec only, and schemathesis's per-operation items have no callspec), the
workers run the first of them and the rest are dropped without a word: 22
conformance cases collected, 4 run, a clean pass.  This plugin counts, on
the process that reports the run (the xdist controller, or pytest itself
without xdist), the tests collected and the tests that reached teardown, and
turns a run that would pass into a failure (exit status 1, one line naming
both numbers) when they differ.

A run that fails already, is interrupted, stops early (``-x``,
``--maxfail``) or only collects is left as it is: its counts differ for
reasons the run already reports.

tests/conftest.py registers it for the suite; ``-p tests.support.run_guard``
loads it into any pytest run.
"""

from __future__ import annotations

import pytest

PLUGIN_NAME = "run-guard"


class RunGuard:
    """Counts the tests that ran (one teardown report each) against the tests collected."""

    def __init__(self) -> None:
        self.ran = 0

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.ran += 1

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus != pytest.ExitCode.OK or session.config.option.collectonly:
            return
        if session.shouldfail or session.shouldstop:
            return
        collected = session.testscollected  # deselected tests (-k, -m) are not counted
        if collected == self.ran:
            return
        message = (f"run guard: {collected} tests collected but {self.ran} ran; tests that share a node id are "
                   "dropped under xdist (see tests/support/run_guard.py)")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("")
            reporter.write_sep("=", message, red=True, bold=True)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    """Register the guard on the process that reports the run (never on an xdist worker)."""
    if hasattr(config, "workerinput") or config.pluginmanager.has_plugin(PLUGIN_NAME):
        return
    config.pluginmanager.register(RunGuard(), PLUGIN_NAME)
