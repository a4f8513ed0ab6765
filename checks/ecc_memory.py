"""ecc_memory: is each GPU's HBM healthy, and how much repair headroom is left?

Reads NVML only (cheap, safe beside workloads), so it runs in the bootstrap suite and as a slow
passive poll. Per GPU, one result with every finding in ``details["problems"]``; the worst
decides status and reason:

- ECC mode off → failed ``EccDisabled`` (a data-centre GPU must run with ECC).
- Volatile uncorrectable ECC errors > 0 → failed ``EccUncorrectable`` (reset the GPU).
- Row remapping (Ampere+): a remap pending → failed ``RowRemapPending`` (reset_gpu); a remap
  failure → failed ``RowRemapFailure`` (replace).
- Remap headroom, from the row-remapper histogram (banks by spare rows left: max, high, partial,
  low, none). No public suite gates on it; we do, to act *before* the GPU runs out:
  ``none`` banks ≥ ``remap_none_banks_degraded`` (1: any bank with no spare row) or ``low``
  banks > ``remap_low_banks_degraded`` → degraded ``RemapHeadroomLow``; ``none`` banks ≥
  ``remap_none_banks_failed`` or ``low`` banks > ``remap_low_banks_failed`` → failed
  ``RemapHeadroomExhausted`` (replace). (``none`` counts are "at least", ``low`` counts "more
  than": one bank without spare rows already matters, a few low banks do not.)
- Corrected errors (the larger of volatile and aggregate totals) above
  ``corrected_total_degraded`` / ``corrected_total_failed`` → ``EccCorrectedHigh``.
- Retired pages (pre-Ampere GPUs, which have no row remapper): more than
  ``retired_pages_limit`` → failed ``RetiredPagesLimit``; a retirement pending → failed
  ``RetiredPagesPending`` (reboot).

A feature the GPU does not support (NotSupported, or a driver without the call) is listed in
``details["not_supported"]``; a GPU supporting none of them is ``skipped``. Any other NVML error
makes the GPU ``unknown`` (``NvmlReadError``) unless a real failure was already found; so does
a GPU NVML cannot identify (checks/_gpus.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from checks._builtin import BuiltinCheck
from checks._findings import TargetFindings
from checks._gpus import enumeration_error, unidentified
from gpu_monitor.check import ClearTracker, Context, Setting
from gpu_monitor.hw.nvml import GpuInfo, NvmlError, NvmlErrorKind
from gpu_monitor.metric_families import CheckMetric, gpu_value, gpu_values
from gpu_monitor.model import (
    ACTION_SEVERITY,
    Action,
    Kind,
    Result,
    Status,
    gpu_target,
)
from gpu_monitor.profiles.schema import COUNT, POSITIVE_INT

_ABSENT = (NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.FUNCTION_NOT_FOUND)

SETTINGS = {
    "remap_low_banks_degraded": Setting(
        POSITIVE_INT, 8, "banks at `low` in the row-remapper histogram",
        "project (no public suite gates on headroom)", at_most="remap_low_banks_failed"),
    "remap_low_banks_failed": Setting(POSITIVE_INT, 32, "banks", "project"),
    "remap_none_banks_degraded": Setting(
        POSITIVE_INT, 1, "banks at `none`", "project: the next remap in such a bank fails",
        at_most="remap_none_banks_failed"),
    "remap_none_banks_failed": Setting(POSITIVE_INT, 8, "banks", "project"),
    "corrected_total_degraded": Setting(
        POSITIVE_INT, 20_000_000, "corrected ECC errors (volatile total)",
        "Azure NHC `check_gpu_ecc` (DRAM 2e7)", at_most="corrected_total_failed"),
    "corrected_total_failed": Setting(POSITIVE_INT, 50_000_000, "errors",
                                      "Meta GCM `ecc_corrected_volatile_total` 5e7"),
    "retired_pages_limit": Setting(COUNT, 10, "pages (pre-Ampere); fail when above",
                                   "Meta GCM `gpu_retired_pages`"),
}


#: The ``level`` label of ``gpu_monitor_gpu_row_remap_banks``: NVML's row-remapper histogram
#: (nvmlDeviceGetRowRemapperHistogram), most spare rows left first.
REMAP_LEVELS = ("max", "high", "partial", "low", "none")


def _by_error_type(name: str, help_text: str, prefix: str) -> CheckMetric:
    """A counter labelled ``(gpu, uuid, type)``: ``type`` corrected from the details key
    ``<prefix>_corrected``, uncorrected from ``<prefix>_uncorrected`` (the ECC and remapped-row
    counts NVML keeps by error type)."""
    keys = {"corrected": f"{prefix}_corrected", "uncorrected": f"{prefix}_uncorrected"}
    return CheckMetric(name, "counter", ("gpu", "uuid", "type"), help_text,
                       details=("uuid", *keys.values()), samples=gpu_values(keys))


#: What an operator of dcgm-exporter graphs: its DCGM_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL,
#: ROW_REMAP_PENDING / _FAILURE and {UN,}CORRECTABLE_REMAPPED_ROWS, under our names. The ECC
#: counts are counters as dcgm-exporter's are: NVML only ever raises them, and a volatile count
#: falling to 0 at a driver reload is a counter reset to rate() and increase(), as a restarted
#: exporter's would be. A count NVML does not keep (ECC off, unsupported) has no sample.
METRICS = (
    _by_error_type("gpu_monitor_gpu_ecc_volatile_errors_total",
                   "ECC errors since the driver loaded (NVML volatile counters; a driver reload "
                   "resets them), by type: corrected (single-bit), uncorrected (double-bit).",
                   "volatile"),
    _by_error_type("gpu_monitor_gpu_ecc_aggregate_errors_total",
                   "ECC errors over the GPU's life (NVML aggregate counters, kept in the InfoROM "
                   "across reboots), by type: corrected, uncorrected.", "aggregate"),
    CheckMetric("gpu_monitor_gpu_row_remap_pending", "gauge", ("gpu", "uuid"),
                "1 while a row remap is pending (applied at the next GPU reset), else 0.",
                details=("uuid", "remap_pending"), samples=gpu_value("remap_pending")),
    CheckMetric("gpu_monitor_gpu_row_remap_failure", "gauge", ("gpu", "uuid"),
                "1 if a row remap failed (the memory can no longer be repaired), else 0.",
                details=("uuid", "remap_failure"), samples=gpu_value("remap_failure")),
    _by_error_type("gpu_monitor_gpu_remapped_rows_total",
                   "Memory rows remapped over the GPU's life, by the error type that caused the "
                   "remap: corrected, uncorrected.", "remapped_rows"),
    CheckMetric("gpu_monitor_gpu_row_remap_banks", "gauge", ("gpu", "uuid", "level"),
                "Memory banks per row-remapper availability level (spare rows left: max, high, "
                "partial, low, none; NVML's row-remapper histogram).",
                details=("uuid", "remap_histogram"),
                samples=gpu_values({lv: lv for lv in REMAP_LEVELS}, nested="remap_histogram")),
)


@dataclass
class _Gpu(TargetFindings):
    """Findings for one GPU while it is being examined."""

    not_supported: list[str] = field(default_factory=list)
    supported: int = 0


class EccMemory(BuiltinCheck):
    kinds = frozenset({Kind.BOOTSTRAP, Kind.PASSIVE})
    summary = "ECC mode and errors, row-remap pending/failure and remap headroom, retired pages"
    requires = frozenset({"nvml"})
    interval = 300.0
    reasons = (
        "EccDisabled",
        "EccUncorrectable",
        "EccCorrectedHigh",
        "RowRemapPending",
        "RowRemapFailure",
        "RemapHeadroomLow",
        "RemapHeadroomExhausted",
        "RetiredPagesLimit",
        "RetiredPagesPending",
        "NotSupported",
        "NvmlReadError",
    )
    settings = SETTINGS
    settings_note = ("Pending or failed row remaps and any volatile uncorrectable ECC error fail "
                     "without a setting.")
    condition = "GPUMemoryError"
    metrics = METRICS

    def __init__(self) -> None:
        self._clear = ClearTracker(self.name)

    def poll(self, ctx: Context) -> Sequence[Result]:
        try:
            gpus = ctx.host.nvml.gpus()
        except NvmlError as exc:
            return [enumeration_error(self, ctx, exc)]
        limits = {k: int(ctx.setting(self.name, k)) for k in SETTINGS}
        return self._clear.track(ctx, [self._gpu(ctx, g, limits) for g in gpus])

    # --- one GPU -------------------------------------------------------------------------------

    def _gpu(self, ctx: Context, gpu: GpuInfo, limits: dict[str, int]) -> Result:
        target = gpu_target(gpu.index)
        base = {"uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id}
        if gpu.lost:
            why = str(gpu.error) if gpu.error else "GPU is lost"
            return self.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                               f"{target} cannot be read: {why}", {**base, "nvml_error": why})
        unread = unidentified(self, ctx, gpu, base, "ECC and memory repair state")
        if unread is not None:
            return unread
        st = _Gpu(details=dict(base))
        nvml = ctx.host.nvml
        self._read(st, "ecc", lambda: nvml.ecc(gpu.index), lambda v: self._ecc(st, v, limits))
        self._read(st, "row_remap", lambda: nvml.remapped_rows(gpu.index),
                   lambda v: self._remap(st, v))
        self._read(st, "remap_histogram", lambda: nvml.remap_histogram(gpu.index),
                   lambda v: self._headroom(st, v, limits))
        if "row_remap" in st.not_supported:  # pre-Ampere: page retirement instead
            self._read(st, "retired_pages", lambda: nvml.retired_pages(gpu.index),
                       lambda v: self._retired(st, v, limits))
        return self._verdict(ctx, target, st, limits)

    @staticmethod
    def _read(st: _Gpu, feature: str, read: Callable[[], Any],
              judge: Callable[[Any], None]) -> None:
        """Read one feature and judge it; an absent feature is noted, an error collected."""
        try:
            value = read()
        except NvmlError as exc:
            if exc.kind in _ABSENT:
                st.not_supported.append(feature)
            else:
                st.errors.append(str(exc))
            return
        st.supported += 1
        judge(value)

    def _ecc(self, st: _Gpu, ecc: Any, limits: dict[str, int]) -> None:
        st.details.update({
            "ecc_enabled": ecc.enabled, "ecc_pending_enabled": ecc.pending_enabled,
            "volatile_uncorrected": ecc.volatile_uncorrected,
            "volatile_corrected": ecc.volatile_corrected,
            "aggregate_uncorrected": ecc.aggregate_uncorrected,
            "aggregate_corrected": ecc.aggregate_corrected,
        })
        if not ecc.enabled:
            after = " (enabled after the next reboot)" if ecc.pending_enabled else ""
            st.add(Status.FAILED, "EccDisabled", f"ECC is disabled{after}",
                   Action.REBOOT if ecc.pending_enabled else Action.NONE)
            return
        if (ecc.volatile_uncorrected or 0) > 0:
            st.add(Status.FAILED, "EccUncorrectable",
                   f"{ecc.volatile_uncorrected} uncorrectable ECC error(s) since the last reset",
                   Action.RESET_GPU)
        counts = [c for c in (ecc.volatile_corrected, ecc.aggregate_corrected) if c is not None]
        corrected = max(counts) if counts else None
        st.details["corrected_total"] = corrected
        st.details["corrected_total_degraded"] = limits["corrected_total_degraded"]
        st.details["corrected_total_failed"] = limits["corrected_total_failed"]
        if corrected is None:
            return
        if corrected > limits["corrected_total_failed"]:
            st.add(Status.FAILED, "EccCorrectedHigh",
                   f"{corrected} corrected ECC errors (> {limits['corrected_total_failed']})",
                   Action.REPLACE)
        elif corrected > limits["corrected_total_degraded"]:
            st.add(Status.DEGRADED, "EccCorrectedHigh",
                   f"{corrected} corrected ECC errors (> {limits['corrected_total_degraded']})",
                   Action.WATCH)

    def _remap(self, st: _Gpu, remap: Any) -> None:
        st.details.update({"remap_pending": remap.pending, "remap_failure": remap.failure,
                           "remapped_rows_corrected": remap.corrected,
                           "remapped_rows_uncorrected": remap.uncorrected})
        if remap.failure:
            st.add(Status.FAILED, "RowRemapFailure",
                   "a row remap failed: the GPU's memory can no longer be repaired",
                   Action.REPLACE)
        if remap.pending:
            st.add(Status.FAILED, "RowRemapPending",
                   "a row remap is pending: reset the GPU to apply it", Action.RESET_GPU)

    def _headroom(self, st: _Gpu, h: Any, limits: dict[str, int]) -> None:
        st.details["remap_histogram"] = {"max": h.max, "high": h.high, "partial": h.partial,
                                         "low": h.low, "none": h.none}
        for key in ("remap_low_banks_degraded", "remap_low_banks_failed",
                    "remap_none_banks_degraded", "remap_none_banks_failed"):
            st.details[key] = limits[key]
        banks = f"{h.none} bank(s) with no spare row, {h.low} with few"
        if h.none >= limits["remap_none_banks_failed"] or h.low > limits["remap_low_banks_failed"]:
            st.add(Status.FAILED, "RemapHeadroomExhausted",
                   f"row-remap headroom exhausted: {banks}", Action.REPLACE)
        elif (h.none >= limits["remap_none_banks_degraded"]
              or h.low > limits["remap_low_banks_degraded"]):
            st.add(Status.DEGRADED, "RemapHeadroomLow", f"row-remap headroom low: {banks}",
                   Action.WATCH)

    def _retired(self, st: _Gpu, pages: Any, limits: dict[str, int]) -> None:
        total = pages.single_bit + pages.double_bit
        st.details.update({"retired_pages_single_bit": pages.single_bit,
                           "retired_pages_double_bit": pages.double_bit,
                           "retired_pages_pending": pages.pending,
                           "retired_pages_limit": limits["retired_pages_limit"]})
        if total > limits["retired_pages_limit"]:
            st.add(Status.FAILED, "RetiredPagesLimit",
                   f"{total} retired pages (> {limits['retired_pages_limit']})", Action.REPLACE)
        if pages.pending:
            st.add(Status.FAILED, "RetiredPagesPending",
                   "a page retirement is pending: reboot to apply it", Action.REBOOT)

    # --- verdict -------------------------------------------------------------------------------

    def _verdict(self, ctx: Context, target: str, st: _Gpu, limits: dict[str, int]) -> Result:
        details = {**st.details, "not_supported": st.not_supported}
        if st.errors:
            details["nvml_errors"] = st.errors
        worst = st.worst_into(details)
        if worst is not None and worst[0] is Status.FAILED:
            action = max((p[3] for p in st.problems), key=ACTION_SEVERITY.__getitem__)
            return self.result(ctx, Status.FAILED, target, worst[1], _message(target, st),
                               details, action)
        if st.errors:
            return self.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                               f"{target}: NVML read failed: {'; '.join(st.errors)}", details)
        if worst is not None:
            return self.result(ctx, worst[0], target, worst[1], _message(target, st), details,
                               worst[3])
        if not st.supported:
            return self.result(ctx, Status.SKIPPED, target, "NotSupported",
                               f"{target} supports none of ECC, row remapping, page retirement",
                               details)
        return self.ok(ctx, target, "ECC and memory repair state healthy", details)


def _message(target: str, st: _Gpu) -> str:
    return f"{target}: " + "; ".join(m for _, _, m, _ in st.problems)
