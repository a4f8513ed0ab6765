"""RDMA port outages: one row per down interval, and per-port totals that only go up.

Why it exists: rdma_ports fails a port by its cumulative downtime inside a sliding window
(default 24 h), which must survive restarts; the Prometheus downtime counter must never go
backwards when old intervals are pruned. An outage opens with ``port_down_start`` (at most one
open per port) and closes with ``port_down_end``, which adds its length to the port's total.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from gpu_monitor.state.connection import Database
from gpu_monitor.state.encoding import from_us, to_us

__all__ = ["PortTables", "clip_downtime_s"]


def clip_downtime_s(intervals: Iterable[tuple[datetime, datetime | None]],
                    window_start: datetime, now: datetime) -> float:
    """Seconds of ``intervals`` inside ``[window_start, now]``; an open interval runs to ``now``.

    Pure, so the window arithmetic is tested apart from SQLite. Overlapping input intervals are
    not merged: the store never has two open at once for one port.
    """
    lo, hi = to_us(window_start), to_us(now)
    total = 0
    for start, end in intervals:
        s = max(to_us(start), lo)
        e = min(hi if end is None else to_us(end), hi)
        if e > s:
            total += e - s
    return total / 1e6



class PortTables(Database):
    """``ports`` (per-port totals) and ``port_down`` (the intervals)."""

    def port_down_start(self, device: str, port: int, at: datetime) -> bool:
        """Open an outage; False when one is already open (the earliest start is kept)."""
        start = to_us(at)
        with self._write() as c:
            c.execute("INSERT INTO ports (device, port) VALUES (?, ?)"
                      " ON CONFLICT (device, port) DO NOTHING", (device, int(port)))
            if c.execute("SELECT 1 FROM port_down WHERE device = ? AND port = ?"
                         " AND end_us IS NULL", (device, int(port))).fetchone():
                return False
            c.execute("INSERT INTO port_down (device, port, start_us) VALUES (?, ?, ?)",
                      (device, int(port), start))
            c.execute("UPDATE ports SET outages = outages + 1 WHERE device = ? AND port = ?",
                      (device, int(port)))
        return True

    def port_down_end(self, device: str, port: int, at: datetime) -> float | None:
        """Close the open outage; returns its length in seconds, None when none was open.

        An end before the start (the clock stepped back) closes it with zero length.
        """
        with self._write() as c:
            row = c.execute("SELECT id, start_us FROM port_down WHERE device = ? AND port = ?"
                            " AND end_us IS NULL", (device, int(port))).fetchone()
            if row is None:
                return None
            outage_id, start = row
            end = max(to_us(at), start)
            c.execute("UPDATE port_down SET end_us = ? WHERE id = ?", (end, outage_id))
            c.execute("UPDATE ports SET closed_down_us = closed_down_us + ?"
                      " WHERE device = ? AND port = ?", (end - start, device, int(port)))
        return (end - start) / 1e6

    def open_port_outage(self, device: str, port: int) -> datetime | None:
        with self._read() as c:
            row = c.execute("SELECT start_us FROM port_down WHERE device = ? AND port = ?"
                            " AND end_us IS NULL", (device, int(port))).fetchone()
        return None if row is None else from_us(row[0])

    def port_intervals(self, device: str, port: int, since: datetime | None = None
                       ) -> list[tuple[datetime, datetime | None]]:
        """Outages still running or ending at/after ``since``, by start; open ones end None."""
        where, args = ["device = ?", "port = ?"], [device, int(port)]
        if since is not None:
            where.append("(end_us IS NULL OR end_us >= ?)")
            args.append(to_us(since))
        with self._read() as c:
            rows = c.execute(f"SELECT start_us, end_us FROM port_down WHERE {' AND '.join(where)}"
                             " ORDER BY start_us, id", args).fetchall()
        return [(from_us(s), None if e is None else from_us(e)) for s, e in rows]

    def port_downtime_s(self, device: str, port: int, window_start: datetime,
                        now: datetime) -> float:
        """Seconds the port was down inside ``[window_start, now]`` (the sliding window)."""
        with self._read() as c:
            rows = c.execute(
                "SELECT start_us, end_us FROM port_down WHERE device = ? AND port = ?"
                " AND start_us < ? AND (end_us IS NULL OR end_us > ?)",
                (device, int(port), to_us(now), to_us(window_start))).fetchall()
        return clip_downtime_s(((from_us(s), None if e is None else from_us(e)) for s, e in rows),
                               window_start, now)

    def port_down_total_s(self, device: str, port: int, now: datetime | None = None) -> float:
        """All downtime ever recorded for the port, the open outage counted up to ``now``.

        Backs a Prometheus counter: closed outages are summed into ``ports`` when they end, so
        pruning intervals never lowers it.
        """
        now_us = to_us(now or self._clock.now())
        with self._read() as c:
            row = c.execute("SELECT closed_down_us FROM ports WHERE device = ? AND port = ?",
                            (device, int(port))).fetchone()
            if row is None:
                return 0.0
            open_row = c.execute("SELECT start_us FROM port_down WHERE device = ? AND port = ?"
                                 " AND end_us IS NULL", (device, int(port))).fetchone()
        total = int(row[0])
        if open_row is not None:
            total += max(0, now_us - open_row[0])
        return total / 1e6

    def port_outages_total(self, device: str, port: int) -> int:
        """Outages ever opened on the port (monotonic)."""
        with self._read() as c:
            row = c.execute("SELECT outages FROM ports WHERE device = ? AND port = ?",
                            (device, int(port))).fetchone()
        return 0 if row is None else int(row[0])

    def known_ports(self) -> list[tuple[str, int]]:
        """Every port that ever had an outage recorded, for the metrics collector."""
        with self._read() as c:
            rows = c.execute("SELECT device, port FROM ports ORDER BY device, port").fetchall()
        return [(d, int(p)) for d, p in rows]

