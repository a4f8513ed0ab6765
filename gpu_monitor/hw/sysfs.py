"""Read PCI devices and RDMA ports from sysfs, below ``HostPaths.sysfs``.

The pcie, pcie_aer, rdma_ports and topology checks need the same few facts the kernel exports
as small text files: a PCI function's identity, NUMA node, link speed/width and AER counters
(``bus/pci/devices/<addr>/``), and an RDMA port's state, rate and counters
(``class/infiniband/<dev>/ports/<n>/``). This module turns those files into frozen values and
leaves every judgement to the checks.

Contract (what callers may rely on):

1. Nothing raises from the list functions. A file that does not exist gives ``None`` for its
   field (older kernels and other drivers lack many attributes; that is "not exported", not a
   fault). A file that exists but cannot be read (permission, I/O error) or holds content we
   cannot parse gives ``None`` *and* a ``SysfsReadError`` in the value's ``errors``, so a check
   can report ``unknown`` for that target instead of a wrong ``ok``.
2. A missing or unlistable root directory (``bus/pci/devices``, ``class/infiniband``) gives an
   empty list; ``pci_available()`` / ``infiniband_available()`` (and the ``*_unavailable_reason``
   twins) tell "sysfs not mounted / not readable" apart from "no such device on this node".
3. Devices that disappear between listing and reading (hot unplug, a GPU falling off the bus,
   the simulated node rewriting its tree) are skipped, never half-reported.
4. Every read goes through ``open`` in this module (``_read_bytes``): the one I/O boundary, so
   tests can inject ``PermissionError`` even when they run as root.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.model import canonical_pci

T = TypeVar("T")

NVIDIA_VENDOR = 0x10DE
MELLANOX_VENDOR = 0x15B3

# PCI base class + subclass (the upper 16 bits of the 24-bit ``class`` attribute).
PCI_CLASS_VGA = 0x0300
PCI_CLASS_3D = 0x0302
PCI_CLASS_BRIDGE_OTHER = 0x0680  # NVSwitch functions enumerate as "Bridge: NVIDIA ... 22a3"
PCI_CLASS_ETHERNET = 0x0200
PCI_CLASS_INFINIBAND = 0x0207

# Transfer rate per lane (GT/s) -> PCIe generation. The kernel prints these values in
# ``current_link_speed``/``max_link_speed`` (pci_speed_string: "2.5 GT/s PCIe" ... "64.0 GT/s
# PCIe"; kernels before 5.x wrote "2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s").
PCIE_GEN_BY_GTS: Mapping[float, int] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
PCIE_GTS_BY_GEN: Mapping[int, float] = {gen: gts for gts, gen in PCIE_GEN_BY_GTS.items()}

# A sysfs attribute is at most one page; AER files are the longest we read (< 1 KiB).
_MAX_READ = 64 * 1024

_SPEED_RE = re.compile(r"^(?P<gts>\d+(?:\.\d+)?)\s*GT/s(?:\s+PCIe)?$")
_IB_STATE_RE = re.compile(r"^(?P<code>\d+):\s*(?P<name>\S.*)$")
_IB_RATE_RE = re.compile(r"^(?P<gbit>\d+(?:\.\d+)?)\s*Gb/sec\b")
# Counters some drivers cannot read (iWARP without a performance management agent).
_COUNTER_NA_RE = re.compile(r"^N/A\b")


# --- values ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SysfsReadError:
    """One attribute that exists but could not be read or understood.

    ``kind`` is ``permission`` (EACCES/EPERM), ``io`` (any other OS error: EIO from a dead
    device, ENODEV, ...) or ``junk`` (content that does not parse). It is a value kept on the
    device it belongs to, not an exception: the list functions never raise.
    """

    path: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class AerCounters:
    """One ``aer_dev_{correctable,nonfatal,fatal}`` file.

    ``counters`` maps each error type the kernel lists (``RxErr``, ``BadTLP``, ``CmpltTO``, ...)
    to its count since boot; ``total`` is the ``TOTAL_ERR_*`` line (the sum when a kernel omits
    it). Which types appear depends on the kernel version, so checks should use ``total``.
    """

    counters: Mapping[str, int]
    total: int


@dataclass(frozen=True)
class PciDevice:
    """One PCI function as sysfs shows it. ``None`` = attribute absent or unreadable."""

    address: str  # canonical 0000:3b:00.0
    vendor: int | None = None
    device: int | None = None
    class_code: int | None = None  # 24 bits: 0x030200 = 3D controller
    numa_node: int | None = None  # sysfs -1 (no NUMA affinity) becomes None
    current_link_speed_gts: float | None = None
    max_link_speed_gts: float | None = None
    current_link_width: int | None = None
    max_link_width: int | None = None
    driver: str | None = None  # basename of the ``driver`` symlink (nvidia, mlx5_core, ...)
    aer_correctable: AerCounters | None = None
    aer_nonfatal: AerCounters | None = None
    aer_fatal: AerCounters | None = None
    errors: tuple[SysfsReadError, ...] = ()

    @property
    def class_base(self) -> int | None:
        """Base class + subclass, e.g. 0x0302 for a 3D controller."""
        return None if self.class_code is None else self.class_code >> 8

    @property
    def current_link_gen(self) -> int | None:
        return pcie_gen(self.current_link_speed_gts)

    @property
    def max_link_gen(self) -> int | None:
        return pcie_gen(self.max_link_speed_gts)

    @property
    def speed_downgraded(self) -> bool | None:
        """Trained below what both ends support; ``None`` when either side is unknown."""
        cur, top = self.current_link_speed_gts, self.max_link_speed_gts
        if cur is None or top is None:
            return None
        return cur < top

    @property
    def width_downgraded(self) -> bool | None:
        cur, top = self.current_link_width, self.max_link_width
        if cur is None or top is None:
            return None
        return cur < top

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.class_base in (PCI_CLASS_VGA, PCI_CLASS_3D)

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.class_base == PCI_CLASS_BRIDGE_OTHER


@dataclass(frozen=True)
class IbPort:
    """One RDMA port (``class/infiniband/<device>/ports/<port>``).

    ``state``/``phys_state`` are the kernel's names ("ACTIVE", "LinkUp") with their numeric
    codes alongside. ``counters`` holds every readable file of ``counters/`` as an int;
    ``counters_unavailable`` names those the driver reports as "N/A (no PMA)" (iWARP devices),
    which are not errors. ``hw_counters`` is ``None`` when the driver has no such directory.
    ``pci_address``/``numa_node`` come through the ``device`` symlink (absent for software
    devices such as rxe).
    """

    device: str
    port: int
    state: str | None = None
    state_code: int | None = None
    phys_state: str | None = None
    phys_state_code: int | None = None
    rate_gbit: float | None = None
    rate_text: str | None = None
    link_layer: str | None = None
    counters: Mapping[str, int] | None = None
    counters_unavailable: tuple[str, ...] = ()
    hw_counters: Mapping[str, int] | None = None
    pci_address: str | None = None
    numa_node: int | None = None
    errors: tuple[SysfsReadError, ...] = ()

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def link_up(self) -> bool:
        return self.phys_state == "LinkUp"

    def counter(self, name: str) -> int | None:
        """A ``counters/`` value, ``None`` when absent, unreadable or N/A."""
        return None if self.counters is None else self.counters.get(name)


# --- pure parsers (each raises ValueError on content it does not understand) -----------------


def parse_hex(text: str) -> int:
    """``0x10de`` -> 0x10de (vendor, device, class attributes)."""
    t = text.strip()
    if not t.lower().startswith("0x"):
        raise ValueError(f"not a hex attribute: {text!r}")
    return int(t, 16)


def parse_int(text: str) -> int:
    t = text.strip()
    if not re.fullmatch(r"-?\d+", t):
        raise ValueError(f"not an integer: {text!r}")
    return int(t)


def parse_numa_node(text: str) -> int | None:
    """``-1`` means the device has no NUMA affinity (single-node machines, many VMs)."""
    node = parse_int(text)
    return None if node < 0 else node


def parse_link_speed(text: str) -> float | None:
    """``32.0 GT/s PCIe`` -> 32.0; ``Unknown`` (link down or not PCIe) -> None."""
    t = text.strip()
    if t.lower().startswith("unknown"):
        return None
    m = _SPEED_RE.match(t)
    if not m:
        raise ValueError(f"not a PCIe link speed: {text!r}")
    return float(m.group("gts"))


def pcie_gen(gts: float | None) -> int | None:
    """PCIe generation for a per-lane rate, ``None`` for unknown or non-standard rates."""
    if gts is None:
        return None
    return PCIE_GEN_BY_GTS.get(float(gts))


def parse_aer(text: str) -> AerCounters:
    """``RxErr 0`` ... ``TOTAL_ERR_COR 2`` (one ``name count`` per line) -> AerCounters.

    Kernels before 5.x printed multi-word names (``Receiver Error 2``, as in the kernel's own
    ABI document); the count is always the last token, the name everything before it.
    """
    counters: dict[str, int] = {}
    total: int | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        head, _, count = line.rpartition(" ")
        name = "_".join(head.split())
        if not name or not count.isdigit():
            raise ValueError(f"not an AER counter line: {line!r}")
        value = int(count)
        if name.startswith("TOTAL_"):
            total = value
        else:
            counters[name] = value
    if not counters and total is None:
        raise ValueError("empty AER counter file")
    return AerCounters(counters=counters, total=sum(counters.values()) if total is None else total)


def parse_ib_state(text: str) -> tuple[str, int]:
    """``4: ACTIVE`` -> ("ACTIVE", 4); ``5: LinkUp`` -> ("LinkUp", 5); ``7: Phy Test`` too."""
    m = _IB_STATE_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an RDMA port state: {text!r}")
    return m.group("name").strip(), int(m.group("code"))


def parse_ib_rate(text: str) -> float:
    """``400 Gb/sec (4X NDR)`` -> 400.0; ``2.5 Gb/sec (1X SDR)`` -> 2.5."""
    m = _IB_RATE_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an RDMA port rate: {text!r}")
    return float(m.group("gbit"))


def parse_counter(text: str) -> int | None:
    """A port counter; ``None`` for the driver's "N/A (no PMA)"."""
    t = text.strip()
    if _COUNTER_NA_RE.match(t):
        return None
    if not t.isdigit():
        raise ValueError(f"not a counter value: {text!r}")
    return int(t)


# --- the I/O boundary ------------------------------------------------------------------------


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(_MAX_READ)


class _Attrs:
    """Reads one device's attributes, turning failures into ``None`` plus collected errors."""

    def __init__(self) -> None:
        self.errors: list[SysfsReadError] = []

    def text(self, path: str) -> str | None:
        try:
            data = _read_bytes(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError as e:
            self.errors.append(SysfsReadError(path, "permission", e.strerror or str(e)))
            return None
        except OSError as e:
            self.errors.append(SysfsReadError(path, "io", e.strerror or str(e)))
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.errors.append(SysfsReadError(path, "junk", f"not text: {data[:32]!r}"))
            return None

    def parsed(self, path: str, parser: Callable[[str], T]) -> T | None:
        text = self.text(path)
        if text is None:
            return None
        try:
            return parser(text)
        except ValueError as e:
            self.errors.append(SysfsReadError(path, "junk", str(e)))
            return None

    def link_name(self, path: str) -> str | None:
        """Basename of a symlink's target (``driver`` -> ``nvidia``); None when not a link."""
        try:
            return os.path.basename(os.readlink(path).rstrip("/"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno == errno.EINVAL:  # exists but is not a symlink
                return None
            kind = "permission" if isinstance(e, PermissionError) else "io"
            self.errors.append(SysfsReadError(path, kind, e.strerror or str(e)))
            return None


def _natural_key(name: str) -> tuple[tuple[int, int, str], ...]:
    """mlx5_2 before mlx5_10 (and mlx5_9 before mlx5_bond_0, without comparing int to str)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p)
                 for p in re.split(r"(\d+)", name) if p)


@dataclass(frozen=True)
class _Listing:
    """A directory's entries, or why there are none (``kind``: missing, permission, io)."""

    names: tuple[str, ...] | None
    kind: str = ""
    reason: str = ""


def _listdir(path: str) -> _Listing:
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return _Listing(None, "missing", f"{path} does not exist")
    except PermissionError:
        return _Listing(None, "permission", f"{path} is not readable (permission denied)")
    except OSError as e:
        return _Listing(None, "io", f"{path} cannot be listed: {e.strerror or e}")
    # Real sysfs has no dot files; writers of simulated trees use them for atomic temp files.
    # Fixed-width lower-case PCI addresses sort correctly as text; device names use _natural_key.
    return _Listing(tuple(sorted(n for n in names if not n.startswith("."))))


# --- the reader ------------------------------------------------------------------------------


class SysfsReader:
    """PCI functions and RDMA ports of the host whose sysfs is mounted at ``paths.sysfs``."""

    def __init__(self, paths: HostPaths) -> None:
        self._paths = paths

    # --- availability ----------------------------------------------------------------------

    def pci_unavailable_reason(self) -> str:
        """Empty when ``bus/pci/devices`` can be listed; else why not (sysfs not mounted...)."""
        return _listdir(self._paths.sys("bus", "pci", "devices")).reason

    def pci_available(self) -> bool:
        return not self.pci_unavailable_reason()

    def infiniband_unavailable_reason(self) -> str:
        """Empty when ``class/infiniband`` can be listed. The directory is absent on nodes
        without RDMA drivers loaded, so callers usually treat this as "no RDMA device"."""
        return _listdir(self._paths.sys("class", "infiniband")).reason

    def infiniband_available(self) -> bool:
        return not self.infiniband_unavailable_reason()

    # --- PCI -------------------------------------------------------------------------------

    def pci_devices(self, vendor: int | None = None) -> list[PciDevice]:
        """Every PCI function (of ``vendor`` when given), in address order.

        A function whose ``vendor`` file exists but cannot be read is kept even when filtering
        (it carries the error): it may be the device the caller is looking for.
        """
        root = self._paths.sys("bus", "pci", "devices")
        devices: list[PciDevice] = []
        for name in _listdir(root).names or ():
            dev = self._read_pci(os.path.join(root, name), name, vendor)
            if dev is not None:
                devices.append(dev)
        return devices

    def pci_device(self, address: str) -> PciDevice | None:
        """One function by address in any spelling NVML or the kernel log uses; None if absent."""
        addr = canonical_pci(address)
        return self._read_pci(self._paths.sys("bus", "pci", "devices", addr), addr, None)

    def nvidia_gpus(self) -> list[PciDevice]:
        """NVIDIA functions of class VGA (0x0300) or 3D controller (0x0302)."""
        return [d for d in self.pci_devices(NVIDIA_VENDOR) if d.is_nvidia_gpu]

    def nvidia_switches(self) -> list[PciDevice]:
        """NVSwitch functions: NVIDIA vendor, class 0x0680 (other bridge)."""
        return [d for d in self.pci_devices(NVIDIA_VENDOR) if d.is_nvswitch]

    def _read_pci(self, path: str, name: str, vendor: int | None) -> PciDevice | None:
        try:
            address = canonical_pci(name)
        except ValueError:
            return None  # not a PCI function entry
        if not os.path.isdir(path):
            return None  # gone since listing (hot unplug) or a dangling link
        a = _Attrs()
        ven = a.parsed(os.path.join(path, "vendor"), parse_hex)
        if vendor is not None and ven != vendor and not (ven is None and a.errors):
            return None
        dev = PciDevice(
            address=address,
            vendor=ven,
            device=a.parsed(os.path.join(path, "device"), parse_hex),
            class_code=a.parsed(os.path.join(path, "class"), parse_hex),
            numa_node=a.parsed(os.path.join(path, "numa_node"), parse_numa_node),
            current_link_speed_gts=a.parsed(
                os.path.join(path, "current_link_speed"), parse_link_speed
            ),
            max_link_speed_gts=a.parsed(os.path.join(path, "max_link_speed"), parse_link_speed),
            current_link_width=a.parsed(os.path.join(path, "current_link_width"), parse_int),
            max_link_width=a.parsed(os.path.join(path, "max_link_width"), parse_int),
            driver=a.link_name(os.path.join(path, "driver")),
            aer_correctable=a.parsed(os.path.join(path, "aer_dev_correctable"), parse_aer),
            aer_nonfatal=a.parsed(os.path.join(path, "aer_dev_nonfatal"), parse_aer),
            aer_fatal=a.parsed(os.path.join(path, "aer_dev_fatal"), parse_aer),
        )
        if not os.path.isdir(path):
            return None  # vanished while we read it: nothing we read can be trusted
        return _with_errors(dev, a)

    # --- RDMA ------------------------------------------------------------------------------

    def infiniband_ports(self) -> list[IbPort]:
        """Every port of every RDMA device, ordered by device (naturally) and port number."""
        root = self._paths.sys("class", "infiniband")
        ports: list[IbPort] = []
        for dev in sorted(_listdir(root).names or (), key=_natural_key):
            ports.extend(self._read_ib_device(os.path.join(root, dev), dev))
        return ports

    def infiniband_port(self, device: str, port: int) -> IbPort | None:
        for p in self.infiniband_ports():
            if p.device == device and p.port == port:
                return p
        return None

    def _read_ib_device(self, path: str, device: str) -> list[IbPort]:
        port_names = _listdir(os.path.join(path, "ports")).names
        if port_names is None:
            return []
        dev_attrs = _Attrs()
        pci_address: str | None = None
        link = dev_attrs.link_name(os.path.join(path, "device"))
        if link is not None:
            try:
                pci_address = canonical_pci(link)
            except ValueError:
                pci_address = None  # a software device (rxe/siw) sits on a netdev, not PCI
        numa = dev_attrs.parsed(os.path.join(path, "device", "numa_node"), parse_numa_node)
        ports: list[IbPort] = []
        for pname in sorted((n for n in port_names if n.isdigit()), key=int):
            ports.append(
                self._read_ib_port(
                    os.path.join(path, "ports", pname), device, int(pname), pci_address, numa,
                    dev_attrs.errors,
                )
            )
        return ports

    def _read_ib_port(
        self,
        path: str,
        device: str,
        port: int,
        pci_address: str | None,
        numa_node: int | None,
        device_errors: list[SysfsReadError],
    ) -> IbPort:
        a = _Attrs()
        a.errors.extend(device_errors)
        state = a.parsed(os.path.join(path, "state"), parse_ib_state)
        phys = a.parsed(os.path.join(path, "phys_state"), parse_ib_state)
        rate_text = a.text(os.path.join(path, "rate"))
        rate_gbit: float | None = None
        if rate_text is not None:
            rate_text = rate_text.strip()
            try:
                rate_gbit = parse_ib_rate(rate_text)
            except ValueError as e:
                a.errors.append(SysfsReadError(os.path.join(path, "rate"), "junk", str(e)))
        link_layer = a.text(os.path.join(path, "link_layer"))
        counters, unavailable = self._read_counters(os.path.join(path, "counters"), a)
        hw_counters, _ = self._read_counters(os.path.join(path, "hw_counters"), a)
        return IbPort(
            device=device,
            port=port,
            state=state[0] if state else None,
            state_code=state[1] if state else None,
            phys_state=phys[0] if phys else None,
            phys_state_code=phys[1] if phys else None,
            rate_gbit=rate_gbit,
            rate_text=rate_text,
            link_layer=link_layer.strip() if link_layer is not None else None,
            counters=counters,
            counters_unavailable=unavailable,
            hw_counters=hw_counters,
            pci_address=pci_address,
            numa_node=numa_node,
            errors=tuple(a.errors),
        )

    @staticmethod
    def _read_counters(path: str, a: _Attrs) -> tuple[dict[str, int] | None, tuple[str, ...]]:
        listing = _listdir(path)
        if listing.names is None:
            if listing.kind != "missing":
                a.errors.append(SysfsReadError(path, listing.kind, listing.reason))
            return None, ()
        values: dict[str, int] = {}
        unavailable: list[str] = []
        for name in listing.names:
            fpath = os.path.join(path, name)
            if os.path.isdir(fpath):
                continue
            text = a.text(fpath)
            if text is None:
                continue
            try:
                v = parse_counter(text)
            except ValueError as e:
                a.errors.append(SysfsReadError(fpath, "junk", str(e)))
                continue
            if v is None:
                unavailable.append(name)
            else:
                values[name] = v
        return values, tuple(unavailable)


def _with_errors(dev: PciDevice, a: _Attrs) -> PciDevice:
    if not a.errors:
        return dev
    return replace(dev, errors=tuple(a.errors))
