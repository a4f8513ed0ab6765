"""Prometheus exposition built from a store snapshot at scrape time.

A custom collector (the prometheus_client pattern for exporters): no global metric objects are
mutated from worker threads; every scrape reads the store (results, runs, counters, XID and
downtime history) and the daemon's in-process statistics, and yields fresh metric families.

Conventions (DESIGN.md §8): names ``gpu_monitor_<subsystem>_<quantity>_<unit>``, base units,
``_total`` only on counters, a fixed label vocabulary. Every declared reason's results counter is
present at 0 from start-up; an XID series appears when its code is first seen. ``METRICS`` below
is the declaration the docs' metrics reference is generated from (a test checks they agree).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
)

from gpu_monitor import __version__
from gpu_monitor.model import Status


@dataclass(frozen=True)
class MetricDoc:
    name: str
    type: str
    labels: tuple[str, ...]
    help: str


METRICS: tuple[MetricDoc, ...] = (
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
    MetricDoc("gpu_monitor_xid_events_total", "counter", ("gpu", "uuid", "code"),
              "NVIDIA Xid events seen in the kernel log, per GPU and code."),
    MetricDoc("gpu_monitor_sxid_events_total", "counter", ("code",),
              "NVSwitch SXid events seen in the kernel log, per code."),
    MetricDoc("gpu_monitor_rdma_port_down_seconds_total", "counter", ("device", "port"),
              "Cumulative time the RDMA port was observed down."),
    MetricDoc("gpu_monitor_rdma_port_outages_total", "counter", ("device", "port"),
              "RDMA port outages observed (including link_downed increments between polls)."),
    MetricDoc("gpu_monitor_rdma_port_state", "gauge", ("device", "port", "state"),
              "Logical state of each RDMA port (1 = current)."),
    MetricDoc("gpu_monitor_gpu_clock_event_active", "gauge", ("gpu", "uuid", "event"),
              "1 while the NVML clock event reason is active on the GPU."),
    MetricDoc("gpu_monitor_gpu_temperature_celsius", "gauge", ("gpu", "uuid", "sensor"),
              "GPU temperature per sensor (core, memory)."),
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
)

STATUS_STATES = tuple(s.value for s in Status)
BOOTSTRAP_STATES = ("passed", "failed", "unknown", "pending")
PORT_STATES = ("active", "down", "init", "armed", "active_defer", "unknown")
CLOCK_EVENTS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake", "sw_power_cap",
                "sw_thermal_slowdown", "gpu_idle", "applications_clocks_setting",
                "sync_boost", "display_clock_setting")


@dataclass(frozen=True)
class _Row:
    """The newest result of one (check, target), as much as metrics need."""

    check: str
    target: str
    status: str
    reason: str
    details: dict


def _help(name: str) -> str:
    for m in METRICS:
        if m.name == name:
            return m.help
    raise KeyError(name)


def _gpu_of(target: str) -> str | None:
    if target.startswith("gpu:"):
        return target.split(":", 1)[1]
    return None


class StoreCollector:
    """Collects every gpu-monitor series from ``store`` and ``stats`` at scrape time.

    ``checks`` are the check classes the daemon runs (their declared reasons seed the results
    counter at 0); ``stats`` returns process-local counters (kmsg parse errors and gaps);
    ``extra`` collectors (remediation) contribute their own families.
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
        latest = [_Row(*row) for row in self.store.latest_rows()]
        yield from self._check_metrics(latest)
        yield from self._xid_metrics()
        yield from self._rdma_metrics(latest)
        yield from self._gpu_metrics(latest)
        yield self._bootstrap_metric()
        yield from self._recoveries_metric()
        stats = self.stats()
        for key, name in (("kmsg_parse_errors", "gpu_monitor_kmsg_parse_errors"),
                          ("kmsg_gaps", "gpu_monitor_kmsg_gaps")):
            c = CounterMetricFamily(name, _help(name + "_total"))
            c.add_metric([], float(stats.get(key, 0)))
            yield c
        for fn in self.extra:
            yield from fn()

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

    # --- XIDs --------------------------------------------------------------------------------------

    def _xid_metrics(self):
        xid = CounterMetricFamily("gpu_monitor_xid_events", _help("gpu_monitor_xid_events_total"),
                                  labels=["gpu", "uuid", "code"])
        for (idx, uuid, code), n in sorted(self.store.xid_counts(kind="xid").items(),
                                           key=lambda kv: (str(kv[0][0]), str(kv[0][1]),
                                                           kv[0][2])):
            xid.add_metric(["" if idx is None else str(idx), uuid or "", str(code)], float(n))
        yield xid
        sxid = CounterMetricFamily("gpu_monitor_sxid_events",
                                   _help("gpu_monitor_sxid_events_total"), labels=["code"])
        per_code: dict[int, int] = {}
        for (_idx, _uuid, code), n in self.store.xid_counts(kind="sxid").items():
            per_code[code] = per_code.get(code, 0) + n
        for code, n in sorted(per_code.items()):
            sxid.add_metric([str(code)], float(n))
        yield sxid

    # --- RDMA --------------------------------------------------------------------------------------

    def _rdma_metrics(self, latest):
        now = self.now() if self.now else None
        down = CounterMetricFamily("gpu_monitor_rdma_port_down_seconds",
                                   _help("gpu_monitor_rdma_port_down_seconds_total"),
                                   labels=["device", "port"])
        outages = CounterMetricFamily("gpu_monitor_rdma_port_outages",
                                      _help("gpu_monitor_rdma_port_outages_total"),
                                      labels=["device", "port"])
        ports = set(self.store.known_ports())
        port_results = {}
        for r in latest:
            if r.check == "rdma_ports" and r.target.startswith("ib:"):
                _, dev, port = r.target.split(":")
                ports.add((dev, int(port)))
                port_results[(dev, int(port))] = r
        for dev, port in sorted(ports):
            down.add_metric([dev, str(port)], float(self.store.port_down_total_s(dev, port, now)))
            outages.add_metric([dev, str(port)], float(self.store.port_outages_total(dev, port)))
        yield down
        yield outages
        state = GaugeMetricFamily("gpu_monitor_rdma_port_state",
                                  _help("gpu_monitor_rdma_port_state"),
                                  labels=["device", "port", "state"])
        for (dev, port), r in sorted(port_results.items()):
            current = str(r.details.get("state") or "unknown").lower()
            if current not in PORT_STATES:
                current = "unknown"
            for s in PORT_STATES:
                state.add_metric([dev, str(port), s], 1.0 if s == current else 0.0)
        yield state

    # --- GPUs --------------------------------------------------------------------------------------

    def _gpu_metrics(self, latest):
        events = GaugeMetricFamily("gpu_monitor_gpu_clock_event_active",
                                   _help("gpu_monitor_gpu_clock_event_active"),
                                   labels=["gpu", "uuid", "event"])
        temps = GaugeMetricFamily("gpu_monitor_gpu_temperature_celsius",
                                  _help("gpu_monitor_gpu_temperature_celsius"),
                                  labels=["gpu", "uuid", "sensor"])
        for r in sorted(latest, key=lambda r: (r.check, r.target)):
            gpu = _gpu_of(r.target)
            if gpu is None:
                continue
            uuid = str(r.details.get("uuid") or "")
            if r.check == "throttle" and "active_events" in r.details:
                active = set(r.details.get("active_events") or ())
                for ev in CLOCK_EVENTS:
                    events.add_metric([gpu, uuid, ev], 1.0 if ev in active else 0.0)
            if r.check == "temperature":
                for sensor, key in (("core", "core_celsius"), ("memory", "memory_celsius")):
                    value = r.details.get(key)
                    if isinstance(value, (int, float)):
                        temps.add_metric([gpu, uuid, sensor], float(value))
        yield events
        yield temps
