"""``gpu-monitor slurm-hook healthcheck|prolog|epilog``: gpu-monitor as Slurm's node hooks.

Where NHC runs today, as slurmd runs it (slurm.conf ``HealthCheckProgram``, ``Prolog``,
``Epilog``):

- **healthcheck**: a quick passive pass (the daemon's passive checks once). slurmd ignores
  its exit code and kills it after 60 s, so when a finding asks for a quarantine the hook
  drains the node itself, through the same remediator, policy, breaker and Slurm delivery as
  the daemon (``remediation.enabled`` and ``daemon.backend: slurm``); it stops acting at its
  time budget (default 50 s): a drain still waiting on jobs is resumed by the next run.
- **prolog**: the bootstrap suite before a job. Exit 1 when the node is unhealthy: slurmd
  then drains the node and requeues the job (Slurm's own reaction to a failed prolog);
  anything else (healthy, degraded, undecided, over its budget) exits 0, so a check that
  cannot decide never takes a node out of service by itself.
- **epilog**: the same suite after a job: the "check between workloads" on Slurm. Exit 1 when
  unhealthy: slurmd drains the node.

Each hook has a time budget (``--budget``; defaults in ``BUDGET_S``): the suite runs in a
thread and a hook over budget exits 0 and says so ("undecided: over budget"), because slurmd
treats a hung prolog as a failure of the node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_monitor.check import Check, Context
from gpu_monitor.model import Report, Verdict
from gpu_monitor.runner import run_suite

log = logging.getLogger(__name__)

__all__ = ["BUDGET_S", "HOOKS", "HookOutcome", "run_hook"]

HOOKS = ("healthcheck", "prolog", "epilog")
#: each hook's default time budget, in seconds (slurmd kills HealthCheckProgram at 60 s)
BUDGET_S = {"healthcheck": 50.0, "prolog": 300.0, "epilog": 600.0}
EXIT_OK = 0
EXIT_UNHEALTHY = 1


@dataclass(frozen=True)
class HookOutcome:
    exit_code: int
    report: Report | None  # None: over budget
    note: str


def _suite_within(checks: Sequence[Check], ctx: Context, budget_s: float, *,
                  bootstrap: bool, disabled: dict[str, str] | None) -> Report | None:
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["report"] = run_suite(checks, ctx, bootstrap=bootstrap, disabled=disabled)[1]
        except BaseException as exc:  # noqa: BLE001 - told to the caller, not lost in a thread
            box["error"] = exc

    t = threading.Thread(target=work, name="slurm-hook-suite", daemon=True)
    t.start()
    t.join(max(0.0, budget_s))
    if "error" in box:
        raise box["error"]
    return box.get("report")


def run_hook(hook: str, checks: Sequence[Check], ctx: Context, *, budget_s: float | None = None,
             disabled: dict[str, str] | None = None,
             remediator: Callable[[], Any] | None = None) -> HookOutcome:
    """Run ``hook`` over ``checks`` (the CLI chose them: passive for the healthcheck, the
    bootstrap suite for prolog/epilog). ``remediator``: makes the node's remediator (None:
    remediation off); only the healthcheck uses it."""
    if hook not in HOOKS:
        raise ValueError(f"not a Slurm hook: {hook!r} (one of {', '.join(HOOKS)})")
    budget = BUDGET_S[hook] if budget_s is None else budget_s
    started = time.monotonic()
    report = _suite_within(checks, ctx, budget, bootstrap=hook != "healthcheck",
                           disabled=disabled)
    if report is None:
        note = f"undecided: over its budget of {budget:g} s"
        log.error("slurm-hook %s: %s; exit 0 (the node is not failed for our slowness)",
                  hook, note)
        return HookOutcome(EXIT_OK, None, note)
    unhealthy = report.verdict is Verdict.UNHEALTHY
    note = f"verdict {report.verdict.value}"
    if hook == "healthcheck" and remediator is not None:
        note += "; " + _remediate(remediator(), report, budget - (time.monotonic() - started))
    code = EXIT_UNHEALTHY if unhealthy else EXIT_OK
    log.log(logging.WARNING if unhealthy else logging.INFO, "slurm-hook %s: %s; exit %d",
            hook, note, code)
    return HookOutcome(code, report, note)


def _remediate(rem: Any, report: Report, left_s: float) -> str:
    """One remediator tick on the pass's results, stopped at the budget's end."""
    rem.on_results(report.results)
    timer = threading.Timer(max(0.0, left_s), lambda: rem.stop(timeout=0))
    timer.daemon = True
    timer.start()
    try:
        rem.tick()
    finally:
        timer.cancel()
    state = rem.store.node_state().state
    return f"node state {state}" + (f" ({rem.last_error})" if rem.last_error else "")
