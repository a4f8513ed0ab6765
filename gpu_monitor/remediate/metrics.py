"""Remediation metrics: an ``extra`` collector for ``gpu_monitor.metrics.StoreCollector``.

Built at scrape time from the state store (node state, counted actions, health reports) and the
last breaker snapshot the remediator saved there - never from the API server, so a scrape
costs no request and works while the API server is down. Every series of a fixed vocabulary is
present from start-up (at 0), so alerts on ``increase()`` see the first event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpu_monitor.metric_families import MetricDoc
from gpu_monitor.remediate.record import KV_BREAKER, KV_NAMESPACE
from gpu_monitor.remediate.reports import REPORT_ACTIONS
from gpu_monitor.state.node import NODE_STATES

__all__ = ["METRICS", "REMEDIATION_METRICS", "remediation_collector"]


REMEDIATION_METRICS: tuple[MetricDoc, ...] = (
    MetricDoc("gpu_monitor_node_state", "gauge", ("state",),
              "Quarantine lifecycle state of this node (one series per state, 1 = current)."),
    MetricDoc("gpu_monitor_breaker_state", "gauge", ("state",),
              "Fleet circuit breaker as last seen by this daemon: closed, tripped, paused "
              "(1 = current; paused is set alongside closed/tripped)."),
    MetricDoc("gpu_monitor_breaker_slots_used", "gauge", (),
              "Quarantine slots held in the fleet breaker, as last seen."),
    MetricDoc("gpu_monitor_breaker_slots_budget", "gauge", (),
              "Quarantine slots the fleet may hold (budget), as last computed; NaN if unknown."),
    MetricDoc("gpu_monitor_remediation_actions_total", "counter", ("action", "result"),
              "Remediation steps taken (or decided, result dry_run) per action and result."),
    MetricDoc("gpu_monitor_drain_evictions_total", "counter", ("result",),
              "Pod eviction outcomes during drains (evicted, gone, blocked, failed, timeout, "
              "stuck, force_deleted)."),
    MetricDoc("gpu_monitor_health_reports_total", "counter", ("reason",),
              "Health reports about this node received (GPUHealthReport or dropped file)."),
    MetricDoc("gpu_monitor_replacements_total", "counter", (),
              "Times this node was labelled for replacement."),
)

BREAKER_STATES = ("closed", "tripped", "paused")
EVICTION_RESULTS = ("evicted", "gone", "blocked", "failed", "timeout", "stuck", "force_deleted")
ACTIONS = ("quarantine", "cordon", "taint", "drain", "reset_gpu", "retest", "reboot", "replace",
           "release", "uncordon")


def _help(name: str) -> str:
    return next(m.help for m in REMEDIATION_METRICS if m.name == name)


def remediation_collector(store: Any,
                          breaker: Callable[[], dict[str, Any] | None] | None = None
                          ) -> Callable[[], Iterable[Any]]:
    """A callable for ``StoreCollector(extra=[...])``; ``breaker`` overrides where the breaker
    snapshot comes from (default: the one the remediator saved in the store)."""

    def snapshot() -> dict[str, Any] | None:
        if breaker is not None:
            return breaker()
        raw = store.get_kv(KV_NAMESPACE, KV_BREAKER)
        return raw if isinstance(raw, dict) else None

    def collect() -> Iterable[Any]:
        state = store.node_state().state
        g = GaugeMetricFamily("gpu_monitor_node_state", _help("gpu_monitor_node_state"),
                              labels=["state"])
        for s in NODE_STATES:
            g.add_metric([s], 1.0 if s == state else 0.0)
        yield g

        snap = snapshot() or {}
        bstate = str(snap.get("state") or "closed") if snap else ""
        g = GaugeMetricFamily("gpu_monitor_breaker_state", _help("gpu_monitor_breaker_state"),
                              labels=["state"])
        for s in BREAKER_STATES:
            on = bool(snap.get("paused")) if s == "paused" else s == bstate
            g.add_metric([s], 1.0 if on else 0.0)
        yield g
        yield GaugeMetricFamily("gpu_monitor_breaker_slots_used",
                                _help("gpu_monitor_breaker_slots_used"),
                                value=float(len(snap.get("slots") or {})))
        budget = snap.get("budget")
        yield GaugeMetricFamily("gpu_monitor_breaker_slots_budget",
                                _help("gpu_monitor_breaker_slots_budget"),
                                value=float(budget) if budget is not None else float("nan"))

        counts = store.action_counts()
        c = CounterMetricFamily("gpu_monitor_remediation_actions_total",
                                _help("gpu_monitor_remediation_actions_total"),
                                labels=["action", "result"])
        seen = set()
        for (action, result), n in sorted(counts.items()):
            if action == "eviction":
                continue
            seen.add(action)
            c.add_metric([action, result], float(n))
        for action in ACTIONS:
            if action not in seen:
                c.add_metric([action, "ok"], 0.0)
        yield c
        c = CounterMetricFamily("gpu_monitor_drain_evictions_total",
                                _help("gpu_monitor_drain_evictions_total"), labels=["result"])
        for result in sorted(set(EVICTION_RESULTS) | {r for a, r in counts if a == "eviction"}):
            c.add_metric([result], float(counts.get(("eviction", result), 0)))
        yield c
        c = CounterMetricFamily("gpu_monitor_health_reports_total",
                                _help("gpu_monitor_health_reports_total"), labels=["reason"])
        reports = store.health_report_counts()
        for reason in sorted(set(REPORT_ACTIONS) | set(reports)):
            c.add_metric([reason], float(reports.get(reason, 0)))
        yield c
        yield CounterMetricFamily("gpu_monitor_replacements_total",
                                  _help("gpu_monitor_replacements_total"),
                                  value=float(counts.get(("replace", "labelled"), 0)))

    return collect

#: The name gpu_monitor/docs_gen.py reads to generate docs/metrics.md.
METRICS = REMEDIATION_METRICS
