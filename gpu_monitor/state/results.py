"""The results checks produced and the latest run of each check: what the collector scrapes.

Why it exists: the metrics collector reads the newest result per (check, target) on every
scrape, windowed checks read a check's recent history, and the per-reason counters must only
go up across restarts and pruning. ``record_run`` writes a run's results, their counts and the
run itself in one transaction.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpu_monitor.model import Action, Result, Status, thaw
from gpu_monitor.state.connection import Database
from gpu_monitor.state.encoding import dumps, from_us, to_us

if TYPE_CHECKING:  # pragma: no cover
    from gpu_monitor.model import RunOutcome

__all__ = ["ResultTables", "RunInfo"]


@dataclass(frozen=True)
class RunInfo:
    """The latest run of one check: when, how long, and whether it ran to completion."""

    check: str
    started_at: datetime
    duration_s: float
    success: bool
    error: str = ""




class ResultTables(Database):
    """``results``, ``latest_results``, ``runs`` and ``reason_counters``."""

    def record_run(self, outcome: RunOutcome) -> None:
        """Store a run's results, count their reasons and remember the run, atomically.

        Each target's newest result is what ``latest_results`` points at, as if each result
        were applied in turn (a later one wins a tie, an older one never replaces a newer):
        that is the last of the run's results with the target's greatest time, so one update
        per target says it (a follower's batch holds many results per GPU)."""
        rows = []
        for r in outcome.results:
            rows.append((r.check, r.target, r.status.value, r.reason, r.message,
                         dumps(thaw(r.details, json_safe=True)), r.action.value,
                         to_us(r.observed_at)))
        started = to_us(outcome.started_at)
        with self._write() as c:
            newest: dict[tuple[str, str], tuple[int, int]] = {}
            for row in rows:
                rid = c.execute(
                    "INSERT INTO results (check_name, target, status, reason, message, details,"
                    " action, observed_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row).lastrowid
                held = newest.get((row[0], row[1]))
                if held is None or row[7] >= held[1]:
                    newest[(row[0], row[1])] = (rid, row[7])
            c.executemany(
                "INSERT INTO latest_results (check_name, target, result_id, observed_us)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (check_name, target) DO UPDATE SET"
                " result_id = excluded.result_id, observed_us = excluded.observed_us"
                " WHERE excluded.observed_us >= latest_results.observed_us",
                [(check, target, rid, at) for (check, target), (rid, at) in newest.items()])
            counts = Counter((r.check, r.reason) for r in outcome.results)
            c.executemany(
                "INSERT INTO reason_counters (check_name, reason, count) VALUES (?, ?, ?)"
                " ON CONFLICT (check_name, reason) DO UPDATE SET count = count + excluded.count",
                [(check, reason, n) for (check, reason), n in counts.items()])
            c.execute(
                "INSERT INTO runs (check_name, started_us, duration_s, success, error)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (check_name) DO UPDATE SET"
                " started_us = excluded.started_us, duration_s = excluded.duration_s,"
                " success = excluded.success, error = excluded.error"
                " WHERE excluded.started_us >= runs.started_us",
                (outcome.check, started, float(outcome.duration_s), int(outcome.success),
                 outcome.error or ""))

    _RESULT_COLUMNS = "check_name, target, status, reason, message, details, action, observed_us"

    @staticmethod
    def _result(row: Sequence[Any]) -> Result:
        check, target, status, reason, message, details, action, observed = row
        return Result(check=check, status=Status(status), target=target, reason=reason,
                      message=message, details=json.loads(details or "{}"),
                      action=Action(action), observed_at=from_us(observed))

    def latest_results(self) -> list[Result]:
        """The newest result per (check, target), ordered by check then target."""
        cols = ", ".join(f"r.{c.strip()}" for c in self._RESULT_COLUMNS.split(","))
        with self._read() as c:
            rows = c.execute(
                f"SELECT {cols} FROM latest_results l JOIN results r ON r.id = l.result_id"
                " ORDER BY l.check_name, l.target").fetchall()
        return [self._result(row) for row in rows]

    def latest_rows(self) -> list[tuple[str, str, str, str, dict[str, Any]]]:
        """``(check, target, status, reason, details)`` of the newest result per (check,
        target): what a scrape needs, without building a frozen ``Result`` per row."""
        with self._read() as c:
            rows = c.execute(
                "SELECT r.check_name, r.target, r.status, r.reason, r.details"
                " FROM latest_results l JOIN results r ON r.id = l.result_id"
                " ORDER BY l.check_name, l.target").fetchall()
        return [(check, target, status, reason, json.loads(details or "{}"))
                for check, target, status, reason, details in rows]

    def results_for(self, check: str, since: datetime | None = None,
                    target: str | None = None, limit: int | None = None) -> list[Result]:
        """A check's results, oldest first; ``limit`` keeps the newest ``limit`` of them."""
        where, args = ["check_name = ?"], [check]
        if target is not None:
            where.append("target = ?")
            args.append(target)
        self._since_clause("observed_us", since, where, args)
        sql = (f"SELECT {self._RESULT_COLUMNS} FROM results WHERE {' AND '.join(where)}"
               " ORDER BY observed_us DESC, id DESC")
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._read() as c:
            rows = c.execute(sql, args).fetchall()
        return [self._result(row) for row in reversed(rows)]

    def result_rows(self, since: datetime | None = None, check: str | None = None,
                    target: str | None = None) -> list[tuple[Any, ...]]:
        """``(check, target, status, reason, message, details JSON text, action, observed
        datetime)`` of every stored result, oldest first, filtered as given: a history of the
        whole node without building a frozen ``Result`` (and decoding its details) per row."""
        rows = self._select(f"SELECT {self._RESULT_COLUMNS} FROM results", "observed_us, id",
                            "observed_us", since, (("check_name", check), ("target", target)))
        return [(*row[:7], from_us(row[7])) for row in rows]

    def last_run(self, check: str) -> RunInfo | None:
        with self._read() as c:
            row = c.execute("SELECT check_name, started_us, duration_s, success, error"
                            " FROM runs WHERE check_name = ?", (check,)).fetchone()
        return None if row is None else self._run_info(row)

    def runs(self) -> dict[str, RunInfo]:
        with self._read() as c:
            rows = c.execute("SELECT check_name, started_us, duration_s, success, error"
                             " FROM runs ORDER BY check_name").fetchall()
        return {row[0]: self._run_info(row) for row in rows}

    @staticmethod
    def _run_info(row: Sequence[Any]) -> RunInfo:
        return RunInfo(check=row[0], started_at=from_us(row[1]), duration_s=float(row[2]),
                       success=bool(row[3]), error=row[4] or "")

    def reason_counts(self) -> dict[tuple[str, str], int]:
        """Results ever recorded per (check, reason): monotonic, untouched by ``prune``."""
        with self._read() as c:
            rows = c.execute("SELECT check_name, reason, count FROM reason_counters").fetchall()
        return {(check, reason): int(n) for check, reason, n in rows}

