"""Faults of the links a GPU node depends on: PCIe (a downgraded link, AER counters), NVLink,
RDMA ports (down intervals, loopback bandwidth), and any one sysfs file of those devices.

Why together: each changes what the simulated sysfs tree or the fake fabric shows for a
device's link, which the link checks read through the real sysfs readers.
"""

from __future__ import annotations

from gpu_monitor.model import canonical_pci
from gpu_monitor.sim.faults.base import Fault, FaultKind, InjectError, fault_gpu, fault_port
from gpu_monitor.sim.spec import (
    NodeSpec,
    SysfsOverride,
)


def _pcie_downgrade(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    g.pcie_gen_current = f.int("gen", g.pcie_gen_current)
    g.pcie_width_current = f.int("width", g.pcie_width_current)
    if (g.pcie_gen_current, g.pcie_width_current) == (g.pcie_gen_max, g.pcie_width_max):
        raise InjectError(f"{f.text}: give gen= or width= below the maximum "
                          f"(Gen{g.pcie_gen_max} x{g.pcie_width_max})")


def _aer(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    kind = f.choice("kind", ("fatal", "nonfatal", "correctable"))
    n = f.int("count", 1)
    if kind == "fatal":
        g.aer_fatal += n
    elif kind == "nonfatal":
        g.aer_nonfatal += n
    else:
        g.aer_correctable += n


def _nvlink_down(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    link = f.int("link")
    if not 0 <= link < len(g.nvlink_up):
        raise InjectError(f"{f.text}: link {link} out of range (gpu has {len(g.nvlink_up)} links)")
    g.nvlink_up[link] = False


def _nvlink_up(spec: NodeSpec, f: Fault) -> None:
    g = fault_gpu(spec, f)
    g.nvlink_up[f.int("link")] = True


def _port_down(spec: NodeSpec, f: Fault) -> None:
    p = fault_port(spec, f)
    p.outages.append((f.after_s, f.for_s if f.for_s is not None else float("inf")))


def _ib_bw(spec: NodeSpec, f: Fault) -> None:
    p = fault_port(spec, f)
    p.loopback_gbit = f.float("gbit")


SYSFS_SHAPES = ("text", "empty", "binary", "dir", "missing")


def _sysfs(spec: NodeSpec, f: Fault) -> None:
    """Replace one file of a PCI function (gpu:/nvswitch:/pcie: target, file relative to the
    function's directory) or of an RDMA port (ib: target, relative to ``ports/<n>``)."""
    rel = f.params.get("file", "").strip()
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise InjectError(f"{f.text}: file= must name a file below the target's directory, "
                          "e.g. file=max_link_width or file=counters/link_downed")
    shape = f.choice("shape", SYSFS_SHAPES, "text")
    if shape == "text" and "value" not in f.params:
        raise InjectError(f"{f.text}: shape=text needs value=TEXT")
    kind, _, rest = f.target.partition(":")
    try:
        if kind == "ib":
            dev, port = f.ib
            spec.ib_port(dev, port)
            owner = f"ib:{dev}:{port}"
        elif kind == "gpu":
            owner = f"pci:{canonical_pci(spec.gpu(f.gpu_index).pci_bus_id)}"
        elif kind == "nvswitch":
            owner = f"pci:{canonical_pci(spec.nvswitch(int(rest)).pci_bus_id)}"
        else:
            addr = canonical_pci(rest)
            known = {canonical_pci(x.pci_bus_id) for x in (*spec.gpus, *spec.nvswitches,
                                                            *spec.ib_ports)}
            if addr not in known:
                raise KeyError(f"no PCI function {addr} on this simulated node")
            owner = f"pci:{addr}"
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None
    spec.sysfs_overrides[(owner, rel)] = SysfsOverride(shape, f.params.get("value", ""))


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("pcie-downgrade", "gpu", ("gen", "width"), "PCIe link trained below max",
          _pcie_downgrade),
    FaultKind("aer", "gpu", ("kind", "count"), "PCIe AER counter increase", _aer,
          timed=True),
    FaultKind("nvlink-down", "gpu", ("link",), "one NVLink link down", _nvlink_down,
          _nvlink_up, timed=True),
    FaultKind("port-down", "ib", (), "an RDMA port goes down (after=, for=)", _port_down,
          timed=True),
    FaultKind("ib-bw", "ib", ("gbit",), "RDMA loopback bandwidth in Gbit/s", _ib_bw),
    FaultKind("sysfs", "sysfs", ("file", "value", "shape"),
          "one sysfs file of a PCI function or RDMA port holds value=TEXT, or is "
          "shape=empty|binary|dir|missing", _sysfs),
)
