"""burn_in: sustained matmul on every device, judged for correctness, speed and heat.

A device can be wrong the same way every time: it then agrees with itself, which is all that
self-comparing burn tools (gpu-burn compares each result copy with the first) can see. So every
device multiplies the *same* seeded inputs and the parent compares the results *across devices*
bit for bit (a SHA-256 of the output bytes); the majority result wins and the odd device is
named. Each device also re-checks its own result during the run (intermittent faults) and
compares a small block with an fp64 reference within a per-dtype tolerance (a fault shared by
every device, e.g. a broken library).

Speed: TFLOP/s per device and dtype must reach ``min_fraction_of_peak`` of the profile's peak
(a floor that catches a badly broken device) and stay within ``median_tolerance`` of the node's
median device (one slow GPU slows every synchronous job). While the workers run, the parent
samples NVML: HW slowdown, HW thermal slowdown or power-brake clock events and a core
temperature above ``max_temp_celsius`` fail the device.

Workers (gpu_monitor/workers): one subprocess per device with a hard timeout; with CPU devices
(the simulated node) the devices take turns in rounds and each is judged by its best round, and
a burst is timed by the worker thread's CPU time (``Device.compute_clock``), so load from
elsewhere on the host cannot single one out: under two busy test suites a healthy CPU device's
wall-clock rate once fell below half the node median. ``duration_s`` is the measuring time per
device, split evenly over dtypes (and rounds).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from checks._device import DEVICE_REASONS, DeviceCheck
from checks._gpus import worker_budget
from gpu_monitor.check import Context, Finding, Setting, worst
from gpu_monitor.hw.nvml import NvmlError
from gpu_monitor.model import NODE, Action, Result, Status, gpu_target
from gpu_monitor.profiles.schema import POSITIVE, SECONDS, Int, List, Map, Num
from gpu_monitor.profiles.sections import DTYPE, DTYPES
from gpu_monitor.workers.pool import DeviceRef, Outcome, Task, WorkerPool

SEED = 1234
CLOCK_EVENTS = {0x8: "hw_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake"}
# Which finding a device's one result shows when it has several (most actionable first).
_PRIORITY = ("BurnInMismatch", "BurnInReferenceMismatch", "WorkerDeviceMismatch",
             "WorkerCrashed", "WorkerTimeout", "BurnInSlow", "BurnInThrottled", "BurnInHot",
             "BurnInTelemetryError")


def headline_finding(findings: Sequence[Finding]) -> Finding | None:
    """The finding a device's one result shows (most serious, then burn-in's priority)."""
    return worst(findings, _PRIORITY)


# --- the worker (runs in a subprocess; torch only here) ---------------------------------------


class BurnRun:
    """One dtype's burn on one device: seeded inputs, the timed loop, the self and reference
    checks. The benchmark drives it directly (bench/bench_burn_in.py), so what it measures is
    exactly what the check measures."""

    def __init__(self, dev: Any, n: int, dtype: str, block: int, seed: int = SEED):
        import torch

        self.dev, self.n, self.dtype = dev, n, dtype
        self.block = max(1, min(block, n))
        dt = dev.set_precision(dtype)
        gen = torch.Generator().manual_seed(seed)
        x, y = torch.randn(n, n, generator=gen).to(dt), torch.randn(n, n, generator=gen).to(dt)
        # The fp64 reference uses the inputs as the device holds them (already rounded).
        self.ref = x[: self.block].double() @ y[:, : self.block].double()
        self.ref_scale = max(float(self.ref.abs().max()), 1e-30)
        self.x, self.y = x.to(dev.torch), y.to(dev.torch)
        self.out = torch.empty(n, n, dtype=dt, device=dev.torch)
        dev.matmul(self.x, self.y, self.out)  # warm-up (library init, clocks); untimed
        dev.synchronize()
        self.first = self.out.clone()
        self.batch = 1
        self.rates: list[float] = []
        self.iterations, self.busy_s = 0, 0.0
        self.self_checks = self.self_mismatches = self.reference_checks = 0
        self.reference_error = 0.0

    def turn(self, seconds: float, check_every_s: float) -> float:
        """Multiply for ``seconds``; returns the turn's TFLOP/s (checks are not timed)."""
        dev, x, y, out = self.dev, self.x, self.y, self.out
        dev.set_precision(self.dtype)
        busy, iters = 0.0, 0
        target_batch_s = min(0.05, seconds / 10)
        end = time.perf_counter() + seconds
        next_check = time.perf_counter() + check_every_s
        while True:
            batch = self.batch
            t0 = dev.compute_clock()  # the device's own time: CPU time on a CPU device
            for _ in range(batch):
                dev.matmul(x, y, out)
            t1 = dev.compute_clock()
            dev.account(t1 - t0)
            busy += dev.compute_clock() - t0
            iters += batch
            if t1 - t0 < target_batch_s and batch < 1 << 16:
                self.batch = batch * 2
            wall = time.perf_counter()
            if wall >= end:
                break
            if wall >= next_check:
                self.verify()
                next_check = time.perf_counter() + check_every_s
        self.verify()
        rate = 2.0 * self.n ** 3 * iters / busy / 1e12 if busy > 0 else 0.0
        self.rates.append(rate)
        self.iterations += iters
        self.busy_s += busy
        return rate

    def verify(self) -> None:
        import torch

        self.self_checks += 1
        if not torch.equal(self.out, self.first):
            self.self_mismatches += 1
        got = self.out[: self.block, : self.block].double().cpu()
        err = float((got - self.ref).abs().max()) / self.ref_scale
        self.reference_error = max(self.reference_error, err)
        self.reference_checks += 1

    def summary(self) -> dict[str, Any]:
        from gpu_monitor.sdc.fingerprint import fingerprints
        from gpu_monitor.sdc.fingerprint_fused import eager_here

        # The result's bit pattern, fingerprinted on the device (no host copy of a large
        # matrix, no numpy): three 64-bit sums, one of them through a full-avalanche mixer, so
        # any difference between devices shows. Eager: one call per worker, where compiling
        # the fused form would cost seconds.
        with eager_here():
            row = fingerprints([self.first.contiguous()])[0].tolist()
        digest = "".join(f"{v & 0xFFFFFFFFFFFFFFFF:016x}" for v in row)
        return {"tflops": max(self.rates) if self.rates else 0.0, "tflops_rounds": self.rates,
                "iterations": self.iterations, "busy_s": self.busy_s, "fingerprint": digest,
                "self_checks": self.self_checks, "self_mismatches": self.self_mismatches,
                "reference_error": self.reference_error,
                "reference_checks": self.reference_checks}


def burn_worker(ctx: Any) -> dict[str, Any]:
    """Multiply the seeded inputs on ``ctx.device`` for the measuring time of each turn."""
    a = ctx.args
    dtypes = list(a["dtypes"])
    per_turn = float(a["duration_s"]) / len(dtypes) / ctx.rounds
    runs = {name: BurnRun(ctx.device, int(a["matrix_size"]), name, int(a["reference_block"]),
                          int(a.get("seed", SEED))) for name in dtypes}
    for _turn in ctx.turns():
        for name, run in runs.items():
            ctx.step(f"burn {name}")
            run.turn(per_turn, float(a["reference_interval_s"]))
    return {"dtypes": {name: run.summary() for name, run in runs.items()},
            "device": str(ctx.device.torch)}


# --- telemetry (parent side, while the workers run) --------------------------------------------


@dataclass
class DeviceTelemetry:
    samples: int = 0
    events: set[str] = field(default_factory=set)
    max_core_c: int | None = None
    max_memory_c: int | None = None
    error: str = ""


class Telemetry:
    """Samples clock events and temperatures of the devices under test through NVML."""

    def __init__(self, nvml: Any, indices: Sequence[int]):
        self.nvml = nvml
        self.devices = {i: DeviceTelemetry() for i in indices}

    def sample(self) -> None:
        for index, t in self.devices.items():
            try:
                reasons = int(self.nvml.clock_event_reasons(index))
                temps = self.nvml.temperatures(index)
            except NvmlError as err:
                t.error = t.error or str(err)
                continue
            t.samples += 1
            t.events.update(name for bit, name in CLOCK_EVENTS.items() if reasons & bit)
            t.max_core_c = max(t.max_core_c or temps.core_c, temps.core_c)
            if temps.memory_c is not None:
                t.max_memory_c = max(t.max_memory_c or temps.memory_c, temps.memory_c)


# --- judgement (pure) --------------------------------------------------------------------------


def split_by_hash(hashes: Mapping[int, str]) -> tuple[str | None, list[int]]:
    """(the majority hash, devices that differ from it); no strict majority -> (None, all
    devices that are not unanimous)."""
    if len(set(hashes.values())) <= 1:
        return (next(iter(hashes.values()), None), [])
    counts = Counter(hashes.values())
    top, votes = counts.most_common(1)[0]
    if votes * 2 > len(hashes):
        return top, sorted(i for i, h in hashes.items() if h != top)
    return None, sorted(hashes)


@dataclass(frozen=True)
class Limits:
    min_fraction_of_peak: float
    median_tolerance: float
    warning_band: float
    max_temp_celsius: float | None
    peak_tflops: Mapping[str, float]
    reference_tolerance: Mapping[str, float]


def burn_findings(measured: Mapping[int, Mapping[str, Any]], telemetry: Mapping[int, DeviceTelemetry],
          limits: Limits) -> tuple[dict[int, list[Finding]], list[Finding], dict[str, Any]]:
    """Findings per device index, node findings, and the node's summary numbers."""
    per: dict[int, list[Finding]] = {i: [] for i in measured}
    node: list[Finding] = []
    dtypes = sorted({d for m in measured.values() for d in m.get("dtypes", {})})
    summary: dict[str, Any] = {"median_tflops": {}, "floor_tflops": {}, "required_tflops": {}}
    for dt in dtypes:
        runs = {i: m["dtypes"][dt] for i, m in measured.items() if dt in m.get("dtypes", {})}
        majority, odd = split_by_hash({i: r["fingerprint"] for i, r in runs.items()})
        if majority is not None:
            for i in odd:
                per[i].append(Finding(
                    Status.FAILED, "BurnInMismatch",
                    f"{dt} result differs from the {len(runs) - len(odd)} other devices' "
                    "(same seeded inputs, bit-for-bit comparison): wrong results",
                    Action.REPLACE))
        elif odd:
            names = ", ".join(gpu_target(i) for i in odd)
            node.append(Finding(
                Status.FAILED, "BurnInMismatch",
                f"{dt} results differ between {names} and no majority says which is right",
                Action.REPLACE))
        median = statistics.median(r["tflops"] for r in runs.values())
        peak = limits.peak_tflops.get(dt)
        floor = limits.min_fraction_of_peak * float(peak) if peak else 0.0
        required = max(floor, (1.0 - limits.median_tolerance) * median)
        summary["median_tflops"][dt] = median
        summary["floor_tflops"][dt] = floor
        summary["required_tflops"][dt] = required
        tol = limits.reference_tolerance.get(dt)
        for i, r in runs.items():
            if r.get("self_mismatches"):
                per[i].append(Finding(
                    Status.FAILED, "BurnInMismatch",
                    f"{dt} result changed between iterations ({r['self_mismatches']} of "
                    f"{r['self_checks']} checks): intermittent wrong results", Action.REPLACE))
            if tol is not None and r["reference_error"] > float(tol):
                per[i].append(Finding(
                    Status.FAILED, "BurnInReferenceMismatch",
                    f"{dt} result is off the fp64 reference by {r['reference_error']:.3g} "
                    f"(relative; tolerance {float(tol):g})", Action.REPLACE))
            v = r["tflops"]
            why = (f"below {limits.min_fraction_of_peak:g} x the {dt} peak ({floor:.4g})"
                   if floor >= required else
                   f"below {1 - limits.median_tolerance:g} x the node median ({median:.4g})")
            if v < required:
                per[i].append(Finding(
                    Status.FAILED, "BurnInSlow",
                    f"{dt} at {v:.4g} TFLOP/s is {why}", Action.RESET_GPU))
            elif v < required * (1.0 + limits.warning_band):
                per[i].append(Finding(
                    Status.DEGRADED, "BurnInSlow",
                    f"{dt} at {v:.4g} TFLOP/s is within {limits.warning_band:g} of the "
                    f"required {required:.4g}", Action.WATCH))
    for i, t in telemetry.items():
        findings = per.setdefault(i, [])
        if t.events:
            findings.append(Finding(
                Status.FAILED, "BurnInThrottled",
                f"clock events during the burn: {', '.join(sorted(t.events))}", Action.WATCH))
        if (limits.max_temp_celsius is not None and t.max_core_c is not None
                and t.max_core_c > limits.max_temp_celsius):
            findings.append(Finding(
                Status.FAILED, "BurnInHot",
                f"core temperature reached {t.max_core_c} C (limit "
                f"{limits.max_temp_celsius:g} C)", Action.WATCH))
        if t.error:
            findings.append(Finding(
                Status.UNKNOWN, "BurnInTelemetryError",
                f"cannot watch clocks and temperature during the burn: {t.error}"))
    return per, node, summary


# --- the check ---------------------------------------------------------------------------------


class BurnIn(DeviceCheck):
    summary = ("sustained matmul per device: results compared across devices bit for bit, "
               "TFLOP/s vs peak and node median, no throttling or overheating")
    timeout = 1800.0
    reasons = ("BurnInMismatch", "BurnInReferenceMismatch", "BurnInSlow", "BurnInThrottled",
               "BurnInHot", "BurnInTelemetryError", *DEVICE_REASONS)
    sections = ("gpu",)
    settings = {
        "duration_s": Setting(SECONDS, 60, "s of measuring per device, split over the dtypes",
                              "SPEC-CHECKS"),
        "min_fraction_of_peak": Setting(
            Num(0, 1, lo_open=True), 0.55, "fraction of `gpu.peak_tflops`",
            "project: cuBLAS at 8192² reaches well under the spec-sheet peak, more so on "
            "power-limited H100; the floor catches a GPU at half speed, the median rule catches "
            "the rest"),
        "median_tolerance": Setting(Num(0, 1, hi_open=True), 0.10,
                                    "fraction below the node's median GPU",
                                    "SPEC-CHECKS (\"within X% of the node's median\")"),
        "dtypes": Setting(List(DTYPE, min_len=1), ("bf16", "tf32"),
                          "list of `bf16`, `fp16`, `tf32`, `fp32`, `fp64`", "SPEC-CHECKS"),
        "matrix_size": Setting(Int(16), 8192, "elements per side",
                               "gpu-burn `SIZE`, DCGM diagnostic `matrix_dim`"),
        "max_temp_celsius": Setting(POSITIVE, 85, "°C",
                                    "DCGM stress plugins' fallback limit (85 °C); Meta GCM "
                                    "example 84"),
        "reference_block": Setting(Int(1), 128, "elements per side of the fp64-checked block",
                                   "project"),
        "reference_interval_s": Setting(SECONDS, 10, "s between fp64 reference checks",
                                        "project"),
        "reference_tolerance": Setting(
            Map({d: POSITIVE for d in DTYPES}, doc="a mapping dtype -> tolerance"),
            {"bf16": 0.02, "fp16": 0.01, "tf32": 0.01, "fp32": 1.0e-4, "fp64": 1.0e-9},
            "relative error per dtype",
            "project: bf16 keeps 8 mantissa bits (2^-8 ≈ 0.4%), tf32 10 bits"),
    }
    condition = "GPUDiagnosticsFailed"

    def run(self, ctx: Context) -> Sequence[Result]:
        nvml = ctx.host.nvml
        results, refs = self.devices(ctx, "not burned")
        if refs is None:
            return results
        if not refs:
            return results
        s = _settings(ctx)
        pool = WorkerPool(ctx.host.worker)
        per_turn = s["duration_s"] / pool.rounds
        budget = worker_budget(self, ctx)
        args = {k: s[k] for k in ("matrix_size", "dtypes", "duration_s", "reference_block",
                                  "reference_interval_s")} | {"seed": SEED}
        telemetry = Telemetry(nvml, [r.index for r in refs])
        started = time.monotonic()
        outcomes = pool.run([Task("checks.burn_in:burn_worker", (r,), args) for r in refs],
                            timeout_s=2 * per_turn * len(s["dtypes"]) + 30, budget_s=budget,
                            on_tick=telemetry.sample)
        wall = time.monotonic() - started
        measured = {o.task.devices[0].index: o.value for o in outcomes if o.ok and o.value}
        per, node, summary = burn_findings(measured, telemetry.devices, s["limits"])
        table = {gpu_target(i): {dt: round(r["tflops"], 6) for dt, r in m["dtypes"].items()}
                 for i, m in sorted(measured.items())}
        common = {"median_tflops": summary["median_tflops"],
                  "floor_tflops": summary["floor_tflops"],
                  "required_tflops": summary["required_tflops"],
                  "min_fraction_of_peak": s["limits"].min_fraction_of_peak,
                  "median_tolerance": s["limits"].median_tolerance,
                  "max_temp_celsius": s["limits"].max_temp_celsius}
        for o in outcomes:
            ref = o.task.devices[0]
            results.append(self._device_result(ctx, ref, o, per.get(ref.index, []),
                                               measured.get(ref.index),
                                               telemetry.devices[ref.index], common))
        node_details = {**common, "tflops": table, "devices": len(refs),
                        "duration_s": s["duration_s"], "matrix_size": s["matrix_size"],
                        "dtypes": s["dtypes"], "rounds": pool.rounds,
                        "mode": "sequential" if pool.sequential else "concurrent",
                        "wall_s": round(wall, 2)}
        if len(measured) < 2:
            node_details["note"] = ("fewer than two devices measured: no cross-device "
                                    "comparison, only the fp64 reference")
        top = headline_finding(node)
        if top is not None:
            results.append(self.result(ctx, top.status, NODE, top.reason, top.message,
                                       node_details, top.action))
        else:
            flagged = [r.target for r in results if r.status is not Status.OK]
            results.append(self.ok(ctx, NODE, _summary_text(summary, len(measured), len(refs),
                                                            flagged), node_details))
        return results

    def _device_result(self, ctx: Context, ref: DeviceRef, outcome: Outcome,
                       findings: list[Finding], measured: Mapping[str, Any] | None,
                       tele: DeviceTelemetry, common: Mapping[str, Any]) -> Result:
        target = ref.target
        details: dict[str, Any] = {"uuid": ref.uuid, **common,
                                   "clock_events": sorted(tele.events),
                                   "max_core_c": tele.max_core_c,
                                   "max_memory_c": tele.max_memory_c,
                                   "telemetry_samples": tele.samples}
        if not outcome.ok:
            findings = [*findings, Finding(Status.UNKNOWN, outcome.reason, outcome.message)]
            details.update(outcome.details)
        if measured:
            runs = measured["dtypes"]
            details["tflops"] = {dt: round(r["tflops"], 6) for dt, r in runs.items()}
            details["tflops_rounds"] = {dt: [round(x, 6) for x in r["tflops_rounds"]]
                                        for dt, r in runs.items()}
            details["fingerprint"] = {dt: r["fingerprint"] for dt, r in runs.items()}
            details["reference_error"] = {dt: r["reference_error"] for dt, r in runs.items()}
            details["iterations"] = {dt: r["iterations"] for dt, r in runs.items()}
        top = headline_finding(findings)
        if top is None:
            rates = ", ".join(f"{dt} {v:.4g}" for dt, v in details.get("tflops", {}).items())
            return self.ok(ctx, target, f"{target}: {rates} TFLOP/s, results match", details)
        if len(findings) > 1:
            details["findings"] = [{"status": f.status.value, "reason": f.reason,
                                    "message": f.message} for f in findings]
        return self.result(ctx, top.status, target, top.reason, f"{target}: {top.message}",
                           details, top.action)


def _settings(ctx: Context) -> dict[str, Any]:
    def get(key: str) -> Any:
        return ctx.setting("burn_in", key)

    dtypes = [str(d) for d in get("dtypes")]
    max_temp = get("max_temp_celsius")
    return {
        "duration_s": float(get("duration_s")),
        "dtypes": dtypes,
        "matrix_size": int(get("matrix_size")),
        "reference_block": int(get("reference_block")),
        "reference_interval_s": float(get("reference_interval_s")),
        "limits": Limits(
            min_fraction_of_peak=float(get("min_fraction_of_peak")),
            median_tolerance=float(get("median_tolerance")),
            warning_band=float(get("warning_band") or 0.0),
            max_temp_celsius=None if max_temp is None else float(max_temp),
            peak_tflops={str(k): float(v) for k, v in (get("peak_tflops") or {}).items()},
            reference_tolerance={str(k): float(v) for k, v in
                                 (get("reference_tolerance") or {}).items()},
        ),
    }


def _summary_text(summary: Mapping[str, Any], measured: int, total: int,
                  flagged: Sequence[str]) -> str:
    medians = ", ".join(f"{dt} {v:.4g}" for dt, v in summary["median_tflops"].items())
    tail = f"; findings on {', '.join(flagged)}" if flagged else "; no findings"
    return f"{measured}/{total} devices burned, median TFLOP/s {medians or 'n/a'}{tail}"
