"""``Remediator``: the daemon's entry point into remediation.

Why: the daemon hands over results and a clock tick; everything else - the policy's memory,
the quarantine lifecycle (lifecycle.py, recovery.py), reports from other detectors, an
operator's release or retest, the breaker's upkeep - happens behind this one object, built with
its dependencies: the node delivery (delivery.py; Kubernetes: remediate/k8s/) and the host's
actuator (actuator.py; the daemon builds gpu_monitor.host_actuator's).

Guarantees (with lifecycle.py's):

1. ``on_results`` never blocks on the node's backend; the work happens in ``tick`` (or in the
   background thread ``start`` runs).
2. **An Event never holds up a step**: Events wait in the delivery's bounded queue and are
   delivered as they happen when the backend answers, else after every tick once the queue's
   backoff allows; a dropped or refused one is counted (action ``event``).
3. **A failing backend neither spins nor floods**: after a failed tick the loop backs off
   exponentially (to ``Timing.max_backoff_s``) whatever wakes it, and logs the traceback only
   when the error changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.model import Result, Status, iso
from gpu_monitor.remediate.actuator import Actuator
from gpu_monitor.remediate.conditions import PROBLEM_CLASSES
from gpu_monitor.remediate.delivery import NodeDelivery, Request
from gpu_monitor.remediate.lifecycle import Lifecycle
from gpu_monitor.remediate.memory import PolicyMemory
from gpu_monitor.remediate.policy import DEFAULT_CONDITION, Decision, Op
from gpu_monitor.remediate.record import KV_BREAKER, KV_NAMESPACE, QuarantineRecord, Retest
from gpu_monitor.remediate.settings import RemediationSettings, Timing
from gpu_monitor.state.recovery import mark_announced, recoveries

log = logging.getLogger(__name__)

__all__ = ["Remediator"]


class Remediator:
    """Turns stored results into remediation on this node.

    Construct once per daemon; call ``on_results(results)`` after each stored outcome and
    ``tick()`` regularly (or ``start()`` a background thread that does, and ``stop()`` it).
    ``retest``: runs the bootstrap suite and returns its results (None: wait for the passive
    checks to report clean instead); ``report_dir``: where jobs on this node drop reports.
    """

    def __init__(self, store: Any, settings: RemediationSettings, node_name: str,
                 delivery: NodeDelivery, actuator: Actuator, *, clock: Clock | None = None,
                 retest: Callable[[], Sequence[Result]] | None = None,
                 report_dir: str | None = None, watch_reports: bool = False,
                 timing: Timing | None = None,
                 workload_note: Callable[[str], str] | None = None):
        self.store = store
        # target -> " (held by pod ns/name, container c)" for events; "" when unknown
        self.workload_note = workload_note or (lambda target: "")
        self.settings = settings
        self.node_name = node_name
        self.delivery = delivery
        self.actuator = actuator
        self.clock = clock or Clock()
        self.timing = timing or Timing()
        self.enabled = settings.enabled
        self.dry_run = settings.dry_run
        self.report_dir = report_dir
        self.watch_reports = watch_reports
        self.memory = PolicyMemory(store)
        self._tick_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reports: Any = None
        self.lifecycle = Lifecycle(store, settings, self.timing, node_name, delivery, actuator,
                                   self.clock, self.memory, retest=retest, cancel=self._stop)
        delivery.on_event_dropped(self._event_dropped)
        self.last_error: str | None = None

    @classmethod
    def from_config(cls, store: Any, config: Any, node_name: str, delivery: NodeDelivery,
                    actuator: Actuator, **kw: Any) -> Remediator:
        return cls(store, RemediationSettings.from_config(config), node_name, delivery,
                   actuator, **kw)

    # --- wiring --------------------------------------------------------------------------------

    def _event_dropped(self, reason: str, why: str) -> None:
        self.lifecycle.record_action("event", why, self.clock.now(), reason=reason)

    @property
    def reports(self) -> Any:
        """This node's incoming health reports (remediate/reports.py's ``ReportSource``)."""
        if self._reports is None:
            self._reports = self.delivery.incoming_reports(self.store, self.report_dir)
        return self._reports

    def start(self) -> None:
        """Run ``tick`` in a background thread: on each ``on_results`` and every ``tick_s``."""
        if not self.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="remediator", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout)
        if self._reports is not None:
            self._reports.stop()

    def _loop(self) -> None:
        """Tick on wake-ups and every ``tick_s``; after a failure back off (guarantee 3)."""
        failures = 0
        last_error = ""
        last_logged = float("-inf")
        tick_s, max_backoff_s = self.timing.tick_s, self.timing.max_backoff_s
        while not self._stop.is_set():
            if failures:
                if self._stop.wait(min(tick_s * (2 ** min(failures, 16)), max_backoff_s)):
                    return
                self._wake.clear()
            else:
                self._wake.wait(tick_s)
                self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - the remediator must survive anything
                failures += 1
                text = f"{type(exc).__name__}: {exc}"
                self.last_error = text
                now = self.clock.monotonic()
                if text != last_error:
                    log.error("remediation tick failed (retrying with backoff): %s", text,
                              exc_info=True)
                    last_logged = now
                elif now - last_logged >= max_backoff_s:
                    log.warning("remediation still failing after %d attempts: %s",
                                failures, text)
                    last_logged = now
                last_error = text
            else:
                if failures:
                    log.info("remediation recovered after %d failed attempts", failures)
                failures = 0
                last_error = ""

    # --- input ---------------------------------------------------------------------------------

    def on_results(self, results: Iterable[Result]) -> None:
        """Fold stored results into the policy's memory (fast; never touches the backend)."""
        if not self.enabled:
            return
        batch = [r for r in results if isinstance(r, Result)]
        if not batch:
            return
        self.memory.observe(batch)
        self._wake.set()

    def decision(self, now: datetime | None = None) -> Decision:
        return self.lifecycle.decision(now)

    # --- the tick ------------------------------------------------------------------------------

    def tick(self) -> None:
        """Do what is due now: publish conditions and Events, advance the lifecycle. May block
        on the backend (a drain runs to its deadline); its errors are logged and retried."""
        if not self.enabled:
            return
        with self._tick_lock:
            try:
                self._tick()
                self.last_error = None
            except self.delivery.errors as err:
                self.last_error = str(err)
                log.warning("remediation step on %s did not complete: %s; retrying later",
                            self.node_name, err)
            finally:
                self._flush_events()

    def _flush_events(self) -> None:
        """Events still waiting (the backend failed earlier): one more try, never waiting."""
        try:
            self.delivery.flush_events()
        except Exception as exc:  # noqa: BLE001 - an Event is never worth failing a tick
            log.debug("flushing Events failed: %s", exc)

    def _sync(self, mono: float) -> None:
        """Read the node at the first tick (and our published conditions), then every
        ``node_sync_s``."""
        memo = self.lifecycle.memo
        self.lifecycle.fresh = False
        if not memo.started:
            self.delivery.read()
            self.lifecycle.fresh = True
            self.delivery.load_conditions(set(PROBLEM_CLASSES.values()) | {DEFAULT_CONDITION})
            memo.last_sync_at = mono
            memo.started = True
            if self.watch_reports:
                self.reports.start_watch(self.on_results)
            if not self.dry_run:
                self.delivery.mirror_state(self.store.node_state().state)
        elif memo.last_sync_at is None or mono - memo.last_sync_at >= self.timing.node_sync_s:
            self.delivery.read()
            memo.last_sync_at = mono
            self.lifecycle.fresh = True

    def _tick(self) -> None:
        now = self.clock.now()
        mono = self.clock.monotonic()
        self._sync(mono)
        if not self.lifecycle.memo.recoveries_announced:
            self._announce_state_recoveries()
        self._collect_reports(mono)
        if self._operator_requests(now):
            return
        decision = self.decision(now)
        if not self.dry_run:
            self.delivery.publish_conditions(decision.conditions, now)
        self.lifecycle.step(self.store.node_state().state, decision, now)
        self._finding_events(decision)  # after the node writes: they matter more
        self._maintain_breaker()

    # --- state recovery ---------------------------------------------------------------------------

    def _announce_state_recoveries(self) -> None:
        """One ``StateRecovered`` Event per recovery of the state file (state/recovery.py keeps
        the record in the fresh store). The record is marked announced only once the backend
        accepted the Event, so an outage or a restart before that delays it, never loses it.
        The recovery really happened, so no ``[dry-run]`` prefix."""
        waiting = False
        for rec in recoveries(self.store):
            if rec.announced:
                continue
            message = (
                f"the state file {rec.path} was damaged ({rec.detail}) and was moved aside "
                f"to {rec.moved_to} at {iso(rec.at)} (by the {rec.by}); gpu-monitor started "
                f"an empty store: counters restart at 0, history windows start empty, the "
                f"bootstrap suite runs again, quarantine state comes from the node's labels")
            try:
                if not self.delivery.event_delivered("StateRecovered", message):
                    # queued (or merged into the one waiting) and tried at once
                    self.delivery.event("StateRecovered", message, warning=True)
                if self.delivery.event_delivered("StateRecovered", message):
                    mark_announced(self.store, rec.moved_to)
                    continue
            except Exception as exc:  # noqa: BLE001 - tried again on the next tick
                log.warning("cannot send Event StateRecovered: %s", exc)
            waiting = True
        self.lifecycle.memo.recoveries_announced = not waiting

    # --- reports and operator requests ---------------------------------------------------------

    def _collect_reports(self, mono: float) -> None:
        memo = self.lifecycle.memo
        due = memo.last_report_poll is None or mono - memo.last_report_poll >= (
            self.timing.report_poll_s)
        if not due and not self.report_dir:
            return
        src = self.reports
        got: list[Result] = []
        if due:
            memo.last_report_poll = mono
            got = src.poll()
        elif self.report_dir:
            got = src.poll(crd=False)
        if got:
            self.on_results(_as_distinct_targets(got))

    def _operator_requests(self, now: datetime) -> bool:
        """``quarantine release|retest`` reach the node through the backend; act on them."""
        facts = self.delivery.facts()
        state = self.store.node_state().state
        lc = self.lifecycle
        if facts is not None and facts.release_requested:
            if self.dry_run:
                lc.event("ReleaseIgnored", "release requested, but remediation is in dry-run")
                return False
            if state == "healthy":
                self.delivery.clear_request(Request.RELEASE)
                self.delivery.read()
                return False
            log.warning("node %s: released by an operator (from %s)", self.node_name, state)
            lc.record_action("release", "operator", now, from_state=state)
            lc.release(now, "released by an operator")
            return True
        if facts is not None and facts.retest_requested:
            if self.dry_run:
                lc.event("RetestIgnored", "retest requested, but remediation is in dry-run")
                return False
            self.delivery.clear_request(Request.RETEST)
            self.delivery.read()
            if state in ("quarantined", "reboot-required"):
                rec = lc.quarantine_record() or QuarantineRecord(op=Op.CORDON, reason="Unknown",
                                                                 since=now)
                lc.save(rec.but(retest=Retest(started=now, needs_reset=state == "quarantined")))
                lc.record_action("retest", "operator", now, from_state=state)
                lc.set_state("retesting", "retest requested by an operator", now,
                             retest_failures=self.store.node_state().retest_failures)
                lc.event("RetestRequested", f"retest requested by an operator (from {state})")
                return True
            lc.event("RetestIgnored", f"retest requested, but the node is {state}: only a "
                                      "quarantined or reboot-required node is retested")
        return False

    # --- events about findings -----------------------------------------------------------------

    def _holder_note(self, target: str) -> str:
        try:
            return self.workload_note(target)
        except Exception as exc:  # noqa: BLE001 - attribution never stops an event
            log.warning("workload attribution for %s failed: %s", target, exc)
            return ""

    def _finding_events(self, decision: Decision) -> None:
        evented = self.lifecycle.memo.evented
        policy = self.settings.policy
        keys = set()
        for t in decision.triggers:
            r = t.result
            key = f"{r.check}|{r.target}|{r.reason}|{t.op.value}"
            keys.add(key)
            if key in evented:
                continue
            evented.add(key)
            what = f"{r.check} {r.target}{self._holder_note(r.target)}: {r.reason}"
            if r.message:
                what += f": {r.message}"
            if t.pending:
                what += (f" (degraded; {t.wanted.value} once it persists "
                         f"{policy.hysteresis_polls} polls and {policy.hysteresis_s:g} s)")
            else:
                what += f" -> {t.op.value}"
            if decision.excluded and t.wanted.quarantines:
                what += " (node excluded from remediation by label)"
            self.lifecycle.event(r.reason, what, warning=r.status is Status.FAILED)
        evented &= keys  # a finding that went away is evented again if it returns

    # --- the breaker ---------------------------------------------------------------------------

    def _maintain_breaker(self) -> None:
        mono = self.clock.monotonic()
        memo = self.lifecycle.memo
        breaker = self.delivery.breaker
        state = self.store.node_state().state
        rec = self.lifecycle.quarantine_record() \
            if state in ("quarantined", "retesting", "reboot-required") else None
        if rec is not None and rec.slot and not self.dry_run:
            every = self.settings.breaker_ttl_s / 3.0
            if memo.last_renew_at is None or mono - memo.last_renew_at >= every:
                memo.last_renew_at = mono
                if not breaker.renew(self.node_name):
                    claim = breaker.claim(self.node_name, rec.reason)
                    if not claim.granted:
                        log.error("node %s lost its breaker slot and cannot claim it back: %s",
                                  self.node_name, claim.message)
                self.lifecycle.save_breaker()
                memo.last_breaker_read = mono
        if memo.last_breaker_read is None or (
                mono - memo.last_breaker_read >= self.timing.breaker_refresh_s):
            memo.last_breaker_read = mono
            try:
                st = breaker.status()
                self.lifecycle.save_breaker()
                if (not self.dry_run and state in ("healthy", "suspect")
                        and self.node_name in st.slots):
                    # claimed just before a crash, and the cause went away meanwhile
                    log.warning("node %s holds a breaker slot while %s: releasing it",
                                self.node_name, state)
                    breaker.release(self.node_name)
                    self.lifecycle.save_breaker()
            except Exception as exc:  # noqa: BLE001 - hygiene and metrics only
                log.debug("cannot read the breaker: %s", exc)

    def breaker_snapshot(self) -> dict[str, Any] | None:
        raw = self.store.get_kv(KV_NAMESPACE, KV_BREAKER)
        return raw if isinstance(raw, dict) else None


def _as_distinct_targets(results: list[Result]) -> list[Result]:
    """Give each report its own target so one report does not replace another's finding."""
    out = []
    for r in results:
        name = str(r.details.get("name") or r.details.get("uid") or "")
        out.append(replace(r, target=f"report:{name}" if name else r.target))
    return out
