"""pcie: are the GPUs' and RDMA NICs' PCIe links trained right, clean, and placed as expected?

A GPU or NIC whose link trained below its capability (x8 instead of x16, Gen3 instead of Gen5)
runs every host transfer at a fraction of the speed, silently. Per device this check compares:

- link generation and width, current vs maximum, from NVML (GPUs) and from sysfs
  (``current_link_speed/width`` vs ``max_link_*``, GPUs and NICs), and against the profile's
  ``pcie.gen``/``pcie.width`` for GPUs (a Gen5 GPU in a Gen4-only slot reports max = current = 4)
  → failed ``PcieLinkDowngraded``. Note: consumer GPUs lower their link speed when idle; the
  data-centre parts our profiles describe hold it in P0 with persistence mode, so a lower speed
  is reported, with ``gpu_idle`` in details for the reader;
- the NVML PCIe replay counter: its increase during the check above ``replay_increase_degraded``
  → degraded ``PcieReplays`` (the since-load value is in details);
- AER counters (sysfs ``aer_dev_fatal`` / ``aer_dev_nonfatal``): any increase during the check
  → failed; fatal errors since boot → failed ``PcieAerFatal``; non-fatal since boot → degraded
  ``PcieAerNonFatal`` (rates over time are the passive pcie_aer check's job);
- topology, when the profile sets them: each GPU's NUMA node vs ``pcie.gpu_numa`` and its
  nearest RDMA NIC vs ``pcie.gpu_nic`` → degraded ``PcieTopologyMismatch``;
- pinned H2D/D2H copy bandwidth vs ``pcie.h2d_floor_gb_per_s``/``d2h_floor_gb_per_s`` (warning
  band above it → degraded): one torch worker subprocess (gpu_monitor/workers) copies
  ``copy_bytes`` × ``repeats`` each way per GPU, one GPU after another (so the host's memory
  bandwidth is not shared), takes the median, and verifies the round-tripped data
  (``PcieCopyMismatch``). Only on CUDA devices: where the workers run on the CPU (the simulated
  node, whose CPU workers stand in for GPUs and cannot pin-copy to one) or another process
  holds a GPU, one ``skipped`` ``CopyTestSkipped`` result says why — never a made-up number.
  Where the workers' torch is missing or has no CUDA (the passive image, a CPU-only wheel), the
  result is ``skipped`` ``RequirementMissing`` naming it, which a bootstrap reports ``unknown``
  (the copy test is part of what the bootstrap requires). A worker that hangs or crashes gives
  ``unknown`` (``WorkerTimeout``/``WorkerCrashed``).

NVML errors (checks/_gpus.py): a GPU NVML cannot identify is ``unknown`` (without its PCI
address its sysfs link and AER counters cannot be found); a link, replay-counter or NUMA read
that fails (NotSupported aside) leaves the GPU ``unknown`` unless a failure was found, naming
the call.

Targets: a GPU's findings name the GPU (``gpu:<i>``, the unit that is reset or replaced; its
``pci_bus_id`` is in details); a NIC's name its PCI function (``pcie:<address>``, with the RDMA
device names in details), since one NIC function can carry several ports.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from checks._builtin import BuiltinCheck
from checks._findings import TargetFindings
from checks._gpus import ABSENT, enumeration_error, error_details, unidentified
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw.nvml import GpuInfo, NvmlError
from gpu_monitor.hw.sysfs_values import PciDevice, pcie_gen
from gpu_monitor.hw.topology import NicFunction, nearest_nic, nic_functions
from gpu_monitor.model import (
    NODE,
    Action,
    Kind,
    Result,
    Status,
    gpu_target,
    pcie_target,
)
from gpu_monitor.profiles.schema import BYTES, POSITIVE_INT, SECONDS
from gpu_monitor.workers.pool import WORKER_REASONS, DeviceRef, Task, WorkerPool

_GPU_IDLE = 0x1  # nvmlClocksEventReasonGpuIdle


def copy_worker(ctx: Any) -> dict[str, Any]:
    """Worker side (runs in a torch subprocess): pinned H2D and D2H copies per device, one
    device after another, timed around a device synchronisation, then a data check of the
    round trip."""
    import torch

    count = max(1, int(ctx.args["copy_bytes"]) // 4)
    repeats = max(1, int(ctx.args["repeats"]))
    out = []
    for _turn in ctx.turns():
        for dev in ctx.devices:
            ctx.step(f"pinned copies gpu:{dev.index}")
            pin = dev.is_cuda
            key = (dev.index * 0x9E3779B1 + 0x7F4A7C15) & 0x7FFFFFFF
            host = torch.bitwise_xor(torch.arange(count, dtype=torch.int32), key)
            host = host.pin_memory() if pin else host
            back = torch.empty(count, dtype=torch.int32, pin_memory=pin)
            buf = torch.empty(count, dtype=torch.int32, device=dev.torch)
            buf.copy_(host)  # warm-up: allocator, mappings
            back.copy_(buf)
            h2d, d2h = [], []
            for _ in range(repeats):
                buf.fill_(-1)  # a copy that does nothing must not pass
                t0 = dev.now()
                buf.copy_(host, non_blocking=pin)
                h2d.append(dev.now() - t0)
                back.fill_(-1)
                t0 = dev.now()
                back.copy_(buf, non_blocking=pin)
                d2h.append(dev.now() - t0)
            dev.synchronize()
            mismatches = int((back != host).sum())
            nbytes = count * 4
            out.append({
                "index": dev.index, "bytes": nbytes, "h2d_times_s": h2d, "d2h_times_s": d2h,
                "h2d_gb_per_s": nbytes / max(statistics.median(h2d), 1e-12) / 1e9,
                "d2h_gb_per_s": nbytes / max(statistics.median(d2h), 1e-12) / 1e9,
                "mismatches": mismatches, "pinned": pin,
            })
            del host, back, buf
    return {"copies": out}


class Pcie(BuiltinCheck):
    kinds = frozenset({Kind.BOOTSTRAP})
    summary = "PCIe link gen/width, replays, AER, NUMA/NIC placement and H2D/D2H bandwidth"
    requires = frozenset({"nvml"})
    unavailable_reasons = ("RequirementMissing",)  # the copy test's torch is missing
    timeout = 300.0
    reasons = (
        "PcieLinkDowngraded",
        "PcieReplays",
        "PcieAerFatal",
        "PcieAerNonFatal",
        "PcieTopologyMismatch",
        "CopyBandwidthLow",
        "CopyBandwidthNearFloor",
        "PcieCopyMismatch",
        "CopyTestSkipped",
        "NvmlReadError",
        "SysfsReadError",
        *WORKER_REASONS,
    )
    sections = ("pcie",)
    settings = {
        "copy_bytes": Setting(BYTES, 268435456, "bytes per H2D/D2H copy", "project"),
        "repeats": Setting(POSITIVE_INT, 5, "copies", "project"),
        "replay_increase_degraded": Setting(POSITIVE_INT, 80,
                                            "PCIe replay counter increase during the check",
                                            "DCGM `pcie` plugin `max_pcie_replays`"),
        "copy_timeout_s": Setting(SECONDS, 120.0, "s; hard limit for the H2D/D2H copy workers",
                                  "project"),
    }
    condition = "GPUPCIeError"

    def run(self, ctx: Context) -> Sequence[Result]:
        nvml, sysfs = ctx.host.nvml, ctx.host.sysfs
        try:
            gpus = nvml.gpus()
        except NvmlError as exc:
            return [enumeration_error(self, ctx, exc)]
        nics = _nics(ctx)
        gpu_devs = {g.index: _pci(ctx, g.pci_bus_id) for g in gpus}
        nic_devs = {n.address: sysfs.pci_device(n.address) for n in nics}
        replays_before = {g.index: _replays(ctx, g.index) for g in gpus if g.identified}

        results: list[Result] = []
        copies = self._copy_bandwidth(ctx, gpus, results)  # the counters bracket this load

        for gpu in gpus:
            results.append(self._gpu(ctx, gpu, gpu_devs[gpu.index], nics,
                                     replays_before.get(gpu.index), copies.get(gpu.index)))
        for nic in nics:
            results.append(self._nic(ctx, nic, nic_devs[nic.address]))
        return results

    # --- GPUs ----------------------------------------------------------------------------------

    def _gpu(self, ctx: Context, gpu: GpuInfo, before: PciDevice | None, nics: list[NicFunction],
             replays_before: tuple[int | None, NvmlError | None] | None,
             copy: dict[str, Any] | None) -> Result:
        target = gpu_target(gpu.index)
        f = TargetFindings(details={"uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id})
        if gpu.lost:
            return self.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                               f"{target} is lost (NVML GPU_IS_LOST)",
                               {**f.details, **(error_details(gpu.error) if gpu.error else {})})
        # Without its PCI address the GPU's sysfs link and AER counters cannot be found.
        unread = unidentified(self, ctx, gpu, f.details, "the PCIe link")
        if unread is not None:
            return unread
        nvml = ctx.host.nvml
        want_gen, want_width = ctx.setting(self.name, "gen"), ctx.setting(self.name, "width")
        try:
            link = nvml.pcie_link(gpu.index)
        except NvmlError as exc:
            link = None
            if exc.kind not in ABSENT:
                f.errors.append(str(exc))
        now = _pci(ctx, gpu.pci_bus_id)
        if link is not None:
            f.details.update({"link_gen": link.gen, "link_gen_max": link.max_gen,
                              "link_width": link.width, "link_width_max": link.max_width,
                              "expected_gen": want_gen, "expected_width": want_width})
            low = []
            if link.gen < link.max_gen or (want_gen and link.max_gen < int(want_gen)):
                low.append(f"Gen{link.gen} (max Gen{link.max_gen}"
                           + (f", profile Gen{want_gen})" if want_gen else ")"))
            if link.width < link.max_width or (want_width and link.max_width < int(want_width)):
                low.append(f"x{link.width} (max x{link.max_width}"
                           + (f", profile x{want_width})" if want_width else ")"))
            if low:
                f.details["gpu_idle"] = _idle(ctx, f, gpu.index)
                f.add(Status.FAILED, "PcieLinkDowngraded",
                      f"PCIe link trained below its capability: {', '.join(low)}")
        self._sysfs_link(f, now)
        self._aer(f, before, now)
        self._replays(ctx, f, gpu.index, replays_before)
        self._topology(ctx, f, gpu, now, nics)
        if copy is not None:
            self._copy(ctx, f, copy)
        return self._verdict(ctx, target, f)

    def _replays(self, ctx: Context, f: TargetFindings, index: int,
                 before_read: tuple[int | None, NvmlError | None] | None) -> None:
        before, before_error = before_read or (None, None)
        after, after_error = _replays(ctx, index)
        for err in (before_error, after_error):
            if err is not None and err.kind not in ABSENT:
                f.errors.append(str(err))
        if after is None:
            return
        limit = int(ctx.setting(self.name, "replay_increase_degraded"))
        f.details.update({"replay_counter": after, "replay_increase_degraded": limit})
        if before is None:
            return
        increase = max(0, after - before)
        f.details["replay_increase"] = increase
        if increase > limit:
            f.add(Status.DEGRADED, "PcieReplays",
                  f"{increase} PCIe replays during the check (> {limit})", Action.WATCH)

    def _topology(self, ctx: Context, f: TargetFindings, gpu: GpuInfo, dev: PciDevice | None,
                  nics: list[NicFunction]) -> None:
        numa = _numa(ctx, f, gpu.index, dev)
        f.details["numa_node"] = numa
        want_numa = _nth(ctx.setting(self.name, "gpu_numa"), gpu.index)
        if want_numa is not None:
            f.details["expected_numa_node"] = want_numa
            if numa is not None and numa != int(want_numa):
                f.add(Status.DEGRADED, "PcieTopologyMismatch",
                      f"on NUMA node {numa}, profile expects {want_numa}", Action.WATCH)
        nearest = nearest_nic(gpu.pci_bus_id, numa, nics)
        f.details["nearest_nic"] = nearest
        want_nic = _nth(ctx.setting(self.name, "gpu_nic"), gpu.index)
        if want_nic is not None:
            f.details["expected_nic"] = want_nic
            if nearest is not None and want_nic != nearest:
                f.add(Status.DEGRADED, "PcieTopologyMismatch",
                      f"nearest RDMA NIC is {nearest}, profile expects {want_nic}", Action.WATCH)

    # --- NICs ----------------------------------------------------------------------------------

    def _nic(self, ctx: Context, nic: NicFunction, before: PciDevice | None) -> Result:
        target = pcie_target(nic.address)
        f = TargetFindings(details={"pci_address": nic.address,
                                    "rdma_devices": list(nic.devices),
                                    "numa_node": nic.numa_node})
        now = ctx.host.sysfs.pci_device(nic.address)
        if now is None:
            return self.result(ctx, Status.UNKNOWN, target, "SysfsReadError",
                               f"{target} ({', '.join(nic.devices)}) vanished from sysfs",
                               f.details)
        self._sysfs_link(f, now, f"NIC {', '.join(nic.devices)}: ")
        self._aer(f, before, now)
        return self._verdict(ctx, target, f)

    # --- shared --------------------------------------------------------------------------------

    @staticmethod
    def _sysfs_link(f: TargetFindings, dev: PciDevice | None, label: str = "") -> None:
        """Judge the sysfs current vs max link speed and width."""
        if dev is None:
            return
        f.errors += [str(e) for e in dev.errors]
        f.details.update({
            "sysfs_link_speed_gts": dev.current_link_speed_gts,
            "sysfs_link_speed_gts_max": dev.max_link_speed_gts,
            "sysfs_link_width": dev.current_link_width,
            "sysfs_link_width_max": dev.max_link_width,
        })
        low = []
        if dev.speed_downgraded:
            gen = pcie_gen(dev.current_link_speed_gts)
            low.append(f"{dev.current_link_speed_gts:g} GT/s (Gen{gen}) of "
                       f"{dev.max_link_speed_gts:g} GT/s")
        if dev.width_downgraded:
            low.append(f"x{dev.current_link_width} of x{dev.max_link_width}")
        if low and not any(p[1] == "PcieLinkDowngraded" for p in f.problems):
            f.add(Status.FAILED, "PcieLinkDowngraded",
                  f"{label}PCIe link trained below its capability: {', '.join(low)}")

    @staticmethod
    def _aer(f: TargetFindings, before: PciDevice | None, now: PciDevice | None) -> None:
        if now is None:
            return
        for kind, attr in (("fatal", "aer_fatal"), ("nonfatal", "aer_nonfatal"),
                           ("correctable", "aer_correctable")):
            counters = getattr(now, attr)
            if counters is None:
                continue
            f.details[f"aer_{kind}_total"] = counters.total
            old = getattr(before, attr, None) if before is not None else None
            if kind != "correctable" and old is not None and counters.total > old.total:
                f.add(Status.FAILED, "PcieAerFatal" if kind == "fatal" else "PcieAerNonFatal",
                      f"{counters.total - old.total} {kind} AER error(s) during the check")
            elif kind == "fatal" and counters.total > 0:
                f.add(Status.FAILED, "PcieAerFatal",
                      f"{counters.total} fatal AER error(s) since boot")
            elif kind == "nonfatal" and counters.total > 0:
                f.add(Status.DEGRADED, "PcieAerNonFatal",
                      f"{counters.total} non-fatal AER error(s) since boot", Action.WATCH)

    def _copy_bandwidth(self, ctx: Context, gpus: list[GpuInfo],
                        results: list[Result]) -> dict[int, dict[str, Any]]:
        """Per GPU index, the worker's copy record; appends a node result when not measured."""
        refs = [DeviceRef(g.index, g.uuid) for g in gpus if g.identified]
        if not refs:
            return {}
        device_type = ctx.host.worker.device_type
        details = {"h2d_floor_gb_per_s": ctx.setting(self.name, "h2d_floor_gb_per_s"),
                   "d2h_floor_gb_per_s": ctx.setting(self.name, "d2h_floor_gb_per_s"),
                   "device_type": device_type}
        why, reason = "", "CopyTestSkipped"
        gap = ctx.host.requirement_gap({"torch"}, ctx) if device_type == "cuda" else None
        if device_type != "cuda":
            why = (f"H2D/D2H pinned copy bandwidth needs CUDA devices; this host's workers run "
                   f"on {device_type!r}")
        elif gap is not None:
            why = f"H2D/D2H copy bandwidth not measured: {gap.message}"
            reason = "RequirementMissing" if gap.missing else reason
            details["requirement"] = gap.requirement
        elif not ctx.force:
            try:
                holders = ctx.host.gpu_holders()
            except NvmlError as exc:
                holders, why = [], f"H2D/D2H copy bandwidth not measured: {exc}"
            if holders:
                names = ", ".join(f"pid {h.pid} ({h.name}) on gpu:{h.gpu_index}"
                                  for h in holders[:8])
                why = f"H2D/D2H copy bandwidth not measured: GPUs in use by {names}"
        if why:
            results.append(self.result(ctx, Status.SKIPPED, NODE, reason, why, details))
            return {}
        args = {"copy_bytes": int(ctx.setting(self.name, "copy_bytes")),
                "repeats": int(ctx.setting(self.name, "repeats"))}
        timeout = float(ctx.setting(self.name, "copy_timeout_s"))
        task = Task("checks.pcie:copy_worker", tuple(refs), args, label="pcie copies")
        (outcome,) = WorkerPool(ctx.host.worker).run([task], timeout_s=timeout, rounds=1)
        if not outcome.ok or not outcome.value:
            results.append(self.result(
                ctx, Status.UNKNOWN, NODE, outcome.reason,
                f"H2D/D2H copy test did not finish: {outcome.message}",
                {**details, **outcome.details}))
            return {}
        return {int(c["index"]): c for c in outcome.value.get("copies", [])}

    def _copy(self, ctx: Context, f: TargetFindings, copy: dict[str, Any]) -> None:
        band = float(ctx.setting(self.name, "warning_band", 0.05) or 0.0)
        f.details["copy_bytes"] = copy["bytes"]
        if copy.get("mismatches"):
            f.add(Status.FAILED, "PcieCopyMismatch",
                  f"{copy['mismatches']} words differ after a host-GPU-host round trip",
                  Action.RESET_GPU)
        for way in ("h2d", "d2h"):
            gbps = round(float(copy[f"{way}_gb_per_s"]), 3)
            floor = ctx.setting(self.name, f"{way}_floor_gb_per_s")
            f.details[f"{way}_gb_per_s"] = gbps
            f.details[f"{way}_floor_gb_per_s"] = floor
            if floor is None:
                continue
            floor = float(floor)
            if gbps < floor:
                f.add(Status.FAILED, "CopyBandwidthLow",
                      f"pinned {way.upper()} copy {gbps:g} GB/s is below the floor {floor:g} GB/s")
            elif gbps < floor * (1 + band):
                f.add(Status.DEGRADED, "CopyBandwidthNearFloor",
                      f"pinned {way.upper()} copy {gbps:g} GB/s is within {band:.0%} of the "
                      f"floor {floor:g} GB/s", Action.WATCH)

    def _verdict(self, ctx: Context, target: str, f: TargetFindings) -> Result:
        details = dict(f.details)
        if f.errors:
            details["read_errors"] = f.errors
        worst = f.worst_into(details)
        message = f"{target}: " + "; ".join(p[2] for p in f.problems)
        if worst is not None and worst[0] is Status.FAILED:
            return self.result(ctx, Status.FAILED, target, worst[1], message, details, worst[3])
        if f.errors:
            reason = "NvmlReadError" if any("nvml" in e.lower() for e in f.errors) \
                else "SysfsReadError"
            return self.result(ctx, Status.UNKNOWN, target, reason,
                               f"{target}: read failed: {'; '.join(f.errors)}", details)
        if worst is not None:
            return self.result(ctx, worst[0], target, worst[1], message, details, worst[3])
        return self.ok(ctx, target, "PCIe link at full generation and width, no AER errors",
                       details)


# --- helpers ------------------------------------------------------------------------------------


def _pci(ctx: Context, address: str | None) -> PciDevice | None:
    if not address:
        return None
    try:
        return ctx.host.sysfs.pci_device(address)
    except ValueError:
        return None


def _replays(ctx: Context, index: int) -> tuple[int | None, NvmlError | None]:
    """(the replay counter, None) or (None, why it could not be read)."""
    try:
        return ctx.host.nvml.pcie_replay_counter(index), None
    except NvmlError as err:
        return None, err


def _idle(ctx: Context, f: TargetFindings, index: int) -> bool | None:
    try:
        return bool(ctx.host.nvml.clock_event_reasons(index) & _GPU_IDLE)
    except NvmlError as err:
        if err.kind not in ABSENT:
            f.errors.append(str(err))
        return None


def _numa(ctx: Context, f: TargetFindings, index: int, dev: PciDevice | None) -> int | None:
    """NVML's NUMA node of the GPU, else (a driver without the call) the sysfs one. An NVML
    error is a read error, not a cue to ask sysfs instead: NVML failing on the GPU is news."""
    try:
        node = ctx.host.nvml.numa_node(index)
    except NvmlError as err:
        f.errors.append(str(err))
        node = None
    if node is None and dev is not None:
        node = dev.numa_node
    return node


def _nth(values: Any, index: int) -> Any:
    if not values or index >= len(values):
        return None
    return values[index]


def _nics(ctx: Context) -> list[NicFunction]:
    """RDMA NIC PCI functions, each with the RDMA device names it carries."""
    return nic_functions(ctx.host.sysfs.infiniband_ports())
