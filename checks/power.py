"""power: how much of the last window each GPU spent at its enforced power limit.

Why a window: a GPU under load touches its power limit all the time, and that is the limit
doing its job. A GPU that sits at the limit for most of ten minutes is held there: its clocks
are capped (throttle reports the SW power cap as normal operation, never as a fault) and every
synchronous job on the node waits for it. A power limit set too low, a PSU or BMC capping the
board, or a cooling problem that raises the draw at the same clocks all look like this.

Guarantees:

1. Each poll takes one sample per GPU: ``ctx.clock`` time, ``nvmlDeviceGetPowerUsage`` and
   ``nvmlDeviceGetEnforcedPowerLimit`` (both mW, reported in W). A sample is *at the limit*
   when the draw is at least ``AT_LIMIT_RATIO`` (95 %) of the limit.
2. Between consecutive samples ``a``, ``b`` at most ``max(3 * interval, 60 s)`` apart the GPU is
   credited ``(b - a) * (samples of a, b at the limit) / 2`` seconds at the limit; a longer gap
   was not observed and credits nothing. Credit is clipped to ``[now - window_s, now]``.
3. Degraded (``PowerAtLimit``) when the credited time is more than ``at_limit_fraction`` of
   ``window_s``; unobserved time counts as not at the limit, so a one-shot run, the first polls
   and a restarted daemon never claim it (``details["window"]``: ``instantaneous``,
   ``partial``, ``sliding``). Samples live in memory: a restart starts a new window.
4. History is per GPU index and restarts when the GPU's UUID changes.
5. NVML errors (checks/_gpus.py): a GPU that is lost or cannot be identified, or whose draw
   cannot be read, is ``unknown`` naming the call; ``skipped`` (``NotSupported``) where NVML
   has no power reading, or no enforced limit to hold it to (the draw is still exported).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from checks._gpus import read_error, unidentified
from checks._nvml_poll import NvmlPollCheck
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw.nvml import GpuInfo, NvmlError, NvmlErrorKind
from gpu_monitor.metric_families import (
    CheckMetric,
    LatestResult,
    MetricsHistory,
    Sample,
    gpu_labels,
)
from gpu_monitor.model import Action, Kind, Result, Status, gpu_target
from gpu_monitor.profiles.schema import SECONDS, Num

AT_LIMIT_RATIO = 0.95  # a draw this close to the enforced limit is the limit holding the GPU
_MAX_SAMPLES = 2000  # per GPU; bounds the history however short the poll interval


def _watts_samples(key: str) -> Any:
    def samples(results: Sequence[LatestResult], history: MetricsHistory) -> Iterable[Sample]:
        for r in results:
            labels = gpu_labels(r)
            value = r.details.get(key)
            if labels is not None and isinstance(value, (int, float)):
                yield labels, float(value)
    samples.__doc__ = f"Each GPU's ``{key}`` at its last poll (not read: no series)."
    return samples


def at_limit_seconds(samples: Sequence[Sequence[float]], start: float, max_gap_s: float
                     ) -> tuple[float, float]:
    """Seconds at the limit within ``[start, last sample]``, and seconds observed.
    ``samples``: ``[time_s, 1.0 at the limit or 0.0]`` in time order."""
    at_limit = observed = 0.0
    for (t0, a), (t1, b) in zip(samples, samples[1:], strict=False):
        length = t1 - t0
        if length <= 0 or length > max_gap_s or t1 <= start:
            continue
        share = (t1 - max(t0, start)) / length
        observed += length * share
        at_limit += length * (a + b) / 2 * share
    return at_limit, observed


class Power(NvmlPollCheck):
    kinds = frozenset({Kind.PASSIVE})
    summary = ("Fraction of a sliding window each GPU's power draw sat at its enforced power "
               "limit (which caps its clocks)")
    required = False  # passive only: no bootstrap runs it
    reasons = ("PowerAtLimit", "NvmlReadError", "GpuLost", "NotSupported", "NoGpu")
    settings = {
        "window_s": Setting(SECONDS, 600, "s", "project (throttle's window)"),
        "at_limit_fraction": Setting(
            Num(0, 1, lo_open=True), 0.5,
            f"fraction of the window at ≥ {AT_LIMIT_RATIO:.0%} of the enforced power limit",
            "project"),
    }
    settings_note = (f"A draw at ≥ {AT_LIMIT_RATIO:.0%} of NVML's enforced power limit counts "
                     "as at the limit.")
    condition = "GPUThermalProblem"  # throttle's: a capped GPU runs slow, like a throttled one
    metrics = (
        CheckMetric("gpu_monitor_gpu_power_watts", "gauge", ("gpu", "uuid"),
                    "GPU power draw at the last poll, in watts.",
                    details=("uuid", "power_watts"), samples=_watts_samples("power_watts")),
        CheckMetric("gpu_monitor_gpu_power_limit_watts", "gauge", ("gpu", "uuid"),
                    "The GPU's enforced power limit at the last poll, in watts.",
                    details=("uuid", "power_limit_watts"),
                    samples=_watts_samples("power_limit_watts")),
    )

    def __init__(self) -> None:
        super().__init__()
        self._hist: dict[int, dict[str, Any]] = {}

    def judge_gpus(self, ctx: Context, gpus: list[GpuInfo]) -> list[Result]:
        return [self._gpu(ctx, gpu) for gpu in gpus]

    def _gpu(self, ctx: Context, gpu: GpuInfo) -> Result:
        target = gpu_target(gpu.index)
        base: dict[str, Any] = {"uuid": gpu.uuid}
        unread = unidentified(self, ctx, gpu, base, "power draw")
        if unread is not None:
            return unread
        try:
            power = ctx.host.nvml.power(gpu.index)
        except NvmlError as err:
            return read_error(self, ctx, target, base, err, "power draw")
        draw_w = power.usage_mw / 1000
        base["power_watts"] = draw_w
        if power.limit_mw is None or power.limit_mw <= 0:
            return self.result(ctx, Status.SKIPPED, target, "NotSupported",
                               f"NVML reports no enforced power limit for {target} "
                               f"(nvmlDeviceGetEnforcedPowerLimit); draw {draw_w:g} W",
                               {**base, "nvml_call": "nvmlDeviceGetEnforcedPowerLimit",
                                "nvml_error_kind": NvmlErrorKind.NOT_SUPPORTED.value})
        limit_w = power.limit_mw / 1000
        return self._judge(ctx, gpu, {**base, "power_limit_watts": limit_w})

    def _judge(self, ctx: Context, gpu: GpuInfo, base: dict[str, Any]) -> Result:
        target = gpu_target(gpu.index)
        window = float(ctx.setting(self.name, "window_s"))
        fraction_limit = float(ctx.setting(self.name, "at_limit_fraction"))
        max_gap = max(3 * self.interval, 60.0)
        now = ctx.clock.now().timestamp()
        draw_w, limit_w = base["power_watts"], base["power_limit_watts"]
        at_limit_now = draw_w >= AT_LIMIT_RATIO * limit_w
        entry = self._hist.get(gpu.index)
        if entry is None or entry["uuid"] != gpu.uuid:
            entry = self._hist[gpu.index] = {"uuid": gpu.uuid, "samples": []}
        # A sample from the future (the clock stepped back) cannot bound an interval.
        samples = [s for s in entry["samples"] if now - window - max_gap <= s[0] < now]
        samples.append([now, 1.0 if at_limit_now else 0.0])
        entry["samples"] = samples = samples[-_MAX_SAMPLES:]
        at_limit_s, observed = at_limit_seconds(samples, now - window, max_gap)
        mode = ("instantaneous" if observed <= 0
                else "partial" if observed < window - max_gap else "sliding")
        fraction = at_limit_s / window
        details = {
            **base, "at_limit_now": at_limit_now, "at_limit_ratio": AT_LIMIT_RATIO,
            "at_limit_s": round(at_limit_s, 3), "at_limit_fraction": round(fraction, 4),
            "at_limit_fraction_degraded": fraction_limit, "window": mode, "window_s": window,
            "observed_s": round(observed, 3),
        }
        use = f"{draw_w:g} W of {limit_w:g} W"
        if fraction > fraction_limit:
            return self.result(
                ctx, Status.DEGRADED, target, "PowerAtLimit",
                f"{target} drew >= {AT_LIMIT_RATIO:.0%} of its {limit_w:g} W power limit for "
                f"{at_limit_s:.0f} s of the last {window:.0f} s ({fraction:.0%}; degraded above "
                f"{fraction_limit:.0%}; now {use})", details, Action.WATCH)
        return self.ok(ctx, target, f"{use}; at the limit {fraction:.0%} of the window "
                       f"({mode}, {observed:.0f} s observed)", details)
