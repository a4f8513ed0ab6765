"""GPU enumeration and NVML read errors, said the same way by every check.

Why one place: these are the rules that keep a check from ever saying `ok` about what it could
not read, and the checks must agree on them.

1. A GPU list NVML cannot give is one node-level `unknown` (NvmlReadError, with the call and the
   NVML error kind).
2. A lost GPU is `unknown` GpuLost (the inventory check is the one that fails it).
3. A GPU NVML cannot fully identify (an error from the handle, UUID, name, PCI info, serial or
   memory-size call: ``GpuInfo.identified`` is false) is `unknown` NvmlReadError in every check
   that judges GPUs, naming the call and the error, and nothing else is said about it: its
   readings could not be tied to its board (the UUID keys results in the store and metrics and
   lets a worker prove it opened the right device) or to its PCI device (sysfs, PCIe, the
   kernel-log mapping). NotSupported on an identity call is no excuse either.
4. Any other NVML read that fails is `unknown` NvmlReadError for that GPU (or its link), naming
   the call and the error; NotSupported / FunctionNotFound of the thing a check measures is
   `skipped`. A check that found a real failure with what it could read keeps it (`failed`
   outranks `unknown`) and lists the errors in details.
5. An active check leaves unusable GPUs (rule 2 or 3) out of its run and says so per GPU
   (DeviceUnavailable, naming the NVML error); its workers get its ``timeout_s`` less a
   margin for reading NVML and judging (``worker_budget``).
"""

from __future__ import annotations

from typing import Any

from gpu_monitor.check import Check, Context
from gpu_monitor.hw.nvml import GpuInfo, NvmlError, NvmlErrorKind
from gpu_monitor.model import NODE, Result, Status, gpu_target

__all__ = ["ABSENT", "active_gpus", "enumeration_error", "error_details", "poll_gpus",
           "read_error", "unidentified"]

#: Kinds that mean "this part or driver does not have it", not "reading it failed".
ABSENT = (NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.FUNCTION_NOT_FOUND)


def error_details(err: NvmlError) -> dict[str, Any]:
    """What every NVML read error puts in details: the error, its kind and its call."""
    return {"nvml_error": str(err), "nvml_error_kind": err.kind.value, "nvml_call": err.call}


def enumeration_error(check: Check, ctx: Context, err: NvmlError) -> Result:
    """The node-level `unknown` for an NVML that cannot list the GPUs."""
    return check.result(ctx, Status.UNKNOWN, NODE, "NvmlReadError",
                        f"cannot enumerate GPUs: {err}", error_details(err))


def poll_gpus(check: Check, ctx: Context) -> tuple[list[GpuInfo], list[Result] | None]:
    """(GPUs, None), or ([], the results to return instead) for a passive NVML check.

    NVML missing altogether -> skipped RequirementMissing; enumeration failing -> unknown;
    no GPU enumerated -> skipped NoGpu (the inventory check judges a GPU count that is wrong).
    The GPUs include lost and unidentified ones: ask ``unidentified`` before judging each.
    """
    nvml = ctx.host.nvml
    if not nvml.available():
        return [], [check.result(ctx, Status.SKIPPED, NODE, "RequirementMissing",
                                 f"NVML unavailable: {nvml.unavailable_reason()}")]
    try:
        gpus = nvml.gpus()
    except NvmlError as err:
        return [], [enumeration_error(check, ctx, err)]
    if not gpus:
        return [], [check.result(ctx, Status.SKIPPED, NODE, "NoGpu", "NVML enumerates no GPU")]
    return gpus, None


def unidentified(check: Check, ctx: Context, gpu: GpuInfo, base: dict[str, Any],
                 what: str, target: str | None = None) -> Result | None:
    """The one result for a GPU that must not be judged (rules 2 and 3), or None when it may.

    ``what`` names what the check would have read ("temperatures"); ``target`` defaults to
    the GPU's."""
    if gpu.identified:
        return None
    target = target or gpu_target(gpu.index)
    if gpu.lost:
        return read_error(check, ctx, target, base, gpu.error, what)
    err = gpu.error
    assert err is not None  # not identified and not lost: an identity read failed
    details = {**base, **error_details(err), "identity_errors": [str(e) for e in gpu.errors]}
    return check.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                        f"cannot judge {what} of {target}: NVML cannot identify it: {err}",
                        details)


def active_gpus(check: Check, ctx: Context,
                left_out: str) -> tuple[list[Result], list[GpuInfo] | None]:
    """(results for what cannot take part, the usable GPUs) for an active check.

    The GPUs are None when NVML cannot list them (the results then hold that `unknown`).
    ``left_out`` completes "gpu:N ... : NVML reports it lost", e.g. "not burned". A GPU NVML
    cannot identify is left out too: without its UUID a worker cannot prove it opened it.
    """
    try:
        gpus = ctx.host.nvml.gpus()
    except NvmlError as err:
        return [enumeration_error(check, ctx, err)], None
    results = []
    for g in gpus:
        if g.identified:
            continue
        target = gpu_target(g.index)
        why = ("NVML reports it lost" if g.lost
               else f"NVML cannot identify it ({g.error})")
        details = error_details(g.error) if g.error is not None else {}
        results.append(check.result(ctx, Status.UNKNOWN, target, "DeviceUnavailable",
                                    f"{target} {left_out}: {why}", details))
    return results, [g for g in gpus if g.identified]


def worker_budget(check: Check, ctx: Context) -> float:
    """The workers' share of an active check's time budget (``timeout_s``, else the check's
    ``timeout``; the runner stops the check a little after it): what is left is for reading
    NVML and judging."""
    budget = float(ctx.setting(check.name, "timeout_s", check.timeout) or check.timeout)
    return budget - min(5.0, 0.05 * budget)


def read_error(check: Check, ctx: Context, target: str, base: dict[str, Any],
               err: NvmlError | None, what: str) -> Result:
    """One GPU's NVML read failure: GpuLost -> unknown; NotSupported / FunctionNotFound ->
    skipped; any other error -> unknown NvmlReadError. ``err`` None: the GPU was already lost
    at enumeration. ``what`` names what could not be read ("clock event reasons")."""
    kind = err.kind if err is not None else NvmlErrorKind.GPU_LOST
    details = {**base, **(error_details(err) if err is not None else
                          {"nvml_error": "GPU_IS_LOST", "nvml_error_kind": kind.value})}
    if kind is NvmlErrorKind.GPU_LOST:
        return check.result(ctx, Status.UNKNOWN, target, "GpuLost",
                            f"{target} is lost (GPU_IS_LOST): {what} cannot be read"
                            + (f" ({err.call})" if err is not None else ""), details)
    if kind in ABSENT:
        return check.result(ctx, Status.SKIPPED, target, "NotSupported",
                            f"{what} not supported on {target} ({err})", details)
    return check.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                        f"cannot read {what} of {target}: {err}", details)
