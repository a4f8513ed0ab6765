"""Property tests of the kernel-log parsers: any text or bytes in, only the documented outcomes out.

``parse_text_line`` never raises (a record or None); ``parse_kmsg_record`` raises nothing but
``KmsgParseError``; ``iter_file`` never raises on content and ``iter_matching`` gives the records
``iter_file`` gives. The strategies build lines in every stamp shape the reader detects, with
fields drawn far outside their real ranges, so the parsing branches behind each shape run, not
only the "plain" fallback that random text lands in.
"""

from __future__ import annotations

import math
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.hw.kmsg.files import iter_file
from gpu_monitor.hw.kmsg.record import MAX_LINE_BYTES, KmsgParseError, KmsgRecord, parse_kmsg_record
from gpu_monitor.hw.kmsg.text import WALLCLOCK_MAX, WALLCLOCK_MIN, parse_text_line
from gpu_monitor.hw.kmsg_scan import iter_matching

PROPERTY = settings(deadline=None, derandomize=True, max_examples=300)
FILES = settings(deadline=None, derandomize=True, max_examples=60)

digits = st.text("0123456789", min_size=1, max_size=30)
huge_digits = st.one_of(digits, st.integers(300, 5000).map(lambda n: "9" * n))


def two() -> st.SearchStrategy[str]:
    """Two digits, drawn often at the edges of the real fields (month 0/1/12/13, hour 23/24,
    minute 59/60) and otherwise anywhere up to 99."""
    edges = st.sampled_from([0, 1, 12, 13, 23, 24, 28, 29, 31, 32, 59, 60, 99])
    return st.one_of(edges, st.integers(0, 99)).map(lambda v: f"{v:02d}")


# Years at the ends of the calendar and of the Unix epoch, and anything in between.
year = st.one_of(st.sampled_from([0, 1, 2, 1969, 1970, 8999, 9000, 9998, 9999]),
                 st.integers(0, 9999)).map(lambda y: f"{y:04d}")


zone = st.one_of(
    st.just(""), st.just("Z"),
    st.tuples(st.sampled_from("+-"), two(), st.sampled_from(["", ":"]), two()).map("".join),
)
iso = st.tuples(
    year, two(), two(), two(), two(), two(),
    st.one_of(st.just(""), st.tuples(st.sampled_from(".,"), digits).map("".join)), zone,
).map(lambda p: f"{p[0]}-{p[1]}-{p[2]}T{p[3]}:{p[4]}:{p[5]}{p[6]}{p[7]} ")
# The first and last moments of the calendar, where converting any offset to UTC overflows.
calendar_end = st.tuples(
    st.sampled_from(["0001-01-01T00:00:00", "0001-01-01T04:59:59", "9999-12-31T23:59:59",
                     "9999-12-31T19:00:00"]),
    st.one_of(st.just(""), st.tuples(st.sampled_from(".,"), digits).map("".join)), zone,
    st.sampled_from([" ", " node-1 kernel: "]),
).map("".join)
month = st.sampled_from(["Jan", "Feb", "Mar", "Jun", "Sep", "Dec", "Foo", "Xyz"])
ctime = st.tuples(month, st.integers(0, 99), two(), two(), two(), year).map(
    lambda p: f"[Mon {p[0]} {p[1]:2d} {p[2]}:{p[3]}:{p[4]} {p[5]}] ")
mono = st.tuples(huge_digits, st.one_of(st.just(""), digits.map(lambda d: "." + d))).map(
    lambda p: f"[{p[0]}{p[1]}] ")
pstore = st.tuples(st.integers(0, 999), st.one_of(st.just(""), mono)).map(
    lambda p: f"<{p[0]}>{p[1]}")
decode = st.tuples(st.sampled_from(["kern", "user", "daemon", "local7", "bogus"]),
                   st.sampled_from(["warn", "err", "info", "nope"]),
                   st.one_of(st.just(""), iso, mono, ctime)).map(
    lambda p: f"{p[0]:<6}:{p[1]:<6}: {p[2]}")
decode = st.one_of(decode, calendar_end.map(lambda c: f"kern  :warn  : {c}"))
journal = st.tuples(iso, st.sampled_from(["node-1 kernel: ", "node-1 systemd[1]: ", ""]),
                    st.one_of(st.just(""), mono)).map("".join)
syslog = st.tuples(month, st.integers(0, 99), two(), two(), two(),
                   st.one_of(st.just(""), mono)).map(
    lambda p: f"{p[0]} {p[1]:2d} {p[2]}:{p[3]}:{p[4]} node kernel: {p[5]}")
kmsg_header = st.tuples(huge_digits, huge_digits, huge_digits,
                        st.text(",;-c0123456789", max_size=6)).map(
    lambda p: f"{p[0]},{p[1]},{p[2]},{p[3]};")
prefix = st.one_of(iso, calendar_end, ctime, mono, pstore, decode, journal, syslog, kmsg_header)
tail = st.one_of(st.text(max_size=80),
                 st.just("NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, GPU has fallen off"))
shaped_line = st.tuples(prefix, tail).map("".join)
any_line = st.one_of(shaped_line, st.text(max_size=200))


def _check_record(rec: KmsgRecord) -> None:
    assert rec.wallclock is None or (WALLCLOCK_MIN <= rec.wallclock < WALLCLOCK_MAX
                                     and rec.wallclock.utcoffset().total_seconds() == 0)
    assert rec.monotonic_s is None or math.isfinite(rec.monotonic_s)
    assert len(rec.message) <= MAX_LINE_BYTES


@PROPERTY
@given(any_line)
def test_parse_text_line_never_raises_and_keeps_times_in_range(line: str) -> None:
    rec = parse_text_line(line, line_no=7)
    if rec is None:
        assert not line.strip()
        return
    assert rec.line_no == 7
    _check_record(rec)


@PROPERTY
@given(st.tuples(prefix, st.just("NVRM: Xid (PCI:0000:53:00): 79, pid=1")).map("".join))
def test_a_stamped_xid_line_keeps_its_text_whatever_the_stamp(line: str) -> None:
    rec = parse_text_line(line)
    assert rec is not None
    _check_record(rec)
    if not rec.malformed:
        assert "NVRM: Xid (PCI:0000:53:00): 79, pid=1" in rec.text


@PROPERTY
@given(st.one_of(
    st.binary(max_size=300),
    st.tuples(kmsg_header.map(str.encode), st.binary(max_size=200)).map(b"".join),
    st.tuples(kmsg_header, st.text(max_size=60),
              st.lists(st.text(max_size=30), max_size=4)).map(
        lambda p: (p[0] + p[1] + "".join("\n " + d for d in p[2])).encode("utf-8",
                                                                            "surrogatepass")),
))
def test_parse_kmsg_record_raises_only_its_parse_error(data: bytes) -> None:
    try:
        rec = parse_kmsg_record(data, line_no=3)
    except KmsgParseError:
        return
    assert rec.source_format == "kmsg" and rec.seq is not None and rec.line_no == 3
    _check_record(rec)


file_line = st.one_of(shaped_line.map(lambda t: t.encode("utf-8", "surrogatepass")),
                      st.binary(max_size=120),
                      st.sampled_from([b"   NVRM: continuation", b"\tSXid indented", b"",
                                       b" SUBSYSTEM=pci", b"x" * (MAX_LINE_BYTES + 3)]))


@FILES
@given(st.lists(file_line, max_size=25), st.booleans())
def test_iter_file_never_raises_and_the_scan_gives_the_same_records(lines, newline_at_end
                                                                    ) -> None:
    data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    fd, path = tempfile.mkstemp(suffix=".log")
    try:
        os.write(fd, data)
        os.close(fd)
        records = list(iter_file(path))
        for rec in records:
            _check_record(rec)
        assert [r.line_no for r in records] == sorted(r.line_no for r in records)
        needles = (b"NVRM", b"SXid")

        def key(r: KmsgRecord):
            return (r.line_no, r.source_format, r.message, r.continuation, dict(r.fields),
                    r.seq, r.monotonic_s, r.wallclock, r.raw)

        def holds(r: KmsgRecord) -> bool:
            return any(n.decode() in r.raw for n in needles)

        assert ([key(r) for r in iter_matching(path, needles) if holds(r)]
                == [key(r) for r in records if holds(r)])
    finally:
        os.unlink(path)
