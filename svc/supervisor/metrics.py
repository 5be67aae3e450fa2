"""Supervisor metrics: per child state, readiness, restarts and uptime, read at scrape time.

``child`` is the model's catalog id (or ``__gateway``) and ``replica`` the
replica's index (0 for the gateway and for a model of one replica), so a
model's replicas are one ``child`` with several ``replica`` values.
"""

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
        labels = ["child", "replica"]
        state = GaugeMetricFamily("service_supervisor_child_state", "1 for the state the child is in, 0 for the others.",
                                  labels=[*labels, "state"])
        ready = GaugeMetricFamily("service_supervisor_child_ready", "1 when the child answers its readiness route.",
                                  labels=labels)
        restarts = CounterMetricFamily("service_supervisor_child_restarts", "Restarts of the child (automatic and requested).",
                                       labels=labels)
        uptime = GaugeMetricFamily("service_supervisor_child_uptime_seconds", "Seconds since the child was spawned.",
                                   labels=labels)
        for name, child in self.manager.children.items():
            snap = child.snapshot()
            info = child.spec.info
            key = [info.get("model", name), str(info.get("replica", 0))]
            for s in STATES:
                state.add_metric([*key, s], 1.0 if snap["state"] == s else 0.0)
            ready.add_metric(key, 1.0 if snap["ready"] else 0.0)
            restarts.add_metric(key, float(snap["restarts"]))
            uptime.add_metric(key, float(snap["uptime_s"] or 0.0))
        yield from (state, ready, restarts, uptime)
