"""``gpu-monitor history``: what the store remembers of a node's results, and when it changed.

Why it exists: a node's daemon writes a result per check and target on every poll (hundreds
a minute on an 8-GPU node), so "what happened on gpu:3 in the last hour" is a few transitions
inside thousands of rows. ``history`` reads them from a read-only store and, unless asked for
every row, keeps the transitions: the first result of each (check, target) in the window and
every result whose status or reason differs from the one before it. The node's lifecycle
changes and remediation steps in the window come with it when no check or target is named.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from gpu_monitor.model import UsageError, iso, parse_iso

__all__ = ["node_history", "parse_since"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_since(text: str, now: datetime) -> datetime:
    """``1h``, ``90m``, ``1h30m``, ``2d`` before ``now``, or an RFC 3339 time."""
    t = text.strip()
    if t and _DURATION.sub("", t) == "" and _DURATION.match(t):
        seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(t))
        return now - timedelta(seconds=seconds)
    try:
        return parse_iso(t)
    except ValueError:
        raise UsageError(f"--since {text!r}: expected a duration (30s, 15m, 1h, 1h30m, 2d) or "
                         f"an RFC 3339 time (2026-01-02T03:04:05Z)") from None


def _row(row: tuple[Any, ...]) -> dict[str, Any]:
    check, target, status, reason, message, details, action, at = row
    return {"at": iso(at), "check": check, "target": target, "status": status,
            "reason": reason, "message": message, "action": action,
            "details": json.loads(details or "{}")}


def _transitions(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    last: dict[tuple[str, str], tuple[str, str]] = {}
    out = []
    for row in rows:
        key, now = (row[0], row[1]), (row[2], row[3])
        if last.get(key) != now:
            out.append(row)
        last[key] = now
    return out


def node_history(store: Any, *, since: datetime | None, check: str | None,
                 target: str | None, every: bool, limit: int) -> dict[str, Any]:
    """The ``gpu-monitor history`` document: results oldest first (the newest ``limit`` of
    them), and the lifecycle changes and actions when no check or target is named."""
    # Rows, not Results: two days of an 8-GPU node are a few hundred thousand of them.
    results = store.result_rows(since=since, check=check, target=target)
    total = len(results)
    shown = results if every else _transitions(results)
    truncated = max(0, len(shown) - limit)
    shown = shown[truncated:]
    doc: dict[str, Any] = {
        "state_file": store.path, "since": iso(since) if since else None, "check": check,
        "target": target, "every_result": every, "results_in_window": total,
        "truncated": truncated, "results": [_row(r) for r in shown]}
    if check is None and target is None:
        ns = store.node_state(history_limit=limit)
        doc["lifecycle"] = [{"at": iso(h.at), "from": h.from_state, "to": h.to_state,
                             "reason": h.reason} for h in ns.history
                            if since is None or h.at >= since]
        doc["actions"] = [{"at": iso(a.at), "action": a.action, "result": a.result,
                           "details": dict(a.details)} for a in store.actions(since=since)]
    return doc
