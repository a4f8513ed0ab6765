"""NVSwitch SXid kernel-log lines: pure parsing, and grouping of one error's lines.

The nvswitch driver logs one hardware error as up to three lines with the same SXid code and
switch: a header (``Fatal``/``Non-fatal``, link, text), then ``Severity <0|1> Engine instance
<n> Sub-engine instance <m>`` and ``Data {...}``. Lines of different switches interleave (see
gpud_sxid-readme_dmesg_xid79_sxid20034.log), and a header may be missing (ring buffer overrun,
truncated paste). ``SxidGrouper`` turns the stream into events: a header opens one, the
severity/data lines attach to the latest open event of the same switch and code (the severity
line preferring the event whose link equals its engine instance), and a line with nothing to
attach to becomes an event of its own (``orphan``). Severity 1 is fatal, 0 non-fatal
(``NVSWITCH_ERROR_SEVERITY_FATAL``/``_NONFATAL`` in the nvswitch driver).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, replace

from gpu_monitor.model import Action, Status, canonical_pci
from gpu_monitor.rules import SxidCatalog, SxidInfo, sxid_catalog
from gpu_monitor.rules.xid import XidParseError

_PCI = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?"
# Decimal fields are bounded (see rules/xid.py): a run of digits past int()'s 4300-digit limit
# must not match rather than raise.

# "nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"
#     (gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt)
_SXID_RE = re.compile(
    r"(?:nvidia-nvswitch(?P<sw>\d{1,4}):\s*)?SXid \(?(?:PCI:)?(?P<pci>" + _PCI + r")\)?:"
    r"\s*(?P<code>\d{1,6})\b,?\s*(?P<rest>.*)")
# "20034, Fatal, Link 48 LTSSM Fault Up" / "22013, Non-fatal, Link 57 Minion Link DLREQ interrupt"
#     (gpud_sxid-readme_dmesg_xid79_sxid20034.log, gpud_testliterals_xid_sxid_nvlink_realistic.txt)
_HEADER_RE = re.compile(
    r"(?P<sev>Fatal|Non-fatal|Nonfatal)\s*,?\s*(?:Link\s+(?P<link>-?\d{1,6})\b)?\s*,?\s*(?P<msg>.*)",
    re.I)
# "20034, Severity 1 Engine instance 30 Sub-engine instance 00"
#     (gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt)
_SEVERITY_RE = re.compile(
    r"Severity\s+(?P<level>\d{1,6})\s+Engine instance\s+(?P<inst>\d{1,6})\b"
    r"(?:\s+Sub-engine instance\s+(?P<sub>\d{1,6})\b)?")
# "20034, Data {0x50610002, 0x10100030, 0x00000000, ...}" (same file; "}p" junk there is ignored)
_DATA_RE = re.compile(r"Data\s*\{(?P<words>[^}]*)\}")

HEADER, SEVERITY, DATA, OTHER = "header", "severity", "data", "other"


@dataclass(frozen=True)
class ParsedSxid:
    code: int
    pci: str
    switch_index: int | None  # from the "nvidia-nvswitchN:" prefix
    kind: str  # header | severity | data | other (e.g. "26006, SOE HALTED")
    raw: str
    fatal: bool | None = None  # what this line says; None when it says nothing
    link: int | None = None
    severity_level: int | None = None
    engine_instance: int | None = None
    sub_instance: int | None = None
    data: tuple[int, ...] = ()
    message: str = ""

    @property
    def key(self) -> tuple[int | None, str, int]:
        return (self.switch_index, self.pci, self.code)


def parse_sxid(text: str) -> ParsedSxid | XidParseError | None:
    """Parse one record's text; never raises."""
    if "SXid" not in text:
        return None
    m = _SXID_RE.search(text)
    if not m:
        return XidParseError("garbage", text[text.index("SXid"):][:200])
    try:
        pci = canonical_pci(m.group("pci"))
    except ValueError:
        return XidParseError("no_pci", text.strip()[:200], int(m.group("code")))
    raw = text[m.start():].split("\n", 1)[0].strip()
    code = int(m.group("code"))
    sw = int(m.group("sw")) if m.group("sw") is not None else None
    rest = m.group("rest").strip()
    if h := _HEADER_RE.fullmatch(rest):
        return ParsedSxid(code, pci, sw, HEADER, raw,
                          fatal=h.group("sev").lower() == "fatal",
                          link=int(h.group("link")) if h.group("link") else None,
                          message=h.group("msg").strip())
    if s := _SEVERITY_RE.match(rest):
        level = int(s.group("level"))
        return ParsedSxid(code, pci, sw, SEVERITY, raw, fatal=level >= 1, severity_level=level,
                          engine_instance=int(s.group("inst")),
                          sub_instance=int(s.group("sub")) if s.group("sub") else None)
    if d := _DATA_RE.match(rest):
        words = []
        for w in d.group("words").split(","):
            try:
                words.append(int(w.strip(), 16))
            except ValueError:
                continue
        return ParsedSxid(code, pci, sw, DATA, raw, data=tuple(words))
    return ParsedSxid(code, pci, sw, OTHER, raw, message=rest)


@dataclass(frozen=True)
class SxidEvent:
    """One NVSwitch error, its lines grouped."""

    code: int
    pci: str
    switch_index: int | None
    fatal: bool
    fatal_basis: str  # line | severity | catalog | default
    link: int | None
    message: str
    lines: tuple[str, ...]
    severity_level: int | None = None
    engine_instance: int | None = None
    data: tuple[int, ...] = ()
    orphan: bool = False  # no header line was seen for it

    @property
    def reason(self) -> str:
        return f"SXid{self.code}"

    @property
    def complete(self) -> bool:
        return self.severity_level is not None and bool(self.data)


def _fatal_from_catalog(info: SxidInfo) -> tuple[bool, str]:
    if info.fatal_class == "always_fatal":
        return True, "catalog"
    return False, "catalog" if info.known else "default"


def status_of(event: SxidEvent) -> tuple[Status, Action]:
    """Fatal -> failed/reboot; otherwise degraded/watch."""
    return (Status.FAILED, Action.REBOOT) if event.fatal else (Status.DEGRADED, Action.WATCH)


class SxidGrouper:
    """Stateful: feed parsed lines in log order; see the module docstring."""

    def __init__(self, catalog: SxidCatalog | None = None, max_open: int = 64):
        self._catalog = catalog or sxid_catalog()
        self._open: deque[tuple[int, SxidEvent]] = deque(maxlen=max_open)
        self._next_id = 0

    def feed(self, line: ParsedSxid) -> tuple[int, SxidEvent, bool]:
        """(event id, event as it stands now, True when this line opened a new event)."""
        if line.kind in (SEVERITY, DATA):
            slot = self._find(line)
            if slot is not None:
                i, (eid, ev) = slot
                if line.kind == SEVERITY:
                    ev = replace(ev, severity_level=line.severity_level,
                                 engine_instance=line.engine_instance,
                                 fatal=ev.fatal if ev.fatal_basis == "line" else bool(line.fatal),
                                 fatal_basis=ev.fatal_basis if ev.fatal_basis == "line"
                                 else "severity",
                                 link=ev.link if ev.link is not None else line.engine_instance,
                                 lines=(*ev.lines, line.raw))
                else:
                    ev = replace(ev, data=line.data, lines=(*ev.lines, line.raw))
                if ev.complete:
                    del self._open[i]
                else:
                    self._open[i] = (eid, ev)
                return eid, ev, False
        return self._start(line)

    def _find(self, line: ParsedSxid) -> tuple[int, tuple[int, SxidEvent]] | None:
        want_severity = line.kind == SEVERITY
        best = None
        for i in range(len(self._open) - 1, -1, -1):
            eid, ev = self._open[i]
            if (ev.switch_index, ev.pci, ev.code) != line.key:
                continue
            filled = ev.severity_level is not None if want_severity else bool(ev.data)
            if filled:
                continue
            if want_severity and ev.link is not None and ev.link == line.engine_instance:
                return i, (eid, ev)
            if best is None:
                best = (i, (eid, ev))
        return best

    def _start(self, line: ParsedSxid) -> tuple[int, SxidEvent, bool]:
        info = self._catalog.get(line.code)
        if line.fatal is not None:
            fatal, basis = line.fatal, ("line" if line.kind == HEADER else "severity")
        else:
            fatal, basis = _fatal_from_catalog(info)
        ev = SxidEvent(
            code=line.code, pci=line.pci, switch_index=line.switch_index, fatal=fatal,
            fatal_basis=basis,
            link=line.link if line.link is not None else line.engine_instance,
            message=line.message or info.name, lines=(line.raw,),
            severity_level=line.severity_level, engine_instance=line.engine_instance,
            data=line.data, orphan=line.kind in (SEVERITY, DATA),
        )
        self._next_id += 1
        eid = self._next_id
        if line.kind != OTHER and not ev.complete:
            self._open.append((eid, ev))
        return eid, ev, True
