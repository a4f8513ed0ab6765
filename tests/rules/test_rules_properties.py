"""Property tests of the Xid/SXid parsers: any text in, only the documented outcomes out.

``parse_xid`` gives a ``ParsedXid``, an ``XidParseError``, a ``GpuHeader`` or None and never
raises; ``parse_sxid`` gives a ``ParsedSxid``, an ``XidParseError`` or None; what they give can be
classified and grouped without raising. The strategies build the real line layouts (the
driver's ``NVRM: Xid (PCI:...): code, pid=..., name=..., msg`` and the nvswitch driver's header /
Severity / Data triplet) with every numeric field drawn far outside its range -- runs of
digits past Python's 4300-digit int() limit, addresses too long, codes too big -- as well as
plain random text.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.rules.sxid import ParsedSxid, SxidGrouper, parse_sxid, status_of
from gpu_monitor.rules.xid import (
    GpuHeader,
    ParsedXid,
    XidParseError,
    classify,
    join_fallen_off,
    parse_xid,
)

PROPERTY = settings(deadline=None, derandomize=True, max_examples=400)

# Decimal fields: small, real-sized, or long enough to break int() (more than 4300 digits).
number = st.one_of(
    st.integers(0, 200).map(str),
    st.integers(0, 2**32).map(str),
    st.just("-1"),
    st.sampled_from([4301, 5000]).map(lambda n: "9" * n),
    st.integers(21, 400).map(lambda n: "1" * n),
)
hexword = st.one_of(st.integers(0, 2**32).map(lambda v: f"0x{v:08x}"),
                    st.integers(1, 3000).map(lambda n: "0x" + "f" * n), st.just("zz"))
hexrun = st.text("0123456789abcdefABCDEF", min_size=0, max_size=10)
pci = st.one_of(
    st.sampled_from(["0000:53:00", "0000:86:00.0", "00000000:3B:00.0", "53:00", "0000:53:00.9",
                     "10000:53:00", "ffffffff:ff:ff.7", "0000:153:00", "", "PCI:"]),
    st.tuples(hexrun, hexrun, hexrun, st.sampled_from(["", ".0", ".7", ".8"])).map(
        lambda p: f"{p[0]}:{p[1]}:{p[2]}{p[3]}"),
)
words = st.lists(hexword, max_size=6).map(" ".join)
payload = st.one_of(
    st.text(max_size=60),
    st.tuples(number, number, number).map(
        lambda p: f"Graphics SM Warp Exception on (GPC {p[0]}, TPC {p[1]}, SM {p[2]}): Out Of "
                  "Range Address"),
    number.map(lambda n: f"Ch 00000001 caused by previous Xid {n}"),
    st.tuples(number, words).map(lambda p: f"NVLink: fatal error detected on link {p[0]}"
                                           f"({p[1]})"),
    st.tuples(st.sampled_from(["NETIR_LINK_EVT", "SAW_MVB", "RLW_REMAP", "x"]),
              st.sampled_from(["Fatal", "Nonfatal"]), number, number, number, words).map(
        lambda p: f"{p[0]} {p[1]} XC{p[2]} i{p[3]} Link {p[4]} ({p[5]})"),
    st.tuples(hexword, st.text(max_size=12), hexword, st.text(max_size=12)).map(
        lambda p: f"GPU recovery action changed from {p[0]} ({p[1]}) to {p[2]} ({p[3]})"),
)
rest = st.tuples(st.one_of(st.just(""), number.map(lambda n: f"pid={n}, "),
                           st.just("pid='<unknown>', ")),
                 st.one_of(st.just(""), st.text(max_size=12).map(lambda t: f"name={t}, ")),
                 payload).map("".join)
xid_line = st.tuples(
    st.sampled_from(["NVRM: Xid (PCI:", "NVRM: Xid (", "NVRM: Xid PCI:", "NVRM: Xid "]),
    pci,
    st.one_of(st.just(""), number.map(lambda n: f" GPU-I:{n}"),
              st.tuples(number, number).map(lambda p: f" GPU-I:{p[0]} GPU-CI:{p[1]}")),
    st.sampled_from(["): ", ": ", "):", ") "]),
    st.one_of(number, st.just(""), st.just("0x4f")),
    st.sampled_from([", ", ",", " "]),
    rest,
).map("".join)
fallen_line = st.one_of(
    st.tuples(pci, st.text(max_size=40)).map(
        lambda p: f"NVRM: The NVIDIA GPU {p[0]}\nNVRM: {p[1]} fallen off the bus and is not "
                  "responding to commands."),
    pci.map(lambda p: f"NVRM: GPU {p}: GPU has fallen off the bus."),
    pci.map(lambda p: f"NVRM: The NVIDIA GPU {p}"),
    st.just("NVRM: fallen off the bus and is not responding to commands."),
)
nvrm_text = st.one_of(xid_line, fallen_line, st.text(max_size=200),
                      st.text(max_size=80).map(lambda t: "NVRM: Xid" + t))

sxid_rest = st.one_of(
    st.tuples(st.sampled_from(["Fatal", "Non-fatal", "Nonfatal", "fatal"]), number,
              st.text(max_size=30)).map(lambda p: f"{p[0]}, Link {p[1]} {p[2]}"),
    st.tuples(number, number, number).map(
        lambda p: f"Severity {p[0]} Engine instance {p[1]} Sub-engine instance {p[2]}"),
    st.lists(hexword, max_size=10).map(lambda w: "Data {" + ", ".join(w) + "}"),
    st.lists(hexword, max_size=4).map(lambda w: "Data {" + ", ".join(w)),  # cut short
    st.text(max_size=40),
)
sxid_line = st.tuples(
    st.one_of(st.just(""), number.map(lambda n: f"nvidia-nvswitch{n}: ")),
    st.sampled_from(["SXid (PCI:", "SXid (", "SXid PCI:"]), pci,
    st.sampled_from(["): ", ": ", ")"]), st.one_of(number, st.just("")),
    st.sampled_from([", ", " "]), sxid_rest,
).map("".join)
sxid_text = st.one_of(sxid_line, st.text(max_size=200),
                      st.text(max_size=80).map(lambda t: "SXid" + t))


@PROPERTY
@given(nvrm_text)
def test_parse_xid_returns_only_its_documented_outcomes(text: str) -> None:
    parsed = parse_xid(text)
    assert parsed is None or isinstance(parsed, ParsedXid | XidParseError | GpuHeader)
    if isinstance(parsed, ParsedXid):
        cls = classify(parsed)  # what the check does next must not raise either
        assert cls.reason == parsed.reason
        assert parsed.pci is None or len(parsed.pci) == len("0000:53:00.0")
    elif isinstance(parsed, XidParseError):
        assert parsed.kind in {"garbage", "no_pci", "fragment"}
        if parsed.kind == "fragment":
            joined = join_fallen_off(GpuHeader("0000:53:00.0"), parsed)
            assert joined.fallen_off_bus


@PROPERTY
@given(st.lists(sxid_text, min_size=1, max_size=8))
def test_parse_sxid_and_the_grouper_return_only_their_documented_outcomes(texts) -> None:
    grouper = SxidGrouper()
    for text in texts:
        parsed = parse_sxid(text)
        assert parsed is None or isinstance(parsed, ParsedSxid | XidParseError)
        if isinstance(parsed, ParsedSxid):
            _eid, event, _new = grouper.feed(parsed)
            status_of(event)
            assert event.reason == f"SXid{parsed.code}"
