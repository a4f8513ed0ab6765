"""Which RDMA NIC each GPU is paired with: the PCIe placement read from sysfs and NVML.

One place for the GPU↔NIC pairing: the ``pcie`` check judges it against the profile, and the
fail-fast notice (gpu_monitor/failfast/) asks which GPUs a port serves. On HGX boards a GPU and
its NIC sit behind the same PCIe switch, so their bus numbers are neighbours (GPU
0000:53:00.0, NIC 0000:4f:00.0): the nearest NIC is the one in the same PCI domain and NUMA
node with the closest bus number. This is a heuristic; the reader exposes no switch hierarchy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_monitor.hw.sysfs_values import IbPort
from gpu_monitor.model import canonical_pci


@dataclass(frozen=True)
class NicFunction:
    """One RDMA NIC PCI function and the RDMA device names it carries."""

    address: str
    devices: tuple[str, ...]
    numa_node: int | None


@dataclass(frozen=True)
class GpuPlacement:
    index: int
    pci_bus_id: str | None
    numa_node: int | None


def nic_functions(ports: Iterable[IbPort]) -> list[NicFunction]:
    """The NIC PCI functions behind ``ports`` (software RDMA, rxe/siw, has none: left out)."""
    by_addr: dict[str, list[str]] = {}
    numa: dict[str, int | None] = {}
    for port in ports:
        if not port.pci_address:
            continue
        names = by_addr.setdefault(port.pci_address, [])
        if port.device not in names:
            names.append(port.device)
        numa[port.pci_address] = port.numa_node
    return [NicFunction(a, tuple(d), numa.get(a)) for a, d in sorted(by_addr.items())]


def nearest_nic(gpu_address: str | None, numa: int | None,
                nics: Iterable[NicFunction]) -> str | None:
    """The RDMA device closest to the GPU (its NIC function's first device name), or None."""
    nics = list(nics)
    if not gpu_address or not nics:
        return None
    addr = canonical_pci(gpu_address)
    domain, bus = addr[:4], int(addr[5:7], 16)
    candidates = [n for n in nics if n.address[:4] == domain
                  and (numa is None or n.numa_node is None or n.numa_node == numa)]
    if not candidates:
        return None
    best = min(candidates, key=lambda n: (abs(int(n.address[5:7], 16) - bus), n.address))
    return best.devices[0]


def gpus_paired_to(device: str, gpus: Iterable[GpuPlacement],
                   nics: Iterable[NicFunction]) -> list[int]:
    """The indices of the GPUs whose nearest NIC function carries RDMA device ``device``."""
    nics = list(nics)
    function = next((n for n in nics if device in n.devices), None)
    if function is None:
        return []
    return [g.index for g in gpus
            if nearest_nic(g.pci_bus_id, g.numa_node, nics) == function.devices[0]]


def read_pairing(nvml, sysfs) -> dict[str, list[int]]:
    """Every RDMA device name on the node mapped to the indices of the GPUs paired with it,
    read now from NVML (``NvmlReader``: PCI bus ids, NUMA nodes) and sysfs (``SysfsReader``).
    An NVML or sysfs error propagates: a caller that cannot read the pairing must say so."""
    gpus = [GpuPlacement(g.index, g.pci_bus_id, nvml.numa_node(g.index)) for g in nvml.gpus()]
    nics = nic_functions(sysfs.infiniband_ports())
    return {device: gpus_paired_to(device, gpus, nics)
            for nic in nics for device in nic.devices}
