"""Render a ``NodeSpec`` as the sysfs/procfs/dev trees a real node would show.

The simulated node does not fake the readers: it writes files in the formats real kernels use
and hands the real ``SysfsReader``/``ProcfsReader`` a ``HostPaths`` rooted here, so the checks
run exactly the code they run in production. The layout follows the kernel's:

- ``sys/devices/pci<domain>:<bus>/<addr>/`` holds each function's attributes (``vendor``
  "0x10de", ``class`` "0x030200", ``current_link_speed`` "32.0 GT/s PCIe", ``aer_dev_*`` with
  every counter line of a 6.x kernel, ``driver`` -> ``bus/pci/drivers/<name>``);
- ``sys/bus/pci/devices/<addr>`` is a relative symlink to it, as on a real host;
- ``sys/class/infiniband/<dev>`` links to ``<pci dir>/infiniband/<dev>``, whose ``device``
  links back to the PCI function, with ``ports/<n>/{state,phys_state,rate,link_layer,
  counters/*,hw_counters/*}``;
- ``proc/sys/kernel/random/boot_id``, ``proc/uptime``, ``proc/sys/kernel/hostname`` and, for
  every process a ``GpuSpec`` lists, ``proc/<pid>/{comm,cmdline,fd/<n>}`` with fd links to the
  GPU's device node; ``dev/nvidia*`` placeholders (regular files: creating device nodes would
  need root).

GPUs with ``off_bus`` set are absent from ``sys`` (removed from the bus); ``missing`` GPUs (not
enumerated by NVML) stay, as a GPU that fell off the bus keeps its cached sysfs entry. ``update_tree`` writes
only what a fault can change (port state and counters, AER counters, link speed/width, GPU
presence, processes, boot id/uptime), and every write is a temp file plus ``os.replace`` in the
same directory, so a concurrent reader sees the old or the new content, never a torn file. Temp
names start with a dot; the readers skip dot files, as real sysfs has none.

``NodeSpec.sysfs_overrides`` (the ``sysfs`` fault) replace single files of a PCI function or an
RDMA port with content no healthy kernel writes (garbage, empty, not UTF-8, a directory, absent);
every later write of that directory keeps them, so a reader never sees the healthy value between
two renders.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from itertools import count

from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.model import canonical_pci
from gpu_monitor.sim.spec import GpuSpec, IbPortSpec, NodeSpec, NvSwitchSpec, SysfsOverride

NVIDIA_VENDOR = 0x10DE
MELLANOX_VENDOR = 0x15B3
GPU_CLASS = 0x030200  # 3D controller (SXM data-centre GPUs have no display engine)
NVSWITCH_CLASS = 0x068000  # Bridge: NVIDIA Corporation Device 22a3
IB_HCA_CLASS = 0x020700  # Infiniband controller
ETH_NIC_CLASS = 0x020000  # a ConnectX in Ethernet (RoCE) mode
NVSWITCH_DEVICE = 0x22A3  # third-generation NVSwitch (H100/H200 HGX boards)
CONNECTX7_DEVICE = 0x1021  # MT2910 Family [ConnectX-7]
CONNECTX7_HCA_TYPE = "MT4129"

# Link each kind of function trains at on an HGX H100 board (lspci -vvv of a real node):
# NVSwitch Gen4 x2, ConnectX-7 Gen5 x16.
NVSWITCH_LINK = (4, 2)
HCA_LINK = (5, 16)

_GTS_TEXT = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0", 6: "64.0"}

# include/rdma/ib_verbs.h enum ib_port_state and the kernel's phys_state_to_str().
IB_STATE_CODES: Mapping[str, int] = {
    "NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5,
}
IB_PHYS_STATE_CODES: Mapping[str, int] = {
    "Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5,
    "LinkErrorRecovery": 6, "Phy Test": 7,
}

# Counter lines of drivers/pci/pcie/aer.c (Linux 6.x), in the kernel's order.
AER_CORRECTABLE = (
    "RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF",
)
AER_UNCORRECTABLE = (
    "Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF",
    "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked",
    "TLPBlockedErr", "PoisonTLPBlocked",
)
# NodeSpec keeps only totals; they are booked on the error type most often seen for each
# class on GPU nodes (receiver errors, completion timeouts, data-link protocol errors).
AER_SPEC_LINE = {"correctable": "RxErr", "nonfatal": "CmpltTO", "fatal": "DLP"}

# counters/ of an mlx5 port (every file a ConnectX-7 exposes), and a few hw_counters.
IB_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
    "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets",
    "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets",
)
IB_HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err", "out_of_buffer",
    "out_of_sequence", "packet_seq_err", "rnr_nak_retry_err",
)

_tmp_seq = count()


# --- renderers: spec values -> file contents -------------------------------------------------


def render_hex(value: int, width: int = 4) -> str:
    return f"0x{value:0{width}x}\n"


def render_link_speed(gen: int) -> str:
    """PCIe generation -> ``current_link_speed`` text ("32.0 GT/s PCIe"); "Unknown" if 0."""
    if gen in _GTS_TEXT:
        return f"{_GTS_TEXT[gen]} GT/s PCIe\n"
    if gen == 0:
        return "Unknown\n"
    raise ValueError(f"no PCIe generation {gen}")


def render_aer(kind: str, total: int) -> str:
    """An ``aer_dev_<kind>`` file with every real counter line and the ``TOTAL_ERR_*`` line."""
    names = AER_CORRECTABLE if kind == "correctable" else AER_UNCORRECTABLE
    total_name = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL",
                  "fatal": "TOTAL_ERR_FATAL"}[kind]
    booked = AER_SPEC_LINE[kind]
    lines = [f"{n} {total if n == booked else 0}" for n in names]
    lines.append(f"{total_name} {total}")
    return "\n".join(lines) + "\n"


def render_ib_port_state(state: str) -> str:
    """``ACTIVE`` -> "4: ACTIVE" (the kernel's ``ports/<n>/state``)."""
    if state not in IB_STATE_CODES:
        raise ValueError(f"not an RDMA port state: {state!r} (one of {sorted(IB_STATE_CODES)})")
    return f"{IB_STATE_CODES[state]}: {state}\n"


def render_ib_phys_state(phys_state: str) -> str:
    """``LinkUp`` -> "5: LinkUp" (the kernel's ``ports/<n>/phys_state``)."""
    if phys_state not in IB_PHYS_STATE_CODES:
        raise ValueError(f"not an RDMA physical state: {phys_state!r}")
    return f"{IB_PHYS_STATE_CODES[phys_state]}: {phys_state}\n"


def ib_port_dynamic_files(port: IbPortSpec) -> dict[str, str]:
    """Files of ``ports/<n>/`` that a fault can change, relative to that directory."""
    return {
        "state": render_ib_port_state(port.state),
        "phys_state": render_ib_phys_state(port.phys_state),
        "rate": f"{port.rate_text}\n",
        "link_layer": f"{port.link_layer}\n",
        "counters/link_downed": f"{port.link_downed}\n",
        "counters/symbol_error": f"{port.symbol_error}\n",
        "counters/link_error_recovery": f"{port.link_error_recovery}\n",
    }


def _pci_dynamic(gen_cur: int, gen_max: int, width_cur: int, width_max: int,
                 aer: tuple[int, int, int] = (0, 0, 0)) -> dict[str, str]:
    return {
        "current_link_speed": render_link_speed(gen_cur),
        "max_link_speed": render_link_speed(gen_max),
        "current_link_width": f"{width_cur}\n",
        "max_link_width": f"{width_max}\n",
        "aer_dev_correctable": render_aer("correctable", aer[0]),
        "aer_dev_nonfatal": render_aer("nonfatal", aer[1]),
        "aer_dev_fatal": render_aer("fatal", aer[2]),
    }


def _pci_static(vendor: int, device: int, klass: int, numa_node: int | None) -> dict[str, str]:
    return {
        "vendor": render_hex(vendor),
        "device": render_hex(device),
        "class": render_hex(klass, 6),
        "revision": "0xa1\n",
        "numa_node": f"{-1 if numa_node is None else numa_node}\n",
    }


def _gpu_dynamic(g: GpuSpec) -> dict[str, str]:
    return _pci_dynamic(g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current,
                        g.pcie_width_max, (g.aer_correctable, g.aer_nonfatal, g.aer_fatal))


def _gpu_static(g: GpuSpec) -> dict[str, str]:
    device = (g.pci_device_id >> 16) & 0xFFFF
    vendor = g.pci_device_id & 0xFFFF or NVIDIA_VENDOR
    return _pci_static(vendor, device, GPU_CLASS, g.numa_node)


# --- file primitives -------------------------------------------------------------------------


class _Node:
    """What a path should be when it is not a file of text: a directory, or nothing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


DIRECTORY = _Node("DIRECTORY")
ABSENT = _Node("ABSENT")
# The bytes a ``binary`` override writes: not UTF-8 (a lone continuation byte, 0xff).
NOT_UTF8 = b"\xff\xfe\x80\x00garbage\x9c\n"
Content = str | bytes | _Node


def overridden(files: Mapping[str, str], overrides: Mapping[str, SysfsOverride]
               ) -> dict[str, Content]:
    """``files`` with each overridden name replaced by what the override says it holds."""
    out: dict[str, Content] = dict(files)
    for rel, o in overrides.items():
        out[rel] = {"text": o.content + "\n", "empty": "", "binary": NOT_UTF8,
                    "dir": DIRECTORY, "missing": ABSENT}[o.shape]
    return out


def _write_atomic(path: str, content: str) -> None:
    directory, name = os.path.split(path)
    if not os.path.isdir(directory):  # a stat is far cheaper than mkdir's EEXIST round trip
        os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.tmp{os.getpid()}.{next(_tmp_seq)}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(content)
    os.replace(tmp, path)


def _write_atomic_bytes(path: str, content: bytes) -> None:
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.tmp{os.getpid()}.{next(_tmp_seq)}")
    with open(tmp, "wb") as f:
        f.write(content)
    os.replace(tmp, path)


def _sync_node(path: str, content: _Node) -> bool:
    if content is DIRECTORY:
        if os.path.isdir(path) and not os.path.islink(path):
            return False
        _remove(path)
        os.makedirs(path)
        return True
    if not os.path.lexists(path):
        return False
    _remove(path)
    return True


def _sync_file(path: str, content: Content) -> bool:
    """Make ``path`` hold ``content`` unless it already does; True when written."""
    if isinstance(content, _Node):
        return _sync_node(path, content)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)  # an override that made it a directory was lifted
    data = content.encode("utf-8") if isinstance(content, str) else content
    if os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                if f.read() == data:
                    return False
        except (FileNotFoundError, NotADirectoryError):
            pass
    if isinstance(content, str):
        _write_atomic(path, content)
    else:
        _write_atomic_bytes(path, data)
    return True


def _sync_files(directory: str, files: Mapping[str, Content]) -> None:
    for rel, content in files.items():
        _sync_file(os.path.join(directory, rel), content)


def _sync_symlink(path: str, target: str) -> None:
    """Point ``path`` at ``target`` (relative), replacing atomically if it differs."""
    try:
        if os.readlink(path) == target:
            return
    except OSError:
        pass
    directory, name = os.path.split(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.tmp{os.getpid()}.{next(_tmp_seq)}")
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _remove(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


# --- layout ----------------------------------------------------------------------------------


class _Layout:
    """Where each object of the spec lives below ``root``."""

    def __init__(self, root: str, spec: NodeSpec | None = None) -> None:
        self.root = root
        self.paths = HostPaths().under(root)
        self._overrides: dict[str, dict[str, SysfsOverride]] = {}
        for (owner, rel), o in (spec.sysfs_overrides if spec is not None else {}).items():
            self._overrides.setdefault(owner, {})[rel] = o

    def files(self, owner: str, files: Mapping[str, str]) -> dict[str, Content]:
        """``files`` of ``owner`` (``pci:<address>``, ``ib:<device>:<port>``) with the
        ``sysfs`` faults that replace some of them."""
        return overridden(files, self._overrides.get(owner, {}))

    def pci_dir(self, address: str) -> str:
        addr = canonical_pci(address)
        return self.paths.sys("devices", f"pci{addr[:7]}", addr)

    def pci_link(self, address: str) -> str:
        return self.paths.sys("bus", "pci", "devices", canonical_pci(address))

    def ib_dir(self, port: IbPortSpec) -> str:
        return os.path.join(self.pci_dir(port.pci_bus_id), "infiniband", port.device)

    def ib_port_dir(self, port: IbPortSpec) -> str:
        return os.path.join(self.ib_dir(port), "ports", str(port.port))


def _write_pci_function(lay: _Layout, address: str, files: Mapping[str, str],
                        driver: str) -> None:
    addr = canonical_pci(address)
    directory = lay.pci_dir(addr)
    _sync_files(directory, lay.files(f"pci:{addr}", files))
    os.makedirs(lay.paths.sys("bus", "pci", "drivers", driver), exist_ok=True)
    # <sys>/devices/pci0000:18/0000:18:00.0/driver -> ../../../bus/pci/drivers/nvidia
    _sync_symlink(os.path.join(directory, "driver"), f"../../../bus/pci/drivers/{driver}")
    # <sys>/bus/pci/devices/0000:18:00.0 -> ../../../devices/pci0000:18/0000:18:00.0
    _sync_symlink(lay.pci_link(addr), f"../../../devices/pci{addr[:7]}/{addr}")


def _remove_pci_function(lay: _Layout, address: str) -> None:
    # The bus link goes first: a reader listing bus/pci/devices then never finds a half-gone dir.
    _remove(lay.pci_link(address))
    _remove(lay.pci_dir(address))


def _gpu_present(lay: _Layout, g: GpuSpec) -> bool:
    return os.path.lexists(lay.pci_link(g.pci_bus_id))


def _write_gpu(lay: _Layout, g: GpuSpec) -> None:
    _write_pci_function(lay, g.pci_bus_id, {**_gpu_static(g), **_gpu_dynamic(g)}, "nvidia")


def _write_nvswitch(lay: _Layout, s: NvSwitchSpec, numa_node: int | None) -> None:
    gen, width = NVSWITCH_LINK
    files = {**_pci_static(NVIDIA_VENDOR, NVSWITCH_DEVICE, NVSWITCH_CLASS, numa_node),
             **_pci_dynamic(gen, gen, width, width)}
    _write_pci_function(lay, s.pci_bus_id, files, "nvidia-nvswitch")


def _hca_ports(spec: NodeSpec) -> dict[str, list[IbPortSpec]]:
    """PCI function -> its ports (a dual-port HCA is one function with ports 1 and 2)."""
    by_addr: dict[str, list[IbPortSpec]] = {}
    for p in spec.ib_ports:
        by_addr.setdefault(canonical_pci(p.pci_bus_id), []).append(p)
    return by_addr


def _write_hca(lay: _Layout, address: str, ports: list[IbPortSpec]) -> None:
    first = ports[0]
    klass = ETH_NIC_CLASS if first.link_layer == "Ethernet" else IB_HCA_CLASS
    gen, width = HCA_LINK
    files = {**_pci_static(MELLANOX_VENDOR, CONNECTX7_DEVICE, klass, first.numa_node),
             **_pci_dynamic(gen, gen, width, width)}
    _write_pci_function(lay, address, files, "mlx5_core")
    for device in dict.fromkeys(p.device for p in ports):
        dev_ports = [p for p in ports if p.device == device]
        ib_dir = lay.ib_dir(dev_ports[0])
        _sync_files(ib_dir, {"hca_type": f"{CONNECTX7_HCA_TYPE}\n", "fw_ver": "28.39.1002\n",
                             "board_id": "MT_0000000838\n"})
        # <pci dir>/infiniband/mlx5_0/device -> ../../../0000:1a:00.0
        _sync_symlink(os.path.join(ib_dir, "device"), f"../../../{address}")
        # <sys>/class/infiniband/mlx5_0 -> ../../devices/pci0000:1a/0000:1a:00.0/infiniband/..
        _sync_symlink(lay.paths.sys("class", "infiniband", device),
                      f"../../devices/pci{address[:7]}/{address}/infiniband/{device}")
        for p in dev_ports:
            port_dir = lay.ib_port_dir(p)
            static = {f"counters/{c}": "0\n" for c in IB_COUNTERS}
            static.update({f"hw_counters/{c}": "0\n" for c in IB_HW_COUNTERS})
            _sync_files(port_dir, lay.files(f"ib:{p.device}:{p.port}",
                                            {**static, **ib_port_dynamic_files(p)}))


def _nvswitch_numa(spec: NodeSpec) -> int | None:
    """NVSwitches hang off the last socket on HGX boards; follow the GPUs' highest node."""
    nodes = [g.numa_node for g in spec.gpus]
    return max(nodes) if nodes else None


def _write_proc(lay: _Layout, spec: NodeSpec) -> None:
    p = lay.paths
    _sync_file(p.proc("sys", "kernel", "random", "boot_id"), f"{spec.boot_id}\n")
    _sync_file(p.proc("sys", "kernel", "hostname"), f"{spec.hostname}\n")
    # The second field is idle time summed over CPUs; any plausible value will do.
    _sync_file(p.proc("uptime"), f"{spec.uptime_s:.2f} {spec.uptime_s * 16:.2f}\n")
    _sync_processes(lay, spec.gpus, fabric_manager=bool(spec.nvswitches)
                    and spec.fabric_manager_running)


FABRIC_MANAGER_PID = 2101


def _sync_processes(lay: _Layout, gpus: Iterable[GpuSpec], fabric_manager: bool = False) -> None:
    """proc/<pid>/ for every process a GPU lists, with an fd link per GPU it holds, and the
    NVSwitch Fabric Manager daemon on NVSwitch systems while it runs."""
    wanted: dict[int, tuple[str, list[int]]] = {}
    if fabric_manager:
        wanted[FABRIC_MANAGER_PID] = ("nv-fabricmanager", [])
    for g in gpus:
        if g.missing:
            continue
        for pid, _mem, name in g.processes:
            entry = wanted.setdefault(pid, (name, []))
            entry[1].append(g.index)
    proc = lay.paths.procfs
    os.makedirs(proc, exist_ok=True)
    for name in os.listdir(proc):
        if name.isdigit() and int(name) not in wanted:
            _remove(os.path.join(proc, name))
    for pid, (name, indexes) in wanted.items():
        pdir = os.path.join(proc, str(pid))
        _sync_files(pdir, {"comm": f"{name[:15]}\n", "cmdline": f"{name}\0"})
        fd_dir = os.path.join(pdir, "fd")
        os.makedirs(fd_dir, exist_ok=True)
        links = {"0": os.devnull}
        links.update({str(3 + i): lay.paths.device(f"nvidia{idx}")
                      for i, idx in enumerate(sorted(indexes))})
        for fd in os.listdir(fd_dir):
            if fd not in links:
                _remove(os.path.join(fd_dir, fd))
        for fd, target in links.items():
            _sync_symlink(os.path.join(fd_dir, fd), target)


def _write_dev(lay: _Layout, spec: NodeSpec) -> None:
    names = ["nvidiactl", "nvidia-uvm"]
    names += [f"nvidia{g.index}" for g in spec.gpus]
    names += [f"nvidia-nvswitch{s.index}" for s in spec.nvswitches]
    for name in names:
        _sync_file(lay.paths.device(name), "")


# --- public API ------------------------------------------------------------------------------


def write_tree(root: str, spec: NodeSpec) -> HostPaths:
    """Render ``spec`` below ``root`` (created if needed) and return the paths to read it."""
    lay = _Layout(root, spec)
    for sub in (lay.paths.sys("bus", "pci", "devices"), lay.paths.sys("class", "infiniband"),
                lay.paths.procfs, lay.paths.dev):
        os.makedirs(sub, exist_ok=True)
    for g in spec.gpus:
        if g.off_bus:
            _remove_pci_function(lay, g.pci_bus_id)
        else:
            _write_gpu(lay, g)
    numa = _nvswitch_numa(spec)
    for s in spec.nvswitches:
        _write_nvswitch(lay, s, numa)
    for address, ports in _hca_ports(spec).items():
        _write_hca(lay, address, ports)
    _write_proc(lay, spec)
    _write_dev(lay, spec)
    return lay.paths


def update_tree(root: str, spec: NodeSpec) -> HostPaths:
    """Bring a tree from ``write_tree`` up to date with ``spec``, touching only what changed.

    Rewritten (when different): RDMA port state, phys_state, rate, link layer and error
    counters; each GPU's AER counters and link speed/width; GPU presence (a GPU newly
    ``off_bus`` is removed, one that comes back is rendered again); processes; boot id, uptime,
    hostname. Identity attributes (vendor, class, NUMA node, topology) are written once.
    """
    lay = _Layout(root, spec)
    for g in spec.gpus:
        present = _gpu_present(lay, g)
        if g.off_bus:
            if present:
                _remove_pci_function(lay, g.pci_bus_id)
        elif not present:
            _write_gpu(lay, g)
        else:
            _sync_files(lay.pci_dir(g.pci_bus_id),
                        lay.files(f"pci:{canonical_pci(g.pci_bus_id)}", _gpu_dynamic(g)))
    for address, ports in _hca_ports(spec).items():
        if not all(os.path.isdir(lay.ib_port_dir(p)) for p in ports):
            _write_hca(lay, address, ports)  # a port the tree has not seen yet
            continue
        for p in ports:
            _sync_files(lay.ib_port_dir(p),
                        lay.files(f"ib:{p.device}:{p.port}", ib_port_dynamic_files(p)))
    _write_proc(lay, spec)
    return lay.paths
