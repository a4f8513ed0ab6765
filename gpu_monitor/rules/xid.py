"""XID kernel-log lines: pure parsing, classification, and the repeat/escalation arithmetic.

Input is ``KmsgRecord.text`` (message plus continuation lines); the kernel-log reader has already
removed timestamps, levels and host prefixes, but we also search inside a line, because XIDs
get quoted by other tools (an NHC report line carries a whole dmesg line). Nothing here reads
the host or the clock: the check (checks/xid.py) supplies history and time.

``parse_xid(text)`` returns a ``ParsedXid``, an ``XidParseError`` (a line that is about an XID
but cannot be used: garbage, no PCI address, a stray fragment), a ``GpuHeader`` (the first line
of a "fallen off the bus" message that arrived without its continuation), or None (not ours).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from gpu_monitor.model import ACTION_SEVERITY, Action, Status, canonical_pci
from gpu_monitor.rules import Nvlink5Decode, XidCatalog, XidInfo, xid_catalog

FALLEN_OFF_BUS_CODE = 79
FALLEN_OFF_BUS_REASON = "GpuFallenOffBus"
NVLINK5_CODES = range(144, 151)
RECOVERY_CODE = 154

_PCI = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?"
# Every decimal field below is bounded: the driver prints 32-bit values (pid, link, GPC, GPU
# instance), and an unbounded ``\d+`` would hand int() a run of digits past Python's 4300-digit
# conversion limit (ValueError). A field too long to be real simply does not match.

# "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
#     (gpud_sxid-readme_dmesg_xid79_sxid20034.log)
# old form without "PCI:": "NVRM: Xid (0000:03:00): 14, Channel 00000001"
#     (gpud_testliterals_xid_sxid_nvlink_realistic.txt)
# no parentheses: "NVRM: Xid PCI:0000:01:00: 43, pid=1814139, name=cuda_assert_64b, Ch 00000018"
#     (dcgm_testliterals_kmsg_raw_xid_prefix_variants.txt)
# MIG: "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). ..."
#     (gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt); the driver also prints
#     "GPU-I:%02u GPU-CI:%02u" together.
_XID_RE = re.compile(
    r"NVRM: Xid \(?(?:PCI:)?(?P<pci>" + _PCI + r")"
    r"(?:[ ,]+GPU-I:\s*(?P<gi>\d{1,6}))?(?:[ ,]+GPU-CI:\s*(?P<ci>\d{1,6}))?\)?:"
    r"\s*(?P<code>\d{1,6})\b,?\s*(?P<rest>.*)"
)
# An Xid whose address is missing: "NVRM: Xid: 79, ..." / "NVRM: Xid (): 79, ..." (garbage tests).
_XID_NOPCI_RE = re.compile(r"NVRM: Xid\s*(?:\(\s*\))?:\s*(?P<code>\d{1,6})\b,?\s*(?P<rest>.*)")
# After the code: "pid='<unknown>', name=<unknown>, msg" (gpud_sxid-readme...), "pid=7194, msg"
# (no name: gpud_history_testliterals...), "pid=1582259, name=nvc:[driver]" (no message:
# nvsentinel_testliterals_xid_sxid_realistic.txt), or just the message (issue_Bumblebee677...).
_REST_RE = re.compile(
    r"(?:pid=(?P<pid>'?<unknown>'?|\d{1,10})\s*(?:,\s*|$))?"
    r"(?:name=(?P<name>[^,]*?)\s*(?:,\s*|$))?(?P<msg>.*)", re.S)
# "Ch 00000001 caused by previous Xid 149"
#     (issue_open-gpu-kernel-modules1150_journal-grep_xid45_caused_by_previous_xid145_149.log)
_CAUSED_BY_RE = re.compile(r"caused by previous Xid (?P<code>\d{1,6})\b")
# "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
#     (gpud_testliterals_xid_sxid_nvlink_realistic.txt)
_RECOVERY_RE = re.compile(
    r"GPU recovery action changed from (?P<from>0x[0-9A-Fa-f]+) \((?P<from_name>[^)]*)\) "
    r"to (?P<to>0x[0-9A-Fa-f]+) \((?P<to_name>[^)]*)\)")
# "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 ... 0x00000000)" (6 words,
#     odd spacing: gpud_testliterals_xid_sxid_nvlink_realistic.txt); "SAW_MVB Fatal XC0 i0 Link 00
#     (0x00000001 0x00000002 0x00000000 0x00000000)" (4 words: gpud_testliterals_xid144-150_...)
_NVLINK5_RE = re.compile(
    r"(?P<unit>[A-Za-z0-9_/]+)\s+(?P<sev>Fatal|Nonfatal|Non-fatal)\s+XC(?P<xc>\d{1,6})\s+"
    r"i(?P<inj>\d{1,6})\s+Link\s+(?P<link>-?\d{1,6})\s*\((?P<regs>[^)]*)\)")
# "Graphics SM Warp Exception on (GPC 9, TPC 1, SM 1): Out Of Range Address"
#     (gpud_dmesg-decode-iso_xid13_xid43_oom.log)
_GPC_RE = re.compile(r"\(GPC (?P<gpc>\d{1,6}), TPC (?P<tpc>\d{1,6}), SM (?P<sm>\d{1,6})\)")
# "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
#     (nvsentinel_testliterals_xid_sxid_realistic.txt)
_XID74_RE = re.compile(r"on link (?P<link>\d{1,6})\s*\((?P<regs>[^)]*)\)")
# "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n
#     NVRM: fallen off the bus and is not responding to commands." (issue_NVSentinel155_...),
#     and on one line: "NVRM: The NVIDIA GPU 0000:b3:00.0 fallen off the bus and ..." (nvsentinel_...)
_FALLEN_LONG_RE = re.compile(
    r"NVRM: The NVIDIA GPU (?P<pci>" + _PCI + r")\b(?P<body>.{0,400}?)fallen off the bus", re.S)
# "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus." (gpud_sxid-readme_dmesg_xid79_sxid20034.log)
# "NVRM: GPU 18:00.0: GPU has fallen off the bus." (gpud_testliterals_xid_sxid_nvlink_realistic.txt)
_FALLEN_SHORT_RE = re.compile(
    r"NVRM: GPU (?P<pci>(?:[0-9A-Fa-f]{4}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): "
    r"GPU has fallen off the bus")
# The first line alone, when a followed file delivered the continuation later:
# "NVRM: The NVIDIA GPU 0000:b3:00.0" (issue_NVSentinel155_... first line)
_GPU_HEADER_RE = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>" + _PCI + r")\s*$")
# "NVRM: fallen off the bus and is not responding to commands." (nvsentinel_testliterals_...)
_FRAGMENT_RE = re.compile(r"NVRM:\s+fallen off the bus")

# nvmlGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.
RECOVERY_ACTIONS = {0: Action.NONE, 1: Action.RESET_GPU, 2: Action.REBOOT, 3: Action.WATCH,
                    4: Action.RESET_GPU}


def _frozen(d: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class RecoveryAction:
    """Xid 154's payload: the driver's recommended recovery, before and after."""

    from_code: int
    from_name: str
    to_code: int
    to_name: str

    @property
    def action(self) -> Action:
        if self.to_code in RECOVERY_ACTIONS:
            return RECOVERY_ACTIONS[self.to_code]
        name = self.to_name.lower()
        if "reboot" in name:
            return Action.REBOOT
        if "reset" in name:
            return Action.RESET_GPU
        return Action.NONE if name == "none" else Action.WATCH


@dataclass(frozen=True)
class Nvlink5Payload:
    """Xid 144-150: ``<unit> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<IntrInfo> <ErrorStatus> ...)``."""

    unit: str
    severity: str  # "Fatal" or "Nonfatal" as printed
    cross_contain: int
    injected: int
    link: int
    registers: tuple[int, ...]

    @property
    def intrinfo(self) -> int:
        return self.registers[0] if self.registers else 0

    @property
    def error_status(self) -> int | None:
        return self.registers[1] if len(self.registers) > 1 else None


@dataclass(frozen=True)
class ParsedXid:
    code: int
    pci: str | None  # canonical 0000:3b:00.0; None when the line had no usable address
    message: str  # the text after pid=/name=
    raw: str  # the matched text, from "NVRM:" on
    pid: int | None = None
    process: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    fallen_off_bus: bool = False  # the "GPU has fallen off the bus" message without an Xid
    caused_by: int | None = None  # Xid 45 "caused by previous Xid N"
    recovery: RecoveryAction | None = None  # Xid 154
    nvlink5: Nvlink5Payload | None = None  # Xid 144-150
    extra: Mapping[str, Any] = field(default_factory=_frozen)  # GPC/TPC/SM, NVLink link

    @property
    def reason(self) -> str:
        return FALLEN_OFF_BUS_REASON if self.fallen_off_bus else f"Xid{self.code}"


@dataclass(frozen=True)
class XidParseError:
    """A line about an XID that cannot be used; ``kind`` is garbage | no_pci | fragment."""

    kind: str
    raw: str
    code: int | None = None


@dataclass(frozen=True)
class GpuHeader:
    """``NVRM: The NVIDIA GPU <pci>`` alone: a split fallen-off-the-bus message may follow."""

    pci: str


def _pci(text: str) -> str | None:
    try:
        return canonical_pci(text)
    except ValueError:
        return None


def _hex_words(text: str) -> tuple[int, ...]:
    out = []
    for word in re.split(r"[\s,]+", text.strip()):
        if not word:
            continue
        try:
            out.append(int(word, 16))
        except ValueError:
            return tuple(out)
    return tuple(out)


def _payload(code: int, pci: str | None, rest: str, raw: str,
             gi: str | None = None, ci: str | None = None) -> ParsedXid:
    m = _REST_RE.fullmatch(rest)
    pid_text = m.group("pid") if m else None
    name = (m.group("name") if m else None) or None
    msg = (m.group("msg") if m else rest).strip()
    extra: dict[str, Any] = {}
    caused = recovery = nvlink5 = None
    if code == 45 and (c := _CAUSED_BY_RE.search(msg)):
        caused = int(c.group("code"))
    if code == RECOVERY_CODE and (r := _RECOVERY_RE.search(msg)):
        recovery = RecoveryAction(int(r.group("from"), 16), r.group("from_name"),
                                  int(r.group("to"), 16), r.group("to_name"))
    if code in NVLINK5_CODES and (n := _NVLINK5_RE.search(msg)):
        nvlink5 = Nvlink5Payload(n.group("unit"), n.group("sev"), int(n.group("xc")),
                                 int(n.group("inj")), int(n.group("link")),
                                 _hex_words(n.group("regs")))
    if code == 13 and (g := _GPC_RE.search(msg)):
        extra.update(gpc=int(g.group("gpc")), tpc=int(g.group("tpc")), sm=int(g.group("sm")))
    if code == 74 and (k := _XID74_RE.search(msg)):
        extra.update(nvlink=int(k.group("link")),
                     registers=[f"0x{v:x}" for v in _hex_words(k.group("regs"))])
    return ParsedXid(
        code=code, pci=pci, message=msg, raw=raw.strip(),
        pid=int(pid_text) if pid_text and pid_text.isdigit() else None,
        process=None if name in (None, "<unknown>") else name,
        gpu_instance=int(gi) if gi else None, compute_instance=int(ci) if ci else None,
        caused_by=caused, recovery=recovery, nvlink5=nvlink5, extra=_frozen(extra),
    )


def parse_xid(text: str) -> ParsedXid | XidParseError | GpuHeader | None:
    """Parse one record's text; never raises."""
    if "NVRM" not in text:
        return None
    if "Xid" in text:
        m = _XID_RE.search(text)
        if m:
            pci = _pci(m.group("pci"))
            raw = text[m.start():].split("\n", 1)[0]
            if pci is None:
                return XidParseError("no_pci", raw, int(m.group("code")))
            return _payload(int(m.group("code")), pci, m.group("rest"), raw,
                            m.group("gi"), m.group("ci"))
        m = _XID_NOPCI_RE.search(text)
        if m:
            raw = text[m.start():].split("\n", 1)[0]
            return _payload(int(m.group("code")), None, m.group("rest"), raw)
        if "NVRM: Xid" in text:
            return XidParseError("garbage", text[text.index("NVRM: Xid"):][:200])
        return None
    if "fallen off the bus" in text:
        m = _FALLEN_LONG_RE.search(text) or _FALLEN_SHORT_RE.search(text)
        if m and (pci := _pci(m.group("pci"))):
            raw = " ".join(part.strip() for part in text[m.start():].splitlines())
            return ParsedXid(code=FALLEN_OFF_BUS_CODE, pci=pci, message=raw, raw=raw,
                             fallen_off_bus=True)
        if _FRAGMENT_RE.search(text):
            return XidParseError("fragment", text.strip()[:200], FALLEN_OFF_BUS_CODE)
        return None
    m = _GPU_HEADER_RE.search(text)
    if m and (pci := _pci(m.group("pci"))):
        return GpuHeader(pci)
    return None


def join_fallen_off(header: GpuHeader, fragment: XidParseError) -> ParsedXid:
    """A header and a later "fallen off the bus" fragment make one fallen-off event."""
    raw = f"NVRM: The NVIDIA GPU {header.pci} {fragment.raw.strip()}"
    return ParsedXid(code=FALLEN_OFF_BUS_CODE, pci=header.pci, message=raw, raw=raw,
                     fallen_off_bus=True)


# --- classification ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Classification:
    """What an event means before history is considered: the catalog's entry for its code, and
    the action the line itself may change (an NVLink5 decode row, a recovery action)."""

    entry: XidInfo  # category: application | hardware | driver | unknown
    reason: str  # the line's own: Xid<code>, or GpuFallenOffBus for the bus message
    action: Action
    basis: str = "catalog"  # catalog | nvlink5_decode | nvlink5_line | recovery_action
    sympathetic: bool = False  # Xid 45 "caused by previous Xid N": follow the other Xid
    decode: Nvlink5Decode | None = None

    @property
    def status(self) -> Status:
        """The status of one occurrence: application and action none -> ok, watch ->
        degraded, reset_gpu/reboot/replace -> failed (repeat rules are applied by the check)."""
        if self.entry.category == "application" or self.action is Action.NONE:
            return Status.OK
        if self.action is Action.WATCH:
            return Status.DEGRADED
        return Status.FAILED


def classify(event: ParsedXid, catalog: XidCatalog | None = None) -> Classification:
    catalog = catalog or xid_catalog()
    info = catalog.get(event.code)
    action, basis, decode = info.action, "catalog", None
    if event.code in NVLINK5_CODES and event.nvlink5 is not None:
        p = event.nvlink5
        decode = catalog.decode_nvlink5(event.code, p.unit, p.intrinfo, p.error_status)
        if decode is not None:
            action, basis = decode.action, "nvlink5_decode"
        else:
            fatal = p.severity == "Fatal"
            action, basis = (Action.RESET_GPU if fatal else Action.WATCH), "nvlink5_line"
    if event.code == RECOVERY_CODE and event.recovery is not None:
        action, basis = event.recovery.action, "recovery_action"
    return Classification(
        entry=info, reason=event.reason, action=action, basis=basis,
        sympathetic=event.code == 45 and event.caused_by is not None, decode=decode,
    )


# --- history arithmetic --------------------------------------------------------------------------

ESCALATION_LADDER = (Action.RESET_GPU, Action.REBOOT, Action.REPLACE)


def burst_count(times: Iterable[datetime], dedup_s: float) -> int:
    """Occurrences, where repeats less than ``dedup_s`` after the previous one are the same
    burst (an Xid 13 storm is one event however long it lasts)."""
    count, last = 0, None
    for t in sorted(times):
        if last is None or (t - last).total_seconds() >= dedup_s:
            count += 1
        last = t
    return count


def count_recoveries(occurrences: Sequence[tuple[datetime, str]],
                     resets: Iterable[datetime] = ()) -> int:
    """How many times the GPU was recovered between consecutive occurrences of a problem.

    ``occurrences`` are (time, boot id), the current one included. A gap counts once when the
    boot id changed across it (a reboot) or a GPU reset was recorded inside it.
    """
    occ = sorted(occurrences)
    reset_times = sorted(resets)
    n = 0
    for (t0, b0), (t1, b1) in zip(occ, occ[1:], strict=False):
        if b0 != b1 or any(t0 < r <= t1 for r in reset_times):
            n += 1
    return n


def escalate(base: Action, recoveries: int, replace_after: int) -> Action:
    """reset_gpu -> reboot -> replace: one step per recovery that did not help, and replace
    once ``replace_after`` recoveries did not help. Other actions are returned unchanged."""
    if base not in ESCALATION_LADDER or recoveries <= 0:
        return base
    if recoveries >= max(1, replace_after):
        return Action.REPLACE
    step = min(ESCALATION_LADDER.index(base) + recoveries, len(ESCALATION_LADDER) - 1)
    return ESCALATION_LADDER[step]


def worse(a: Action, b: Action) -> Action:
    return a if ACTION_SEVERITY[a] >= ACTION_SEVERITY[b] else b
