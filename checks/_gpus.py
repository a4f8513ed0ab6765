"""GPU enumeration and NVML read errors, said the same way by every check.

Why one place: these are the rules that keep a check from ever saying `ok` about what it could
not read, and the checks must agree on them. A GPU list NVML cannot give is `unknown`
(NvmlReadError, with the NVML error kind); a lost GPU is `unknown` GpuLost (the inventory check
is the one that fails it); NotSupported / FunctionNotFound is `skipped`; an active check leaves
lost GPUs out of its run and says so per GPU (DeviceUnavailable).
"""

from __future__ import annotations

from typing import Any

from gpu_monitor.check import Check, Context
from gpu_monitor.hw.nvml import GpuInfo, NvmlError, NvmlErrorKind
from gpu_monitor.model import NODE, Result, Status, gpu_target

__all__ = ["active_gpus", "enumeration_error", "poll_gpus", "read_error"]


def enumeration_error(check: Check, ctx: Context, err: NvmlError) -> Result:
    """The node-level `unknown` for an NVML that cannot list the GPUs."""
    return check.result(ctx, Status.UNKNOWN, NODE, "NvmlReadError",
                        f"cannot enumerate GPUs: {err}",
                        {"nvml_error": str(err), "nvml_error_kind": err.kind.value})


def poll_gpus(check: Check, ctx: Context) -> tuple[list[GpuInfo], list[Result] | None]:
    """(GPUs, None), or ([], the results to return instead) for a passive NVML check.

    NVML missing altogether -> skipped RequirementMissing; enumeration failing -> unknown;
    no GPU enumerated -> skipped NoGpu (the inventory check judges a GPU count that is wrong).
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


def active_gpus(check: Check, ctx: Context,
                left_out: str) -> tuple[list[Result], list[GpuInfo] | None]:
    """(results for what cannot take part, the usable GPUs) for an active check.

    The GPUs are None when NVML cannot list them (the results then hold that `unknown`).
    ``left_out`` completes "gpu:N ... : NVML reports it lost", e.g. "not burned".
    """
    try:
        gpus = ctx.host.nvml.gpus()
    except NvmlError as err:
        return [enumeration_error(check, ctx, err)], None
    results = [check.result(ctx, Status.UNKNOWN, gpu_target(g.index), "DeviceUnavailable",
                            f"{gpu_target(g.index)} {left_out}: NVML reports it lost")
               for g in gpus if g.lost]
    return results, [g for g in gpus if not g.lost]


def read_error(check: Check, ctx: Context, target: str, base: dict[str, Any],
               err: NvmlError | None, what: str) -> Result:
    """One GPU's NVML read failure: GpuLost -> unknown; NotSupported / FunctionNotFound ->
    skipped; any other error -> unknown NvmlReadError. ``err`` None: the GPU was already lost
    at enumeration. ``what`` names what could not be read ("clock event reasons")."""
    kind = err.kind if err is not None else NvmlErrorKind.GPU_LOST
    details = {**base, "nvml_error": str(err) if err else "GPU_IS_LOST",
               "nvml_error_kind": kind.value}
    if kind is NvmlErrorKind.GPU_LOST:
        return check.result(ctx, Status.UNKNOWN, target, "GpuLost",
                            f"{target} is lost (GPU_IS_LOST): {what} cannot be read", details)
    if kind in (NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.FUNCTION_NOT_FOUND):
        return check.result(ctx, Status.SKIPPED, target, "NotSupported",
                            f"{what} not supported on {target} ({kind.value})", details)
    return check.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                        f"cannot read {what} of {target}: {err}", details)
