"""The tables ``status``, ``history`` and ``explain`` print on a terminal.

Why apart: each command builds one JSON document (status.py, history.py, explain.py) and
``-o json`` prints it as it is; the table is drawn from the same document here, so a person
and a script never see different facts.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

__all__ = ["explain_table", "history_table", "status_table"]

_MARK = {"ok": "ok", "degraded": "DEGRADED", "failed": "FAILED", "unknown": "UNKNOWN",
         "skipped": "skipped", None: "-"}
_ORDER = ("ok", "skipped", "degraded", "unknown", "failed")


def _counts(results: list[Mapping[str, Any]]) -> str:
    n = {s: 0 for s in _ORDER}
    for r in results:
        n[r["status"]] += 1
    return ", ".join(f"{n[s]} {s}" for s in _ORDER if n[s])


def _check_lines(c: Mapping[str, Any], every: bool) -> list[str]:
    run = c["last_run"]
    when = f"last run {run['started_at']}" if run else "never ran"
    if run and not run["success"]:
        when += f" (did not complete: {run['error'] or 'see the log'})"
    rs = c["results"]
    head = f"{_MARK[c['status']]:<9} {c['check']:<20}"
    lines = [f"{head} {_counts(rs) or 'no results':<28} {when}"]
    for r in rs:
        if every or r["status"] not in ("ok", "skipped"):
            lines.append(f"  {_MARK[r['status']]:<9} {r['target']:<22} {r['reason']:<24} "
                         f"{r['message']}")
    return lines


def status_table(doc: Mapping[str, Any], every: bool = False) -> str:
    lc = doc["lifecycle"]
    since = f" since {lc['since']}" if lc["since"] else " (never changed)"
    reason = f" ({lc['reason']})" if lc["reason"] else ""
    lines = [f"node {doc['node'] or '?'}  state file {doc['state_file']}  at {doc['at']}",
             f"lifecycle: {lc['state']}{since}{reason}"]
    if doc["quarantine"]:
        q = doc["quarantine"]
        lines.append(f"quarantine: {q['op']} for {q['reason']} since {q['since']}, "
                     f"drain {q['drain']}, breaker slot {'held' if q['slot'] else 'not held'}")
    b = doc["breaker"]
    if b is None:
        lines.append("breaker: not read by this daemon (no API server, or not yet)")
    else:
        budget = "?" if b["budget"] is None else b["budget"]
        extra = f", tripped by {b['tripped_by']}: {b['tripped_reason']}" \
            if b["state"] == "tripped" else ""
        lines.append(f"breaker: {b['state']}{' (paused)' if b['paused'] else ''}, "
                     f"{b['slots_held']}/{budget} slots held{extra}")
    g = doc["bootstrap"]
    if g["passed"]:
        lines.append(f"bootstrap gate: passed at {g['passed_at']}")
    elif g["last_verdict"]:
        lines.append(f"bootstrap gate: closed, last suite {g['last_verdict']} at "
                     f"{g['last_attempt_at']}: {g['problems'] or 'no detail'}")
    else:
        lines.append("bootstrap gate: no bootstrap suite recorded")
    nxt = doc["next"]
    off = "" if nxt["remediation_enabled"] else " (remediation is off in this config)"
    lines.append(f"next remediation step{off}: {nxt['step']}")
    for s in nxt["suppressed"][:5]:
        lines.append(f"  not acted on: {s['check']} {s['target']} {s['reason']} ({s['why']})")
    counts = ", ".join(f"{n} {s}" for s, n in doc["results"].items() if n)
    lines.append(f"results ({counts or 'none yet'}):")
    for c in doc["checks"]:
        lines += ["  " + line for line in _check_lines(c, every)]
    return "\n".join(lines)


def history_table(doc: Mapping[str, Any]) -> str:
    what = "every result" if doc["every_result"] else "changes"
    lines = [f"{what} in {doc['state_file']} since {doc['since'] or 'the start'}: "
             f"{len(doc['results'])} shown of {doc['results_in_window']} results"
             + (f" ({doc['truncated']} older left out: --limit)" if doc["truncated"] else "")]
    events = [(r["at"], f"{_MARK[r['status']]:<9} {r['check']:<16} {r['target']:<22} "
                        f"{r['reason']:<24} {r['message']}") for r in doc["results"]]
    events += [(h["at"], f"{'LIFECYCLE':<9} {h['from']} -> {h['to']} ({h['reason']})")
               for h in doc.get("lifecycle", [])]
    events += [(a["at"], f"{'ACTION':<9} {a['action']}: {a['result']}")
               for a in doc.get("actions", [])]
    for at, text in sorted(events, key=lambda e: e[0]):
        lines.append(f"{at}  {text}")
    return "\n".join(lines)


def _wrap(label: str, text: str) -> list[str]:
    if not text:
        return []
    body = textwrap.fill(" ".join(text.split()), width=96, initial_indent="  ",
                         subsequent_indent="  ")
    return [f"{label}:", body]


def explain_table(doc: Mapping[str, Any]) -> str:
    if not doc["found"]:
        close = ", ".join(doc.get("close") or []) or "none"
        return (f"the runbook does not know the reason {doc['reason']} (close: {close}); "
                f"each check's reasons are listed in docs/checks.md")
    lines: list[str] = []
    for a in doc["answers"]:
        where = a["check"] or "any check (worker and framework reasons)"
        row = a.get("row") or doc["reason"]
        named = "" if row == doc["reason"] else f"{row}: "
        status = f", {named}{a['status']}" if a["status"] else ""
        lines.append(f"{doc['reason']}  ({where}{status})")
        lines += _wrap("what it means", a["meaning"])
        lines += _wrap("how sure", a["how_sure"])
        lines += _wrap("what to do", a["what_to_do"])
        lines.append(f"runbook: {a['runbook']}")
        lines.append("")
    return "\n".join(lines).rstrip()
