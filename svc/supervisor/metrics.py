"""Supervisor metrics: per child state, readiness, restarts and uptime, read at scrape time."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from svc.supervisor.child import STATES


class ChildCollector:
    """A prometheus-client collector over the manager's children."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        state = GaugeMetricFamily("service_supervisor_child_state", "1 for the state the child is in, 0 for the others.",
                                  labels=["child", "state"])
        ready = GaugeMetricFamily("service_supervisor_child_ready", "1 when the child answers its readiness route.",
                                  labels=["child"])
        restarts = CounterMetricFamily("service_supervisor_child_restarts", "Restarts of the child (automatic and requested).",
                                       labels=["child"])
        uptime = GaugeMetricFamily("service_supervisor_child_uptime_seconds", "Seconds since the child was spawned.",
                                   labels=["child"])
        for name, child in self.manager.children.items():
            snap = child.snapshot()
            for s in STATES:
                state.add_metric([name, s], 1.0 if snap["state"] == s else 0.0)
            ready.add_metric([name], 1.0 if snap["ready"] else 0.0)
            restarts.add_metric([name], float(snap["restarts"]))
            uptime.add_metric([name], float(snap["uptime_s"] or 0.0))
        yield from (state, ready, restarts, uptime)
