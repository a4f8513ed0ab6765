"""Downtime in a sliding window, and how long an outage NCCL survives.

rdma_ports judges a port by its cumulative downtime in a window, not by how often it flapped,
and by whether one outage outlasted NCCL's InfiniBand retries; these are that arithmetic, free
of the store and of sysfs (with ``Track``, what the check remembers of one port between polls), so it can be read against docs/checks-notes/rdma_ports.md and tested
on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.hw.sysfs_values import IbPort

VERBS_TIMEOUT_UNIT_S = 4.096e-6  # IBTA local ACK timeout unit: 4.096 µs × 2^timeout


def nccl_tolerance_s(ib_timeout: int, retry_cnt: int) -> float:
    """Seconds an RDMA outage may last before NCCL fails: 4.096 µs × 2^t × retries.

    A retry count of 0 still waits one timeout, so the factor is at least 1.
    """
    return VERBS_TIMEOUT_UNIT_S * (2 ** int(ib_timeout)) * max(1, int(retry_cnt))


def port_is_down(port: IbPort) -> bool:
    """Down = not ACTIVE or not LinkUp (INIT/ARMED wait for the subnet manager: no traffic)."""
    return port.state != "ACTIVE" or port.phys_state != "LinkUp"


def window_stats(intervals: Iterable[Sequence[Any]], window_start: float,
                 now: float) -> tuple[float, float, int]:
    """(downtime inside the window, longest interval touching it, how many touch it).

    Intervals are ``(start, end)`` in epoch seconds, ``end`` None while open (runs to ``now``).
    The longest is measured whole, not clipped: NCCL felt all of it.
    """
    downtime = longest = 0.0
    count = 0
    for start, end in intervals:
        stop = now if end is None else end
        if end is not None and stop <= window_start:
            continue  # ended before the window: drained
        count += 1
        longest = max(longest, stop - start)
        downtime += max(0.0, min(stop, now) - max(start, window_start))
    return downtime, longest, count


def crossing_at(open_start: float | None, tolerance_s: float, now: float) -> float | None:
    """The instant an open outage starting at ``open_start`` outlasts ``tolerance_s`` (epoch
    seconds), while that is still ahead of ``now``; None when no outage is open or it already
    crossed."""
    if open_start is None:
        return None
    at = open_start + tolerance_s
    return at if at > now else None


def intervals_over(intervals: Iterable[Sequence[Any]], tolerance_s: float, window_start: float,
                   now: float) -> list[tuple[float, float | None]]:
    """Every interval touching the window that lasted (or, open, has lasted) longer than
    ``tolerance_s``, oldest first: each one an outage NCCL did not survive."""
    out: list[tuple[float, float | None]] = []
    for start, end in intervals:
        stop = now if end is None else end
        if end is not None and stop <= window_start:
            continue
        if stop - start > tolerance_s:
            out.append((start, end))
    return out


def longest_interval(intervals: Iterable[Sequence[Any]], window_start: float,
                     now: float) -> tuple[float, float | None] | None:
    """The ``(start, end)`` of the longest interval touching the window (``end`` None while
    open): the outage ``window_stats`` measures as the longest."""
    best: tuple[float, float | None] | None = None
    best_len = -1.0
    for start, end in intervals:
        stop = now if end is None else end
        if end is not None and stop <= window_start:
            continue
        if stop - start > best_len:
            best, best_len = (start, end), stop - start
    return best


@dataclass
class Track:
    """What the check remembers about one port (times in epoch seconds)."""

    intervals: list[list[float | None]] = field(default_factory=list)  # [start, end|None]
    link_downed: int | None = None
    owed: int = 0  # down transitions seen whose link_downed increment has not shown yet
    last_poll: float | None = None
    last_down_seen: float | None = None
    flaps: list[float] = field(default_factory=list)  # unseen flaps (link_downed only)
    stored_boot: str | None = None
    resumed: bool = False  # the open interval came from the store: check it on first sight

    def open_start(self) -> float | None:
        if self.intervals and self.intervals[-1][1] is None:
            return self.intervals[-1][0]
        return None
