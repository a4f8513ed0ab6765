"""Attribution metrics: an ``extra`` collector for ``gpu_monitor.metrics.StoreCollector``, built
at scrape time from the refresher's current snapshot (no kubelet call on a scrape)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpu_monitor.metric_families import MetricDoc
from gpu_monitor.workloads.attribution import Refresher

#: Pods per GPU exported at most (time-slicing can share one GPU among many pods): with the
#: GPU count this bounds the info family's series.
MAX_PODS_PER_GPU = 16
ATTRIBUTION_STATES = ("ok", "stale", "unknown")
READ_RESULTS = ("ok", "unavailable", "timeout", "unimplemented", "permission_denied", "error")

WORKLOAD_METRICS: tuple[MetricDoc, ...] = (
    MetricDoc("gpu_monitor_gpu_pod_info", "gauge", ("gpu", "uuid", "namespace", "pod", "container"),
              "1 per (GPU, container) the kubelet allocated the GPU to, from the last good "
              f"pod-resources read (at most {MAX_PODS_PER_GPU} per GPU; none off Kubernetes)."),
    MetricDoc("gpu_monitor_workloads_state", "gauge", ("state",),
              "Attribution freshness: ok (last read succeeded), stale (last read failed, the "
              "mapping is the last good one), unknown (no read succeeded); 1 = current."),
    MetricDoc("gpu_monitor_workloads_reads_total", "counter", ("result",),
              "Attribution reads by result (ok, unavailable, timeout, unimplemented, "
              "permission_denied, error)."),
)


def _help(name: str) -> str:
    return next(m.help for m in WORKLOAD_METRICS if m.name == name)


def workload_collector(refresher: Refresher) -> Callable[[], Iterable[Any]]:
    """A callable for ``StoreCollector(extra=[...])``."""

    def collect():
        snap = refresher.current()
        info = GaugeMetricFamily("gpu_monitor_gpu_pod_info", _help("gpu_monitor_gpu_pod_info"),
                                 labels=["gpu", "uuid", "namespace", "pod", "container"])
        for uuid in sorted(snap.gpus, key=lambda u: (snap.gpu_index.get(u, 1 << 30), u)):
            index = snap.gpu_index.get(uuid)
            pods = [h for h in snap.gpus[uuid] if h.pod][:MAX_PODS_PER_GPU]
            for h in pods:
                info.add_metric(["" if index is None else str(index), uuid, h.namespace, h.pod,
                                 h.container], 1.0)
        yield info
        state = GaugeMetricFamily("gpu_monitor_workloads_state",
                                  _help("gpu_monitor_workloads_state"), labels=["state"])
        for s in ATTRIBUTION_STATES:
            state.add_metric([s], 1.0 if s == snap.state else 0.0)
        yield state
        reads = CounterMetricFamily("gpu_monitor_workloads_reads",
                                    _help("gpu_monitor_workloads_reads_total"), labels=["result"])
        counts = dict(refresher.reads)
        for result in READ_RESULTS:
            reads.add_metric([result], float(counts.get(result, 0)))
        yield reads

    return collect
