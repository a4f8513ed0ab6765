"""Bad input, class "kernel log": ``check xid`` / ``check nvswitch --simulate h100-sxm-8 --kmsg``.

Two generated tables, each for both checks:

- path shapes (tests/hw/kmsg_shapes.PATH_SHAPES: missing, directory, dangling symlink,
  unreadable, a device, a FIFO without a writer, an empty file, blank lines only): every GPU /
  NVSwitch is ``unknown`` naming the file and the error, none ``ok``;
- line shapes: a garbled line -- a stamp at the edge of the calendar in every text format, a
  monotonic stamp too big for a float, garbage prefixes, binary, NUL bytes, invalid UTF-8, a
  line of megabytes, numeric fields of thousands of digits, codes and PCI addresses out of
  range, truncated records -- followed by a real Xid / SXid line, which must still be counted
  (``failed`` on its GPU / switch). Where the garbled line still holds a readable event (a bad
  stamp, a garbage prefix, a huge pid), that event must be counted too.

The simulated node puts GPUs at the real HGX buses (gpu:0 = 0000:53:00.0, gpu:3 = 0000:86:00.0)
and NVSwitches at 0000:05..08:00.0 (nvswitch:0..3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.badinput.harness import Case, run_case
from tests.hw.kmsg_shapes import (
    EDGES,
    GOOD,
    HUGE_SECONDS,
    LOG_NAME,
    MONOTONIC_FORMATS,
    PATH_SHAPES,
    WALLCLOCK_FORMATS,
    deny_open,
    make_log_path,
    unreadable_needs_faking,
)

ARGV = ("--simulate", "h100-sxm-8", "--kmsg", "{tmp}/" + LOG_NAME)
HUGE = "9" * 5000

# Real lines (tests/fixtures/xid_kmsg: gpud_dmesg-time-format-iso_xid48_xid63_xid94_peermem.log,
# gpud_sxid-readme_dmesg_xid79_sxid20034.log), moved onto the simulated node's buses.
XID48_GPU3 = ("NVRM: Xid (PCI:0000:86:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
              "double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
              "0x12bac1c3e0 partition 2, subpartition 1.")
XID79_GPU0 = ("NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
              "off the bus.")
SXID_SW1 = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
SXID_SW0 = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up"


@dataclass(frozen=True)
class Subject:
    """What one check reads from the log: the real line that must be counted (``real``, on
    ``target`` with ``reason``) and a real line to garble (``event``, on ``event_target``)."""

    check: str
    target: str
    reason: str
    mention: str
    real: str
    event: str
    event_target: str
    event_reason: str
    targets: str  # the prefix of every target the log speaks for


SUBJECTS = (
    Subject("xid", "gpu:3", "Xid48", "Xid48", XID48_GPU3, XID79_GPU0, "gpu:0", "Xid79", "gpu:"),
    Subject("nvswitch", "nvswitch:1", "SXid20034", "SXid 20034", SXID_SW1, SXID_SW0,
            "nvswitch:0", "SXid20034", "nvswitch:"),
)


@dataclass(frozen=True)
class KmsgCase:
    case: Case
    subject: Subject
    counted: tuple[tuple[str, str], ...] = ()  # (target, reason) that must be reported
    unread: bool = False  # the whole log is unread: no target of the subject may be ok
    deny: bool = False  # refuse open(2) of the log (mode 000 does not stop root)


def _write(data: bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / LOG_NAME).write_bytes(data)
    return setup


def _shape(shape: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        make_log_path(tmp, shape)
    return setup


# --- path shapes -------------------------------------------------------------------------------


def path_cases() -> list[KmsgCase]:
    out = []
    for s in SUBJECTS:
        for shape, error in PATH_SHAPES.items():
            case = Case(
                id=f"{s.check}-path-{shape}", argv=("check", s.check, *ARGV), check=s.check,
                target=s.target, mentions=(LOG_NAME, error), statuses=frozenset({"unknown"}),
                exits=frozenset({3}), setup=_shape(shape))
            out.append(KmsgCase(case, s, unread=True,
                                deny=shape == "unreadable" and unreadable_needs_faking()))
    return out


# --- line shapes -------------------------------------------------------------------------------

# The calendar edges run through the CLI in every format; tests/hw/test_kmsg.py runs all of EDGES
# through the parser.
CLI_EDGES = ("calendar-start-east", "calendar-end-west", "feb-29-not-a-leap-year", "offset-24h")


def _line_case(s: Subject, id: str, garbled: bytes, real: str, event_kept: bool) -> KmsgCase:
    counted = ((s.target, s.reason),) + (((s.event_target, s.event_reason),) if event_kept
                                         else ())
    case = Case(id=f"{s.check}-line-{id}", argv=("check", s.check, *ARGV), check=s.check,
                target=s.target, mentions=(s.mention,), statuses=frozenset({"failed"}),
                exits=frozenset({1}), setup=_write(garbled + b"\n" + real.encode() + b"\n"))
    return KmsgCase(case, s, counted=counted)


def stamp_cases() -> list[KmsgCase]:
    out = []
    edges = [e for e in EDGES if e.id in CLI_EDGES]
    assert len(edges) == len(CLI_EDGES)
    for s in SUBJECTS:
        for name, (render, _fmt) in WALLCLOCK_FORMATS.items():
            for stamp in edges:
                line = render(stamp, s.event)
                if line is None:
                    continue  # dmesg -T prints no zone: an offset cannot be wrong there
                out.append(_line_case(s, f"{name}-{stamp.id}", line.encode(),
                                      render(GOOD, s.real) or "", event_kept=True))
        for name, (render_mono, _fmt) in MONOTONIC_FORMATS.items():
            out.append(_line_case(s, f"{name}-monotonic-too-big-for-a-float",
                                  render_mono(HUGE_SECONDS, s.event).encode(),
                                  render_mono("12.5", s.real), event_kept=True))
    return out


def _dmesg(text: str) -> str:
    return f"[ 6781753.400584] {text}"


def _garbled_common(event: str) -> list[tuple[str, bytes, bool]]:
    """Shapes any kernel-log line can be garbled into: (id, bytes, the event is still read)."""
    e = event.encode()
    return [
        ("garbage-prefix-escape-codes", b"\x1b[31m\x07#### " + e, True),
        ("garbage-prefix-pstore-priority-999", b"<999>[1.0] " + e, True),
        ("garbage-prefix-kmsg-priority-5-digits", b"99999,1,2,-;" + e, True),
        ("garbage-prefix-invalid-utf8", b"\xff\xfe4,1,2,-;" + e, False),
        ("binary-every-byte-value", bytes(range(256)) * 8, False),
        ("nul-bytes", _dmesg(event).encode().replace(b": ", b":\x00 ", 1), False),
        ("invalid-utf8-inside", _dmesg(event).encode().replace(b", ", b", \xc3\x28", 1), False),
        ("a-line-of-2-mib", _dmesg(event).encode() + b" " + b"A" * (2 << 20), False),
        ("a-line-of-2-mib-without-newlines-of-binary",
         bytes(b for b in range(256) if b != 0x0A) * 8300, False),
        ("kmsg-seq-of-25-digits", b"4," + b"9" * 25 + b",1,-;" + e, False),
        ("kmsg-usec-of-5000-digits", b"4,1," + HUGE.encode() + b",-;" + e, False),
        ("kmsg-header-cut", b"4,1234,5678", False),
        ("kmsg-header-without-semicolon", b"4,1234,5678,-" + e, False),
    ]


def _header_garbled(word: str, pci: tuple[str, str, str, str | None], code: str, rest: str
                    ) -> list[tuple[str, str, bool]]:
    """The broken headers both parsers must refuse, built from one real header: its event code
    or PCI address out of bounds, missing or cut off. ``word``: the line up to the address;
    ``pci``: (domain, bus, device, function or None) as the real line writes it."""
    dom, bus, dev, fn = pci

    def pci_at(d: str = dom, b: str = bus, f: str | None = fn) -> str:
        return f"{d}:{b}:{dev}" + ("" if f is None else f".{f}")

    def line(address: str, value: str) -> str:
        return f"{word} (PCI:{address}): {value}, {rest}"

    return [
        ("code-of-7-digits", line(pci_at(), code.ljust(7, "0")), False),
        ("code-of-5000-digits", line(pci_at(), HUGE), False),
        ("code-negative", line(pci_at(), f"-{code}"), False),
        ("code-missing", line(pci_at(), ""), False),
        ("pci-domain-past-16-bits", line(pci_at(d=f"1{dom}"), code), False),
        ("pci-bus-of-3-digits", line(pci_at(b=f"1{bus}"), code), False),
        ("pci-function-8", line(pci_at(f="8"), code), False),
        ("pci-empty", line("", code), False),
        ("cut-in-the-address", f"{word} (PCI:{dom}:{bus}:{dev[0]}", False),
        ("cut-after-the-word", word, False),
    ]


def _xid_garbled() -> list[tuple[str, bytes, bool]]:
    at = "NVRM: Xid (PCI:0000:53:00): "
    lines = [
        ("huge-pid", f"{at}79, pid={HUGE}, name=x, GPU has fallen off the bus.", True),
        ("huge-gpc", f"{at}13, pid=1, name=x, Graphics SM Warp Exception on (GPC {HUGE}, TPC 1, "
                     "SM 1): Out Of Range Address", False),
        ("huge-caused-by", f"{at}45, pid=1, name=x, Ch 00000001 caused by previous Xid {HUGE}",
         False),
        ("huge-nvlink-link", f"{at}74, pid=1, name=x, NVLink: fatal error detected on link "
                             f"{HUGE}(0x0, 0x0, 0x10000, 0x0)", False),
        ("huge-nvlink5-link", f"{at}145, RLW_REMAP Nonfatal XC0 i0 Link {HUGE} (0x1 0x2)", False),
        ("huge-gpu-instance", f"NVRM: Xid (PCI:0000:53:00 GPU-I:{HUGE}): 94, pid=1, x", False),
        ("code-in-hex", f"{at}0x4f, pid=1, name=x, text", False),
        ("pci-domain-of-9-digits", "NVRM: Xid (PCI:123456789:53:00): 79, pid=1, x", False),
        ("cut-before-the-code", at, False),
        ("fallen-off-header-alone", "NVRM: The NVIDIA GPU 0000:53:00.0", False),
        *_header_garbled("NVRM: Xid", ("0000", "53", "00", None), "79", "pid=1, name=x, text"),
    ]
    return [(i, _dmesg(t).encode(), kept) for i, t, kept in lines] + _garbled_common(XID79_GPU0)


def _sxid_garbled() -> list[tuple[str, bytes, bool]]:
    at = "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): "
    lines = [
        ("huge-switch-index", f"nvidia-nvswitch{HUGE}: SXid (PCI:0000:05:00.0): 20034, Fatal, "
                              "Link 63 LTSSM Fault Up", True),
        ("huge-link", f"{at}20034, Fatal, Link {HUGE} LTSSM Fault Up", True),
        ("huge-severity", f"{at}20034, Severity {HUGE} Engine instance 63 Sub-engine instance 00",
         False),
        ("huge-engine-instance", f"{at}20034, Severity 1 Engine instance {HUGE}", False),
        ("huge-data-word", f"{at}20034, Data {{0x{'f' * 5000}, 0x1}}", False),
        ("data-block-cut", f"{at}20034, Data {{0x50610002, 0x1010", False),
        *_header_garbled("nvidia-nvswitch0: SXid", ("0000", "05", "00", "0"), "20034",
                         "Fatal, Link 63 LTSSM Fault Up"),
    ]
    return [(i, _dmesg(t).encode(), kept) for i, t, kept in lines] + _garbled_common(SXID_SW0)


def garbled_cases() -> list[KmsgCase]:
    out = []
    for s in SUBJECTS:
        shapes = _xid_garbled() if s.check == "xid" else _sxid_garbled()
        for id, data, kept in shapes:
            out.append(_line_case(s, id, data, _dmesg(s.real), event_kept=kept))
    return out


CASES = path_cases() + stamp_cases() + garbled_cases()


def test_the_table_is_generated_large_and_unique():
    ids = [k.case.id for k in CASES]
    assert len(ids) == len(set(ids)) >= 60
    for s in SUBJECTS:
        mine = [k for k in CASES if k.subject is s]
        assert {k.case.id.split("-path-")[1] for k in mine if k.unread} == set(PATH_SHAPES)
        for name in WALLCLOCK_FORMATS:
            assert any(k.case.id.startswith(f"{s.check}-line-{name}-") for k in mine), name


@pytest.mark.parametrize("kcase", CASES, ids=[k.case.id for k in CASES])
def test_kmsg(kcase: KmsgCase, tmp_path, capsys, caplog, monkeypatch):
    if kcase.deny:
        deny_open(monkeypatch, tmp_path / LOG_NAME)
    report = run_case(kcase.case, tmp_path, capsys, caplog)
    assert report is not None
    mine = [r for r in report["results"] if r["check"] == kcase.subject.check]
    got = {(r["target"], r["reason"]) for r in mine}
    for want in kcase.counted:
        assert want in got, f"{kcase.case.id}: {want} not reported; got {sorted(got)}"
    if kcase.unread:
        ok = [r["target"] for r in mine
              if r["target"].startswith(kcase.subject.targets) and r["status"] == "ok"]
        assert not ok, f"{kcase.case.id}: ok about a log nobody read: {ok}"
