"""Faults of one GPU as NVML and the torch workers see it: missing, row remapping, ECC, clock
events, temperature, power draw, speed, wrong results, silent corruption, a foreign process.

Why together: each sets fields of one ``GpuSpec``; the fake pynvml and the simulated workers
read them. Those that NVIDIA's driver also logs append the matching Xid line.
"""

from __future__ import annotations

from gpu_monitor.sim.faults.base import Fault, FaultKind, InjectError, fault_gpu
from gpu_monitor.sim.faults.kernel_log import xid_line
from gpu_monitor.sim.spec import (
    CLOCK_EVENT_HW_POWER_BRAKE,
    CLOCK_EVENT_HW_SLOWDOWN,
    CLOCK_EVENT_HW_THERMAL,
    NodeSpec,
    TimedLine,
)


def _gpu_missing(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    g.missing = True
    g.off_bus = f.int("bus", 1) == 0
    spec.kmsg_lines.append(TimedLine(f.after_s, xid_line(g, 79)))


def _remap_pending(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    g.remap_pending = True
    g.remapped_unc += 1
    spec.kmsg_lines.append(TimedLine(f.after_s, xid_line(g, 63)))


def _remap_failure(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    g.remap_failure = True
    spec.kmsg_lines.append(TimedLine(f.after_s, xid_line(g, 64)))


def _remap_headroom(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    low = f.int("low", 0)
    none = f.int("none", 0)
    h = g.histogram
    h["low"] = low
    h["none"] = none
    h["max"] = max(0, h.get("max", 0) - low - none)


def _ecc_uncorrectable(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    n = f.int("count", 1)
    g.ecc_volatile_uncorrected += n
    g.ecc_aggregate_uncorrected += n
    spec.kmsg_lines.append(TimedLine(f.after_s, xid_line(g, 48)))


_THROTTLE_BITS = {
    "hw_slowdown": CLOCK_EVENT_HW_SLOWDOWN,
    "hw_thermal_slowdown": CLOCK_EVENT_HW_THERMAL,
    "hw_power_brake": CLOCK_EVENT_HW_POWER_BRAKE,
}


def _throttle(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    event = f.choice("event", tuple(_THROTTLE_BITS))
    g.clock_event_reasons |= _THROTTLE_BITS[event]


def _unthrottle(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    g.clock_event_reasons &= ~_THROTTLE_BITS[f.params["event"]]


def _hot(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    g.temperature_core_c = f.int("core", g.temperature_core_c)
    g.temperature_memory_c = f.int("memory", g.temperature_memory_c)


def _power_limit(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    pct = f.float("pct", 100.0)
    if pct < 0:
        raise InjectError(f"{f.text}: pct must be >= 0")
    g.power_usage_mw = round(g.power_limit_mw * pct / 100)


def _slow(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    factor = f.float("factor", 3.0)
    if factor <= 0:
        raise InjectError(f"{f.text}: factor must be > 0")
    g.speed_factor = factor


def _wrong_results(spec: NodeSpec, f: Fault) -> None:
    fault_gpu(spec, f).wrong_results = True


def _sdc(spec: NodeSpec, f: Fault) -> None:
    fault_gpu(spec, f).sdc = True


def _gpu_process(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    pid = f.int("pid", 4242)
    g.processes.append((pid, f.int("mib", 1024) * 1024 * 1024, f.params.get("name", "python")))


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("gpu-missing", "gpu", ("bus",),
          "GPU not enumerated by NVML (fallen off the bus); bus=0 also removes it "
          "from the PCI bus", _gpu_missing),
    FaultKind("row-remap-pending", "gpu", (), "a row remap pending (needs a GPU reset)",
          _remap_pending),
    FaultKind("row-remap-failure", "gpu", (), "a row remap failure (needs replacement)",
          _remap_failure),
    FaultKind("remap-headroom", "gpu", ("low", "none"),
          "remapper histogram: N banks at low / none spare rows", _remap_headroom),
    FaultKind("ecc-uncorrectable", "gpu", ("count",), "volatile uncorrectable ECC errors",
          _ecc_uncorrectable),
    FaultKind("throttle", "gpu", ("event",),
          "a HW clock event active (hw_slowdown, hw_thermal_slowdown, hw_power_brake)",
          _throttle, _unthrottle, timed=True),
    FaultKind("hot", "gpu", ("core", "memory"), "core / HBM temperature in Celsius", _hot,
          timed=True),
    FaultKind("power-limit", "gpu", ("pct",),
              "the GPU draws pct % (default 100) of its enforced power limit", _power_limit),
    FaultKind("slow", "gpu", ("factor",), "the device computes factor× slower", _slow),
    FaultKind("wrong-results", "gpu", (), "the device's matmul results are wrong",
          _wrong_results),
    FaultKind("sdc", "gpu", (), "silent data corruption in the device's training step",
          _sdc),
    FaultKind("gpu-process", "gpu", ("pid", "name", "mib"),
          "a foreign process holds the GPU", _gpu_process),
)
