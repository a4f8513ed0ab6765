"""The values sysfs gives for PCI functions and RDMA ports, and the parsers that make them.

Split from the reader (hw/sysfs.py) so that what a file's content means -- each parser's
domain, and the frozen values the checks judge -- can be read and tested without the I/O
around it. Every parser raises ``SysfsParseError`` (a ``ValueError``) naming the content for
anything outside its domain (hw/sysfs.py, guarantee 2); none reads a file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

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
