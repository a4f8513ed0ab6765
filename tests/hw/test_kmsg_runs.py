"""The followed file's run skipping (``hw/kmsg/runs.py``) against its per-line reference.

A pre-searching ``KmsgFileSource`` skips whole runs of plain lines at once; with
``skip_runs = False`` every line goes through ``_skip``, the path the run skipping must equal.
The property: for any log, written in any pieces and read in batches of any size, both give
the same records (so every record holding a literal, the ones a check uses), the same counts
(skipped lines, parse errors) and the same saved position after every read.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.hw.kmsg.files import KmsgFileSource, iter_file
from gpu_monitor.hw.kmsg.record import MAX_LINE_BYTES
from gpu_monitor.hw.kmsg.runs import PlainRuns

FILES = settings(deadline=None, derandomize=True, max_examples=200)
LITERALS = ("NVRM", "SXid")
STAMP = b"[Mon Jan  1 00:00:00 2024] "
XID = b"NVRM: Xid (PCI:0000:53:00): 13, pid=1, name=python, Graphics Exception"
SXID = b"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 16"

# Every kind of line the per-line path treats differently, plain ones most often.
LINE = st.one_of(
    st.integers(0, 300).map(lambda n: STAMP + b"mlx5_core port event " + b"x" * n),
    st.integers(0, 300).map(lambda n: STAMP + b"plain " + b"q" * n + b"\r"),
    # Big lines move the next one's start within the 64 KiB reads: a line past MAX_LINE_BYTES
    # is complete in the buffer only when it starts part-way into one.
    st.integers(1000, 40_000).map(lambda n: b"big " + b"w" * n),
    st.sampled_from([
        STAMP + XID, XID, STAMP + SXID, b"6,1234,5678,-;" + XID, STAMP + b"tail NVRM",
        b" continuation", b"\tcontinuation NVRM: more", b"  SXid in a continuation",
        b"", b"   ", b"\r", b"\x0b", b"\x0cform feed", b"\x01control start",
        STAMP + b"bad \xff\xfe bytes", b"\xc3\xa9t\xc3\xa9 utf-8", b"nul \x00 byte",
        b"NV", b"RM split literal", b"SXi", b"d",
    ]),
    st.integers(-2, 2).map(lambda d: b"z" * (MAX_LINE_BYTES + d)),
    st.integers(-2, 2).map(lambda d: b"z" * (MAX_LINE_BYTES + d - 4) + b"NVRM"),
)


def _read_all(src: KmsgFileSource, max_records: int | None) -> list:
    """Every call's outcome until the source has nothing more now."""
    calls = []
    while True:
        batch = src.read_available(max_records=max_records)
        calls.append((batch, src.lines_skipped, src.parse_errors, src.position()))
        if not batch:
            return calls


def _both(path: Path, pieces: list[bytes], max_records: int | None) -> tuple[list, list]:
    """The run-skipping source's and the per-line source's reads of ``pieces``, appended one at
    a time to ``path`` with both sources draining it after each."""
    path.write_bytes(b"")
    fast, slow = KmsgFileSource(str(path)), KmsgFileSource(str(path))
    slow.skip_runs = False
    for src in (fast, slow):
        src.select(LITERALS)
    got: tuple[list, list] = ([], [])
    try:
        for piece in pieces:
            with path.open("ab") as fh:
                fh.write(piece)
            for src, calls in zip((fast, slow), got, strict=True):
                calls.extend(_read_all(src, max_records))
    finally:
        fast.close()
        slow.close()
    return got


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)] or [b""]


@FILES
@given(st.lists(LINE, max_size=40), st.booleans(), st.lists(st.integers(0, 200_000),
       max_size=4), st.sampled_from([None, 1, 2, 3, 32]))
def test_run_skipping_equals_the_per_line_path(tmp_path_factory, lines, newline_at_end, cuts,
                                               max_records) -> None:
    data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    path = tmp_path_factory.mktemp("runs") / "kern.log"
    fast, slow = _both(path, _cut(data, cuts), max_records)
    assert fast == slow


def test_a_storm_slice_skips_the_same_lines_and_keeps_every_candidate(tmp_path) -> None:
    """The issue-18 mix (99% ordinary lines up to 4 KiB, some not UTF-8; 1% Xid lines):
    identical reads, and every record the full read holds a literal in is among them."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
    from _kmsg_storm import storm_slices

    data = b"".join(d for d, _ in storm_slices(random.Random(18), seconds=0.5, rate=20500,
                                               burst_seconds=0.1, burst_rate=2000))
    cuts = [len(data) // 3, len(data) // 3 + 7, 2 * len(data) // 3]
    fast, slow = _both(tmp_path / "kern.log", _cut(data, cuts), 32)
    assert fast == slow
    got = [r for batch, *_ in fast for r in batch]
    want = [r for r in iter_file(tmp_path / "kern.log") if any(w in r.raw for w in LITERALS)]
    assert want and [r for r in got if not r.malformed] == want
    assert fast[-1][1] > 0.9 * data.count(b"\n")  # the plain lines were skipped, not parsed


def test_a_run_ends_at_the_first_line_that_is_not_plain() -> None:
    lines = [b"a", b"b NVRM", b"c", b"\xff", b"d", b" e", b"f", b"", b"g", b"h\x00", b"i",
             b"y" * (MAX_LINE_BYTES + 1), b"j", b"partial"]
    buf = bytearray(b"\n".join(lines))
    starts = [sum(len(x) + 1 for x in lines[:i]) for i in range(len(lines))]
    runs = PlainRuns(buf, (b"NVRM",))  # asked at each line start in turn, as the source does
    plain = {0, 2, 4, 6, 8, 10, 12}
    want = [starts[i + 1] if i in plain else starts[i] for i in range(len(lines))]
    assert [runs.end(start) for start in starts] == want


def _plain(line: bytes, words: tuple[bytes, ...]) -> bool:
    """The per-line reference of the module contract's plain line."""
    return (bool(line) and line[0] not in b" \t\n\r\x0b\x0c" and line.isascii()
            and b"\x00" not in line and len(line) <= MAX_LINE_BYTES
            and not any(w in line for w in words))


@FILES
@given(st.lists(LINE, max_size=40), st.booleans())
def test_a_run_is_the_plain_lines_up_to_the_next_that_is_not(lines, newline_at_end) -> None:
    """At every line start in turn, ``end`` is the start of the next line that is not plain
    (or of the unterminated last line): never past a line the per-line path must see."""
    words = tuple(w.encode() for w in LITERALS)
    buf = bytearray(b"\n".join(lines) + (b"\n" if newline_at_end else b""))
    complete = [bytes(x) for x in buf.split(b"\n")[:-1]]  # newline-terminated lines
    starts = [sum(len(x) + 1 for x in complete[:i]) for i in range(len(complete) + 1)]
    runs = PlainRuns(buf, words)
    for i, start in enumerate(starts):
        j = i
        while j < len(complete) and _plain(complete[j], words):
            j += 1
        assert runs.end(start) == starts[j]
