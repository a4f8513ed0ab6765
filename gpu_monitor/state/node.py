"""The node's own record: its quarantine state and history, the remediation steps taken, and
the reports other detectors made about it.

Why it exists: the remediator resumes a quarantine after a restart from here, acts on each
GPUHealthReport once only (its uid is remembered for good), and the action and report counters
behind the remediation metrics only go up. ``NODE_STATES`` is the lifecycle the store accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpu_monitor.state.connection import Database
from gpu_monitor.state.encoding import dumps, from_us, loads_mapping, to_us

__all__ = [
    "NODE_STATES",
    "ActionRecord",
    "HealthReport",
    "NodeState",
    "NodeStateChange",
    "NodeTables",
]

# The quarantine lifecycle of DESIGN.md §7; the store refuses anything else (a typo persisted
# would be read back as an unknown state after every restart).
NODE_STATES = ("healthy", "suspect", "quarantined", "retesting", "reboot-required", "replace")


@dataclass(frozen=True)
class NodeStateChange:
    at: datetime
    from_state: str
    to_state: str
    reason: str


@dataclass(frozen=True)
class NodeState:
    """Where the node is in the quarantine lifecycle; ``since`` is None if never recorded."""

    state: str = "healthy"
    since: datetime | None = None
    reason: str = ""
    retest_failures: int = 0
    history: tuple[NodeStateChange, ...] = ()  # oldest first


@dataclass(frozen=True)
class ActionRecord:
    """One remediation step taken (or, in dry-run, decided) and how it ended."""

    action: str
    result: str
    at: datetime
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthReport:
    """A report about this node from another detector (GPUHealthReport CR or the drop dir)."""

    uid: str
    node: str
    reason: str
    source: str
    observed_at: datetime
    payload: Mapping[str, Any] = field(default_factory=dict)


class NodeTables(Database):
    """``node_state``/``node_state_history``, ``actions``/``action_counters`` and
    ``health_reports``/``health_report_counters``."""

    def node_state(self, history_limit: int = 50) -> NodeState:
        """The current lifecycle state; ``healthy`` with ``since=None`` if never recorded."""
        with self._read() as c:
            row = c.execute("SELECT state, since_us, reason, retest_failures FROM node_state"
                            " WHERE id = 1").fetchone()
            hist = c.execute("SELECT at_us, from_state, to_state, reason FROM node_state_history"
                             " ORDER BY id DESC LIMIT ?", (int(history_limit),)).fetchall()
        history = tuple(NodeStateChange(from_us(a), f, t, r) for a, f, t, r in reversed(hist))
        if row is None:
            return NodeState(history=history)
        return NodeState(state=row[0], since=from_us(row[1]), reason=row[2],
                         retest_failures=int(row[3]), history=history)

    def set_node_state(self, state: str, reason: str, at: datetime, *,
                       retest_failures: int | None = None) -> bool:
        """Move to ``state``; True when it changed (and a history row was appended).

        ``retest_failures`` counts failed retests in the current quarantine: leaving
        ``retesting`` for anything but ``healthy`` adds one, reaching ``healthy`` resets it;
        pass a value to set it explicitly.
        """
        if state not in NODE_STATES:
            raise ValueError(f"unknown node state {state!r}; expected one of {NODE_STATES}")
        at_us = to_us(at)
        with self._write() as c:
            row = c.execute("SELECT state, retest_failures FROM node_state WHERE id = 1"
                            ).fetchone()
            current, failures = (row[0], int(row[1])) if row else ("healthy", 0)
            changed = state != current
            if changed:
                if state == "healthy":
                    failures = 0
                elif current == "retesting":
                    failures += 1
            if retest_failures is not None:
                failures = int(retest_failures)
            if not changed and row is not None:
                c.execute("UPDATE node_state SET retest_failures = ? WHERE id = 1", (failures,))
                return False
            if changed or row is None:
                c.execute(
                    "INSERT INTO node_state (id, state, since_us, reason, retest_failures)"
                    " VALUES (1, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
                    " since_us = excluded.since_us, reason = excluded.reason,"
                    " retest_failures = excluded.retest_failures",
                    (state, at_us, reason, failures))
            if changed:
                c.execute("INSERT INTO node_state_history (at_us, from_state, to_state, reason)"
                          " VALUES (?, ?, ?, ?)", (at_us, current, state, reason))
        return changed

    # --- remediation actions -----------------------------------------------------------------

    def record_action(self, action: str, result: str, at: datetime,
                      details: Mapping[str, Any] | None = None) -> None:
        """Remember a remediation step and count it per (action, result)."""
        text = dumps(dict(details or {}))
        with self._write() as c:
            c.execute("INSERT INTO actions (action, result, at_us, details) VALUES (?, ?, ?, ?)",
                      (action, result, to_us(at), text))
            c.execute("INSERT INTO action_counters (action, result, count) VALUES (?, ?, 1)"
                      " ON CONFLICT (action, result) DO UPDATE SET count = count + 1",
                      (action, result))

    def actions(self, since: datetime | None = None,
                action: str | None = None) -> list[ActionRecord]:
        rows = self._select("SELECT action, result, at_us, details FROM actions", "at_us, id",
                            "at_us", since, (("action", action),))
        return [ActionRecord(a, r, from_us(t), loads_mapping(d)) for a, r, t, d in rows]

    def action_counts(self) -> dict[tuple[str, str], int]:
        with self._read() as c:
            rows = c.execute("SELECT action, result, count FROM action_counters").fetchall()
        return {(a, r): int(n) for a, r, n in rows}

    # --- health reports from other detectors -------------------------------------------------

    def add_health_report(self, uid: str, node: str, reason: str, source: str,
                          observed_at: datetime, payload: Mapping[str, Any] | None = None
                          ) -> bool:
        """Remember a report by uid; False when that uid was already seen (act once only)."""
        text = dumps(dict(payload or {}))
        with self._write() as c:
            inserted = c.execute(
                "INSERT INTO health_reports (uid, node, reason, source, observed_us,"
                " received_us, payload) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (uid) DO NOTHING",
                (uid, node, reason, source, to_us(observed_at), to_us(self._clock.now()),
                 text)).rowcount
            if inserted:
                c.execute("INSERT INTO health_report_counters (reason, count) VALUES (?, 1)"
                          " ON CONFLICT (reason) DO UPDATE SET count = count + 1", (reason,))
        return bool(inserted)

    def health_reports(self, since: datetime | None = None) -> list[HealthReport]:
        rows = self._select(
            "SELECT uid, node, reason, source, observed_us, payload FROM health_reports",
            "observed_us, uid", "observed_us", since)
        return [HealthReport(u, n, r, s, from_us(t), loads_mapping(p)) for u, n, r, s, t, p in rows]

    def health_report_counts(self) -> dict[str, int]:
        with self._read() as c:
            rows = c.execute("SELECT reason, count FROM health_report_counters").fetchall()
        return {r: int(n) for r, n in rows}

