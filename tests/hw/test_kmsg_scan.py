"""iter_matching gives exactly the records iter_file gives for the lines that hold a keyword."""

from __future__ import annotations

import pytest

from gpu_monitor.hw import kmsg_scan
from gpu_monitor.hw.kmsg.files import iter_file
from gpu_monitor.hw.kmsg.record import MAX_LINE_BYTES
from gpu_monitor.hw.kmsg_scan import ScanStats, iter_matching

NEEDLES = (b"NVRM", b"SXid")


def _key(r):
    return (r.line_no, r.source_format, r.message, r.continuation, dict(r.fields), r.seq,
            r.priority, r.monotonic_s, r.wallclock, r.host, r.raw)


def _holds(r) -> bool:
    return any(n.decode() in r.raw for n in NEEDLES)


def _compare(path) -> None:
    slow = [_key(r) for r in iter_file(path) if _holds(r)]
    stats = ScanStats()
    fast = [_key(r) for r in iter_matching(path, NEEDLES, stats) if _holds(r)]
    assert fast == slow
    with open(path, "rb") as fh:
        assert stats.lines == sum(1 for _ in fh)


def _fixture_files(fixtures_dir):
    return sorted(p for p in fixtures_dir.rglob("*") if p.is_file())


@pytest.mark.parametrize("count_chunk", [16 * 1024 * 1024, 5])
def test_same_records_as_iter_file_for_every_fixture(fixtures_dir, monkeypatch, count_chunk):
    monkeypatch.setattr(kmsg_scan, "_COUNT_CHUNK", count_chunk)
    files = _fixture_files(fixtures_dir)
    assert len(files) > 100
    for path in files:
        _compare(path)


def test_continuations_blank_lines_overlong_and_binary(tmp_path):
    path = tmp_path / "k.log"
    path.write_bytes(
        b"   NVRM: fallen off the bus (a continuation with nothing before it)\n"
        b"[ 1.0] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        b"\n"
        b"               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        b"               NVRM: fallen off the bus and is not responding to commands.\n"
        b"[ 2.0] unrelated\n"
        b"    SXid in a continuation of an unrelated record\n"
        b"\xff\xfe NVRM: not UTF-8\n"
        b"   indented after a malformed line\n"
        b"NVRM: with a NUL \x00 byte\n"
        + b"NVRM: " + b"x" * (MAX_LINE_BYTES + 10) + b"\n"
        b"4,1227,437812449,c;NVRM: Xid (PCI:0000:01:00): 43, pid=1, name=a, Ch 00000018\n"
        b" DEVICE=+pci:0000:01:00.0\n"
        b"6,3,4,-;nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 X"  # no \n
    )
    _compare(path)
    got = [r for r in iter_matching(path, NEEDLES) if _holds(r)]
    assert got[1].continuation[-1].startswith("NVRM: fallen off the bus")
    assert got[-2].fields["DEVICE"] == "+pci:0000:01:00.0"


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    stats = ScanStats()
    assert list(iter_matching(empty, NEEDLES, stats)) == [] and stats.lines == 0
    assert (stats.source, stats.text) == ("file", False)


@pytest.mark.parametrize(("data", "text"), [
    pytest.param(b"\n \n\t\r\n", False, id="blank-lines-only"),
    pytest.param(b"\n\n[1.0] unrelated\n", True, id="one-line-without-a-needle"),
    pytest.param(b"\xff\x00\n", True, id="binary"),
])
def test_stats_say_whether_the_log_held_any_line(tmp_path, data, text):
    path = tmp_path / "k.log"
    path.write_bytes(data)
    stats = ScanStats()
    assert list(iter_matching(path, NEEDLES, stats)) == []
    assert stats.text is text and stats.lines == data.count(b"\n")


def test_finds_records_fast_on_a_big_log(tmp_path):
    path = tmp_path / "big.log"
    filler = b"[%d.000000] mlx5_core 0000:5c:00.0: mlx5_pcie_event:299: insufficient power\n"
    with open(path, "wb") as fh:
        for i in range(200_000):
            fh.write(filler % i)
            if i % 10_000 == 0:
                fh.write(b"[%d.5] NVRM: Xid (PCI:0000:86:00): 79, pid=1, name=p, off the bus\n" % i)
    stats = ScanStats()
    found = [r for r in iter_matching(path, (b"NVRM",), stats)]
    assert len(found) == 20 and stats.lines == 200_020
    assert [r.line_no for r in found][:2] == [2, 10_003]
