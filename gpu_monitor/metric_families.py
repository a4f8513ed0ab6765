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
3. Families that count over history (XID events, RDMA down time) read the store through
   ``MetricsHistory`` instead of result details: their counters must continue across restarts
   and grow between polls (an outage still in progress at scrape time), which a value frozen
   into one poll's result cannot do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Sample = tuple[Sequence[str], float]


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


def state_set(current: str, states: Sequence[str]) -> Iterable[tuple[str, float]]:
    """One (state, 1.0 or 0.0) per state: a state set spelled as a gauge with a state label."""
    for state in states:
        yield state, 1.0 if state == current else 0.0
