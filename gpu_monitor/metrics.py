"""Prometheus exposition built from a store snapshot at scrape time: a composer, not a catalog.

A custom collector (the prometheus_client pattern for exporters): no global metric objects are
mutated from worker threads; every scrape reads the store and the daemon's in-process
statistics and yields fresh metric families. The collector owns only the framework's families
(``METRICS``: every check's status, success, duration and results counter, the bootstrap gate,
state recoveries, the kernel-log follower's counters); every family about what a check found
is declared on that check (``Check.metrics``) and built by the check's own pure function from
its newest results (gpu_monitor/metric_families.py). The collector only composes them, in the
order of the checks it serves.

Conventions (DESIGN.md §8): names ``gpu_monitor_<subsystem>_<quantity>_<unit>``, base units,
``_total`` only on counters, a fixed label vocabulary. Every declared reason's results counter is
present at 0 from start-up; an XID series appears when its code is first seen. docs/metrics.md
is generated from ``documented_metrics`` (a test checks they agree).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
)

from gpu_monitor import __version__
from gpu_monitor.metric_families import CheckMetric, LatestResult, MetricDoc
from gpu_monitor.model import Status

_CHECK_METRICS: tuple[MetricDoc, ...] = (
    MetricDoc("gpu_monitor_build_info", "info", ("version",),
              "Build information of the running gpu-monitor."),
    MetricDoc("gpu_monitor_check_status", "gauge", ("check", "target", "status"),
              "Latest status of each check on each target (one series per status, 1 = current)."),
    MetricDoc("gpu_monitor_check_success", "gauge", ("check",),
              "1 if the check's last run completed (no crash, no timeout), else 0."),
    MetricDoc("gpu_monitor_check_duration_seconds", "gauge", ("check",),
              "Duration of the check's last run."),
    MetricDoc("gpu_monitor_check_last_run_timestamp_seconds", "gauge", ("check",),
              "Unix time the check last ran."),
    MetricDoc("gpu_monitor_check_results_total", "counter", ("check", "reason"),
              "Results produced per check and reason; every declared reason starts at 0."),
)
_NODE_METRICS: tuple[MetricDoc, ...] = (
    MetricDoc("gpu_monitor_bootstrap_state", "gauge", ("state",),
              "The provisioning gate: passed (a pass is recorded), failed, unknown (last suite "
              "undecided) or pending (not run yet); 1 = current."),
    MetricDoc("gpu_monitor_state_recoveries_total", "counter", (),
              "Damaged state files moved aside on this node (by the daemon at start or by "
              "gpu-monitor state recover), counted from the copies kept beside the file."),
    MetricDoc("gpu_monitor_kmsg_parse_errors_total", "counter", (),
              "Kernel-log lines that could not be parsed."),
    MetricDoc("gpu_monitor_kmsg_gaps_total", "counter", (),
              "Kernel ring-buffer overruns (records lost before they were read)."),
    MetricDoc("gpu_monitor_kmsg_read_total", "counter", (),
              "Kernel-log records (or text-log lines) the daemon's follower has read, whether "
              "or not a check was handed them; its rate is the ingest rate."),
)
#: The collector's own families (the checks' are on the checks).
METRICS: tuple[MetricDoc, ...] = (*_CHECK_METRICS, *_NODE_METRICS)

#: Samples one scrape of the simulated 8-GPU node (profile h100-sxm-8: 18 NVLinks per GPU, 8
#: RDMA ports, 4 NVSwitches) may carry, and what it carried when last measured (the faulty
#: golden scenario, remediation included): tests/test_metrics_cardinality.py holds both.
SERIES_BOUND_8GPU = 3000
SERIES_MEASURED_8GPU = 2178
#: Families renamed, old name -> (new name, why): a breaking change for dashboards and alerts.
RENAMED: Mapping[str, tuple[str, str]] = MappingProxyType({
    "gpu_monitor_breaker_slots_total": (
        "gpu_monitor_breaker_slots_budget",
        "a gauge named like a counter (`_total`); the value is unchanged"),
})

STATUS_STATES = tuple(s.value for s in Status)
BOOTSTRAP_STATES = ("passed", "failed", "unknown", "pending")


def documented_metrics(checks: Iterable[type] | None = None) -> tuple[MetricDoc, ...]:
    """Every family the collector serves for ``checks`` (default: the built-in checks), in
    exposition order: the framework's, each check's own, then the node's."""
    if checks is None:
        from gpu_monitor.registry import all_check_classes

        checks = all_check_classes(plugins=False)
    own = [m for cls in checks for m in getattr(cls, "metrics", ())]
    return (*_CHECK_METRICS, *own, *_NODE_METRICS)


def _help(name: str) -> str:
    for m in METRICS:
        if m.name == name:
            return m.help
    raise KeyError(name)


def _family(doc: MetricDoc):
    """An empty prometheus_client family for ``doc`` (counters are named without ``_total``:
    the client appends it)."""
    if doc.type == "counter":
        return CounterMetricFamily(doc.name.removesuffix("_total"), doc.help,
                                   labels=list(doc.labels))
    return GaugeMetricFamily(doc.name, doc.help, labels=list(doc.labels))


class _StoreHistory:
    """The store's history as a check's metric family may read it (``MetricsHistory``):
    read-only, with down time counted up to this scrape."""

    def __init__(self, store, now: Any):
        self._store, self._now = store, now

    def xid_counts(self, kind: str):
        return self._store.xid_counts(kind=kind)

    def known_ports(self):
        return self._store.known_ports()

    def port_down_seconds(self, device: str, port: int) -> float:
        return self._store.port_down_total_s(device, port, self._now)

    def port_outages(self, device: str, port: int) -> int:
        return self._store.port_outages_total(device, port)


def _declared_view(rows: Sequence[LatestResult], metric: CheckMetric) -> list[LatestResult]:
    """``rows`` with only the details keys ``metric`` declares (guarantee 2 of
    gpu_monitor/metric_families.py)."""
    keys = metric.details
    return [LatestResult(r.check, r.target, r.status, r.reason,
                         MappingProxyType({k: r.details[k] for k in keys if k in r.details}))
            for r in rows]


class StoreCollector:
    """Collects every gpu-monitor series from ``store`` and ``stats`` at scrape time.

    ``checks`` are the check classes the daemon runs (their declared reasons seed the results
    counter at 0, their declared families are built from their results); ``stats`` returns
    process-local counters (kmsg parse errors and gaps); ``extra`` collectors (remediation)
    contribute their own families.
    """

    def __init__(self, store, checks: Iterable[type] = (),
                 stats: Callable[[], Mapping[str, float]] | None = None,
                 now: Callable[[], Any] | None = None,
                 extra: Iterable[Callable[[], Iterable[Any]]] = ()):
        self.store = store
        self.checks = list(checks)
        self.stats = stats or (lambda: {})
        self.now = now
        self.extra = list(extra)

    def describe(self):
        return []

    def collect(self):
        info = InfoMetricFamily("gpu_monitor_build", _help("gpu_monitor_build_info"))
        info.add_metric([], {"version": __version__})
        yield info
        latest = [LatestResult(*row) for row in self.store.latest_rows()]
        yield from self._check_metrics(latest)
        yield from self._checks_own_metrics(latest)
        yield self._bootstrap_metric()
        yield from self._recoveries_metric()
        stats = self.stats()
        for key, name in (("kmsg_parse_errors", "gpu_monitor_kmsg_parse_errors"),
                          ("kmsg_gaps", "gpu_monitor_kmsg_gaps"),
                          ("kmsg_read", "gpu_monitor_kmsg_read")):
            c = CounterMetricFamily(name, _help(name + "_total"))
            c.add_metric([], float(stats.get(key, 0)))
            yield c
        for fn in self.extra:
            yield from fn()

    def _checks_own_metrics(self, latest: Sequence[LatestResult]):
        """Each served check's declared families, built by the check from its newest results
        (sorted by target) and a read-only view of the store's history."""
        history = _StoreHistory(self.store, self.now() if self.now else None)
        for cls in self.checks:
            rows = sorted((r for r in latest if r.check == cls.name), key=lambda r: r.target)
            for metric in getattr(cls, "metrics", ()):
                family = _family(metric)
                for labels, value in metric.samples(_declared_view(rows, metric), history):
                    family.add_metric(list(labels), float(value))
                yield family

    def _bootstrap_metric(self):
        state = "pending"
        try:
            if self.store.get_kv("bootstrap", "passed"):
                state = "passed"
            else:
                last = self.store.get_kv("bootstrap", "last") or {}
                verdict = last.get("verdict") if isinstance(last, dict) else None
                state = {"unhealthy": "failed", "unknown": "unknown"}.get(verdict, state)
        except Exception:  # noqa: BLE001 - a scrape never fails on one family
            state = "pending"
        g = GaugeMetricFamily("gpu_monitor_bootstrap_state", _help("gpu_monitor_bootstrap_state"),
                              labels=["state"])
        for s in BOOTSTRAP_STATES:
            g.add_metric([s], 1.0 if s == state else 0.0)
        return g

    def _recoveries_metric(self):
        from gpu_monitor.state.recovery import recoveries_total

        try:
            total = recoveries_total(self.store)
        except Exception:  # noqa: BLE001 - a scrape never fails on one family
            return  # absent rather than a 0 that would read as a counter reset
        c = CounterMetricFamily("gpu_monitor_state_recoveries",
                                _help("gpu_monitor_state_recoveries_total"))
        c.add_metric([], float(total))
        yield c

    # --- per-check -------------------------------------------------------------------------------

    def _check_metrics(self, latest):
        # A state set spelled as a gauge with an explicit `status` label (the text format's
        # native state set would name the label after the metric).
        status = GaugeMetricFamily("gpu_monitor_check_status", _help("gpu_monitor_check_status"),
                                   labels=["check", "target", "status"])
        for r in sorted(latest, key=lambda r: (r.check, r.target)):
            for s in STATUS_STATES:
                status.add_metric([r.check, r.target, s], 1.0 if s == r.status else 0.0)
        yield status

        runs = self.store.runs()
        success = GaugeMetricFamily("gpu_monitor_check_success",
                                    _help("gpu_monitor_check_success"), labels=["check"])
        duration = GaugeMetricFamily("gpu_monitor_check_duration_seconds",
                                     _help("gpu_monitor_check_duration_seconds"),
                                     labels=["check"])
        last = GaugeMetricFamily("gpu_monitor_check_last_run_timestamp_seconds",
                                 _help("gpu_monitor_check_last_run_timestamp_seconds"),
                                 labels=["check"])
        for name in sorted(runs):
            info = runs[name]
            success.add_metric([name], 1.0 if info.success else 0.0)
            duration.add_metric([name], float(info.duration_s))
            last.add_metric([name], info.started_at.timestamp())
        yield success
        yield duration
        yield last

        counts = dict(self.store.reason_counts())
        for cls in self.checks:
            for reason in cls.all_reasons():
                counts.setdefault((cls.name, reason), 0)
        results = CounterMetricFamily("gpu_monitor_check_results",
                                      _help("gpu_monitor_check_results_total"),
                                      labels=["check", "reason"])
        for (check, reason), n in sorted(counts.items()):
            results.add_metric([check, reason], float(n))
        yield results
