"""The long-running per-node process: polls passive checks on their intervals.

Guarantees:
1. One slow check never starves another: each passive check has its own scheduling slot and
   runs under the runner's timeout.
2. Every outcome is committed to the store before anything consumes it.
3. SIGTERM/SIGINT stop the loop cleanly within one tick.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence

from gpu_monitor.check import Check, Context
from gpu_monitor.model import Kind, Report
from gpu_monitor.runner import RunOutcome, run_check

log = logging.getLogger(__name__)


class Daemon:
    def __init__(self, checks: Sequence[Check], ctx: Context, tick_s: float = 0.2):
        self.checks = list(checks)
        self.ctx = ctx
        self.tick_s = tick_s
        self.stop_event = threading.Event()
        self.next_due: dict[str, float] = {}

    def interval(self, check: Check) -> float:
        value = self.ctx.setting(check.name, "interval_s", check.interval)
        return float(value or 0.0)

    def run_once(self) -> list[RunOutcome]:
        outcomes = []
        for check in self.checks:
            outcomes.append(self._run(check))
        return outcomes

    def _run(self, check: Check) -> RunOutcome:
        outcome = run_check(check, self.ctx, method="poll")
        if self.ctx.store is not None:
            try:
                self.ctx.store.record_run(outcome)
            except Exception as exc:  # noqa: BLE001 - keep monitoring even if history fails
                log.error("cannot store results of %s: %s", check.name, exc)
        return outcome

    def step(self) -> None:
        now = self.ctx.clock.monotonic()
        for check in self.checks:
            interval = self.interval(check)
            if interval <= 0:
                continue
            due = self.next_due.get(check.name, now)
            if now >= due:
                self._run(check)
                self.next_due[check.name] = now + interval

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.step()
            self.ctx.clock.wait(self.stop_event, self.tick_s)

    def stop(self, *_args) -> None:
        self.stop_event.set()


def run_daemon(env, args) -> int:
    from gpu_monitor.cli import _select_checks, emit

    checks = _select_checks(env, kinds={Kind.PASSIVE})
    ctx = env.context(force=getattr(args, "force", False), one_shot=bool(args.once))
    env.host.start(env.clock)
    daemon = Daemon(checks, ctx)
    if args.once:
        started = env.clock.now()
        outcomes = daemon.run_once()
        report = Report(node=env.node, profile=env.profile.name, started_at=started,
                        finished_at=env.clock.now(),
                        results=tuple(r for o in outcomes for r in o.results))
        emit(report, args.output)
        return report.exit_code
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, daemon.stop)
    log.info("gpu-monitor daemon started on %s with %d passive checks", env.node, len(checks))
    daemon.run()
    log.info("gpu-monitor daemon stopped")
    return 0
