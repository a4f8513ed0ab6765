"""Read PCI devices and RDMA ports from sysfs, below ``HostPaths.sysfs``.

The pcie, pcie_aer, rdma_ports and topology checks need the same few facts the kernel exports
as small text files: a PCI function's identity, NUMA node, link speed/width and AER counters
(``bus/pci/devices/<addr>/``), and an RDMA port's state, rate and counters
(``class/infiniband/<dev>/ports/<n>/``). This module turns those files into frozen values and
leaves every judgement to the checks.

Contract (what callers may rely on):

1. Nothing raises from the list functions. A file that does not exist gives ``None`` for its
   field (older kernels and other drivers lack many attributes; that is "not exported", not a
   fault). A file that exists but cannot be read (permission, I/O error, a directory) or holds
   content we cannot parse gives ``None`` *and* a ``SysfsReadError`` in the value's ``errors``,
   so a check can report ``unknown`` for that target instead of a wrong ``ok``.
   Exceptions to "absent is fine", where the kernel always exports a file or a whole group
   together: a PCI function's ``vendor``/``device``/``class``; its link group
   (``{current,max}_link_{speed,width}``) and its AER group (``aer_dev_*``) when any member is
   there; an RDMA port's ``state``/``phys_state``/``rate``; ``counters/link_downed`` when
   ``counters/`` holds anything. One of those missing is a ``missing`` error.
2. Every parser gives its value a domain (a PCIe width is 0..32 lanes, a speed one of PCIe's
   rates, a NUMA node -1..1023, a counter an unsigned 64-bit number, a port state a code with the
   kernel's name for it, an RDMA rate 0 < r <= ``MAX_RDMA_RATE_GBIT``) and raises
   ``SysfsParseError`` (a ``ValueError``), naming the content, for anything outside it: a
   negative width, a NaN, 10^30 errors, a name that does not match its code.
3. A missing or unlistable root directory (``bus/pci/devices``, ``class/infiniband``) gives an
   empty list; ``pci_available()`` / ``infiniband_available()`` (and the ``*_unavailable_reason``
   twins) tell "sysfs not mounted / not readable" apart from "no such device on this node".
4. Devices that disappear between listing and reading (hot unplug, a GPU falling off the bus,
   the simulated node rewriting its tree) are skipped, never half-reported.
5. Every read goes through ``open`` in this module (``_read_bytes``): the one I/O boundary, so
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
# PCIe"; kernels before 5.x wrote "2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s"; PCIe 7.0 is 128).
PCIE_GEN_BY_GTS: Mapping[float, int] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6,
                                        128.0: 7}
PCIE_GTS_BY_GEN: Mapping[int, float] = {gen: gts for gts, gen in PCIE_GEN_BY_GTS.items()}
PCIE_MAX_WIDTH = 32  # x32 is the widest link the PCIe specification defines
MAX_NUMA_NODE = 1023  # MAX_NUMNODES = 1 << CONFIG_NODES_SHIFT, at most 10 bits
# No RDMA link is faster: IB XDR 4X is 800 Gb/s (12X XDR 2400), Ethernet ports 1.6 Tb/s.
MAX_RDMA_RATE_GBIT = 3200.0
U64_MAX = 2**64 - 1  # sysfs counters are u64 (AER counters, IB port counters)

# include/rdma/ib_verbs.h enum ib_port_state, as drivers/infiniband/core/sysfs.c names them
# ("UNKNOWN" beyond the table); phys_state from ib_port_phys_state_str ("<unknown>" beyond).
IB_PORT_STATES: Mapping[int, str] = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE",
                                     5: "ACTIVE_DEFER"}
IB_PHYS_STATES: Mapping[int, str] = {1: "Sleep", 2: "Polling", 3: "Disabled",
                                     4: "PortConfigurationTraining", 5: "LinkUp",
                                     6: "LinkErrorRecovery", 7: "Phy Test"}

# Attribute groups the kernel exports whole (pcie_dev_attr_group, aer_stats_attr_group): when
# one member is there, all must be.
LINK_ATTRS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
AER_ATTRS = ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")

# A sysfs attribute is at most one page; AER files are the longest we read (< 1 KiB).
_MAX_READ = 64 * 1024

_SPEED_RE = re.compile(r"^(?P<gts>[0-9]{1,3}(?:\.[0-9]{1,2})?)\s*GT/s(?:\s+PCIe)?$")
_IB_STATE_RE = re.compile(r"^(?P<code>[0-9]{1,3}):\s*(?P<name>\S.*)$")
_IB_RATE_RE = re.compile(r"^(?P<gbit>[0-9]{1,6}(?:\.[0-9]{1,3})?)\s*Gb/sec(?:\s|$)")
_INT_RE = re.compile(r"^-?[0-9]{1,20}$")
_COUNT_RE = re.compile(r"^[0-9]{1,20}$")
LINK_DOWNED = os.path.join("counters", "link_downed")
# Counters some drivers cannot read (iWARP without a performance management agent).
_COUNTER_NA_RE = re.compile(r"^N/A\b")


class SysfsParseError(ValueError):
    """Content of a sysfs attribute that is not a value of its kind (garbage, out of domain).

    The one error every parser below raises; the reader turns it into a ``junk``
    ``SysfsReadError`` naming the file.
    """


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


def _below(current: float | None, top: float | None) -> bool | None:
    """A link trained below its top speed or width; ``None`` when either is unknown."""
    if current is None or top is None:
        return None
    return current < top


class _ReadFromFiles:
    """A value read from several sysfs files, keeping the reads that failed (``errors``), so a
    check can ask about just the files it judges."""

    errors: tuple[SysfsReadError, ...]

    def errors_for(self, *names: str) -> tuple[SysfsReadError, ...]:
        """The read errors of the named attributes (file basenames), for a check that judges
        only those; every error when no name is given."""
        if not names:
            return self.errors
        return tuple(e for e in self.errors if os.path.basename(e.path) in names)


@dataclass(frozen=True)
class PciDevice(_ReadFromFiles):
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
        return _below(self.current_link_speed_gts, self.max_link_speed_gts)

    @property
    def width_downgraded(self) -> bool | None:
        """Trained narrower than both ends support; ``None`` when either side is unknown."""
        return _below(self.current_link_width, self.max_link_width)

    @property
    def unidentified(self) -> bool:
        """Its vendor or class could not be read: it may be the GPU or NIC a caller looks for."""
        return bool(self.errors_for("vendor", "class"))

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.class_base in (PCI_CLASS_VGA, PCI_CLASS_3D)

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.class_base == PCI_CLASS_BRIDGE_OTHER


@dataclass(frozen=True)
class IbPort(_ReadFromFiles):
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


# --- pure parsers (each raises SysfsParseError on content outside its domain) ----------------


def _one_line(text: str, what: str) -> str:
    t = text.strip()
    if not t:
        raise SysfsParseError(f"empty {what}")
    return t


def _bounded(value: int, lo: int | None, hi: int | None, text: str, what: str) -> int:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"{'' if lo is None else lo}..{'' if hi is None else hi}"
        raise SysfsParseError(f"{what} out of range ({span}): {text.strip()!r}")
    return value


def parse_hex(text: str, bits: int = 32) -> int:
    """``0x10de`` -> 0x10de (vendor and device are 16 bits, ``class`` 24)."""
    t = _one_line(text, "hex attribute")
    if not re.fullmatch(r"0[xX][0-9a-fA-F]{1,16}", t):
        raise SysfsParseError(f"not a hex attribute: {text!r}")
    return _bounded(int(t, 16), 0, (1 << bits) - 1, text, f"{bits}-bit hex attribute")


def parse_pci_id(text: str) -> int:
    """``vendor`` / ``device``: a 16-bit PCI id."""
    return parse_hex(text, 16)


def parse_pci_class(text: str) -> int:
    """``class``: base class, subclass and programming interface, 24 bits."""
    return parse_hex(text, 24)


def parse_int(text: str, lo: int | None = None, hi: int | None = None) -> int:
    """A decimal integer, within ``lo..hi`` when given."""
    t = _one_line(text, "integer")
    if not _INT_RE.match(t):
        raise SysfsParseError(f"not an integer: {text!r}")
    return _bounded(int(t), lo, hi, text, "integer")


def parse_link_width(text: str) -> int:
    """``current_link_width``/``max_link_width``: lanes, 0 (not trained) to 32."""
    return parse_int(text, 0, PCIE_MAX_WIDTH)


def parse_numa_node(text: str) -> int | None:
    """``-1`` means the device has no NUMA affinity (single-node machines, many VMs)."""
    node = parse_int(text, -1, MAX_NUMA_NODE)
    return None if node < 0 else node


def parse_link_speed(text: str) -> float | None:
    """``32.0 GT/s PCIe`` -> 32.0; ``Unknown`` (link down or not PCIe) -> None.

    Only PCIe's own rates are speeds: ``3 GT/s`` or ``99999 GT/s`` is junk, not Gen-unknown.
    """
    t = text.strip()
    if t.lower().startswith("unknown"):
        return None
    m = _SPEED_RE.match(t)
    if not m:
        raise SysfsParseError(f"not a PCIe link speed: {text!r}")
    gts = float(m.group("gts"))
    if gts not in PCIE_GEN_BY_GTS:
        raise SysfsParseError(f"not a PCIe transfer rate: {text!r}")
    return gts


def pcie_gen(gts: float | None) -> int | None:
    """PCIe generation for a per-lane rate, ``None`` for unknown or non-standard rates."""
    if gts is None:
        return None
    return PCIE_GEN_BY_GTS.get(float(gts))


def parse_aer(text: str) -> AerCounters:
    """``RxErr 0`` ... ``TOTAL_ERR_COR 2`` (one ``name count`` per line) -> AerCounters.

    Kernels before 5.x printed multi-word names (``Receiver Error 2``, as in the kernel's own
    ABI document); the count is always the last token, the name everything before it. Counts are
    the kernel's u64s: a sign, a fraction or more than 2^64 - 1 is junk.
    """
    counters: dict[str, int] = {}
    total: int | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        head, _, count = line.rpartition(" ")
        name = "_".join(head.split())
        if not name or not _COUNT_RE.match(count):
            raise SysfsParseError(f"not an AER counter line: {line[:80]!r}")
        value = _bounded(int(count), 0, U64_MAX, line, "AER count")
        if name.startswith("TOTAL_"):
            total = value
        else:
            counters[name] = value
    if not counters and total is None:
        raise SysfsParseError("empty AER counter file")
    return AerCounters(counters=counters, total=sum(counters.values()) if total is None else total)


def parse_ib_state(text: str, names: Mapping[int, str] | None = None,
                   unknown: str = "UNKNOWN") -> tuple[str, int]:
    """``4: ACTIVE`` -> ("ACTIVE", 4); ``5: LinkUp`` -> ("LinkUp", 5); ``7: Phy Test`` too.

    With ``names`` (the kernel's table for the attribute) a known code must carry its own name
    (``4: DOWN`` is junk) and a code beyond the table the kernel's ``unknown`` word.
    """
    m = _IB_STATE_RE.match(text.strip())
    if not m:
        raise SysfsParseError(f"not an RDMA port state: {text!r}")
    name, code = m.group("name").strip(), int(m.group("code"))
    if names is not None and name != names.get(code, unknown):
        raise SysfsParseError(f"RDMA port state code {code} does not name {name!r}: {text!r}")
    return name, code


def parse_ib_port_state(text: str) -> tuple[str, int]:
    """``ports/<n>/state``: ``4: ACTIVE``."""
    return parse_ib_state(text, IB_PORT_STATES, "UNKNOWN")


def parse_ib_phys_state(text: str) -> tuple[str, int]:
    """``ports/<n>/phys_state``: ``5: LinkUp``."""
    return parse_ib_state(text, IB_PHYS_STATES, "<unknown>")


def parse_ib_rate(text: str) -> float:
    """``400 Gb/sec (4X NDR)`` -> 400.0; ``2.5 Gb/sec (1X SDR)`` -> 2.5."""
    m = _IB_RATE_RE.match(text.strip())
    if not m:
        raise SysfsParseError(f"not an RDMA port rate: {text!r}")
    gbit = float(m.group("gbit"))
    if not 0 < gbit <= MAX_RDMA_RATE_GBIT:
        raise SysfsParseError(f"RDMA port rate out of range (0, {MAX_RDMA_RATE_GBIT:g}] Gb/s: "
                              f"{text!r}")
    return gbit


def parse_counter(text: str) -> int | None:
    """A port counter (u64); ``None`` for the driver's "N/A (no PMA)"."""
    t = text.strip()
    if _COUNTER_NA_RE.match(t):
        return None
    if not _COUNT_RE.match(t):
        raise SysfsParseError(f"not a counter value: {text!r}")
    return _bounded(int(t), 0, U64_MAX, text, "counter")


# --- the I/O boundary ------------------------------------------------------------------------


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(_MAX_READ)


class _Attrs:
    """Reads one device's attributes, turning failures into ``None`` plus collected errors."""

    def __init__(self) -> None:
        self.errors: list[SysfsReadError] = []

    def text(self, path: str, required: bool = False) -> str | None:
        """The file's text; ``None`` when absent (an error too when ``required``)."""
        try:
            data = _read_bytes(path)
        except (FileNotFoundError, NotADirectoryError):
            if required:
                self.errors.append(SysfsReadError(path, "missing", "not exported, although the "
                                                  "kernel exports it with its siblings"))
            return None
        except PermissionError as e:
            self.errors.append(SysfsReadError(path, "permission", e.strerror or str(e)))
            return None
        except OSError as e:  # EIO from a dead device, EISDIR, ENODEV, ...
            self.errors.append(SysfsReadError(path, "io", e.strerror or str(e)))
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.errors.append(SysfsReadError(path, "junk", f"not text: {data[:32]!r}"))
            return None

    def parsed(self, path: str, parser: Callable[[str], T], required: bool = False) -> T | None:
        text = self.text(path, required)
        if text is None:
            return None
        try:
            return parser(text)
        except ValueError as e:  # SysfsParseError; ValueError from any parser a caller passes
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

        def attr(name: str, parser: Callable[[str], T], required: bool) -> T | None:
            return a.parsed(os.path.join(path, name), parser, required)

        link = _group_present(path, LINK_ATTRS)
        aer = _group_present(path, AER_ATTRS)
        ven = attr("vendor", parse_pci_id, True)
        if vendor is not None and ven != vendor and not (ven is None and a.errors):
            return None
        dev = PciDevice(
            address=address,
            vendor=ven,
            device=attr("device", parse_pci_id, True),
            class_code=attr("class", parse_pci_class, True),
            numa_node=attr("numa_node", parse_numa_node, False),
            current_link_speed_gts=attr("current_link_speed", parse_link_speed, link),
            max_link_speed_gts=attr("max_link_speed", parse_link_speed, link),
            current_link_width=attr("current_link_width", parse_link_width, link),
            max_link_width=attr("max_link_width", parse_link_width, link),
            driver=a.link_name(os.path.join(path, "driver")),
            aer_correctable=attr("aer_dev_correctable", parse_aer, aer),
            aer_nonfatal=attr("aer_dev_nonfatal", parse_aer, aer),
            aer_fatal=attr("aer_dev_fatal", parse_aer, aer),
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

    def poll_ib_port(self, port: IbPort) -> IbPort:
        """``port`` with the four files a steady-state poll needs read again: ``state``,
        ``phys_state``, ``rate`` and ``counters/link_downed`` (required where discovery found
        it). Nothing raises; ``errors`` says what could not be read, as for a full walk."""
        path = self._paths.sys("class", "infiniband", port.device, "ports", str(port.port))
        a = _Attrs()
        state = a.parsed(os.path.join(path, "state"), parse_ib_port_state, True)
        phys = a.parsed(os.path.join(path, "phys_state"), parse_ib_phys_state, True)
        rate_text, rate_gbit = self._rate(path, a)
        counters: dict[str, int] = {}
        if port.counters is not None and "link_downed" in port.counters:
            downed = a.parsed(os.path.join(path, LINK_DOWNED), parse_counter, True)
            if downed is not None:
                counters["link_downed"] = downed
        return replace(
            port, state=state[0] if state else None, state_code=state[1] if state else None,
            phys_state=phys[0] if phys else None, phys_state_code=phys[1] if phys else None,
            rate_gbit=rate_gbit, rate_text=rate_text, counters=counters, errors=tuple(a.errors))

    @staticmethod
    def _rate(path: str, a: _Attrs) -> tuple[str | None, float | None]:
        rate_path = os.path.join(path, "rate")
        text = a.text(rate_path, True)
        if text is None:
            return None, None
        text = text.strip()
        try:
            return text, parse_ib_rate(text)
        except ValueError as e:
            a.errors.append(SysfsReadError(rate_path, "junk", str(e)))
            return text, None

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
        state = a.parsed(os.path.join(path, "state"), parse_ib_port_state, True)
        phys = a.parsed(os.path.join(path, "phys_state"), parse_ib_phys_state, True)
        rate_text, rate_gbit = self._rate(path, a)
        link_layer = a.text(os.path.join(path, "link_layer"))
        counters, unavailable = self._read_counters(os.path.join(path, "counters"), a,
                                                    required=("link_downed",))
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
    def _read_counters(path: str, a: _Attrs, required: tuple[str, ...] = ()
                       ) -> tuple[dict[str, int] | None, tuple[str, ...]]:
        """Every counter file of ``path``; a ``required`` one must be a readable file whenever
        the directory holds anything (the kernel creates a counter group whole)."""
        listing = _listdir(path)
        if listing.names is None:
            if listing.kind != "missing":
                a.errors.append(SysfsReadError(path, listing.kind, listing.reason))
            return None, ()
        values: dict[str, int] = {}
        unavailable: list[str] = []
        names = list(listing.names)
        if names:
            names += [n for n in required if n not in names]
        for name in names:
            fpath = os.path.join(path, name)
            if name not in required and os.path.isdir(fpath):
                continue
            text = a.text(fpath, name in required)
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


def _group_present(path: str, names: tuple[str, ...]) -> bool:
    """Whether any attribute of a group the kernel exports whole is there (then all must be)."""
    return any(os.path.lexists(os.path.join(path, n)) for n in names)


def _with_errors(dev: PciDevice, a: _Attrs) -> PciDevice:
    if not a.errors:
        return dev
    return replace(dev, errors=tuple(a.errors))
