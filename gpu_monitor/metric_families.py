"""The metric families gpu-monitor exports, declared as data: what each one is and, for a check's
own families, how it is built from the check's results.

Why here and not in ``gpu_monitor.metrics``: a check declares the families it exports
(``Check.metrics``) beside its other declarations, and checks never import the metrics
collector (nor ``prometheus_client``). The collector composes: for every check it serves it
calls each declared family's ``samples`` function and turns what comes back into Prometheus
families at scrape time. docs/metrics.md is generated from the same declarations.

Guarantees:

1. ``samples`` is a pure function of the check's newest result per target and a read-only view
   of the store's history: no I/O, no writes, no Prometheus objects. It returns (label values,
   value) pairs in the order they are exposed.
2. A family reads only the ``details`` keys it declares (``CheckMetric.details``): the collector
   hands it each result with the other keys removed, so a key the check stops writing shows up
   as a missing declaration in tests, not as a silently empty series.
3. A value that was not read (``None``, missing, not a number) yields no sample: never a 0
   that would read as healthy. ``number`` is the one test of that, for every family below.
4. Every label is one of ``LABELS`` (DESIGN.md §8's fixed vocabulary, one meaning each across
   all families; tests/test_metric_labels.py holds every declared family to it).
5. Families that count over history (XID events, RDMA down time) read the store through
   ``MetricsHistory`` instead of result details: their counters must continue across restarts
   and grow between polls (an outage still in progress at scrape time), which a value frozen
   into one poll's result cannot do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Sample = tuple[Sequence[str], float]

#: The fixed label vocabulary: every label a family may carry, and what it means everywhere.
LABELS: Mapping[str, str] = {
    "version": "gpu-monitor's version (build info)",
    "check": "a check's name (its module name)",
    "target": "what a result is about: `gpu:3`, `nvlink:3:7`, `ib:mlx5_0:1`, `pcie:<address>`, "
              "`nvswitch:0`, `node`",
    "status": "a result's status: ok, degraded, failed, unknown, skipped",
    "reason": "a result's CamelCase reason token (never an NVML clock event reason)",
    "state": "one state of a state set (a port's, the node's, the breaker's, the bootstrap "
             "gate's, the cleaner's)",
    "verdict": "a suite run's verdict: healthy, unhealthy, unknown",
    "gpu": "the GPU's NVML index; empty on a PCI function that is not a GPU",
    "uuid": "the GPU's UUID (survives re-enumeration); empty where `gpu` is",
    "pci_bus_id": "a PCI function's address, `0000:19:00.0` (GPU, NVSwitch or NIC)",
    "link": "an NVLink link's index on its GPU (0-17 on H100 SXM)",
    "device": "an RDMA device (`mlx5_0`)",
    "port": "an RDMA port number on its device",
    "code": "an Xid or SXid code",
    "sensor": "a temperature sensor: core, memory",
    "event": "an NVML clock event reason (`hw_slowdown`, `sw_power_cap`, ...)",
    "type": "what a hardware error counter counts: ECC and remapped rows corrected / "
            "uncorrected; NVLink replay, recovery, crc_flit, crc_data",
    "level": "a row-remapper availability level (spare rows left in a bank): max, high, "
             "partial, low, none",
    "severity": "a PCIe AER severity: correctable, nonfatal, fatal",
    "action": "a remediation action",
    "result": "the outcome of a remediation action, a drain's eviction or an attribution read",
    "namespace": "the Kubernetes namespace of the pod holding a device",
    "pod": "the name of the pod holding a device",
    "container": "the container (in `pod`) the device is allocated to",
}


@dataclass(frozen=True)
class MetricDoc:
    """One exported family: its full exposition name (counters end in ``_total``), type
    (``gauge``, ``counter``, ``info``), label names and help text."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class LatestResult:
    """The newest result of one (check, target), as much as a metric family may read."""

    check: str
    target: str
    status: str
    reason: str
    details: Mapping[str, Any]


class MetricsHistory(Protocol):
    """The store's history as a family may read it at scrape time (read-only)."""

    def xid_counts(self, kind: str) -> Mapping[tuple[int | None, str | None, int], int]:
        """Events per (GPU index, UUID, code) of ``kind`` (``xid`` or ``sxid``)."""

    def known_ports(self) -> Sequence[tuple[str, int]]:
        """Every RDMA (device, port) the store has history for."""

    def port_down_seconds(self, device: str, port: int) -> float:
        """Cumulative seconds the port was seen down, up to the scrape."""

    def port_outages(self, device: str, port: int) -> int:
        """Outages the port had."""


SamplesFn = Callable[[Sequence[LatestResult], MetricsHistory], Iterable[Sample]]


@dataclass(frozen=True)
class CheckMetric(MetricDoc):
    """A family a check exports: built by ``samples`` from the check's newest results (sorted by
    target) and the history view; ``details`` lists the result details keys it reads."""

    details: tuple[str, ...] = ()
    samples: SamplesFn | None = None


def gpu_labels(result: LatestResult) -> tuple[str, str] | None:
    """``(gpu, uuid)`` label values of a ``gpu:<i>`` result (``uuid`` from its details), or None
    for any other target."""
    if not result.target.startswith("gpu:"):
        return None
    return result.target.split(":", 1)[1], str(result.details.get("uuid") or "")


def number(value: Any) -> float | None:
    """``value`` as a sample value, or None when it was not read (None, a string, a list):
    guarantee 3. A bool is 1.0 / 0.0."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return None


def gpu_value(key: str) -> SamplesFn:
    """Samples of each GPU's ``details[key]`` labelled ``(gpu, uuid)``."""

    def samples(results: Sequence[LatestResult], history: MetricsHistory) -> Iterable[Sample]:
        for r in results:
            labels, value = gpu_labels(r), number(r.details.get(key))
            if labels is not None and value is not None:
                yield labels, value

    samples.__doc__ = f"Each GPU's ``{key}`` at its last poll (not read: no sample)."
    return samples


def gpu_values(keys: Mapping[str, str], nested: str | None = None) -> SamplesFn:
    """Samples labelled ``(gpu, uuid, <label value>)``, one per entry of ``keys`` (label value
    -> details key, or key of the mapping ``details[nested]``), in ``keys``' order."""

    def samples(results: Sequence[LatestResult], history: MetricsHistory) -> Iterable[Sample]:
        for r in results:
            labels = gpu_labels(r)
            source = r.details if nested is None else r.details.get(nested)
            if labels is None or not isinstance(source, Mapping):
                continue
            for label, key in keys.items():
                value = number(source.get(key))
                if value is not None:
                    yield (*labels, label), value

    samples.__doc__ = (f"Per GPU, one sample per {', '.join(keys)}"
                       + (f" of ``{nested}``" if nested else "") + " (not read: no sample).")
    return samples


def state_set(current: str, states: Sequence[str]) -> Iterable[tuple[str, float]]:
    """One (state, 1.0 or 0.0) per state: a state set spelled as a gauge with a state label."""
    for state in states:
        yield state, 1.0 if state == current else 0.0
