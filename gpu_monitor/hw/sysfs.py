"""Read PCI devices and RDMA ports from sysfs, below ``HostPaths.sysfs``.

The pcie, pcie_aer, rdma_ports and topology checks need the same few facts the kernel exports
as small text files: a PCI function's identity, NUMA node, link speed/width and AER counters
(``bus/pci/devices/<addr>/``), and an RDMA port's state, rate and counters
(``class/infiniband/<dev>/ports/<n>/``). This module reads those files and turns them into
frozen values (the values and their parsers: hw/sysfs_values.py), leaving every judgement to
the checks.

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
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.hw.sysfs_values import (
    AER_ATTRS,
    LINK_ATTRS,
    LINK_DOWNED,
    NVIDIA_VENDOR,
    IbPort,
    PciDevice,
    SysfsReadError,
    parse_aer,
    parse_counter,
    parse_ib_phys_state,
    parse_ib_port_state,
    parse_ib_rate,
    parse_link_speed,
    parse_link_width,
    parse_numa_node,
    parse_pci_class,
    parse_pci_id,
)
from gpu_monitor.model import canonical_pci

T = TypeVar("T")

_MAX_READ = 64 * 1024


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
