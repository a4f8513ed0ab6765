"""NCCL arithmetic: what a collective sweep measured, in nccl-tests' terms, and its limits.

Why a module of its own: the node check (``checks/nccl_allreduce.py``: the devices of one node)
and the fabric probe (``gpu_monitor/fabric``: ranks across nodes) time the same collectives and
must report them the same way, so the arithmetic is written once: the message sizes of a sweep,
the nearest-rank percentile, the bus-bandwidth factor per collective, the per-size table and
the two limits a sweep is held to. Pure (no torch, no NVML, no I/O); each user phrases its own
findings (reasons, targets, actions) around the ``LimitBreach`` this module returns.

Guarantees:

1. Latency per iteration is the slowest rank's (as nccl-tests times each iteration); algbw is
   bytes / the slowest rank's mean iteration time (nccl-tests times a rank's whole loop, so
   the per-iteration maximum would add every rank's jitter on top); busbw = algbw x the
   collective's bus factor.
2. The busbw floor is judged at the large sizes (>= ``large_message_min_bytes``, else the
   largest size swept), by their lowest busbw; the latency limit at the small sizes
   (<= ``small_message_max_bytes``), by their highest p95. A limit that is not set is not
   judged.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_monitor.model import Status

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"


def sweep_sizes(lo: int, hi: int, factor: int) -> list[int]:
    """Message sizes from ``lo`` bytes up to ``hi``, each ``factor`` (at least 2) times the last."""
    sizes, s = [], max(1, int(lo))
    factor = max(2, int(factor))
    while s <= hi:
        sizes.append(s)
        s *= factor
    return sizes


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100), as nccl-tests reports i_p99."""
    ordered = sorted(values)
    k = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[k - 1]


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factors: all-reduce 2(n-1)/n, all-gather (n-1)/n."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if op == ALL_REDUCE else (n - 1) / n


def sweep_table(op: str, per_rank: Sequence[Sequence[Mapping[str, Any]]]
                ) -> list[dict[str, Any]]:
    """Per size, from every rank's rows (``bytes``, ``times_s``, ``wrong``): p50/p95 of the
    slowest rank per iteration, algbw from the slowest rank's mean, busbw, wrong values."""
    n = len(per_rank)
    rows = []
    for k, first in enumerate(per_rank[0]):
        series = [r[k]["times_s"] for r in per_rank]
        slowest = [max(ts) for ts in zip(*series, strict=True)]
        mean = max(statistics.fmean(ts) for ts in series) if slowest else float("nan")
        algbw = first["bytes"] / mean / 1e9 if mean > 0 else 0.0
        rows.append({
            "bytes": int(first["bytes"]),
            "p50_s": percentile(slowest, 50),
            "p95_s": percentile(slowest, 95),
            "time_avg_s": mean,
            "algbw_gb_per_s": algbw,
            "busbw_gb_per_s": algbw * bus_factor(op, n),
            "wrong": sum(int(r[k]["wrong"]) for r in per_rank),
        })
    return rows


def significant(value: Any) -> Any:
    """A float to 6 significant digits (what a report prints); anything else as it is."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def rounded(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A table with its floats to 6 significant digits."""
    return [{k: significant(v) for k, v in r.items()} for r in rows]


# --- limits ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepLimits:
    """What a sweep is held to (from the profile; ``None``: not judged)."""

    busbw_floor_gb_per_s: float | None
    large_message_min_bytes: int
    small_message_max_bytes: int
    small_p95_latency_limit_s: float | None
    warning_band: float


@dataclass(frozen=True)
class LimitBreach:
    """A sweep outside one of its limits: ``failed`` past it, ``degraded`` within the warning
    band of the busbw floor. ``message`` names the number, the size and the limit."""

    status: Status
    message: str


def busbw_breach(rows: Sequence[Mapping[str, Any]], limits: SweepLimits) -> LimitBreach | None:
    """The lowest busbw at the large sizes against the floor and its warning band."""
    floor = limits.busbw_floor_gb_per_s
    if not rows or not floor:
        return None
    large = [r for r in rows if r["bytes"] >= limits.large_message_min_bytes] or [rows[-1]]
    low = min(large, key=lambda r: r["busbw_gb_per_s"])
    bw = low["busbw_gb_per_s"]
    if bw < floor:
        return LimitBreach(Status.FAILED, f"busbw {bw:.4g} GB/s at {low['bytes']} B is below "
                                          f"the floor {floor:g} GB/s")
    if bw < floor * (1.0 + limits.warning_band):
        return LimitBreach(Status.DEGRADED, f"busbw {bw:.4g} GB/s at {low['bytes']} B is within "
                                            f"{limits.warning_band:g} of the floor {floor:g} GB/s")
    return None


def latency_breach(rows: Sequence[Mapping[str, Any]], limits: SweepLimits
                   ) -> LimitBreach | None:
    """The highest p95 latency at the small sizes against the limit."""
    limit = limits.small_p95_latency_limit_s
    small = [r for r in rows if r["bytes"] <= limits.small_message_max_bytes]
    if not limit or not small:
        return None
    slow = max(small, key=lambda r: r["p95_s"])
    if slow["p95_s"] <= limit:
        return None
    return LimitBreach(Status.FAILED, f"p95 latency {slow['p95_s'] * 1e6:.1f} us at "
                                      f"{slow['bytes']} B is above the limit "
                                      f"{limit * 1e6:.1f} us")
