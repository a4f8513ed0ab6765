"""inventory: are all the expected GPUs there, of the right model, on a good enough driver?

The first check of every suite. It compares what NVML enumerates with what the PCI bus shows
(sysfs) and with the profile: a GPU present on the bus but absent from NVML has fallen off the
bus or failed to initialise; NVIDIA GPU functions on the bus with NVML unavailable mean a broken
driver (``NvmlUnavailable``) — a GPU node with a broken driver must never look healthy. A GPU
NVML enumerates but cannot identify (its handle, UUID, name, PCI info, serial or memory size
answers an error) is ``unknown`` ``NvmlReadError`` naming the call, never ``ok``; a lost one is
``failed`` ``GpuLost``; a driver version NVML cannot read leaves the node ``unknown``. With NVML unavailable, a PCI function whose
vendor or class file cannot be read makes "no GPU here" ``unknown`` (``SysfsReadError``), not
``ok``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from checks._builtin import BuiltinCheck
from checks._gpus import enumeration_error, error_details, unidentified
from gpu_monitor.check import ClearTracker, Context, Setting
from gpu_monitor.hw.nvml import NvmlError, SystemInfo
from gpu_monitor.hw.sysfs_values import NVIDIA_VENDOR
from gpu_monitor.model import NODE, Action, Kind, Result, Status, gpu_target
from gpu_monitor.profiles.schema import SECONDS0


def version_tuple(text: str) -> tuple[int, ...]:
    """``"535.104.05"`` -> (535, 104, 5); non-numeric parts end the tuple."""
    out = []
    for part in re.split(r"[.\-]", text.strip()):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


class Inventory(BuiltinCheck):
    kinds = frozenset({Kind.BOOTSTRAP, Kind.PASSIVE})
    summary = "GPU count, models, UUIDs, PCI bus IDs and driver/CUDA versions vs the profile"
    interval = 60.0
    timeout = 30.0
    reasons = (
        "NvmlUnavailable",
        "GpuMissing",
        "GpuLost",
        "GpuCountUnexpected",
        "GpuModelMismatch",
        "DriverTooOld",
        "CudaTooOld",
        "NvmlReadError",
        "BootGrace",
        "SysfsReadError",
    )
    sections = ("gpu",)
    settings = {
        "boot_grace_s": Setting(
            SECONDS0, None,
            "s after boot during which missing GPUs / NVML not ready are `unknown` "
            "(`BootGrace`), not failed; unset: `nvlink.boot_grace_s` (300)",
            "project: the driver may still be loading"),
    }
    condition = "GPUInventoryMismatch"

    def __init__(self) -> None:
        self._cleared = ClearTracker(self.name)

    def poll(self, ctx: Context) -> Sequence[Result]:
        results = self._inspect(ctx)
        return self._cleared.track(ctx, self._boot_grace(ctx, results))

    def _boot_grace(self, ctx: Context, results: list[Result]) -> list[Result]:
        """Right after boot the driver may still be loading and GPUs enumerating: missing GPUs
        and an unavailable NVML are ``unknown`` (``BootGrace``) until the grace period ends."""
        grace = float(ctx.setting(self.name, "boot_grace_s", None)
                      or ctx.profile.get("nvlink.boot_grace_s") or 300.0)
        try:
            uptime = ctx.host.procfs.uptime_s()
        except Exception:  # noqa: BLE001 - no uptime: no grace
            uptime = None
        if uptime is None or uptime >= grace:
            return results
        out = []
        for r in results:
            if r.status is Status.FAILED and r.reason in ("NvmlUnavailable", "GpuMissing",
                                                          "GpuLost"):
                r = self.result(ctx, Status.UNKNOWN, r.target, "BootGrace",
                                f"{r.message} (uptime {uptime:.0f} s < boot grace {grace:g} s: "
                                "not judged yet)",
                                {**dict(r.details), "pending_reason": r.reason,
                                 "uptime_s": uptime, "boot_grace_s": grace})
            out.append(r)
        return out

    def _inspect(self, ctx: Context) -> list[Result]:
        """The GPUs NVML enumerates against the PCI bus and the profile, then the driver."""
        nvml = ctx.host.nvml
        functions = ctx.host.sysfs.pci_devices(NVIDIA_VENDOR)
        bus_addrs = sorted(d.address for d in functions if d.is_nvidia_gpu)
        if not nvml.available():
            # Functions whose vendor or class cannot be read: "no GPU on the bus" is not earned.
            return self._without_nvml(ctx, bus_addrs, [d for d in functions if d.unidentified])
        results: list[Result] = []
        try:
            gpus = nvml.gpus()
        except NvmlError as exc:
            return [enumeration_error(self, ctx, exc)]
        try:
            system: SystemInfo | None = nvml.system()
        except NvmlError as exc:  # the GPUs are still judged; the node is not
            system = None
            results.append(self.result(
                ctx, Status.UNKNOWN, NODE, "NvmlReadError",
                f"cannot read the driver and CUDA versions: {exc}", error_details(exc)))
        slots = _BusSlots.of(gpus, bus_addrs)
        results += self._missing(ctx, gpus, slots)
        results += [self._gpu(ctx, gpu, slots) for gpu in gpus]
        if system is None:
            return results
        return results + self._driver(ctx, gpus, system, results)

    def _without_nvml(self, ctx: Context, bus_addrs: list[str],
                      unreadable_functions: list) -> list[Result]:
        """NVML is unavailable: a GPU on the bus means a broken driver; none, with GPUs
        expected, means they are missing; no GPU expected is only ``ok`` when every function
        on the bus could be identified."""
        nvml, profile = ctx.host.nvml, ctx.profile
        expected = profile.expected_gpus
        reason = nvml.unavailable_reason()
        init = nvml.init_error
        if bus_addrs:
            return [self.result(
                ctx, Status.FAILED, NODE, "NvmlUnavailable",
                f"{len(bus_addrs)} NVIDIA GPU(s) on the PCI bus but NVML is unavailable: "
                f"{reason}",
                {"pci_bus_ids": bus_addrs,
                 **(error_details(init) if init is not None else {}),
                 "nvml_error": reason, "expected_gpus": expected},
                Action.REBOOT,
            )]
        if expected > 0:
            return [self.result(
                ctx, Status.FAILED, NODE, "GpuMissing",
                f"profile {profile.name} expects {expected} GPUs; none found "
                f"(NVML unavailable: {reason})",
                {"expected_gpus": expected, "found_gpus": 0, "nvml_error": reason},
                Action.REPLACE,
            )]
        if unreadable_functions:
            errors = [str(e) for d in unreadable_functions
                      for e in d.errors_for("vendor", "class")]
            return [self.result(
                ctx, Status.UNKNOWN, NODE, "SysfsReadError",
                f"NVML unavailable and {len(unreadable_functions)} PCI function(s) could not "
                f"be identified, any of which may be a GPU: {'; '.join(errors)}",
                {"expected_gpus": 0, "nvml_error": reason, "read_errors": errors})]
        return [self.ok(ctx, NODE, "no GPU expected and none found",
                        {"expected_gpus": 0, "found_gpus": 0})]

    def _missing(self, ctx: Context, gpus: Sequence[Any], slots: _BusSlots) -> list[Result]:
        """GPUs on the bus but not in NVML, GPUs the profile expects that are nowhere, and more
        GPUs than the profile expects."""
        profile = ctx.profile
        expected = profile.expected_gpus
        results: list[Result] = []
        for addr in slots.missing:
            idx = slots.all_addrs.index(addr)
            results.append(self.result(
                ctx, Status.FAILED, gpu_target(idx), "GpuMissing",
                f"gpu:{idx} ({addr}) is on the PCI bus but not visible to NVML "
                "(fallen off the bus or failed to initialise)",
                {"pci_bus_id": addr, "expected_gpus": expected, "found_gpus": len(gpus)},
                Action.REBOOT,
            ))
        unexplained = expected - len(gpus) - len(slots.missing)
        if unexplained > 0:
            seen = {g.index for g in gpus}
            guesses = [i for i in range(expected) if i not in seen][-unexplained:]
            for idx in guesses:
                results.append(self.result(
                    ctx, Status.FAILED, gpu_target(idx), "GpuMissing",
                    f"profile {profile.name} expects {expected} GPUs, NVML sees {len(gpus)}; "
                    f"gpu:{idx} is missing (not on the PCI bus either)",
                    {"expected_gpus": expected, "found_gpus": len(gpus)},
                    Action.REPLACE,
                ))
        elif len(gpus) > expected:
            results.append(self.result(
                ctx, Status.DEGRADED, NODE, "GpuCountUnexpected",
                f"NVML sees {len(gpus)} GPUs but profile {profile.name} expects {expected}: "
                "is the profile right? (config expected_gpus)",
                {"expected_gpus": expected, "found_gpus": len(gpus)},
                Action.WATCH,
            ))
        return results

    def _gpu(self, ctx: Context, gpu: Any, slots: _BusSlots) -> Result:
        """One enumerated GPU: lost, unidentified, the wrong model, or ``ok``."""
        profile = ctx.profile
        want_name = profile.get("gpu.product_name")
        # With a GPU missing, NVML renumbers the rest; name each GPU by its place on the
        # bus so gpu:N means the same board slot in every result of this report.
        addr = gpu.pci_bus_id or slots.lost.get(gpu.index)
        slot = slots.all_addrs.index(addr) if addr in slots.all_addrs else gpu.index
        target = gpu_target(slot)
        info = {"uuid": gpu.uuid, "name": gpu.name, "pci_bus_id": addr,
                "serial": getattr(gpu, "serial", None), "nvml_index": gpu.index}
        if getattr(gpu, "lost", False):
            return self.result(
                ctx, Status.FAILED, target, "GpuLost",
                f"{target} ({addr or 'address unknown'}) is enumerated but NVML reports it lost "
                "(GPU_IS_LOST): it needs a reset or reboot",
                {**info, **(error_details(gpu.error) if gpu.error else {})}, Action.REBOOT,
            )
        unread = unidentified(self, ctx, gpu, info, "the model", target)
        if unread is not None:
            return unread
        if want_name and not _name_matches(gpu.name, want_name, profile.get("match") or ()):
            return self.result(
                ctx, Status.FAILED, target, "GpuModelMismatch",
                f"{target} is a {gpu.name!r}; profile {profile.name} expects {want_name!r}",
                {**info, "expected_name": want_name}, Action.NONE,
            )
        return self.ok(ctx, target, f"{gpu.name} {gpu.uuid}", info)

    def _driver(self, ctx: Context, gpus: Sequence[Any], system: SystemInfo,
                results: list[Result]) -> list[Result]:
        """The driver and CUDA versions against the profile's floors; the node's ``ok`` when
        nothing else was said about the node."""
        profile = ctx.profile
        expected = profile.expected_gpus
        node_details = {
            "expected_gpus": expected,
            "found_gpus": len(gpus),
            "driver_version": system.driver_version,
            "cuda_driver_version": system.cuda_driver_version,
            "uuids": [g.uuid for g in gpus],
        }
        out: list[Result] = []
        min_driver = profile.get("gpu.min_driver_version")
        if min_driver and version_tuple(system.driver_version) < version_tuple(str(min_driver)):
            out.append(self.result(
                ctx, Status.FAILED, NODE, "DriverTooOld",
                f"driver {system.driver_version} is older than the required {min_driver}",
                {**node_details, "min_driver_version": str(min_driver)}, Action.NONE,
            ))
        min_cuda = profile.get("gpu.min_cuda_version")
        if min_cuda and version_tuple(system.cuda_driver_version) < version_tuple(str(min_cuda)):
            out.append(self.result(
                ctx, Status.FAILED, NODE, "CudaTooOld",
                f"CUDA driver API {system.cuda_driver_version} is older than the required "
                f"{min_cuda}",
                {**node_details, "min_cuda_version": str(min_cuda)}, Action.NONE,
            ))
        if not any(r.target == NODE for r in [*results, *out]):
            out.append(self.ok(
                ctx, NODE,
                f"{len(gpus)}/{expected} GPUs, driver {system.driver_version}, "
                f"CUDA {system.cuda_driver_version}",
                node_details,
            ))
        return out


@dataclass(frozen=True)
class _BusSlots:
    """Where each GPU sits on the PCI bus. NVML numbers GPUs in PCI bus order; so does CUDA
    with CUDA_DEVICE_ORDER=PCI_BUS_ID. A GPU on the bus but not in NVML gets the index it would
    have had in that order; a lost GPU (or one whose PCI info cannot be read) is still
    enumerated but NVML cannot say where it is, so it accounts for one unmatched bus address
    (NVML and the bus list GPUs in the same order)."""

    all_addrs: list[str]  # every GPU address, on the bus or in NVML, in bus order
    missing: list[str]  # on the bus, in NVML under no address and not lost
    lost: dict[int, str]  # NVML index of an address-less GPU -> the bus address it takes

    @classmethod
    def of(cls, gpus: Sequence[Any], bus_addrs: list[str]) -> _BusSlots:
        nvml_addrs = {g.pci_bus_id for g in gpus if g.pci_bus_id}
        missing = [a for a in bus_addrs if a not in nvml_addrs]
        lost: dict[int, str] = {}
        for gpu in sorted((g for g in gpus if not g.pci_bus_id), key=lambda g: g.index):
            if missing:
                lost[gpu.index] = missing.pop(0)
        return cls(sorted(set(bus_addrs) | nvml_addrs), missing, lost)


def _name_matches(name: str, want: str, match: Sequence[str]) -> bool:
    if want.lower() in name.lower():
        return True
    return any(m.lower() in name.lower() for m in match)
