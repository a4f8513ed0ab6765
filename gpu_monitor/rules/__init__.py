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
from typing import Any, Generic, TypeVar

from gpu_monitor.model import Action

CATEGORIES = ("application", "hardware", "driver", "unknown")
XID_CATALOG_FILE = "xid_catalog.json"
SXID_CATALOG_FILE = "sxid_catalog.json"


class CatalogError(RuntimeError):
    """The shipped catalog cannot be read (packaging problem)."""


@dataclass(frozen=True)
class XidInfo:
    """What the catalog says about one XID code (``known=False`` for codes it lacks)."""

    code: int
    mnemonic: str
    description: str
    action: Action
    category: str
    nvidia_immediate: str = ""
    nvidia_investigatory: str = ""
    rule: str = ""
    known: bool = True

    @property
    def reason(self) -> str:
        return f"Xid{self.code}"


@dataclass(frozen=True)
class SxidInfo:
    code: int
    name: str
    fatal_class: str  # non_fatal | potential_fatal | always_fatal | unknown
    action: Action
    recovery: str = ""
    known: bool = True

    @property
    def reason(self) -> str:
        return f"SXid{self.code}"


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
    """What both catalogs answer the same way: the codes they know, and an entry for any code,
    a stand-in (``known=False``, action watch) for one they do not."""

    _entries: dict[int, _Entry]

    def codes(self) -> list[int]:
        return sorted(self._entries)

    def get(self, code: int) -> _Entry:
        info = self._entries.get(code)
        if info is not None:
            return info
        return self._unknown(code)

    def _unknown(self, code: int) -> _Entry:
        raise NotImplementedError


class XidCatalog(_CodeCatalog[XidInfo]):
    def __init__(self, data: dict[str, Any], source: str = XID_CATALOG_FILE):
        try:
            self.version: str = data["about"]["catalog_version"]
            self._entries = {
                int(code): XidInfo(
                    code=int(code), mnemonic=e["mnemonic"], description=e["description"],
                    action=Action(e["action"]), category=e["category"],
                    nvidia_immediate=e["nvidia_immediate"],
                    nvidia_investigatory=e["nvidia_investigatory"], rule=e["rule"])
                for code, e in data["xids"].items()
            }
            self._decode: list[dict[str, Any]] = list(data["nvlink5_decode"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CatalogError(f"{source}: not a gpu-monitor XID catalog ({exc!r})") from exc

    def _unknown(self, code: int) -> XidInfo:
        """An unknown code: category unknown, action watch."""
        return XidInfo(code=code, mnemonic="UNKNOWN", description="not in the XID catalog",
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
    def __init__(self, data: dict[str, Any], source: str = SXID_CATALOG_FILE):
        try:
            self.version: str = data["about"]["catalog_version"]
            self._entries = {
                int(code): SxidInfo(code=int(code), name=e["name"], fatal_class=e["fatal_class"],
                                    action=Action(e["action"]), recovery=e["recovery"])
                for code, e in data["sxids"].items()
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise CatalogError(f"{source}: not a gpu-monitor SXid catalog ({exc!r})") from exc

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
