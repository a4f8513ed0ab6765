"""throttle: how much of the last window HW slowdown held each GPU's clocks down.

Why a window: a HW slowdown bit seen once is a moment, not a fault; a GPU that spends minutes of
every ten at half clock or less slows every job on the node. SW power cap, SW thermal slowdown,
idle, application clocks, sync boost, display clocks and the legacy board-limit / reliability
bits are normal operation: they are reported (``active_events``), never judged.

Evidence per fault event (docs/checks-notes/throttle.md has the sources):

- ``hw_slowdown`` (0x8) and ``hw_power_brake`` (0x80): sampled clock-event bitmasks. No
  ``nvmlDeviceGetViolationStatus`` perf policy isolates them; the *power* policy is the SW power
  cap's counter (nvml.h aliases ``NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP`` to it), board
  limit and reliability are other limiters.
- ``hw_thermal_slowdown`` (0x40): the sampled bit, refined by the *thermal* policy's cumulative
  violation time. That counter also counts SW thermal slowdown, so it only measures how long an
  interval in which the HW bit was seen was really held down; it never erases sampled evidence
  (a counter that did not grow or went backwards leaves the sampled estimate).

Guarantees:

1. Each poll adds one sample per GPU (``ctx.clock`` time, bitmask, thermal counter) to the
   store's key/value table (``throttle/samples``), so a restart keeps the window.
2. Between consecutive samples ``a``, ``b`` at most ``max(3 * interval, 60 s)`` apart an event is
   credited ``(b - a) * (bits seen at a and b) / 2``; a longer gap was not observed and credits
   nothing. Credit is clipped to ``[now - window_s, now]``.
3. ``active_fraction = credited seconds / window_s``; unobserved time counts as not throttled.
   Degraded at or above ``degraded_fraction``, failed at or above ``failed_fraction``.
4. No sample in the window (a one-shot run, the first poll): the instantaneous sample is judged,
   an active HW event is ``degraded`` (one sample cannot show "sustained"); until the window is
   fully observed an event active now keeps at least ``degraded``. ``details["window"]`` says
   which: ``instantaneous``, ``partial`` or ``sliding``.
5. History is per GPU index and restarts when the GPU's UUID changes.
6. NVML errors (checks/_gpus.py): a GPU that is lost or cannot be identified, or whose clock
   event reasons cannot be read, is ``unknown`` (``skipped`` when the driver has no such call).
   A thermal violation counter the driver lacks (NotSupported / FunctionNotFound) leaves the
   sampled bits alone; one that fails otherwise leaves the GPU ``unknown`` naming the call,
   unless the sampled bits already fail it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from checks._gpus import ABSENT, error_details, read_error, unidentified
from checks._nvml_poll import NvmlPollCheck
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw.nvml import GpuInfo, NvmlError, NvmlErrorKind
from gpu_monitor.metric_families import (
    CheckMetric,
    LatestResult,
    MetricsHistory,
    Sample,
    gpu_labels,
    gpu_values,
)
from gpu_monitor.model import STATUS_SEVERITY, Action, Result, Status, gpu_target
from gpu_monitor.profiles.schema import SECONDS, Num

#: nvmlClocksEventReason* bits by the name used in details and as the metrics ``event`` label.
EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake": 0x80,
    "display_clock_setting": 0x100,
    "board_limit": 0x200,  # legacy nvmlClocksThrottleReason* bits
    "reliability": 0x400,
}
#: The events that are hardware faults, and their reasons.
FAULT_EVENTS: dict[str, str] = {
    "hw_slowdown": "HwSlowdown",
    "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake": "HwPowerBrake",
}
#: The event the stored violation counter (sample field 2, NVML perf policy "thermal") refines.
COUNTER_EVENT = "hw_thermal_slowdown"
# Equal severity names the specific cause before the umbrella HW slowdown bit it comes with.
_SPECIFIC_FIRST = ("hw_thermal_slowdown", "hw_power_brake", "hw_slowdown")
_MAX_SAMPLES = 2000  # per GPU; bounds the stored history however short the poll interval
#: The ``event`` label of ``gpu_monitor_gpu_clock_event_active``: every current NVML clock event
#: reason (the legacy board-limit / reliability bits are not exported).
CLOCK_EVENTS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake", "sw_power_cap",
                "sw_thermal_slowdown", "gpu_idle", "applications_clocks_setting",
                "sync_boost", "display_clock_setting")


def window_credit(samples: Sequence[Sequence[Any]], start: float, max_gap_s: float
                  ) -> tuple[dict[str, float], float]:
    """Seconds each fault event was active within ``[start, last sample]``, and seconds
    observed. ``samples``: ``[time_s, bitmask, thermal_violation_ns | None]`` in time order."""
    credit = dict.fromkeys(FAULT_EVENTS, 0.0)
    observed = 0.0
    for a, b in zip(samples, samples[1:], strict=False):
        length = b[0] - a[0]
        if length <= 0 or length > max_gap_s or b[0] <= start:
            continue
        share = (b[0] - max(a[0], start)) / length
        observed += length * share
        for event in FAULT_EVENTS:
            bit = EVENT_BITS[event]
            seen = bool(a[1] & bit) + bool(b[1] & bit)
            if not seen:
                continue
            part = length * seen / 2
            if event == COUNTER_EVENT and a[2] is not None and b[2] is not None:
                grown_s = (b[2] - a[2]) / 1e9
                if grown_s > 0:
                    part = min(length, grown_s)
            credit[event] += part * share
    return credit, observed


def clock_event_samples(results: Sequence[LatestResult], history: MetricsHistory
                        ) -> Iterable[Sample]:
    """1 per clock event reason active on each GPU at its last poll, 0 for the others."""
    for r in results:
        labels = gpu_labels(r)
        if labels is None or "active_events" not in r.details:
            continue
        active = set(r.details.get("active_events") or ())
        for event in CLOCK_EVENTS:
            yield (*labels, event), 1.0 if event in active else 0.0


class Throttle(NvmlPollCheck):
    summary = ("Fraction of a sliding window each GPU spent in HW slowdown, HW thermal slowdown "
               "or HW power brake (SW power cap and idle are never faults)")
    reasons = ("HwSlowdown", "HwThermalSlowdown", "HwPowerBrake", "NvmlReadError", "GpuLost",
               "NotSupported", "NoGpu")
    settings = {
        "window_s": Setting(SECONDS, 600, "s", "GPUd hw-slowdown window (10 min)"),
        "degraded_fraction": Setting(
            Num(0, 1, lo_open=True), 0.05,
            "fraction of the window with HW slowdown/thermal/power brake active",
            "project (GPUd: ≥ 0.6 events/min)", at_most="failed_fraction"),
        "failed_fraction": Setting(Num(0, 1, lo_open=True), 0.25, "fraction", "project"),
    }
    condition = "GPUThermalProblem"
    metrics = (CheckMetric("gpu_monitor_gpu_clock_event_active", "gauge",
                           ("gpu", "uuid", "event"),
                           "1 while the NVML clock event reason is active on the GPU.",
                           details=("uuid", "active_events"), samples=clock_event_samples),
               CheckMetric("gpu_monitor_gpu_clock_event_active_ratio", "gauge",
                           ("gpu", "uuid", "event"),
                           "Fraction of the throttle check's window (window_s, 600 s by default) "
                           "each HW clock event reason held the GPU's clocks down: what the "
                           "check judges; time not yet observed counts as not throttled. No sample "
                           "before the window has any history.",
                           details=("uuid", "active_fraction"),
                           samples=gpu_values({e: e for e in FAULT_EVENTS},
                                              nested="active_fraction")),)

    def __init__(self) -> None:
        super().__init__()
        self._hist: dict[str, dict[str, Any]] | None = None

    def judge_gpus(self, ctx: Context, gpus: list[GpuInfo]) -> list[Result]:
        hist = self._load(ctx)
        results = [self._judge(ctx, gpu, hist) for gpu in gpus]
        if ctx.store is not None:
            try:
                ctx.store.set_kv(self.name, "samples", hist)
            except Exception as exc:  # noqa: BLE001 - the window is best effort, judging is not
                ctx.log.warning("throttle: cannot persist samples: %s", exc)
        return results

    # --- one GPU ---------------------------------------------------------------------------

    def _judge(self, ctx: Context, gpu: GpuInfo, hist: dict[str, dict[str, Any]]) -> Result:
        """One GPU: read its clock events, add the sample to its window, judge the window."""
        target = gpu_target(gpu.index)
        base: dict[str, Any] = {"uuid": gpu.uuid}
        unread = unidentified(self, ctx, gpu, base, "clock events")
        if unread is not None:
            return unread
        read = self._read(ctx, gpu, target, base)
        if isinstance(read, Result):
            return read
        mask, thermal_ns, counter_error = read
        window = float(ctx.setting(self.name, "window_s"))
        deg = float(ctx.setting(self.name, "degraded_fraction"))
        fail = float(ctx.setting(self.name, "failed_fraction"))
        interval = float(ctx.setting(self.name, "interval_s", self.interval) or self.interval)
        max_gap = max(3 * interval, 60.0)
        credit, observed = _add_sample(ctx, gpu, hist, [mask, thermal_ns], window, max_gap)
        mode = ("instantaneous" if observed <= 0
                else "partial" if observed < window - max_gap else "sliding")
        status, event = _worst_event(mask, credit, mode, window, deg, fail)
        active = [name for name, bit in EVENT_BITS.items() if mask & bit]
        details = {
            **base,
            "active_events": active,
            "clock_event_reasons": mask,
            "active_fraction": {e: None if mode == "instantaneous"
                                else round(credit[e] / window, 4) for e in FAULT_EVENTS},
            "active_s": {e: round(credit[e], 3) for e in FAULT_EVENTS},
            "fraction_source": {e: "violation_counter" if e == COUNTER_EVENT and thermal_ns
                                is not None else "sampled_bitmask" for e in FAULT_EVENTS},
            "window": mode,
            "window_s": window,
            "observed_s": round(observed, 3),
            "degraded_fraction": deg,
            "failed_fraction": fail,
        }
        unknown_bits = mask & ~sum(EVENT_BITS.values())
        if unknown_bits:
            details["unknown_event_bits"] = hex(unknown_bits)
        if counter_error is not None and status is not Status.FAILED:
            return self.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                               f"cannot read the thermal violation time of {target}: "
                               f"{counter_error}", {**details, **error_details(counter_error)})
        if status is Status.OK:
            others = [e for e in active if e not in FAULT_EVENTS]
            note = f"; not faults: {', '.join(others)}" if others else ""
            return self.ok(ctx, target, f"no HW slowdown over {_span(mode, observed)}{note}",
                           details)
        return self._finding(ctx, target, status, event, credit[event], observed, details)

    def _read(self, ctx: Context, gpu: GpuInfo, target: str, base: dict[str, Any]
              ) -> Result | tuple[int, int | None, NvmlError | None]:
        """The clock event bitmask and the thermal violation counter (None: not read, and the
        error when that is not the driver lacking it); a Result when the GPU cannot be judged.
        A counter error other than a lost GPU is noted in ``base``."""
        nvml = ctx.host.nvml
        try:
            mask = nvml.clock_event_reasons(gpu.index)
        except NvmlError as err:
            return read_error(self, ctx, target, base, err, "clock event reasons")
        thermal_ns: int | None = None
        counter_error: NvmlError | None = None
        try:
            thermal_ns = nvml.violation_ns(gpu.index, "thermal").violation_ns
        except NvmlError as err:
            if err.kind is NvmlErrorKind.GPU_LOST:
                return read_error(self, ctx, target, base, err, "violation time")
            base["violation_counter_error"] = str(err)
            if err.kind not in ABSENT:
                counter_error = err
        return mask, thermal_ns, counter_error

    def _finding(self, ctx: Context, target: str, status: Status, event: str, credit_s: float,
                 observed: float, details: dict[str, Any]) -> Result:
        """The GPU's degraded or failed result for its worst fault event."""
        mode, window = details["window"], details["window_s"]
        deg, fail = details["degraded_fraction"], details["failed_fraction"]
        if mode == "instantaneous":
            message = (f"{event} active now on {target} (instantaneous sample, no history: a "
                       "window is needed to tell a blip from a sustained slowdown)")
        else:
            message = (f"{event} active {credit_s:.0f} s of the last {window:.0f} s on "
                       f"{target} ({credit_s / window:.1%}; degraded at {deg:.0%}, failed "
                       f"at {fail:.0%}; {mode} window, {observed:.0f} s observed)")
        action = Action.REPLACE if status is Status.FAILED else Action.WATCH
        return self.result(ctx, status, target, FAULT_EVENTS[event], message, details, action)

    def _load(self, ctx: Context) -> dict[str, dict[str, Any]]:
        if self._hist is None:
            stored: Any = None
            if ctx.store is not None:
                try:
                    stored = ctx.store.get_kv(self.name, "samples")
                except Exception as exc:  # noqa: BLE001 - start a fresh window instead
                    ctx.log.warning("throttle: cannot load samples: %s", exc)
            self._hist = {}
            for key, entry in (stored or {}).items() if isinstance(stored, dict) else ():
                samples = entry.get("samples") if isinstance(entry, dict) else None
                good = [list(s) for s in samples or () if _valid_sample(s)]
                self._hist[str(key)] = {"uuid": entry.get("uuid") if good else None,
                                        "samples": sorted(good, key=lambda s: s[0])}
        return self._hist


def _add_sample(ctx: Context, gpu: GpuInfo, hist: dict[str, dict[str, Any]],
                reading: list[Any], window: float, max_gap: float
                ) -> tuple[dict[str, float], float]:
    """Append ``[now, *reading]`` to the GPU's window (a new UUID starts a new one), drop what
    fell out of it, and credit each fault event over it (``window_credit``)."""
    now = ctx.clock.now().timestamp()
    entry = hist.get(str(gpu.index))
    if entry is None or entry.get("uuid") != gpu.uuid:
        entry = {"uuid": gpu.uuid, "samples": []}
    # A sample from the future (the clock stepped back) cannot bound an interval.
    samples = [s for s in entry["samples"] if s[0] < now]
    samples.append([round(now, 3), *reading])
    older = [i for i, s in enumerate(samples) if s[0] < now - window]
    samples = samples[older[-1]:] if older else samples
    entry["samples"] = samples[-_MAX_SAMPLES:]
    hist[str(gpu.index)] = entry
    return window_credit(entry["samples"], now - window, max_gap)


def _worst_event(mask: int, credit: dict[str, float], mode: str, window: float, deg: float,
                 fail: float) -> tuple[Status, str]:
    """Each fault event's status from its share of the window (an event active now keeps at
    least ``degraded`` until the window is fully observed); the worst, the specific first."""
    findings: list[tuple[Status, str]] = []
    for event in FAULT_EVENTS:
        active_now = bool(mask & EVENT_BITS[event])
        fraction = credit[event] / window
        status = (Status.FAILED if fraction >= fail and mode != "instantaneous"
                  else Status.DEGRADED if fraction >= deg and mode != "instantaneous"
                  else Status.OK)
        if status is Status.OK and active_now and mode != "sliding":
            status = Status.DEGRADED
        findings.append((status, event))
    return max(findings, key=lambda f: (STATUS_SEVERITY[f[0]], -_SPECIFIC_FIRST.index(f[1])))


def _valid_sample(s: Any) -> bool:
    return (isinstance(s, (list, tuple)) and len(s) == 3
            and isinstance(s[0], (int, float)) and isinstance(s[1], int)
            and (s[2] is None or isinstance(s[2], int)))


def _span(mode: str, observed: float) -> str:
    return "the instantaneous sample" if mode == "instantaneous" else f"{observed:.0f} s observed"
