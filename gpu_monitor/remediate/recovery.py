"""The way back from a quarantine: GPU reset, retest, reboot (lifecycle.py's other half).

Why apart: these steps are where the lifecycle meets the host (through the injected
``Actuator``: reset, boot id, reboot sentinel) and the bootstrap suite, and where an outcome
escalates: a blocked or failed reset asks for a reboot; a failed retest asks for a reboot, then
(``retest_max_failures``) for a replacement; an undecided one (nothing failed, something could
not be decided) keeps the node quarantined and runs again later - never a pass, never an
escalation. Each step commits the record before it acts (lifecycle.py, guarantee 1): a reset is
never repeated after a crash once the suite started, and a reboot is recognised by the boot id
it was asked in (or, without one, by the sentinel having gone).

Functions over the ``Lifecycle`` rather than methods: one state machine, cut in two readable
halves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpu_monitor.model import Result, Status
from gpu_monitor.remediate.policy import REPORT_CHECK, Decision, Op
from gpu_monitor.remediate.record import QuarantineRecord, Retest
from gpu_monitor.runner import run_suite

if TYPE_CHECKING:  # pragma: no cover
    from gpu_monitor.remediate.lifecycle import Lifecycle

log = logging.getLogger(__name__)

__all__ = ["UNDECIDED", "reboot_required", "request_reboot", "retesting", "suite_retest"]

#: What ``_run_retest`` answers when nothing failed but something could not be decided.
UNDECIDED = "undecided"


def suite_retest(checks: Sequence[Any], ctx: Any) -> Callable[[], list[Result]]:
    """A ``retest`` for the Remediator: run ``checks`` (the bootstrap suite) once through the
    runner (results stored as any run's) and return their results. Leave out checks that judge
    history rather than the GPUs as they are now (e.g. a kernel-log scan that would report the
    Xid that caused the quarantine)."""

    def retest() -> list[Result]:
        # As a bootstrap: a required check that cannot run for a missing tool or runtime is
        # ``unknown`` (the retest is undecided), never a skipped pass.
        _, report = run_suite(list(checks), ctx, bootstrap=True)
        return list(report.results)

    return retest


# --- retesting -----------------------------------------------------------------------------------


def retesting(lc: Lifecycle, decision: Decision, now: datetime) -> None:
    rec = lc.record_unless_releasing(decision, now, Op.RESET_GPU, "retest passed")
    if rec is None:
        return
    rt = rec.retest or Retest(started=now)
    if rt.phase == "reset":
        if rt.needs_reset:
            outcome = lc.actuator.reset_gpus(rec.gpus)
            if not outcome.ok:
                kind = "blocked" if outcome.blocked_by else "failed"
                lc.record_action("reset_gpu", kind, now, detail=outcome.detail,
                                 holders=list(outcome.blocked_by))
                lc.event("GpuResetBlocked" if outcome.blocked_by else "GpuResetFailed",
                         f"GPU reset {kind}: {outcome.detail}; escalating to a reboot",
                         warning=True)
                request_reboot(lc, rec, now, f"GPU reset {kind}", keep_failures=True)
                return
            for i in outcome.gpus:
                lc.record_action("reset_gpu", "ok", now, gpu_index=i, target=f"gpu:{i}")
            lc.event("GpuReset", outcome.detail)
        rt = replace(rt, phase="suite", started=now)
        rec = lc.save(rec.but(retest=rt))
        lc.memory.forget([REPORT_CHECK])  # a report is one event, handled by this reset and retest
    if rt.retry_at and now < rt.retry_at:
        return  # an undecided retest waits before the suite runs again
    passed = _run_retest(lc, rt, decision, now)
    if passed is None:
        return  # still waiting for the passive checks to settle
    if passed == UNDECIDED:
        # Nothing failed, but something could not be decided (a required check without its
        # tool, a busy GPU, a timeout): not a pass, and no evidence to escalate on either.
        # The node stays quarantined and the suite runs again later.
        retry_s = lc.settings.retest_retry_s
        lc.save(rec.but(retest=replace(rt, retry_at=now + timedelta(seconds=retry_s))))
        lc.record_action("retest", "undecided", now)
        lc.event("RetestUndecided",
                 f"the retest could not decide ({lc.undecided}); the node stays "
                 f"quarantined and is retested in {retry_s:g} s", warning=True)
        return
    if passed:
        lc.record_action("retest", "passed", now)
        lc.event("RetestPassed", "the retest passed; returning the node to service")
        lc.release(now, "retest passed")
        return
    _retest_failed(lc, rec, now)


def _retest_failed(lc: Lifecycle, rec: QuarantineRecord, now: datetime) -> None:
    failures = lc.store.node_state().retest_failures + 1
    lc.record_action("retest", "failed", now, failures=failures)
    limit = lc.settings.retest_max_failures
    if failures >= limit:
        lc.event("RetestFailed", f"retest failed ({failures}/{limit}): replacing the node",
                 warning=True)
        lc.to_replace(rec, now, f"retest failed {failures} times")
    else:
        lc.event("RetestFailed", f"retest failed ({failures}/{limit}): rebooting",
                 warning=True)
        request_reboot(lc, rec, now, f"retest failed ({failures}/{limit})")


def _run_retest(lc: Lifecycle, rt: Retest, decision: Decision,
                now: datetime) -> bool | str | None:
    if lc.retest is not None:
        try:
            results = list(lc.retest())
        except Exception as exc:  # noqa: BLE001 - a crashed suite is a failed retest
            log.error("retest on %s crashed: %s", lc.node_name, exc, exc_info=True)
            return False
        lc.memory.observe_afresh(results)
        bad = [r for r in results if r.status in (Status.FAILED, Status.UNKNOWN)]
        for r in bad[:5]:
            log.warning("retest on %s: %s %s %s %s", lc.node_name, r.check, r.target,
                        r.status.value, r.reason)
        if bad and not any(r.status is Status.FAILED for r in bad):
            lc.undecided = ", ".join(sorted({f"{r.check} {r.target} {r.reason}"
                                             for r in bad})[:5])
            return UNDECIDED
        return not bad
    # No suite available: the passive checks must report clean for the settle time.
    fresh_bad = [t for t in decision.triggers
                 if t.wanted.quarantines and t.result.observed_at > rt.started]
    if fresh_bad:
        return False
    if decision.clear and (now - rt.started).total_seconds() >= lc.settings.policy.hysteresis_s:
        return True
    return None


# --- reboot --------------------------------------------------------------------------------------


def request_reboot(lc: Lifecycle, rec: QuarantineRecord, now: datetime, why: str, *,
                   keep_failures: bool = False) -> None:
    sentinel = lc.actuator.sentinel_path()
    rec = lc.save(rec.but(boot_id=lc.actuator.boot_id(), sentinel=sentinel, retest=None))
    kw = {}
    if keep_failures:
        kw["retest_failures"] = lc.store.node_state().retest_failures
    lc.set_state("reboot-required", why, now, mirror=False, **kw)
    lc.apply_quarantine(rec, now, "reboot-required", force=True)
    if sentinel:
        lc.actuator.write_sentinel(sentinel, why)
    lc.record_action("reboot", "requested", now, reason=why, sentinel=sentinel)
    lc.event("RebootRequested", f"reboot requested ({why}): "
             + (f"wrote {lc.actuator.reboot_sentinel} for Kured" if sentinel
                else "no reboot sentinel configured: reboot the node by hand"),
             warning=True)


def reboot_required(lc: Lifecycle, decision: Decision, now: datetime) -> None:
    rec = lc.record_unless_releasing(decision, now, Op.REBOOT, "returning to service")
    if rec is None:
        return
    rec = lc.apply_quarantine(rec, now, "reboot-required")
    boot = lc.actuator.boot_id()
    sentinel, before = rec.sentinel, rec.boot_id
    rebooted = (before and boot and boot != before) or (
        not before and sentinel and not lc.actuator.sentinel_present(sentinel))
    if not rebooted:
        if sentinel:
            lc.actuator.write_sentinel(sentinel, rec.reason or "reboot")
        return
    lc.record_action("reboot", "ok", now, boot_id=boot)
    lc.event("Rebooted", "the node rebooted; retesting")
    lc.save(rec.but(retest=Retest(started=now, phase="suite", needs_reset=False)))
    lc.set_state("retesting", "rebooted", now,
                 retest_failures=lc.store.node_state().retest_failures)
    lc.memory.forget()  # results from before the reboot describe another boot
    retesting(lc, lc.decision(now), now)
