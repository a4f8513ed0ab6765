"""The quarantine lifecycle of this node: a resumable state machine over one node delivery.

Why: detection produces results continuously; remediation must turn them into a small number
of deliberate, resumable steps. The state lives in the state store (``Store.node_state`` plus
the ``QuarantineRecord``, record.py) and is mirrored on the node (the ``gpu-monitor.io/state``
label on Kubernetes)::

    healthy -> suspect -> quarantined (cordoned, tainted, drained)
                               |-> retesting (GPU reset + the bootstrap suite) -> healthy
                               |-> reboot-required (Kured's sentinel) -> retesting -> ...
                               '-> replace (labelled; permanent until an operator releases it)
    a retest that fails retest_max_failures times -> replace; a blocked/failed reset -> reboot

This module takes the node out of service and gives it back (healthy/suspect, quarantined,
the drain, replace, release); recovery.py is the way back (reset, retest, reboot). Every write
goes through the injected ``NodeDelivery`` (delivery.py), every host step through the
injected ``Actuator`` (actuator.py).

Guarantees:

1. **Every step is idempotent and resumable.** The state and the record (what op, which
   reason, the drain's start, the boot id a reboot was asked in) are committed before the
   step's writes; each step re-reads the node and writes only what is missing. A daemon killed
   at any point (``kill -9``) resumes on restart and ends in the same state.
2. **No slot, no quarantine**: the fleet breaker must grant a slot before the first cordon; a
   denied node stays ``suspect``, with an Event, a log line and a counted action, and the
   claim is retried later.
3. **Only our own changes are undone**: a pre-existing cordon is never undone; a human's
   uncordon or untaint during a quarantine is recorded and respected (never re-applied).
4. **Dry-run changes nothing**: decisions are logged, evented and counted (result
   ``dry_run``); no node write, no slot, no reset, no sentinel. States only move between
   healthy and suspect.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.model import Result
from gpu_monitor.remediate import recovery
from gpu_monitor.remediate.actuator import Actuator
from gpu_monitor.remediate.breaker import Claim
from gpu_monitor.remediate.delivery import NodeDelivery
from gpu_monitor.remediate.memory import PolicyMemory
from gpu_monitor.remediate.policy import Decision, Op, gpu_indices
from gpu_monitor.remediate.record import (
    KV_BREAKER,
    KV_DRY_RUN,
    KV_NAMESPACE,
    KV_RECORD,
    QuarantineRecord,
    Retest,
    delete_record,
    load_record,
    save_record,
)
from gpu_monitor.remediate.settings import RemediationSettings, Timing

log = logging.getLogger(__name__)

__all__ = ["Lifecycle", "Memo"]


@dataclass
class Memo:
    """Process-local bookkeeping (not persisted: losing it costs at most a repeated Event)."""

    evented: set[str] = field(default_factory=set)
    last_claim_at: float | None = None
    last_sync_at: float | None = None
    last_renew_at: float | None = None
    last_breaker_read: float | None = None
    last_report_poll: float | None = None
    clear_since: datetime | None = None
    started: bool = False
    recoveries_announced: bool = False


def _gpus(decision: Decision) -> tuple[int, ...] | None:
    gpus = gpu_indices(decision.at_least(Op.CORDON))
    return None if gpus is None else tuple(gpus)


class Lifecycle:
    """The steps of this node's quarantine; ``Remediator.tick`` calls ``step`` once per tick.

    ``retest``: runs the bootstrap suite and returns its results (None: wait for the passive
    checks to report clean instead); ``cancel``: set when the daemon stops (ends a drain)."""

    def __init__(self, store: Any, settings: RemediationSettings, timing: Timing,
                 node_name: str, delivery: NodeDelivery, actuator: Actuator, clock: Clock,
                 memory: PolicyMemory, *,
                 retest: Callable[[], Sequence[Result]] | None = None,
                 cancel: threading.Event | None = None):
        self.store = store
        self.settings = settings
        self.timing = timing
        self.node_name = node_name
        self.delivery = delivery
        self.actuator = actuator
        self.clock = clock
        self.memory = memory
        self.retest = retest
        self.cancel = cancel or threading.Event()
        self.memo = Memo()
        self.fresh = False  # the node was re-read in this tick
        self.undecided = ""  # what the last undecided retest could not decide

    # --- what the steps share -------------------------------------------------------------------

    def decision(self, now: datetime | None = None) -> Decision:
        facts = self.delivery.facts()
        return self.memory.decide(self.settings.policy, now or self.clock.now(),
                                  facts.labels if facts is not None else None)

    def quarantine_record(self) -> QuarantineRecord | None:
        return load_record(self.store, self.clock.now())

    def save(self, record: QuarantineRecord) -> QuarantineRecord:
        return save_record(self.store, record)

    def rebuilt(self, decision: Decision, now: datetime, op: Op = Op.CORDON
                ) -> QuarantineRecord:
        """The record of a quarantine state found without one (a state set by hand, say)."""
        return QuarantineRecord(op=decision.op or op, reason=decision.reason or "Unknown",
                                since=now)

    def record_unless_releasing(self, decision: Decision, now: datetime, op: Op,
                                released: str) -> QuarantineRecord | None:
        """The quarantine record a state goes on with (rebuilt for ``op`` when none is stored),
        or None when it was marked releasing: the node is released now (``released`` names
        why when the record does not)."""
        rec = self.quarantine_record() or self.rebuilt(decision, now, op)
        if rec.releasing:
            self.release(now, rec.release_reason or released)
            return None
        return rec

    def set_state(self, state: str, reason: str, now: datetime, *, mirror: bool = True,
                  **kw: Any) -> None:
        if self.store.set_node_state(state, reason, now, **kw):
            log.warning("node %s: %s (%s)", self.node_name, state, reason)
        if mirror and not self.settings.dry_run:
            self.delivery.mirror_state(state)

    def record_action(self, action: str, result: str, now: datetime, **details: Any) -> None:
        self.store.record_action(action, result, now, details)

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        try:
            prefix = "[dry-run] " if self.settings.dry_run and not message.startswith("[") else ""
            self.delivery.event(reason, prefix + message, warning=warning)
        except Exception as exc:  # noqa: BLE001 - an Event is never worth failing a step
            log.warning("cannot send Event %s: %s", reason, exc)

    def save_breaker(self) -> None:
        last = self.delivery.breaker.last
        if last is not None:
            self.store.set_kv(KV_NAMESPACE, KV_BREAKER, last.to_dict())

    def step(self, state: str, decision: Decision, now: datetime) -> None:
        """Advance the lifecycle from ``state`` on ``decision``."""
        {"healthy": self.healthy, "suspect": self.healthy, "quarantined": self.quarantined,
         "retesting": lambda d, n: recovery.retesting(self, d, n),
         "reboot-required": lambda d, n: recovery.reboot_required(self, d, n),
         "replace": self.replace_state}[state](decision, now)

    # --- healthy / suspect ---------------------------------------------------------------------

    def healthy(self, decision: Decision, now: datetime) -> None:
        state = self.store.node_state().state
        if self.store.get_kv(KV_NAMESPACE, KV_RECORD) is not None:
            delete_record(self.store)  # a release that crashed at its end
        if decision.quarantine:
            if self.settings.dry_run:
                self._dry_run_quarantine(decision, now)
                if state != "suspect":
                    self.set_state("suspect", f"{decision.reason} (dry-run)", now)
                return
            mono = self.clock.monotonic()
            last = self.memo.last_claim_at
            if state == "suspect" and last is not None and (
                    mono - last < self.timing.breaker_retry_s):
                return
            self.memo.last_claim_at = mono
            claim = self.delivery.breaker.claim(self.node_name, decision.reason)
            self.save_breaker()
            self.memo.last_renew_at = mono
            if not claim.granted:
                self._denied(claim, decision, now)
                if state != "suspect":
                    self.set_state("suspect", f"{decision.reason}: {claim.why}", now)
                return
            self.save(QuarantineRecord(op=decision.op or Op.CORDON, reason=decision.reason,
                                       since=now, slot=True, gpus=_gpus(decision)))
            # the state is mirrored with the quarantine itself, in one request
            self.set_state("quarantined", decision.reason, now, mirror=False)
            self.quarantined(decision, now)
            return
        if decision.triggers:
            if state != "suspect":
                self.set_state("suspect", decision.reason, now)
        elif state == "suspect":
            self.store.delete_kv(KV_NAMESPACE, KV_DRY_RUN)
            self.set_state("healthy", "findings cleared", now)

    def _dry_run_quarantine(self, decision: Decision, now: datetime) -> None:
        key = f"{decision.op}:{decision.reason}"
        if self.store.get_kv(KV_NAMESPACE, KV_DRY_RUN) == key:
            return
        op = decision.op or Op.CORDON
        steps = ["cordon", "taint"] + (["drain"] if op.drains else [])
        steps += {Op.RESET_GPU: ["reset the GPUs and retest"], Op.REBOOT: ["request a reboot"],
                  Op.REPLACE: ["label for replacement"]}.get(op, [])
        try:
            claim = self.delivery.breaker.would_allow(self.node_name)
            self.save_breaker()
            verdict = ("the breaker would grant a slot" if claim.granted
                       else f"the breaker would refuse: {claim.message}")
        except Exception as exc:  # noqa: BLE001 - dry-run reporting only
            verdict = f"the breaker could not be read: {exc}"
        self.event("DryRunQuarantine", f"would quarantine for {decision.reason} "
                                       f"({op.value}: {', '.join(steps)}); {verdict}")
        log.warning("dry-run: node %s would be quarantined for %s (%s); %s", self.node_name,
                    decision.reason, op.value, verdict)
        self.record_action(op.value, "dry_run", now, reason=decision.reason)
        self.store.set_kv(KV_NAMESPACE, KV_DRY_RUN, key)

    def _denied(self, claim: Claim, decision: Decision, now: datetime) -> None:
        msg = f"not quarantining for {decision.reason}: {claim.message}"
        log.error("node %s: %s", self.node_name, msg)
        self.record_action("quarantine", "breaker_" + claim.why, now, reason=decision.reason)
        self.event("BreakerTripped" if claim.tripped_now else "RemediationSkipped", msg,
                   warning=True)

    # --- quarantined ---------------------------------------------------------------------------

    def quarantined(self, decision: Decision, now: datetime) -> None:
        rec = self.quarantine_record()
        if rec is None and not decision.quarantine:  # a state without record or cause
            self.release(now, "quarantined without a recorded cause")
            return
        if rec is None:  # resumed from a store without a record (e.g. set by hand): rebuild it
            rec = self.rebuilt(decision, now)
        if rec.releasing:
            self.release(now, rec.release_reason or "returning to service")
            return
        op = rec.op
        if decision.quarantine and decision.op is not None and decision.op.severity > op.severity:
            self.event("QuarantineEscalated", f"{op.value} -> {decision.op.value} for "
                                              f"{decision.reason}", warning=True)
            op = decision.op
            rec = rec.but(op=op, reason=decision.reason, gpus=_gpus(decision), applied=False)
        if decision.quarantine and decision.reason and decision.reason != rec.reason \
                and decision.op is not None and decision.op.severity >= op.severity:
            rec = rec.but(reason=decision.reason, applied=False)
        rec = self.apply_quarantine(rec, now)
        if self._human_took_over():
            # A human uncordoned the node: no drain, reset or reboot against that decision;
            # our taint goes once the problem has cleared (or on `quarantine release`).
            self._release_when_clear(decision, now)
            return
        if op.drains and rec.drain != "succeeded":
            rec, drained = self._drain(rec, now)
            if not drained:
                return
        if op is Op.RESET_GPU:
            rec = self.save(rec.but(retest=Retest(started=now)))
            self.set_state("retesting", rec.reason, now)
            recovery.retesting(self, decision, now)
        elif op is Op.REBOOT:
            recovery.request_reboot(self, rec, now, rec.reason)
        elif op is Op.REPLACE:
            self.to_replace(rec, now, rec.reason)
        else:  # cordon/drain only: back in service once clean for the healthy delay
            self._release_when_clear(decision, now)

    def apply_quarantine(self, rec: QuarantineRecord, now: datetime,
                         state: str = "quarantined", *, force: bool = False
                         ) -> QuarantineRecord:
        if rec.applied and not self.fresh and not force:
            return rec  # re-checked whenever the node is re-read (human overrides, lost writes)
        first = not rec.applied and not rec.announced
        out = self.delivery.quarantine(rec.reason, state, now)
        if out.cordoned:
            self.record_action("cordon", "ok", now, reason=rec.reason)
        if out.tainted:
            self.record_action("taint", "ok", now, reason=rec.reason)
        if out.human_uncordoned:
            self.record_action("uncordon", "human", now)
            self.event("ManualUncordonRespected", "a human uncordoned the node during the "
                                                  "quarantine; gpu-monitor will not cordon it "
                                                  "again (the taint stays)", warning=True)
        if out.human_untainted:
            self.record_action("untaint", "human", now)
            self.event("ManualUntaintRespected", "a human removed the gpu-monitor taint during "
                                                 "the quarantine; it will not be re-applied",
                       warning=True)
        rec = rec.but(applied=True)
        if first:
            rec = rec.but(announced=True)
            pre = " (it was already cordoned: that cordon stays)" if out.cordon_pre_existing \
                else ""
            self.record_action("quarantine", "ok", now, reason=rec.reason, op=rec.op.value,
                               cordon_pre_existing=out.cordon_pre_existing)
            self.event("Quarantined", f"quarantined for {rec.reason} ({rec.op.value}): "
                                      f"{self.delivery.quarantine_text(rec.reason)}{pre}",
                       warning=True)
        return self.save(rec)

    def _drain(self, rec: QuarantineRecord, now: datetime) -> tuple[QuarantineRecord, bool]:
        """Drain (or resume the drain); (the record, whether it succeeded)."""
        if rec.drain == "failed":
            if rec.drain_next and now < rec.drain_next:
                return rec, False
            rec = rec.but(drain_started=None)
        if not rec.drain_started:
            rec = rec.but(drain_started=now, drain_attempts=rec.drain_attempts + 1)
        rec = self.save(rec.but(drain="pending"))
        assert rec.drain_started is not None
        timeout_s = self.delivery.drain_timeout_s
        remaining = max(0.0, timeout_s - (now - rec.drain_started).total_seconds())
        report = self.delivery.drain(
            remaining, self.cancel,
            lambda result: self.record_action("eviction", result, self.clock.now()))
        if report.cancelled:
            return rec, False
        now = self.clock.now()
        if report.ok:
            self.delivery.record_drain("succeeded")  # before the record: a crash re-drains
            rec = self.save(rec.but(drain="succeeded", drain_next=None))
            self.record_action("drain", "ok", now, summary=report.summary())
            self.event("DrainSucceeded", f"drained: {report.summary()}")
            return rec, True
        self.delivery.record_drain("failed: " + report.summary()[:200])
        rec = self.save(rec.but(drain="failed", drain_detail=report.summary(),
                                drain_next=now + timedelta(seconds=timeout_s)))
        self.record_action("drain", "failed", now, summary=report.summary())
        self.event("DrainFailed", f"drain failed: {report.summary()}; the node stays cordoned "
                                  "and tainted; retrying after the drain timeout", warning=True)
        return rec, False

    def _human_took_over(self) -> bool:
        facts = self.delivery.facts()
        return facts is not None and facts.returned_by_human

    def _release_when_clear(self, decision: Decision, now: datetime) -> None:
        if not decision.clear:
            self.memo.clear_since = None
            return
        if self.memo.clear_since is None:
            self.memo.clear_since = now
        hold_s = self.settings.policy.hysteresis_s
        if (now - self.memo.clear_since).total_seconds() >= hold_s:
            self.release(now, f"no problem for {hold_s:g} s")

    # --- replace -------------------------------------------------------------------------------

    def to_replace(self, rec: QuarantineRecord, now: datetime, why: str) -> None:
        rec = self.save(rec.but(replace_reason=why, replaced=False))
        self.set_state("replace", why, now, mirror=False)
        self._finish_replace(rec, now)

    def _finish_replace(self, rec: QuarantineRecord, now: datetime) -> None:
        """Label for replacement and give the slot back; resumable after a crash."""
        self.delivery.mark_replace()
        if rec.slot:
            self.delivery.breaker.release(self.node_name, replaced=True)
            self.save_breaker()
            rec = self.save(rec.but(slot=False))
        if not rec.replaced:
            rec = self.save(rec.but(replaced=True))
            self.record_action("replace", "labelled", now, reason=rec.replace_reason)
            self.event("ReplacementRequested", f"node labelled for replacement "
                       f"({rec.replace_reason}); it stays cordoned until `gpu-monitor "
                       "quarantine release`", warning=True)

    def replace_state(self, decision: Decision, now: datetime) -> None:
        rec = self.record_unless_releasing(decision, now, Op.REPLACE, "released")
        if rec is None:
            return
        rec = self.apply_quarantine(rec, now, "replace")
        self._finish_replace(rec, now)

    # --- release -------------------------------------------------------------------------------

    def release(self, now: datetime, why: str) -> None:
        rec = self.quarantine_record() or QuarantineRecord(op=Op.CORDON, reason="", since=now)
        self.save(rec.but(releasing=True, release_reason=why))
        uncordoned = self.delivery.release(now)
        if uncordoned:
            self.record_action("uncordon", "ok", now)
        self.delivery.breaker.release(self.node_name)
        self.save_breaker()
        self.memory.forget()
        self.delivery.publish_conditions(self.decision(now).conditions, now, force=True)
        self.memo.clear_since = None
        self.memo.evented.clear()
        self.record_action("release", "ok", now, reason=why)
        note = "" if uncordoned else " (not uncordoned: the cordon was not ours)"
        self.event("ReturnedToService", f"returned to service: {why}{note}")
        self.store.set_node_state("healthy", why, now)  # then the record: see healthy()
        delete_record(self.store)
        self.store.delete_kv(KV_NAMESPACE, KV_DRY_RUN)
