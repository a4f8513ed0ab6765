"""The provisioning gate: a new node stays unschedulable until its bootstrap suite passes.

Nodes join with the taint ``gpu-monitor.io/bootstrap:NoSchedule`` (kubelet
``--register-with-taints``). The daemon, not an init container, runs the bootstrap suite when
the node has no recorded pass: an init container that fails crash-loops and re-burns the GPUs on
every restart, while the daemon records its verdict in the state store and retries on its own
schedule.

Contract:
1. A pass is recorded in the store (``bootstrap``/``passed``) before the taint is removed, so a
   crash in between only repeats an idempotent removal.
2. A failed or undecided suite keeps the taint and sets the NodeCondition
   ``GpuMonitorBootstrapFailed=True`` with the failing reasons, plus an Event; it is retried after
   ``daemon.bootstrap_retry_s``.
3. In dry-run nothing is written to the node: the decision is logged and evented only.
4. With no node delivery (a laptop, ``--simulate``, no API server) the suite still runs and its
   verdict is recorded; the taint part is skipped. The node is reached only through the
   remediator's node delivery (delivery.py): ``delivery()`` returns it.
5. Only an image that can run the active checks lifts the taint. ``active_runtime`` says what
   this image lacks for them ("" when nothing: the daemon asks the host's requirement gate for
   torch, see daemon.py); while it names something -- the passive image has no torch -- no pass
   is recorded and the taint is never removed, whatever the config disables or a profile
   makes optional: the suite still runs and reports, its verdict is at best ``unknown``
   (``BootstrapUndecided``) naming what is missing. A pass recorded earlier by a full image
   stays recorded; this image just does not act on it (``blocked``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from gpu_monitor.model import Report, Status, Verdict, iso
from gpu_monitor.remediate.policy import ConditionWant

log = logging.getLogger(__name__)

BOOTSTRAP_TAINT = "gpu-monitor.io/bootstrap"
CONDITION = "GpuMonitorBootstrapFailed"
KV_NAMESPACE = "bootstrap"
KV_PASSED = "passed"
KV_LAST = "last"


class BootstrapGate:
    def __init__(self, store, run_suite: Callable[[], Report], clock,
                 delivery: Callable[[], Any] | None = None, dry_run: bool = True,
                 retry_s: float = 600.0, active_runtime: Callable[[], str] | None = None):
        self.store = store
        self.run_suite = run_suite
        self.clock = clock
        self.delivery = delivery
        self.dry_run = dry_run
        self.retry_s = retry_s
        self.active_runtime = active_runtime
        self._last_attempt: float | None = None
        self._blocked_logged = False

    def passed(self) -> bool:
        return bool(self.store.get_kv(KV_NAMESPACE, KV_PASSED))

    def due(self) -> bool:
        if self._last_attempt is None:
            return True
        return self.clock.monotonic() - self._last_attempt >= self.retry_s

    def missing_runtime(self) -> str:
        """What this image lacks for the active checks ("" when nothing, or when not asked).
        A probe that raises counts as missing: an unknown runtime earns no pass."""
        if self.active_runtime is None:
            return ""
        try:
            return str(self.active_runtime() or "")
        except Exception as exc:  # noqa: BLE001 - contract 5: no pass on an unknown image
            return f"cannot tell whether this image can run the active checks: {exc}"

    def step(self) -> str:
        """Run what is due: ``passed`` (recorded, taint released), ``failed``, ``unknown``,
        ``blocked`` (a pass is recorded but this image may not act on it, contract 5) or
        ``waiting`` (nothing due)."""
        missing = self.missing_runtime()
        if self.passed():
            if missing:
                if not self._blocked_logged:
                    log.warning("a bootstrap pass is recorded, but this image cannot run the "
                                "active checks (%s): the %s taint is left as it is",
                                missing, BOOTSTRAP_TAINT)
                    self._blocked_logged = True
                return "blocked"
            self._release_taint()
            return "passed"
        if not self.due():
            return "waiting"
        self._last_attempt = self.clock.monotonic()
        report = self.run_suite()
        now = self.clock.now()
        verdict = report.verdict
        bad = [r for r in report.results if r.status in (Status.FAILED, Status.UNKNOWN)]
        summary = ", ".join(sorted({f"{r.check}/{r.reason}@{r.target}" for r in bad})[:10])
        if missing:
            summary = f"this image cannot run the active checks: {missing}" + (
                f"; {summary}" if summary else "")
            if verdict is Verdict.HEALTHY:
                verdict = Verdict.UNKNOWN
        self.store.set_kv(KV_NAMESPACE, KV_LAST, {"at": iso(now), "verdict": verdict.value,
                                                  "problems": summary})
        if verdict is Verdict.HEALTHY:
            self.store.set_kv(KV_NAMESPACE, KV_PASSED, iso(now))
            log.info("bootstrap suite passed (%d results)", len(report.results))
            self._publish(ConditionWant(CONDITION, "False", "BootstrapPassed",
                                        "the bootstrap suite passed"), "BootstrapPassed",
                          "gpu-monitor bootstrap suite passed", warning=False)
            self._release_taint()
            return "passed"
        reason = "BootstrapFailed" if verdict is Verdict.UNHEALTHY else "BootstrapUndecided"
        message = (f"bootstrap suite verdict {verdict.value}: {summary or 'no detail'}; "
                   f"the {BOOTSTRAP_TAINT} taint stays; retry in {self.retry_s:g} s")
        log.warning("%s", message)
        self._publish(ConditionWant(CONDITION, "True", reason, message[:1000]), reason, message,
                      warning=True)
        return "failed" if verdict is Verdict.UNHEALTHY else "unknown"

    # --- the node -----------------------------------------------------------------------------

    def _node(self) -> Any:
        if self.delivery is None:
            return None
        try:
            return self.delivery()
        except Exception as exc:  # noqa: BLE001 - no API: record locally, touch nothing
            log.info("no node delivery for the bootstrap gate: %s", exc)
            return None

    def _publish(self, cond: ConditionWant, reason: str, message: str, warning: bool) -> None:
        node = self._node()
        if node is None:
            return
        try:
            node.event(reason, message, warning=warning)
            if self.dry_run:
                log.info("dry-run: would set condition %s=%s (%s)", cond.type, cond.status,
                         cond.reason)
                return
            node.publish_conditions([cond], self.clock.now(), force=True)
        except Exception as exc:  # noqa: BLE001 - retried on the next step
            log.warning("could not publish the bootstrap verdict: %s", exc)

    def _release_taint(self) -> None:
        node = self._node()
        if node is None:
            return
        try:
            if not node.bootstrap_held():
                return
            if self.dry_run:
                log.info("dry-run: would remove the %s taint", BOOTSTRAP_TAINT)
                return
            node.lift_bootstrap_hold()
            log.info("removed the %s taint: the node is open for workloads", BOOTSTRAP_TAINT)
        except Exception as exc:  # noqa: BLE001 - retried on the next step
            log.warning("could not remove the %s taint: %s", BOOTSTRAP_TAINT, exc)


def bootstrap_checks(classes: Sequence[type]) -> list[type]:
    from gpu_monitor.model import Kind

    return [c for c in classes if c.kinds & {Kind.BOOTSTRAP}]
