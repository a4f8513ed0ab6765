"""The fail-fast counts on ``/metrics``: an ``extra`` collector for ``StoreCollector``, read from
the store at scrape time (the counts survive restarts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily

from gpu_monitor.failfast.records import NoticeBook
from gpu_monitor.metric_families import MetricDoc

#: ``action="notice"`` counts triggers by outcome; the others count one action on one workload.
NOTICE_RESULTS = ("notified", "would_notify", "error", "nobody", "stale", "unknown")
ACTION_RESULTS = ("ok", "error", "dry_run")

FAILFAST_METRICS: tuple[MetricDoc, ...] = (
    MetricDoc("gpu_monitor_failfast_notices_total", "counter", ("action", "result"),
              "Fail-fast notices (docs/workloads.md#the-fail-fast-notice): action=\"notice\" "
              "counts outages by result (notified, would_notify in dry-run, error when no "
              "action reached anyone, nobody, stale, unknown); action=file|signal|event|delete counts that action per workload "
              "(ok, error, dry_run)."),
)


def failfast_collector(store: Any, actions: Iterable[str]) -> Callable[[], Iterable[Any]]:
    book = NoticeBook(store)
    actions = tuple(actions)

    def collect():
        fam = CounterMetricFamily("gpu_monitor_failfast_notices",
                                  FAILFAST_METRICS[0].help, labels=["action", "result"])
        counts = book.counts()
        rows = {("notice", r): 0 for r in NOTICE_RESULTS}
        rows.update({(a, r): 0 for a in actions for r in ACTION_RESULTS})
        rows.update(counts)
        for (action, result), n in sorted(rows.items()):
            fam.add_metric([action, result], float(n))
        yield fam

    return collect
