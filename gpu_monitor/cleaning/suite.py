"""The active suite as the cleaner runs it, while its hold keeps the node's GPUs.

``HeldSuite`` is the ``run_suite(budget_s, still_held) -> Verdict`` the cleaner's loop is handed:

1. **The bootstrap suite, as a bootstrap.** The same checks in the same order as ``gpu-monitor
   bootstrap``, with the invasive-check guard (they refuse beside a GPU process), required
   checks that cannot be skipped for a missing tool, and the checks the config disables
   reported, not run.
2. **Stops between checks** the moment the hold is gone (``still_held`` re-reads the API
   server: a person deleted it, the node's lifecycle evicted it), the budget is spent or the
   daemon is stopping. The
   GPUs may then be a workload's, so nothing more runs, and an unfinished run is ``unknown``,
   never a pass. A check already running is bounded by its own timeout, not cut off.
3. **Every outcome is recorded** as it comes (``record``: the daemon's store-then-remediation
   path), so a failed check reaches remediation like a failed poll does.
4. **One suite at a time.** The run holds the runner's ``ACTIVE_SUITE`` lock, as the
   bootstrap gate's and the remediation retest's suites do: active checks never share GPUs.
5. **No runtime, no pass.** An image that cannot run the active checks (no torch; a CPU-only
   torch on a GPU node) runs nothing and answers ``unknown`` naming what it lacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpu_monitor.check import Check, Context
from gpu_monitor.clock import Clock
from gpu_monitor.model import RunOutcome, Status, Verdict
from gpu_monitor.runner import ACTIVE_SUITE, disabled_outcome, run_check, suite_verdict

log = logging.getLogger(__name__)

#: Why a run stopped before its last check (the ``stopped`` of ``LastRun``).
STOPPED_HOLD_LOST = "hold_lost"
STOPPED_BUDGET = "budget"
STOPPED_NO_RUNTIME = "no_runtime"
STOPPED_DAEMON = "daemon_stopping"


@dataclass(frozen=True)
class LastRun:
    """The last run, as ``gpu-monitor status`` and the metrics tell it."""

    verdict: Verdict
    started: datetime
    seconds: float
    checks_run: int
    stopped: str = ""  # "" when every check ran; else one of the STOPPED_* words
    problems: str = ""  # check/reason@target of the failed and unknown results (first 10)


class HeldSuite:
    def __init__(self, checks: Sequence[Check], context: Callable[[], Context], *,
                 record: Callable[[RunOutcome], None],
                 disabled: Mapping[str, str] | None = None,
                 runtime_missing: Callable[[], str] = lambda: "",
                 stopping: Callable[[], bool] = lambda: False,
                 clock: Clock | None = None) -> None:
        self.checks = list(checks)
        self.context = context
        self.record = record
        self.disabled = dict(disabled or {})
        self.runtime_missing = runtime_missing
        self.stopping = stopping
        self.clock = clock or Clock()
        self.last: LastRun | None = None

    def __call__(self, budget_s: float, still_held: Callable[[], bool]) -> Verdict:
        started, t0 = self.clock.now(), self.clock.monotonic()
        missing = self.runtime_missing()
        if missing:
            log.warning("cleaning: this image cannot run the active checks (%s): no pass",
                        missing)
            return self._done(Verdict.UNKNOWN, started, t0, [], STOPPED_NO_RUNTIME, missing)
        with ACTIVE_SUITE:  # never beside the bootstrap gate's or a retest's suite
            return self._run(budget_s, still_held, started, t0)

    def _run(self, budget_s: float, still_held: Callable[[], bool], started: datetime,
             t0: float) -> Verdict:
        ctx = self.context()
        outcomes: list[RunOutcome] = []
        for check in self.checks:
            stopped = self._stop_before(check, t0, budget_s, still_held)
            if stopped:
                return self._done(Verdict.UNKNOWN, started, t0, outcomes, stopped)
            if check.name in self.disabled:
                outcome = disabled_outcome(check, ctx, self.disabled[check.name])
            else:
                outcome = run_check(check, ctx, bootstrap=True)
            outcomes.append(outcome)
            try:
                self.record(outcome)
            except Exception as exc:  # noqa: BLE001 - losing history must not lose the verdict
                log.error("cleaning: could not record %s: %s", check.name, exc)
        return self._done(suite_verdict(outcomes), started, t0, outcomes)

    def _stop_before(self, check: Check, t0: float, budget_s: float,
                     still_held: Callable[[], bool]) -> str:
        if self.stopping():
            log.info("cleaning: the daemon is stopping; the suite stops before %s, no pass",
                     check.name)
            return STOPPED_DAEMON
        if self.clock.monotonic() - t0 >= budget_s:
            log.warning("cleaning: the %.0f s budget is spent before %s: no pass", budget_s,
                        check.name)
            return STOPPED_BUDGET
        if not still_held():
            log.warning("cleaning: the hold is gone before %s: the GPUs may be a workload's; "
                        "stopped, no pass", check.name)
            return STOPPED_HOLD_LOST
        return ""

    def _done(self, verdict: Verdict, started: datetime, t0: float,
              outcomes: list[RunOutcome], stopped: str = "", problems: str = "") -> Verdict:
        if not problems:
            bad = sorted({f"{r.check}/{r.reason}@{r.target}" for o in outcomes for r in o.results
                          if r.status in (Status.FAILED, Status.UNKNOWN)})
            problems = ", ".join(bad[:10])
        self.last = LastRun(verdict, started, self.clock.monotonic() - t0, len(outcomes),
                            stopped, problems[:500])
        return verdict
