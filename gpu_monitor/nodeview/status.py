"""``gpu-monitor status``: the node now, as its daemon's store records it.

Why it exists: the store holds the newest result of every check and target, the quarantine
lifecycle, the breaker as the daemon last read it, the bootstrap gate's verdict and the
policy's standing results; without this an operator reassembles them from /metrics, the Node
object and the logs. ``node_status`` reads them in a few snapshots of a read-only store
(state/readonly.py) and says what remediation would do next by asking the same pure policy
the daemon asks (remediate/policy.py ``decide``), with the configuration it is handed.

The returned mapping is the ``-o json`` document (docs/cli.md#gpu-monitor-status); the table
is rendered from it (render.py), so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpu_monitor.model import STATUS_SEVERITY, Result, Status, iso
from gpu_monitor.remediate.bootstrap_gate import KV_LAST, KV_PASSED
from gpu_monitor.remediate.bootstrap_gate import KV_NAMESPACE as KV_BOOTSTRAP
from gpu_monitor.remediate.breaker import BreakerStatus
from gpu_monitor.remediate.conditions import PROBLEM_CLASSES
from gpu_monitor.remediate.policy import (
    Decision,
    PolicySettings,
    PolicyState,
    decide,
    observe,
)
from gpu_monitor.remediate.record import (
    KV_BREAKER,
    KV_NAMESPACE,
    KV_POLICY,
    QuarantineRecord,
    load_record,
)

__all__ = ["next_step", "node_status"]


def _result(r: Result) -> dict[str, Any]:
    return {"check": r.check, "target": r.target, "status": r.status.value,
            "reason": r.reason, "message": r.message, "action": r.action.value,
            "observed_at": iso(r.observed_at), "details": r.to_dict()["details"]}


def _checks(results: list[Result], runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per check: its worst status, its last run, and every target's result."""
    by_check: dict[str, list[Result]] = {}
    for r in results:
        by_check.setdefault(r.check, []).append(r)
    out = []
    for check in sorted(set(by_check) | set(runs)):
        rs = by_check.get(check, [])
        run = runs.get(check)
        worst = max(rs, key=lambda r: STATUS_SEVERITY[r.status]).status if rs else None
        out.append({
            "check": check, "status": worst.value if worst else None,
            "last_run": None if run is None else {
                "started_at": iso(run.started_at), "duration_s": round(run.duration_s, 6),
                "success": run.success, "error": run.error},
            "results": [_result(r) for r in rs]})
    return out


def _lifecycle(store: Any) -> dict[str, Any]:
    ns = store.node_state(history_limit=10)
    return {"state": ns.state, "since": iso(ns.since) if ns.since else None,
            "reason": ns.reason, "retest_failures": ns.retest_failures,
            "history": [{"at": iso(h.at), "from": h.from_state, "to": h.to_state,
                         "reason": h.reason} for h in ns.history]}


def _breaker(store: Any) -> dict[str, Any] | None:
    raw = store.get_kv(KV_NAMESPACE, KV_BREAKER)
    if not isinstance(raw, Mapping):
        return None  # the daemon has not read the breaker (no API server, or not yet)
    st = BreakerStatus.from_dict(raw)
    return {"state": st.state, "paused": st.paused, "slots_held": len(st.slots),
            "budget": st.budget, "holders": sorted(st.slots), "tripped_at": st.tripped_at,
            "tripped_by": st.tripped_by, "tripped_reason": st.tripped_reason}


def _bootstrap(store: Any) -> dict[str, Any]:
    passed = store.get_kv(KV_BOOTSTRAP, KV_PASSED)
    last = store.get_kv(KV_BOOTSTRAP, KV_LAST)
    last = last if isinstance(last, Mapping) else {}
    return {"passed": bool(passed), "passed_at": passed if isinstance(passed, str) else None,
            "last_attempt_at": last.get("at"), "last_verdict": last.get("verdict"),
            "problems": last.get("problems") or ""}


def _quarantine_step(rec: QuarantineRecord, dry_run: bool) -> str:
    """What the lifecycle does next for a quarantine in progress (lifecycle.py's order)."""
    if rec.releasing:
        return f"finish returning the node to service ({rec.release_reason or 'released'})"
    if not rec.applied:
        return f"cordon and taint the node ({rec.op.value} for {rec.reason})"
    if rec.op.drains and rec.drain in ("none", "pending"):
        return "drain the node through the Eviction API"
    if rec.drain == "failed":
        nxt = f" from {iso(rec.drain_next)}" if rec.drain_next else ""
        return f"try the failed drain again{nxt} ({rec.drain_detail or 'see the Events'})"
    if rec.retest is not None:
        if rec.retest.phase == "reset" and rec.retest.needs_reset:
            return "reset the GPUs, then run the retest suite"
        return "run the retest suite; a pass returns the node to service"
    if rec.op.value == "replace":
        return ("wait for replacement: labelled; only `gpu-monitor quarantine release` "
                "returns it" if rec.replaced else "label the node for replacement")
    if rec.op.value == "reboot":
        return "wait for the requested reboot, then retest"
    if rec.op.value == "reset_gpu":
        return "reset the GPUs, then retest"
    return "hold the quarantine until the findings clear, then retest"


def next_step(decision: Decision, record: QuarantineRecord | None,
              dry_run: bool) -> dict[str, Any]:
    """The next remediation step: the quarantine's, else what the policy wants now."""
    triggers = [{"check": t.result.check, "target": t.result.target,
                 "reason": t.result.reason, "op": t.op.value, "wanted": t.wanted.value}
                for t in decision.triggers]
    suppressed = [{"check": r.check, "target": r.target, "reason": r.reason, "why": why}
                  for r, why in decision.suppressed]
    if record is not None:
        step = _quarantine_step(record, dry_run)
    elif decision.op is None:
        step = "nothing: no finding asks for an operation"
    elif not decision.op.quarantines:
        step = f"an Event for {decision.reason}; nothing on the node changes"
    else:
        step = f"quarantine ({decision.op.value}) for {decision.reason}"
        if dry_run:
            step += " -- dry-run: only announced (Event, log, metrics)"
    pending = [t for t in triggers if t["op"] != t["wanted"]]
    if pending and record is None:
        p = pending[0]
        step += (f"; {p['check']} {p['target']} {p['reason']} asks for {p['wanted']} once "
                 f"past hysteresis")
    return {"step": step, "op": decision.op.value if decision.op else None,
            "reason": decision.reason, "dry_run": dry_run, "triggers": triggers,
            "suppressed": suppressed}


def node_status(store: Any, config: Any, now: datetime) -> dict[str, Any]:
    """The ``gpu-monitor status`` document for ``store`` (read-only) at ``now``."""
    results = store.latest_results()
    checks = _checks(results, store.runs())
    stored = store.get_kv(KV_NAMESPACE, KV_POLICY)
    # No remediator wrote its memory (remediation off, or none ran yet): judge the latest
    # results as a remediator starting now would, without its hysteresis history.
    policy = (PolicyState.from_json(stored) if stored
              else observe(PolicyState(), results))
    settings = PolicySettings.from_config(config, PROBLEM_CLASSES)
    dry_run = bool(config.remediation.dry_run)
    decision = decide(policy, settings, now)
    record = load_record(store, now)
    counts = {s.value: 0 for s in Status}
    for r in results:
        counts[r.status.value] += 1
    return {
        "state_file": store.path, "at": iso(now), "node": config.node_name or None,
        "results": counts, "checks": checks, "lifecycle": _lifecycle(store),
        "quarantine": None if record is None else record.to_dict(),
        "breaker": _breaker(store), "bootstrap": _bootstrap(store),
        "next": {**next_step(decision, record, dry_run),
                 "remediation_enabled": bool(config.remediation.enabled),
                 "from": "the remediator's memory" if stored else "the latest results"},
    }
