"""temperature: GPU core and HBM temperatures against NVML's limits, each other and the peers.

NVML's own thresholds are the hard limits (a GPU at its slowdown temperature is already losing
clocks; HBM at its max operating temperature is outside its rating): ``failed``. The soft
signals are a cooling problem on one GPU before it reaches them: ``degraded`` when core and HBM
are far apart (``gradient_limit_celsius``), or when a GPU runs far hotter than the median of its
peers (``peer_deviation_celsius``). docs/checks-notes/temperature.md has the sources.

Guarantees:

1. Failed: core >= the NVML slowdown threshold (``TempAboveSlowdown``; the profile's
   ``gpu.slowdown_temp_celsius`` when NVML reports none, or reports <= 0 as H100 T.Limit parts
   may); HBM >= NVML's memory max threshold (``MemTempAboveMax``).
2. Degraded: ``|HBM - core| > gradient_limit_celsius`` (``TempGradient``); a GPU hotter than the
   median of its comparable peers by ``peer_deviation_celsius`` or more (``TempOutlier``).
   Comparable peers draw at least ``LOAD_MATCH`` of this GPU's power, so a busy GPU is not
   called hot beside idle ones; colder than the peers is never a fault; fewer than
   ``MIN_PEERS`` comparable peers: not judged (said in details).
3. HBM temperature unsupported (GDDR boards): the core alone is judged, and the message says so.
4. An NVML error gives that GPU ``unknown`` (``GpuLost`` / ``NvmlReadError``, the call and kind
   in details), ``skipped`` (``NotSupported``) when the core temperature is not supported; so
   does a GPU NVML cannot identify (checks/_gpus.py). A power draw that cannot be read
   (NotSupported aside) leaves the GPU ``unknown`` unless a hard limit already failed it. A GPU
   that cannot be fully read is nobody's peer.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from checks._gpus import ABSENT, error_details, read_error, unidentified
from checks._nvml_poll import NvmlPollCheck
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw.nvml import GpuInfo, NvmlError, NvmlErrorKind, Temperatures
from gpu_monitor.metric_families import (
    CheckMetric,
    LatestResult,
    MetricsHistory,
    Sample,
    gpu_labels,
)
from gpu_monitor.model import STATUS_SEVERITY, Action, Result, Status, gpu_target
from gpu_monitor.profiles.schema import POSITIVE

LOAD_MATCH = 0.8  # a comparable peer draws >= 80% of this GPU's power
MIN_PEERS = 2  # a median of fewer peers says nothing about "the others"


@dataclass(frozen=True)
class _Reading:
    gpu: GpuInfo
    temps: Temperatures
    power_w: float | None
    power_error: NvmlError | None = None


def temperature_samples(results: Sequence[LatestResult], history: MetricsHistory
                        ) -> Iterable[Sample]:
    """Each GPU's core and HBM temperature at its last poll (a sensor not read: no series)."""
    for r in results:
        labels = gpu_labels(r)
        if labels is None:
            continue
        for sensor, key in (("core", "core_celsius"), ("memory", "memory_celsius")):
            value = r.details.get(key)
            if isinstance(value, (int, float)):
                yield (*labels, sensor), float(value)


class Temperature(NvmlPollCheck):
    summary = ("GPU core and HBM temperature vs NVML's slowdown / memory max thresholds, the "
               "core-HBM gradient and the node's other GPUs")
    reasons = ("TempAboveSlowdown", "MemTempAboveMax", "TempGradient", "TempOutlier",
               "NvmlReadError", "GpuLost", "NotSupported", "NoGpu")
    sections = ("gpu",)
    settings = {
        "gradient_limit_celsius": Setting(POSITIVE, 20, "°C between HBM and GPU core", "project"),
        "peer_deviation_celsius": Setting(POSITIVE, 20, "°C from the median of the node's GPUs",
                                          "project"),
    }
    settings_note = "Above the NVML slowdown/shutdown thresholds is `failed` without a setting."
    condition = "GPUThermalProblem"
    metrics = (CheckMetric("gpu_monitor_gpu_temperature_celsius", "gauge",
                           ("gpu", "uuid", "sensor"),
                           "GPU temperature per sensor (core, memory).",
                           details=("uuid", "core_celsius", "memory_celsius"),
                           samples=temperature_samples),)

    def judge_gpus(self, ctx: Context, gpus: list[GpuInfo]) -> list[Result]:
        nvml = ctx.host.nvml
        results: dict[int, Result] = {}
        readings: dict[int, _Reading] = {}
        for gpu in gpus:
            target = gpu_target(gpu.index)
            unread = unidentified(self, ctx, gpu, {"uuid": gpu.uuid}, "temperatures")
            if unread is not None:
                results[gpu.index] = unread
                continue
            try:
                temps = nvml.temperatures(gpu.index)
            except NvmlError as err:
                results[gpu.index] = read_error(self, ctx, target, {"uuid": gpu.uuid}, err,
                                                "temperatures")
                continue
            power_w: float | None = None  # unsupported: the peer comparison ignores load
            power_error: NvmlError | None = None
            try:
                power_w = nvml.power(gpu.index).usage_mw / 1000
            except NvmlError as err:
                if err.kind is NvmlErrorKind.GPU_LOST:
                    results[gpu.index] = read_error(self, ctx, target, {"uuid": gpu.uuid}, err,
                                                    "power draw")
                    continue
                if err.kind not in ABSENT:
                    power_error = err
            readings[gpu.index] = _Reading(gpu, temps, power_w, power_error)
        peers = {i: r for i, r in readings.items() if r.power_error is None}
        for index, reading in readings.items():
            results[index] = self._judge(ctx, reading, [r for i, r in peers.items()
                                                        if i != index])
        return [results[g.index] for g in gpus]

    def _judge(self, ctx: Context, r: _Reading, peers: list[_Reading]) -> Result:
        t = r.temps
        target = gpu_target(r.gpu.index)
        gradient_limit = float(ctx.setting(self.name, "gradient_limit_celsius"))
        deviation_limit = float(ctx.setting(self.name, "peer_deviation_celsius"))
        slowdown, source = _positive(t.slowdown_c), "nvml"
        if slowdown is None:
            slowdown = _positive(ctx.setting(self.name, "slowdown_temp_celsius"))
            source = "profile" if slowdown is not None else None
        mem_max = _positive(t.memory_max_c)
        details: dict[str, Any] = {
            "uuid": r.gpu.uuid, "core_celsius": t.core_c, "memory_celsius": t.memory_c,
            "slowdown_celsius": slowdown, "slowdown_source": source,
            "shutdown_celsius": _positive(t.shutdown_c), "memory_max_celsius": mem_max,
            "gradient_limit_celsius": gradient_limit, "peer_deviation_celsius": deviation_limit,
            "memory_supported": t.memory_c is not None, "power_w": r.power_w,
        }
        found: list[tuple[Status, str, str]] = []
        if slowdown is not None and t.core_c >= slowdown:
            found.append((Status.FAILED, "TempAboveSlowdown",
                          f"core {t.core_c} C >= slowdown threshold {slowdown} C ({source})"))
        if t.memory_c is not None and mem_max is not None and t.memory_c >= mem_max:
            found.append((Status.FAILED, "MemTempAboveMax",
                          f"HBM {t.memory_c} C >= memory max threshold {mem_max} C"))
        if t.memory_c is not None:
            gradient = t.memory_c - t.core_c
            details["gradient_celsius"] = gradient
            if abs(gradient) > gradient_limit:
                found.append((Status.DEGRADED, "TempGradient",
                              f"HBM {t.memory_c} C vs core {t.core_c} C: |{gradient}| C > "
                              f"{gradient_limit:g} C"))
        for sensor, value in (("core", t.core_c), ("memory", t.memory_c)):
            if value is None:
                continue
            median, n = _peer_median(r, peers, sensor)
            details[f"peer_median_{sensor}_celsius"] = median
            details[f"comparable_peers_{sensor}"] = n
            if median is not None:
                details[f"{sensor}_above_peers_celsius"] = round(value - median, 1)
                if value - median >= deviation_limit:
                    found.append((Status.DEGRADED, "TempOutlier",
                                  f"{sensor} {value} C is {value - median:g} C above the median "
                                  f"of {n} comparable peers ({median:g} C; limit "
                                  f"{deviation_limit:g} C)"))
        details["findings"] = list(dict.fromkeys(reason for _, reason, _ in found))
        note = "" if t.memory_c is not None else " (HBM temperature unsupported: core only)"
        failed = any(status is Status.FAILED for status, _, _ in found)
        if r.power_error is not None and not failed:
            return self.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                               f"cannot read the power draw of {target} (peer comparison needs "
                               f"it): {r.power_error}",
                               {**details, **error_details(r.power_error)})
        if r.power_error is not None:
            details.update(error_details(r.power_error))
        if not found:
            mem = f", HBM {t.memory_c} C" if t.memory_c is not None else ""
            return self.ok(ctx, target, f"core {t.core_c} C{mem}{note}", details)
        status, reason, message = max(found, key=lambda f: STATUS_SEVERITY[f[0]])
        action = Action.NONE if status is Status.FAILED else Action.WATCH
        others = [m for _, _, m in found if m != message]
        more = f" (also: {'; '.join(others)})" if others else ""
        return self.result(ctx, status, target, reason, f"{target}: {message}{more}{note}",
                           details, action)


def _positive(value: Any) -> float | int | None:
    """A threshold NVML reports as 0 or below (H100 T.Limit-style parts) is no threshold."""
    return value if isinstance(value, (int, float)) and value > 0 else None


def _peer_median(r: _Reading, peers: list[_Reading], sensor: str) -> tuple[float | None, int]:
    attr = "core_c" if sensor == "core" else "memory_c"
    usable = [p for p in peers if getattr(p.temps, attr) is not None]
    if r.power_w is not None and all(p.power_w is not None for p in usable):
        usable = [p for p in usable if p.power_w >= LOAD_MATCH * r.power_w]  # type: ignore[operator]
    if len(usable) < MIN_PEERS:
        return None, len(usable)
    return float(statistics.median(getattr(p.temps, attr) for p in usable)), len(usable)
