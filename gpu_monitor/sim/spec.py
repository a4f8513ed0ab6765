"""The simulated node's hardware, as plain mutable data.

``SimulatedNode`` (sim/node.py) builds a ``NodeSpec`` from a profile, applies ``--inject`` faults
to it (faults change these fields, nothing else), and then renders it at the lowest boundaries:
the fake pynvml module reads ``GpuSpec`` fields, the sysfs tree is written from ``GpuSpec`` /
``IbPortSpec`` / ``NvSwitchSpec``, the kernel-log file from ``kmsg_lines``, and the fake tools
print their recorded real formats with these values. The real readers and checks then run
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# NVML clock-event reason bits (nvml.h: nvmlClocksEventReason*).
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_APP_CLOCKS = 0x2
CLOCK_EVENT_SW_POWER_CAP = 0x4
CLOCK_EVENT_HW_SLOWDOWN = 0x8
CLOCK_EVENT_SYNC_BOOST = 0x10
CLOCK_EVENT_SW_THERMAL = 0x20
CLOCK_EVENT_HW_THERMAL = 0x40
CLOCK_EVENT_HW_POWER_BRAKE = 0x80
CLOCK_EVENT_DISPLAY_CLOCKS = 0x100

# nvmlGpuFabricState_t
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3


@dataclass
class GpuSpec:
    index: int
    uuid: str
    name: str
    pci_bus_id: str  # canonical 0000:18:00.0
    serial: str = "1650000000000"
    pci_device_id: int = 0x233010DE  # NVML's pciDeviceId: device << 16 | vendor
    memory_total_bytes: int = 80 * 1024**3
    numa_node: int = 0
    # ECC
    ecc_enabled: bool = True
    ecc_volatile_uncorrected: int = 0
    ecc_volatile_corrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    ecc_aggregate_corrected: int = 0
    retired_pages: int = 0
    # Row remapping (nvmlDeviceGetRemappedRows) and the remapper histogram
    remapped_corr: int = 0
    remapped_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    histogram: dict[str, int] = field(
        default_factory=lambda: {"max": 640, "high": 0, "partial": 0, "low": 0, "none": 0}
    )
    # Clocks, throttling, power
    clock_event_reasons: int = CLOCK_EVENT_GPU_IDLE
    # Cumulative violation time in ns per NVML perf policy name (power, thermal, sync_boost,
    # board_limit, low_utilization, reliability, total_app_clocks, total_base_clocks).
    violation_ns: dict[str, int] = field(default_factory=dict)
    sm_clock_mhz: int = 1980
    max_sm_clock_mhz: int = 1980
    power_usage_mw: int = 70_000
    power_limit_mw: int = 700_000
    # Temperatures
    temperature_core_c: int = 32
    temperature_memory_c: int = 36
    slowdown_threshold_c: int = 90
    shutdown_threshold_c: int = 92
    memory_max_threshold_c: int = 95
    # NVLink: one bool per link (True = up) and error counters per (link, counter name)
    nvlink_up: list[bool] = field(default_factory=list)
    nvlink_errors: dict[tuple[int, str], int] = field(default_factory=dict)
    # PCIe
    pcie_gen_current: int = 5
    pcie_gen_max: int = 5
    pcie_width_current: int = 16
    pcie_width_max: int = 16
    pcie_replay_counter: int = 0
    aer_correctable: int = 0
    aer_nonfatal: int = 0
    aer_fatal: int = 0
    # Fabric (NVSwitch systems, H100+)
    fabric_state: int = FABRIC_STATE_COMPLETED
    fabric_status: int = 0  # NVML_SUCCESS
    fabric_supported: bool = True
    mig_enabled: bool = False
    # Processes using the GPU: (pid, used memory bytes, name)
    processes: list[tuple[int, int, str]] = field(default_factory=list)
    # Fault state
    missing: bool = False  # not enumerated by NVML; still on the PCI bus ("fallen off the bus")
    off_bus: bool = False  # gone from the PCI bus too (sysfs entry removed)
    lost: bool = False  # enumerated but every call raises GpuIsLost
    nvml_errors: dict[str, str] = field(default_factory=dict)  # NVML call name -> error name
    # Active-check seams (read by the simulated device worker, see sim/worker.py)
    speed_factor: float = 1.0  # 3.0 = three times slower
    wrong_results: bool = False
    sdc: bool = False
    dcgm_failures: list[str] = field(default_factory=list)  # DCGM test names that fail


@dataclass
class IbPortSpec:
    device: str  # mlx5_0
    port: int  # 1
    pci_bus_id: str
    numa_node: int = 0
    state: str = "ACTIVE"  # sysfs: "4: ACTIVE"
    phys_state: str = "LinkUp"  # sysfs: "5: LinkUp"
    rate_gbit: int = 400
    rate_text: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "InfiniBand"
    link_downed: int = 0
    symbol_error: int = 0
    link_error_recovery: int = 0
    loopback_gbit: float = 392.0  # what a fake ib_write_bw loopback measures
    # An ib-bw-output fault: how the fake ib_write_bw mangles its report (cut=, exit=).
    perftest_output: dict[str, Any] = field(default_factory=dict)
    # Scheduled outages: (start_s, duration_s) relative to the simulation start
    outages: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class NvSwitchSpec:
    index: int
    pci_bus_id: str
    fatal: bool = False


@dataclass
class TimedLine:
    """A kernel-log line that appears ``after`` seconds into the simulation."""

    after_s: float
    message: str
    priority: int = 4  # KERN_WARNING, as NVRM logs Xids


@dataclass(frozen=True)
class SysfsOverride:
    """One sysfs file of the simulated node replaced by content no healthy kernel writes.

    ``shape``: ``text`` (``content`` then a newline, as the kernel ends its attributes),
    ``empty``, ``binary`` (bytes that are not UTF-8), ``dir`` (a directory where the file
    should be), ``missing`` (the file is not there).
    """

    shape: str
    content: str = ""


@dataclass
class NodeSpec:
    profile: str
    hostname: str = "sim-node-0"
    driver_version: str = "550.90.07"
    cuda_driver_version: int = 12040  # nvmlSystemGetCudaDriverVersion: 12.4
    nvml_version: str = "12.550.90.07"
    nvml_library_missing: bool = False
    # NVML call name -> error name, for every GPU and for the calls no GPU is named in
    # (nvmlInit, nvmlDeviceGetCount, nvmlSystemGet*)
    nvml_errors: dict[str, str] = field(default_factory=dict)
    gpus: list[GpuSpec] = field(default_factory=list)
    ib_ports: list[IbPortSpec] = field(default_factory=list)
    nvswitches: list[NvSwitchSpec] = field(default_factory=list)
    kmsg_lines: list[TimedLine] = field(default_factory=list)
    boot_id: str = "6f0c2b1e-8a5d-4c1f-9e7a-2d3b4c5d6e7f"
    uptime_s: float = 86400.0
    dcgm_available: bool = True  # the DCGM host engine answers dcgmi
    dcgmi_installed: bool = True  # the dcgmi executable is in the image
    perftest_available: bool = True
    torch_available: bool = True  # the workers' interpreter has torch (False: the passive image)
    fabric_manager_running: bool = True
    # A dcgm-output fault: what the fake dcgmi prints instead (format, exit, lines, drop, ...).
    dcgm_output: dict[str, Any] = field(default_factory=dict)
    # ("pci:<address>" | "ib:<device>:<port>", file relative to that directory) -> override
    sysfs_overrides: dict[tuple[str, str], SysfsOverride] = field(default_factory=dict)

    def gpu(self, index: int) -> GpuSpec:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"no gpu:{index} on this simulated node ({len(self.gpus)} GPUs)")

    def ib_port(self, device: str, port: int) -> IbPortSpec:
        for p in self.ib_ports:
            if p.device == device and p.port == port:
                return p
        raise KeyError(f"no ib:{device}:{port} on this simulated node")

    def nvswitch(self, index: int) -> NvSwitchSpec:
        for s in self.nvswitches:
            if s.index == index:
                return s
        raise KeyError(f"no nvswitch:{index} on this simulated node")
