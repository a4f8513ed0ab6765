"""The simulated node: a whole GPU host, faked at its lowest boundaries.

``SimulatedNode(profile, faults)`` builds a ``NodeSpec`` from the profile (GPU count and model,
NVLink links, PCIe generation, RDMA ports, NVSwitches), applies ``--inject`` faults to it, then
renders it:

- a fake ``pynvml`` module (sim/fake_nvml.py) handed to the real ``NvmlReader``;
- a sysfs/procfs tree on disk (sim/sysfs_tree.py) read by the real ``SysfsReader``;
- a kernel-log file of raw ``/dev/kmsg`` records, followed by the real kmsg reader;
- fake ``dcgmi`` / ``ib_write_bw`` executables (sim/tools.py) printing the recorded real formats
  with the simulated values, found first on the command runner's PATH;
- a fault file read by the simulated device worker (sim/worker.py) for ``slow``,
  ``wrong-results`` and ``sdc``;
- for ``missing@node,what=torch``, an interpreter without site-packages handed to the workers
  (``WorkerSettings.python``): the passive image, as the requirement gate and the workers see it.

Faults that unfold over time (``after=``/``for=``) are applied by ``advance(elapsed_s)``, which a
ticker thread drives from the daemon's clock, so an injected fake clock makes ten minutes pass in
milliseconds. Nothing here is visible to checks except through those boundaries.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_monitor.clock import Clock
from gpu_monitor.host import Host, WorkerSettings
from gpu_monitor.hw.command import CommandRunner
from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.sim import inject as inj
from gpu_monitor.sim.faults.base import Fault
from gpu_monitor.sim.spec import (
    CLOCK_EVENT_HW_THERMAL,
    CLOCK_EVENT_SW_POWER_CAP,
    CLOCK_EVENT_SW_THERMAL,
    CLOCK_EVENT_SYNC_BOOST,
    GpuSpec,
    IbPortSpec,
    NodeSpec,
    NvSwitchSpec,
)
from gpu_monitor.sim.worker import SEAM_FOR

# The kernel release the simulated node's boot records name.
BOOT_KERNEL = "5.15.0-1053-nvidia"
# Bus addresses as on a real HGX H100 board (nvidia-smi -q of an 8xH100 node).
GPU_BUSES = (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA)
NVSWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)
NIC_BUSES = (0x4F, 0x60, 0x71, 0x82, 0x93, 0xA4, 0xB5, 0xC6)

# Clock-event bits -> the NVML perf policy whose violation counter grows while any is active.
VIOLATION_POLICIES = (
    (CLOCK_EVENT_SW_POWER_CAP, "power"),
    (CLOCK_EVENT_SYNC_BOOST, "sync_boost"),
    (CLOCK_EVENT_SW_THERMAL | CLOCK_EVENT_HW_THERMAL, "thermal"),
)

_PCI_DEVICE_IDS = {"H100": 0x2330, "H200": 0x2335, "A100": 0x20B2}


@dataclass
class _Scheduled:
    at_s: float
    fault: Fault
    revert: bool = False
    before: dict | None = None


def build_spec(profile, hostname: str = "sim-node-0") -> NodeSpec:
    """A healthy node as the profile describes it."""
    count = int(profile.expected_gpus)
    name = str(profile.get("gpu.product_name") or "NVIDIA H100 80GB HBM3")
    links = int(profile.get("nvlink.links_per_gpu") or 0)
    gen = int(profile.get("pcie.gen") or 5)
    width = int(profile.get("pcie.width") or 16)
    numa = list(profile.get("pcie.gpu_numa") or [])
    mem_gib = int(profile.get("gpu.memory_gib") or 80)
    dev_id = next((v for k, v in _PCI_DEVICE_IDS.items() if k in name), 0x2330)
    dev_id = int(profile.get("gpu.pci_device_id") or dev_id)
    # A node without GPUs has no NVIDIA driver either: NVML's library is absent.
    spec = NodeSpec(profile=profile.name, hostname=hostname, nvml_library_missing=count == 0)
    for i in range(count):
        bus = GPU_BUSES[i] if i < len(GPU_BUSES) else 0xD0 + i
        spec.gpus.append(GpuSpec(
            index=i,
            uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{hostname}/gpu/{i}")),
            name=name,
            pci_bus_id=f"0000:{bus:02x}:00.0",
            serial=f"16550220{i:05d}",
            pci_device_id=(dev_id << 16) | 0x10DE,
            memory_total_bytes=mem_gib * 1024**3,
            numa_node=numa[i] if i < len(numa) else (0 if i < count / 2 else 1),
            nvlink_up=[True] * links,
            pcie_gen_current=gen, pcie_gen_max=gen,
            pcie_width_current=width, pcie_width_max=width,
            fabric_supported=bool(profile.get("nvlink.nvswitch")),
        ))
    for i in range(int(profile.get("nvlink.nvswitch_count") or 0)):
        bus = NVSWITCH_BUSES[i] if i < len(NVSWITCH_BUSES) else 0x09 + i
        spec.nvswitches.append(NvSwitchSpec(i, f"0000:{bus:02x}:00.0"))
    rate = int(profile.get("rdma.rate_gbit_per_s") or 400)
    floor = float(profile.get("rdma.loopback_floor_gbit_per_s") or rate * 0.9)
    for i, port_name in enumerate(profile.get("rdma.ports") or ()):
        dev, port = str(port_name).rsplit(":", 1)
        bus = NIC_BUSES[i] if i < len(NIC_BUSES) else 0xE0 + i
        gen_name = {100: "EDR", 200: "HDR", 400: "NDR", 800: "XDR"}.get(rate, "NDR")
        spec.ib_ports.append(IbPortSpec(
            device=dev, port=int(port), pci_bus_id=f"0000:{bus:02x}:00.0",
            numa_node=0 if i < 4 else 1, rate_gbit=rate,
            rate_text=f"{rate} Gb/sec (4X {gen_name})",
            loopback_gbit=round(max(floor * 1.03, rate * 0.98), 2),
        ))
    return spec


class SimulatedNode:
    """Owns a temporary host tree; ``host()`` returns the readers over it."""

    TICK_S = 0.2  # fault timing resolution; the ticker's wake-ups are part of what benches see

    def __init__(self, profile, faults: Iterable[Fault] = (), root: str | None = None,
                 hostname: str = "sim-node-0"):
        self.profile = profile
        self.spec = build_spec(profile, hostname)
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="gpu-monitor-sim-")
        self._lock = threading.RLock()
        self._pending: list[_Scheduled] = []
        self._written_lines = 0
        self._seq = 1000
        self._elapsed = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.faults = list(faults)
        try:
            for fault in self.faults:
                self._schedule(fault)
            self.paths = self._render()
            self.advance(0.0)
        except BaseException:
            # A fault that does not fit this node (or Ctrl-C) must not leave the tree behind:
            # nobody holds this object to close it.
            self.close()
            raise

    # --- faults ------------------------------------------------------------------------------

    def _schedule(self, fault: Fault) -> None:
        kind = inj.KINDS[fault.kind]
        # Kernel-log and port faults carry their own timing inside the spec.
        self_timed = fault.kind in ("xid", "sxid", "port-down")
        if self_timed or (fault.after_s == 0 and fault.for_s is None):
            kind.apply(self.spec, fault)
            return
        self._pending.append(_Scheduled(fault.after_s, fault))
        if fault.for_s is not None:
            self._pending.append(_Scheduled(fault.after_s + fault.for_s, fault, revert=True))
        # Validate now, so a bad spec fails at start, not minutes later.
        kind.apply(copy.deepcopy(self.spec), fault)

    def _apply_scheduled(self, item: _Scheduled) -> None:
        kind = inj.KINDS[item.fault.kind]
        gpu = None
        if item.fault.target.startswith("gpu:"):
            gpu = self.spec.gpu(item.fault.gpu_index)
        if not item.revert:
            before = dataclasses.asdict(gpu) if gpu is not None else None
            kind.apply(self.spec, item.fault)
            for other in self._pending:
                if other.fault is item.fault and other.revert:
                    other.before = before
        elif gpu is not None and item.before is not None:
            after = dataclasses.asdict(gpu)
            for key, value in item.before.items():
                # Cumulative counters keep what accrued while the fault was active.
                if after[key] != value and key != "violation_ns":
                    setattr(gpu, key, copy.deepcopy(value))
        elif kind.revert is not None:
            kind.revert(self.spec, item.fault)

    # --- rendering -----------------------------------------------------------------------------

    @property
    def kmsg_path(self) -> str:
        return os.path.join(self.root, "var", "log", "kmsg.log")

    @property
    def bin_dir(self) -> str:
        return os.path.join(self.root, "usr", "bin")

    @property
    def state_file(self) -> str:
        return os.path.join(self.root, "sim-state.json")

    def _render(self) -> HostPaths:
        from gpu_monitor.sim.sysfs_tree import write_tree

        paths = write_tree(self.root, self.spec)
        os.makedirs(os.path.dirname(self.kmsg_path), exist_ok=True)
        if not os.path.exists(self.kmsg_path) or not os.path.getsize(self.kmsg_path):
            self._write_boot_records()
        os.makedirs(self.bin_dir, exist_ok=True)
        try:
            from gpu_monitor.sim.tools import install_tools
        except ImportError:  # tools arrive with the active checks
            install_tools = None
        if install_tools is not None:
            wanted = []
            if self.spec.dcgmi_installed and self.spec.gpus:
                wanted.append("dcgmi")
            if self.spec.perftest_available and self.spec.ib_ports:
                wanted.append("ib_write_bw")
            install_tools(self.bin_dir, self.state_file, only=tuple(wanted))
        if not self.spec.torch_available:
            self._write_passive_python()
        self._write_state()
        return dataclasses.replace(paths, kmsg=self.kmsg_path)

    @property
    def passive_python(self) -> str:
        return os.path.join(self.root, "opt", "passive-image", "bin", "python3")

    def _write_passive_python(self) -> None:
        """The passive image's interpreter: this Python without its site-packages, so torch
        cannot be imported (nothing is uninstalled; the workers are handed this interpreter
        through ``WorkerSettings.python``, the seam the requirement gate asks)."""
        import sys

        os.makedirs(os.path.dirname(self.passive_python), exist_ok=True)
        with open(self.passive_python, "w") as fh:
            fh.write(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
        os.chmod(self.passive_python, 0o755)

    def _write_state(self) -> None:
        """The JSON the fake tools and the simulated device worker read."""
        state = {
            "hostname": self.spec.hostname,
            "profile": self.spec.profile,
            "elapsed_s": self._elapsed,
            "dcgm_available": self.spec.dcgm_available,
            "dcgm_output": self.spec.dcgm_output,
            "driver_version": self.spec.driver_version,
            "gpus": [
                {"index": g.index, "uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id,
                 "missing": g.missing, "lost": g.lost, "speed_factor": g.speed_factor,
                 "wrong_results": g.wrong_results, "sdc": g.sdc,
                 "dcgm_failures": list(g.dcgm_failures)}
                for g in self.spec.gpus
            ],
            "ib_ports": [
                {"device": p.device, "port": p.port, "state": p.state,
                 "loopback_gbit": p.loopback_gbit, "rate_gbit": p.rate_gbit,
                 "link_layer": p.link_layer, "output": p.perftest_output}
                for p in self.spec.ib_ports
            ],
        }
        tmp = self.state_file + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(state, fh, indent=1)
        os.replace(tmp, self.state_file)

    def _write_boot_records(self) -> None:
        """The first records of a real ring: the kernel's banner and its command line. A real
        kernel log is never empty, and a scan of an empty one reads nothing (``KmsgEmpty``).
        Their sequence numbers are 0 and 1; fault records start at 1001."""
        lines = [(5, f"Linux version {BOOT_KERNEL} (sim@{self.spec.hostname}) #1 SMP"),
                 (6, f"Command line: BOOT_IMAGE=/boot/vmlinuz-{BOOT_KERNEL} ro quiet")]
        with open(self.kmsg_path, "w") as fh:
            for seq, (priority, message) in enumerate(lines):
                fh.write(f"{priority},{seq},0,-;{message}\n")

    def _append_kmsg(self, message: str, priority: int, at_s: float) -> None:
        self._seq += 1
        usec = int((self.spec.uptime_s + at_s) * 1_000_000)
        # The /dev/kmsg record format: <syslog prefix>,<seq>,<usec>,<flags>;<message>
        with open(self.kmsg_path, "a") as fh:
            fh.write(f"{priority},{self._seq},{usec},-;{message}\n")

    def advance(self, elapsed_s: float, always_render: bool = True) -> None:
        """Bring the simulated hardware to ``elapsed_s`` seconds after start.

        The ticker passes ``always_render=False`` so an idle simulation rewrites nothing (the
        daemon's steady-state cost is then measurable on a simulated node); direct calls
        re-render whatever a test changed in the spec.
        """
        from gpu_monitor.sim.sysfs_tree import update_tree

        with self._lock:
            changed = always_render
            since = self._elapsed
            self._elapsed = max(self._elapsed, elapsed_s)
            now = self._elapsed
            due = sorted((p for p in self._pending if p.at_s <= now), key=lambda p: p.at_s)
            for item in due:
                # Violation time accrues piecewise: up to each change, under the old clock events.
                at = min(max(item.at_s, since), now)
                self._accrue_violations(at - since)
                since = at
                self._pending.remove(item)
                self._apply_scheduled(item)
                changed = True
            self._accrue_violations(now - since)
            for port in self.spec.ib_ports:
                down = any(start <= now < start + dur for start, dur in port.outages)
                if down and port.state == "ACTIVE":
                    port.state, port.phys_state = "DOWN", "Polling"
                    port.link_downed += 1
                    changed = True
                elif not down and port.state == "DOWN":
                    port.state, port.phys_state = "ACTIVE", "LinkUp"
                    changed = True
            if self._written_lines < len(self.spec.kmsg_lines):
                lines = sorted(self.spec.kmsg_lines, key=lambda t: t.after_s)
                for line in lines[self._written_lines:]:
                    if line.after_s > now:
                        break
                    self._append_kmsg(line.message, line.priority, line.after_s)
                    self._written_lines += 1
            if changed:
                update_tree(self.root, self.spec)
                self._write_state()

    def _accrue_violations(self, seconds: float) -> None:
        """Grow NVML's cumulative violation counters (nvmlDeviceGetViolationStatus) for the
        clock events active during ``seconds``, as the driver does while they hold clocks down.

        nvml.h aliases ``NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP`` to the power policy's
        counter and ``..._SYNC_BOOST`` to the sync-boost one; the thermal policy ("thermal
        violations", no SW/HW split documented) is modelled as counting both thermal slowdowns.
        HW slowdown and HW power brake have no perf-policy counter, so none grows for them.
        """
        if seconds <= 0:
            return
        ns = int(round(seconds * 1e9))
        for gpu in self.spec.gpus:
            for bits, policy in VIOLATION_POLICIES:
                if gpu.clock_event_reasons & bits:
                    gpu.violation_ns[policy] = gpu.violation_ns.get(policy, 0) + ns

    def next_event_s(self) -> float | None:
        """When the next scheduled change happens (for tests stepping a fake clock)."""
        times = [p.at_s for p in self._pending]
        times += [t.after_s for t in self.spec.kmsg_lines if t.after_s > self._elapsed]
        for port in self.spec.ib_ports:
            for start, dur in port.outages:
                times += [t for t in (start, start + dur) if t > self._elapsed]
        return min(times) if times else None

    # --- lifecycle -------------------------------------------------------------------------------

    def start_ticker(self, clock: Clock) -> None:
        if self._thread is not None:
            return
        t0 = clock.monotonic()

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.advance(clock.monotonic() - t0, always_render=False)
                except Exception:  # noqa: BLE001 - the simulation must not kill the daemon
                    pass
                self._stop.wait(self.TICK_S)

        self._thread = threading.Thread(target=loop, name="sim-ticker", daemon=True)
        self._thread.start()

    def host(self) -> Host:
        from gpu_monitor.hw.nvml_reader import NvmlReader
        from gpu_monitor.hw.procfs import ProcfsReader
        from gpu_monitor.hw.sysfs import SysfsReader
        from gpu_monitor.sim.fake_nvml import FakeNvml

        host = Host(
            paths=self.paths,
            nvml=NvmlReader(FakeNvml(self.spec)),
            sysfs=SysfsReader(self.paths),
            procfs=ProcfsReader(self.paths),
            commands=CommandRunner(search_path=[self.bin_dir]),
            worker=WorkerSettings(
                device_type="cpu",
                env={"GPU_MONITOR_SIM_STATE": self.state_file},
                device_seam=SEAM_FOR,
                fault_file=self.state_file,
                device_count=len([g for g in self.spec.gpus if not g.missing]),
                python=None if self.spec.torch_available else self.passive_python,
            ),
            description=f"simulated:{self.spec.profile}",
        )
        host.closers.append(self.close)
        host.starters.append(self.start_ticker)
        return host

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
