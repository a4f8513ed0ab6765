"""Vendor rule tables as data: the XID and SXid catalogs and the NVLink5 (Xid 144-150) decode.

The catalogs are JSON files next to this module, generated from the shared fixtures by
``python -m gpu_monitor.rules.generate_catalog --shared tests`` (see that module for the
derivation rules and docs/xid.md for what they mean). This module only loads and looks up; it
never decides a status. Loading is lazy and cached; a damaged catalog file raises
``CatalogError`` naming the file (a packaging bug, not a host condition).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, ClassVar, Generic, TypeVar

from gpu_monitor.model import Action

CATEGORIES = ("application", "hardware", "driver", "unknown")
XID_CATALOG_FILE = "xid_catalog.json"
SXID_CATALOG_FILE = "sxid_catalog.json"


class CatalogError(RuntimeError):
    """The shipped catalog cannot be read (packaging problem)."""


@dataclass(frozen=True, kw_only=True)
class CatalogEntry:
    """What either catalog holds for a code: its name, the action it calls for, and whether the
    catalog knows it (``known=False``: a stand-in for a code it lacks). The reason a finding
    about the code carries is the kind's prefix and the code (``Xid79``, ``SXid20034``)."""

    REASON_PREFIX: ClassVar[str]

    code: int
    name: str
    action: Action
    known: bool = True

    @property
    def reason(self) -> str:
        return f"{self.REASON_PREFIX}{self.code}"


@dataclass(frozen=True, kw_only=True)
class XidInfo(CatalogEntry):
    """One row of the XID catalog; ``name`` is NVIDIA's mnemonic."""

    REASON_PREFIX: ClassVar[str] = "Xid"

    description: str
    category: str
    nvidia_immediate: str = ""
    nvidia_investigatory: str = ""
    rule: str = ""


@dataclass(frozen=True, kw_only=True)
class SxidInfo(CatalogEntry):
    """One row of the NVSwitch SXid catalog."""

    REASON_PREFIX: ClassVar[str] = "SXid"

    fatal_class: str  # non_fatal | potential_fatal | always_fatal | unknown
    recovery: str = ""


@dataclass(frozen=True)
class Nvlink5Decode:
    """One matched row of NVIDIA's "XID 144-150 Decode" sheet."""

    unit: str
    version: str  # "v1" (<R575 IntrInfo layout) or "v2" (>=R575)
    resolution: str
    action: Action
    investigatory: str
    severity: str
    hw_sw: str
    promoted: bool = False  # the row's "Action 2" IntrInfo pattern matched


def _bits_match(pattern: str, value: int) -> bool:
    """``pattern`` is MSB-first over the low ``len(pattern)`` bits; '-' is don't-care."""
    width = len(pattern)
    if width == 0 or value >> width:
        return False
    for i, ch in enumerate(pattern):
        bit = (value >> (width - 1 - i)) & 1
        if (ch == "0" and bit) or (ch == "1" and not bit):
            return False
    return True


def _unit_versions(row_unit: str, line_unit: str) -> tuple[str, ...]:
    """The IntrInfo layouts a line's unit name allows for a decode row.

    A row unit ``A/B`` names the unit as the V1 driver (<R575) prints it, then as V2 (>=R575)
    prints it; a single name is the same in both. A line that prints the row's whole text
    (test literals do) may be either.
    """
    if line_unit == row_unit:
        return ("v2", "v1")
    names = [n.strip() for n in row_unit.split("/")]
    if len(names) != 2:
        return ()
    return tuple(v for v, n in (("v2", names[1]), ("v1", names[0])) if n == line_unit)


_Entry = TypeVar("_Entry")


class _CodeCatalog(Generic[_Entry]):
    """What both catalogs do the same way: read a file's version and rows (data that is not such
    a catalog raises ``CatalogError`` naming its source), list the codes they know, and give an
    entry for any code, a stand-in (``known=False``, action watch) for one they do not."""

    FILE: ClassVar[str]  # the shipped file
    KIND: ClassVar[str]  # what an error calls the catalog
    ROWS: ClassVar[str]  # the key of its rows, by code

    def __init__(self, data: dict[str, Any], source: str | None = None):
        try:
            self.version: str = data["about"]["catalog_version"]
            self._entries: dict[int, _Entry] = {
                int(code): self._entry(int(code), row) for code, row in data[self.ROWS].items()}
            self._read_more(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise CatalogError(f"{source or self.FILE}: not a gpu-monitor {self.KIND} catalog "
                               f"({exc!r})") from exc

    def codes(self) -> list[int]:
        return sorted(self._entries)

    def get(self, code: int) -> _Entry:
        info = self._entries.get(code)
        if info is not None:
            return info
        return self._unknown(code)

    def _entry(self, code: int, row: dict[str, Any]) -> _Entry:
        raise NotImplementedError

    def _read_more(self, data: dict[str, Any]) -> None:
        """What a catalog holds besides its rows (read under the same guard)."""

    def _unknown(self, code: int) -> _Entry:
        raise NotImplementedError


class XidCatalog(_CodeCatalog[XidInfo]):
    FILE, KIND, ROWS = XID_CATALOG_FILE, "XID", "xids"

    def _entry(self, code: int, row: dict[str, Any]) -> XidInfo:
        return XidInfo(code=code, name=row["mnemonic"], description=row["description"],
                       action=Action(row["action"]), category=row["category"],
                       nvidia_immediate=row["nvidia_immediate"],
                       nvidia_investigatory=row["nvidia_investigatory"], rule=row["rule"])

    def _read_more(self, data: dict[str, Any]) -> None:
        self._decode: list[dict[str, Any]] = list(data["nvlink5_decode"])

    def _unknown(self, code: int) -> XidInfo:
        """An unknown code: category unknown, action watch."""
        return XidInfo(code=code, name="UNKNOWN", description="not in the XID catalog",
                       action=Action.WATCH, category="unknown", rule="R6 unknown code",
                       known=False)

    def decode_nvlink5(self, code: int, unit: str, intrinfo: int,
                       error_status: int | None) -> Nvlink5Decode | None:
        """Match one 144-150 payload against the decode sheet; None when no row fits."""
        status_hex = None if error_status is None else f"0x{error_status:08x}"
        for row in self._decode:
            if row["xid"] != code:
                continue
            statuses = row["error_status"]
            if statuses and status_hex not in statuses:
                continue
            for version in _unit_versions(row["unit"], unit):
                if not _bits_match(row[f"intrinfo_{version}"], intrinfo):
                    continue
                promoted = bool(row["action2"]) and _bits_match(row[f"action2_{version}"],
                                                                intrinfo)
                return Nvlink5Decode(
                    unit=row["unit"], version=version,
                    resolution=row["resolution"],
                    action=Action(row["action2"] if promoted else row["action"]),
                    investigatory=row["investigatory"], severity=row["severity"],
                    hw_sw=row["hw_sw"], promoted=promoted)
        return None


class SxidCatalog(_CodeCatalog[SxidInfo]):
    FILE, KIND, ROWS = SXID_CATALOG_FILE, "SXid", "sxids"

    def _entry(self, code: int, row: dict[str, Any]) -> SxidInfo:
        return SxidInfo(code=code, name=row["name"], fatal_class=row["fatal_class"],
                        action=Action(row["action"]), recovery=row["recovery"])

    def _unknown(self, code: int) -> SxidInfo:
        return SxidInfo(code=code, name="unknown SXid", fatal_class="unknown",
                        action=Action.WATCH, known=False)


def _load(name: str) -> dict[str, Any]:
    try:
        text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
        return json.loads(text)
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read the shipped {name}: {exc}") from exc


@lru_cache(maxsize=1)
def xid_catalog() -> XidCatalog:
    return XidCatalog(_load(XID_CATALOG_FILE))


@lru_cache(maxsize=1)
def sxid_catalog() -> SxidCatalog:
    return SxidCatalog(_load(SXID_CATALOG_FILE))


__all__ = [
    "CATEGORIES", "CatalogError", "Nvlink5Decode", "SxidCatalog", "SxidInfo", "XidCatalog",
    "XidInfo", "sxid_catalog", "xid_catalog",
]
