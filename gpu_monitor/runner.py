"""Runs one check safely, and a suite of checks in order.

Guarantees, in order of importance:
1. The caller never sees an exception from a check: a crash becomes one ``unknown`` result
   naming the exception (``CheckCrashed``), a check that overruns its timeout becomes
   ``unknown`` (``Timeout``) and the caller moves on.
2. A missing requirement (no NVML, no GPU, no dcgmi...) gives ``skipped`` with the reason, and
   the check's code is not entered -- except in a bootstrap (``bootstrap=True``) for a check
   the bootstrap requires (``Context.required``): there a tool or runtime that is *missing*
   (Host.requirement_gap; not "not applicable here") gives ``unknown`` naming it, and so do the
   check's own ``unavailable_reasons`` skips. A bootstrap that did not run its checks is not
   healthy.
2a. A check the config disables is not run by a bootstrap, but it is reported: one ``skipped``
   ``DisabledByConfig`` result whose message says "disabled by config" and names the field.
3. Every run records its duration and whether it completed (the framework's "success", like
   node_exporter's per-collector ``scrape_collector_success``), independent of the verdict.
4. A check that returns nothing gets one ``ok`` result for ``node`` only when it completed, so
   "no news" is visible; undeclared reasons are logged (tests hold checks to their declaration).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpu_monitor.check import Check, Context
from gpu_monitor.hw.nvml import NvmlError
from gpu_monitor.model import NODE, Report, Result, RunOutcome, Status, verdict_of

REQUIRED_NOTE = "required for the bootstrap"

#: One bootstrap suite at a time in this process: the bootstrap gate, the remediation retest
#: and the cleaning between workloads each run the node's active checks, which measure the GPUs
#: and must not share them with one another (a burn-in beside a burn-in reads half its speed).
#: Held for a whole suite (``run_suite(bootstrap=True)``, ``cleaning.suite.HeldSuite``).
ACTIVE_SUITE = threading.RLock()


@dataclass
class RunnerHooks:
    """Optional observers of a suite run (the CLI's progress display)."""

    on_start: Callable[[type[Check] | Check, int, int], None] | None = None
    on_done: Callable[[RunOutcome, int, int], None] | None = None


def _framework_result(check: Check, ctx: Context, status: Status, reason: str, message: str,
                      details: dict | None = None) -> Result:
    return Result(check=check.name, status=status, target=NODE, reason=reason, message=message,
                  details=details or {}, observed_at=ctx.clock.now())


def _invasive_gate(check: Check, ctx: Context) -> tuple[Result, ...]:
    """Invasive checks never run beside a workload or on MIG-partitioned GPUs.

    Foreign GPU processes give ``unknown`` (``GpuBusy``, the node was not proven healthy) naming
    each holder, unless ``--force``; MIG mode gives ``skipped`` (``MigEnabled``). A MIG mode or
    process list NVML cannot read is ``unknown`` ``GpuBusy`` too, naming the call and error:
    the GPU was not proven free. A GPU list NVML cannot give passes the gate: the check's own
    enumeration reports it.
    """
    nvml = ctx.host.nvml
    if not nvml.available():
        return ()
    try:
        gpus = nvml.gpus()
    except NvmlError:
        return ()
    mig = []
    for gpu in gpus:
        if getattr(gpu, "lost", False):
            continue
        try:
            if nvml.mig_enabled(gpu.index):
                mig.append(gpu.index)
        except NvmlError as err:
            return (_not_proven_free(check, ctx, gpu.index, err),)
    if mig:
        return tuple(
            Result(check=check.name, status=Status.SKIPPED, target=f"gpu:{i}",
                   reason="MigEnabled",
                   message=f"{check.name} does not run on MIG-enabled GPUs (gpu:{i})",
                   observed_at=ctx.clock.now())
            for i in mig
        )
    if ctx.force:
        return ()
    try:
        holders = ctx.host.gpu_holders()
    except NvmlError as err:
        return (_not_proven_free(check, ctx, err.gpu_index, err),)
    if not holders:
        return ()
    by_gpu: dict[int, list] = {}
    for h in holders:
        by_gpu.setdefault(h.gpu_index, []).append(h)
    return tuple(
        Result(
            check=check.name, status=Status.UNKNOWN, target=f"gpu:{i}", reason="GpuBusy",
            message=(f"{check.name} refused: gpu:{i} is in use by "
                     + ", ".join(f"pid {h.pid} ({h.name})" for h in hs)
                     + "; stop the workload or pass --force"),
            details={"pids": [h.pid for h in hs], "names": [h.name for h in hs]},
            observed_at=ctx.clock.now(),
        )
        for i, hs in sorted(by_gpu.items())
    )


def _not_proven_free(check: Check, ctx: Context, index: int | None, err: NvmlError) -> Result:
    target = NODE if index is None else f"gpu:{index}"
    return Result(check=check.name, status=Status.UNKNOWN, target=target, reason="GpuBusy",
                  message=f"{check.name} refused: cannot tell whether {target} is free: {err}",
                  details={"nvml_error": str(err), "nvml_error_kind": err.kind.value,
                           "nvml_call": err.call},
                  observed_at=ctx.clock.now())


def _requirement_result(check: Check, ctx: Context, gap, required: bool) -> Result:
    details = {"requires": sorted(check.requires), "requirement": gap.requirement}
    if not gap.missing:
        return _framework_result(check, ctx, Status.SKIPPED, "RequirementMissing", gap.message,
                                 {**details, "not_applicable": True})
    if required:
        return _framework_result(
            check, ctx, Status.UNKNOWN, "RequirementMissing",
            f"{check.name} is {REQUIRED_NOTE} but cannot run: {gap.message}",
            {**details, "required": True})
    return _framework_result(check, ctx, Status.SKIPPED, "RequirementMissing", gap.message,
                             details)


def _as_required(check: Check, results: tuple[Result, ...]) -> tuple[Result, ...]:
    """A required check's own "a tool is missing" skips, as the ``unknown`` they are in a
    bootstrap."""
    missing = set(check.unavailable_reasons)
    if not missing:
        return results
    return tuple(
        dataclasses.replace(
            r, status=Status.UNKNOWN,
            message=f"{check.name} is {REQUIRED_NOTE} but could not run: {r.message}",
            details={**dict(r.details), "required": True})
        if r.status is Status.SKIPPED and r.reason in missing else r
        for r in results)


def disabled_outcome(check: Check | type[Check], ctx: Context, why: str) -> RunOutcome:
    """What a bootstrap reports for a check the config (or ``--skip``, ``why`` then starts with
    ``--``) disables: it was not run, on purpose."""
    now = ctx.clock.now()
    said = (f"disabled by {why} on the command line" if why.startswith("--")
            else f"disabled by config ({why})")
    res = Result(check=check.name, status=Status.SKIPPED, target=NODE,
                 reason="DisabledByConfig",
                 message=f"{check.name} {said}; not run",
                 details={"disabled_by": why, "required": ctx.required(check)},
                 observed_at=now)
    return RunOutcome(check.name, (res,), now, 0.0, True)


def _limit(check: Check, ctx: Context) -> float:
    """The runner's time limit for one run: a backstop a little beyond the check's own budget
    (the configured ``timeout_s``, with which the check kills its tools and reports its own
    reason); 0 is no limit."""
    try:
        budget = float(ctx.setting(check.name, "timeout_s", check.timeout))
    except (TypeError, ValueError, AttributeError):
        budget = float(check.timeout)
    return budget + max(2.0, 0.1 * budget) if budget > 0 else 0.0


def _call_in_thread(check: Check, ctx: Context, method: str, record: object,
                    limit: float) -> tuple[threading.Thread, dict[str, object]]:
    """Call ``check.<method>`` in a daemon thread and wait up to ``limit`` seconds. The box
    holds its ``results`` or its ``error``; a thread still alive has overrun the limit (it is
    abandoned: Python cannot stop it)."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            fn = getattr(check, method)
            out = fn(record, ctx) if method == "on_kmsg" else fn(ctx)
            box["results"] = tuple(out or ())
        except BaseException as exc:  # noqa: BLE001 - a check must never crash its caller
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"check-{check.name}", daemon=True)
    thread.start()
    thread.join(limit if limit and limit > 0 else None)
    return thread, box


def run_check(check: Check, ctx: Context, method: str = "run", record: object = None,
              timeout: float | None = None, bootstrap: bool = False) -> RunOutcome:
    """Run ``check.<method>(ctx)`` with the requirement gate, timeout and crash capture.

    ``bootstrap``: this run is part of a bootstrap suite, so a check the bootstrap requires
    cannot be skipped for a missing tool (guarantee 2)."""
    started = ctx.clock.now()
    clock = ctx.clock
    t0 = clock.monotonic()
    required = bootstrap and ctx.required(check)
    gap = ctx.host.requirement_gap(check.requires, ctx)
    if gap is not None:
        res = _requirement_result(check, ctx, gap, required)
        return RunOutcome(check.name, (res,), started, clock.monotonic() - t0,
                          res.status is Status.SKIPPED,
                          "" if res.status is Status.SKIPPED else "requirement-missing")

    if check.invasive:
        gate = _invasive_gate(check, ctx)
        if gate:
            return RunOutcome(check.name, gate, started, clock.monotonic() - t0, True)

    limit = _limit(check, ctx) if timeout is None else timeout
    thread, box = _call_in_thread(check, ctx, method, record, limit)
    duration = clock.monotonic() - t0
    if thread.is_alive():
        res = _framework_result(
            check, ctx, Status.UNKNOWN, "Timeout",
            f"{check.name} did not finish within {limit:g} s",
            {"timeout_s": limit},
        )
        ctx.log.warning("check %s timed out after %.1f s", check.name, limit)
        return RunOutcome(check.name, (res,), started, duration, False, "timeout")
    if "error" in box:
        exc = box["error"]
        assert isinstance(exc, BaseException)
        res = _framework_result(
            check, ctx, Status.UNKNOWN, "CheckCrashed",
            f"{check.name} crashed: {type(exc).__name__}: {exc}",
            {"exception": type(exc).__name__, "error": str(exc)[:500]},
        )
        ctx.log.error("check %s crashed: %s: %s", check.name, type(exc).__name__, exc,
                      exc_info=(type(exc), exc, exc.__traceback__))
        return RunOutcome(check.name, (res,), started, duration, False, type(exc).__name__)
    results = box.get("results", ())
    assert isinstance(results, tuple)
    bad = [r for r in results if not isinstance(r, Result)]
    if bad:
        res = _framework_result(check, ctx, Status.UNKNOWN, "CheckCrashed",
                                f"{check.name} returned a non-Result value: {bad[0]!r:.80}")
        return RunOutcome(check.name, (res,), started, duration, False, "bad-return")
    declared = set(check.all_reasons())
    for r in results:
        if r.reason not in declared:
            ctx.log.warning("check %s emitted undeclared reason %s", check.name, r.reason)
    if not results and method != "on_kmsg":
        results = (_framework_result(check, ctx, Status.OK, "NoResult",
                                     f"{check.name} found nothing to report"),)
    if required:
        results = _as_required(check, results)
    return RunOutcome(check.name, results, started, duration, True)


def run_on_kmsg(check: Check, ctx: Context, record: object) -> RunOutcome | None:
    """``check.on_kmsg(record)`` called inline (the follower's hot path: no thread, no
    requirement gate per record); None when it found nothing. Guarantee 1 holds: a crash or a
    non-Result value becomes the check's ``CheckCrashed`` outcome. There is no timeout here: a
    call that hangs stops the follower, whose heartbeat the daemon's health reports."""
    try:
        results = tuple(check.on_kmsg(record, ctx) or ())
    except Exception as exc:  # noqa: BLE001 - a check must never crash its caller
        res = _framework_result(
            check, ctx, Status.UNKNOWN, "CheckCrashed",
            f"{check.name} crashed: {type(exc).__name__}: {exc}",
            {"exception": type(exc).__name__, "error": str(exc)[:500]})
        ctx.log.error("check %s crashed: %s: %s", check.name, type(exc).__name__, exc,
                      exc_info=(type(exc), exc, exc.__traceback__))
        return RunOutcome(check.name, (res,), ctx.clock.now(), 0.0, False, type(exc).__name__)
    if not results:
        return None
    bad = [r for r in results if not isinstance(r, Result)]
    if bad:
        res = _framework_result(check, ctx, Status.UNKNOWN, "CheckCrashed",
                                f"{check.name} returned a non-Result value: {bad[0]!r:.80}")
        return RunOutcome(check.name, (res,), ctx.clock.now(), 0.0, False, "bad-return")
    declared = _declared_reasons(check)
    for r in results:
        if r.reason not in declared:
            ctx.log.warning("check %s emitted undeclared reason %s", check.name, r.reason)
    return RunOutcome(check.name, results, ctx.clock.now(), 0.0, True)


@functools.lru_cache(maxsize=256)
def _reasons_of(cls: type, reasons: tuple[str, ...]) -> frozenset[str]:
    return frozenset(cls.all_reasons())


def _declared_reasons(check: Check) -> frozenset[str] | set[str]:
    """``set(check.all_reasons())``, built once per check class and its ``reasons`` (the
    follower asks per event): a class whose ``reasons`` is replaced gets a new entry."""
    cls = type(check)
    reasons = getattr(cls, "reasons", None)
    own = getattr(getattr(cls, "all_reasons", None), "__func__", None)
    if isinstance(reasons, tuple) and own is Check.all_reasons.__func__:
        return _reasons_of(cls, reasons)
    return set(check.all_reasons())  # another rule than Check's, or reasons not a tuple


def run_suite(checks: Sequence[Check], ctx: Context, fail_fast: bool = False,
              hooks: RunnerHooks | None = None, *, bootstrap: bool = False,
              disabled: Mapping[str, str] | None = None) -> tuple[list[RunOutcome], Report]:
    """Run checks in the given order; stop after the first failing check with ``fail_fast``.

    ``bootstrap``: the suite is a bootstrap (guarantee 2). ``disabled``: check name -> the
    config field that disables it; such a check is reported ``DisabledByConfig``, not run.
    """
    if bootstrap:
        with ACTIVE_SUITE:
            return _run_suite(checks, ctx, fail_fast, hooks, True, disabled)
    return _run_suite(checks, ctx, fail_fast, hooks, False, disabled)


def _run_suite(checks: Sequence[Check], ctx: Context, fail_fast: bool,
               hooks: RunnerHooks | None, bootstrap: bool,
               disabled: Mapping[str, str] | None) -> tuple[list[RunOutcome], Report]:
    hooks = hooks or RunnerHooks()
    disabled = disabled or {}
    started = ctx.clock.now()
    outcomes: list[RunOutcome] = []
    total = len(checks)
    for i, check in enumerate(checks):
        if hooks.on_start:
            hooks.on_start(check, i, total)
        if check.name in disabled:
            outcome = disabled_outcome(check, ctx, disabled[check.name])
        else:
            outcome = run_check(check, ctx, bootstrap=bootstrap)
        outcomes.append(outcome)
        if ctx.store is not None:
            try:
                ctx.store.record_run(outcome)
            except Exception as exc:  # noqa: BLE001 - losing history must not lose the verdict
                ctx.log.error("could not store results of %s: %s", check.name, exc)
        if hooks.on_done:
            hooks.on_done(outcome, i, total)
        if fail_fast and any(r.status is Status.FAILED for r in outcome.results):
            break
    results = tuple(r for o in outcomes for r in o.results)
    report = Report(node=ctx.node, profile=ctx.profile.name if ctx.profile else None,
                    started_at=started, finished_at=ctx.clock.now(), results=results)
    return outcomes, report


def suite_verdict(outcomes: Iterable[RunOutcome]):
    return verdict_of(r for o in outcomes for r in o.results)
