"""The cleaner on ``/metrics`` (gpu_monitor_cleaning_*): an ``extra`` collector for
``StoreCollector``. What must survive a restart (the missed count, the last clean) is read from
the stored memory at scrape time; the per-process counts (runs, releases, API errors) start at
zero with the process, as Prometheus counters may."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpu_monitor.cleaning import plan
from gpu_monitor.cleaning.loop import Cleaner
from gpu_monitor.cleaning.suite import HeldSuite
from gpu_monitor.metric_families import MetricDoc
from gpu_monitor.model import Verdict

STATES = (plan.STATE_OFF, plan.STATE_PROVISIONING, plan.STATE_IN_USE, plan.STATE_WAITING,
          plan.STATE_CLEANING, plan.STATE_RETRYING, plan.STATE_FAILED, plan.STATE_CLEAN,
          plan.STATE_UNCLEAN, plan.STATE_QUARANTINED)

CLEANING_METRICS: tuple[MetricDoc, ...] = (
    MetricDoc("gpu_monitor_cleaning_state", "gauge", ("state",),
              "The check between workloads (docs/cleaning.md): 1 for the cleaner's state now "
              "(provisioning, in_use, waiting, cleaning, retrying, failed, clean, unclean, "
              "quarantined; off before its first pass), 0 for the others."),
    MetricDoc("gpu_monitor_cleaning_runs_total", "counter", ("verdict",),
              "Suite runs on the held node by verdict; unknown counts runs stopped by the "
              "budget or a lost hold, and images that cannot run the suite."),
    MetricDoc("gpu_monitor_cleaning_releases_total", "counter", (),
              "Holds deleted after a pass: the node was given back to workloads."),
    MetricDoc("gpu_monitor_cleaning_given_back_total", "counter", (),
              "Nodes given back to workloads without a pass: a failed run no quarantine took "
              "over within cleaning.retry_after_s (remediation off, in dry-run, the breaker), or "
              "cleaning.max_attempts runs without an answer. Kept in the state store."),
    MetricDoc("gpu_monitor_cleaning_missed_total", "counter", (),
              "Workloads that started on the node before it was cleaned since the one before "
              "(the race the hold cannot close; docs/cleaning.md#the-race-that-remains). Kept "
              "in the state store: it survives restarts."),
    MetricDoc("gpu_monitor_cleaning_api_errors_total", "counter", (),
              "Passes of the cleaner's loop cut short by a Kubernetes API error."),
    MetricDoc("gpu_monitor_cleaning_last_clean_timestamp_seconds", "gauge", (),
              "When the node last passed the suite between workloads (Unix time); absent "
              "before the first pass."),
    MetricDoc("gpu_monitor_cleaning_last_run_duration_seconds", "gauge", (),
              "How long the last suite run on the held node took; absent before the first."),
)
_HELP = {m.name: m.help for m in CLEANING_METRICS}


def _base(name: str) -> str:
    return name.removesuffix("_total")


def cleaning_collector(cleaner: Cleaner, suite: HeldSuite | None = None
                       ) -> Callable[[], Iterable[Any]]:
    def collect():
        counts = cleaner.counts
        mem = cleaner.memory()
        state = GaugeMetricFamily("gpu_monitor_cleaning_state",
                                  _HELP["gpu_monitor_cleaning_state"], labels=["state"])
        for s in STATES:
            state.add_metric([s], 1.0 if counts.state == s else 0.0)
        yield state
        runs = CounterMetricFamily(_base("gpu_monitor_cleaning_runs_total"),
                                   _HELP["gpu_monitor_cleaning_runs_total"], labels=["verdict"])
        for v in Verdict:
            runs.add_metric([v.value], float(counts.runs.get(v.value, 0)))
        yield runs
        for name, value in (("gpu_monitor_cleaning_releases_total", counts.released),
                            ("gpu_monitor_cleaning_given_back_total", mem.given_back),
                            ("gpu_monitor_cleaning_missed_total", mem.missed),
                            ("gpu_monitor_cleaning_api_errors_total", counts.errors)):
            yield CounterMetricFamily(_base(name), _HELP[name], value=float(value))
        name = "gpu_monitor_cleaning_last_clean_timestamp_seconds"
        fam = GaugeMetricFamily(name, _HELP[name])
        if mem.last_clean is not None:
            fam.add_metric([], mem.last_clean.timestamp())
        yield fam
        name = "gpu_monitor_cleaning_last_run_duration_seconds"
        fam = GaugeMetricFamily(name, _HELP[name])
        if suite is not None and suite.last is not None:
            fam.add_metric([], suite.last.seconds)
        yield fam

    return collect
