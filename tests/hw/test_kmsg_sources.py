"""Kernel-log sources: the /dev/kmsg record device (through fakes) and followed files/FIFOs."""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_monitor.hw.kmsg.device import KMSG_READ_BUFFER, FdRecordReader, KmsgDeviceSource
from gpu_monitor.hw.kmsg.files import KmsgFileSource, iter_file
from gpu_monitor.hw.kmsg.follow import open_kmsg
from gpu_monitor.hw.kmsg.record import MAX_LINE_BYTES, KmsgGap, KmsgRecord
from gpu_monitor.hw.paths import HostPaths


class FakeKmsg:
    """/dev/kmsg semantics: one record per read, scripted OSErrors, EAGAIN when empty."""

    def __init__(self, script: list[bytes | OSError] | None = None):
        self.script: list[bytes | OSError] = list(script or [])
        self.sizes: list[int] = []
        self.seeked_to_end = False
        self.closed = False

    def push(self, *items: bytes | OSError) -> None:
        self.script.extend(items)

    def read(self, size: int) -> bytes:
        self.sizes.append(size)
        if not self.script:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        item = self.script.pop(0)
        if isinstance(item, OSError):
            raise item
        if len(item) > size:
            raise OSError(errno.EINVAL, "Invalid argument")
        return item

    def seek_end(self) -> None:
        self.seeked_to_end = True
        self.script.clear()

    def fileno(self) -> int:
        return 99

    def close(self) -> None:
        self.closed = True


def rec(seq: int, msg: str, pri: int = 4, usec: int = 1_000_000) -> bytes:
    return f"{pri},{seq},{usec + seq},-;{msg}\n".encode()


def only_records(items: list[KmsgRecord | KmsgGap]) -> list[KmsgRecord]:
    return [i for i in items if isinstance(i, KmsgRecord)]


# --- device ----------------------------------------------------------------------------------


def test_device_reads_one_record_per_read_until_eagain() -> None:
    fake = FakeKmsg([rec(10, "a"), rec(11, "b"), rec(12, "NVRM: Xid (PCI:0000:3b:00): 79")])
    src = KmsgDeviceSource("/unused", reader=fake)
    items = src.read_available()
    assert [r.message for r in only_records(items)] == ["a", "b", "NVRM: Xid (PCI:0000:3b:00): 79"]
    assert [r.line_no for r in only_records(items)] == [1, 2, 3]
    assert all(size >= 8192 for size in fake.sizes)
    assert src.read_available() == []
    assert src.parse_errors == 0


def test_device_epipe_yields_a_gap_counted_from_sequence_numbers() -> None:
    fake = FakeKmsg([rec(10, "a"), rec(11, "b")])
    src = KmsgDeviceSource("/unused", reader=fake)
    assert len(src.read_available()) == 2
    fake.push(OSError(errno.EPIPE, "Broken pipe"), rec(50, "after overrun"), rec(51, "next"))
    items = src.read_available()
    assert items[0] == KmsgGap(missed=38, reason=items[0].reason)
    assert "EPIPE" in items[0].reason
    assert [r.seq for r in only_records(items)] == [50, 51]
    assert src.gaps == 1


def test_device_epipe_at_end_of_round_still_reports_the_gap() -> None:
    fake = FakeKmsg([rec(1, "a"), BrokenPipeError(errno.EPIPE, "Broken pipe")])
    src = KmsgDeviceSource("/unused", reader=fake)
    items = src.read_available()
    assert isinstance(items[-1], KmsgGap) and items[-1].missed is None
    fake.push(rec(9, "later"))
    assert [type(i) for i in src.read_available()] == [KmsgRecord]  # reported once


def test_device_sequence_jump_without_epipe_is_a_gap() -> None:
    src = KmsgDeviceSource("/unused", reader=FakeKmsg([rec(5, "a"), rec(9, "b")]))
    items = src.read_available()
    assert [type(i) for i in items] == [KmsgRecord, KmsgGap, KmsgRecord]
    assert items[1].missed == 3


def test_device_replay_false_seeks_to_end() -> None:
    fake = FakeKmsg([rec(1, "old history")])
    src = KmsgDeviceSource("/unused", replay=False, reader=fake)
    assert fake.seeked_to_end
    assert src.read_available() == []
    fake.push(rec(2, "new"))
    assert [r.message for r in only_records(src.read_available())] == ["new"]


def test_device_replay_true_does_not_seek() -> None:
    fake = FakeKmsg([rec(1, "old history")])
    src = KmsgDeviceSource("/unused", replay=True, reader=fake)
    assert not fake.seeked_to_end
    assert [r.message for r in only_records(src.read_available())] == ["old history"]


def test_device_record_dictionary_becomes_fields() -> None:
    fake = FakeKmsg(
        [b"3,812,98765432,-;pcieport 0000:3a:00.0: AER: error\n SUBSYSTEM=pci\n"
         b" DEVICE=+pci:0000:3b:00.0\n"]
    )  # fmt: skip
    (record,) = KmsgDeviceSource("/unused", reader=fake).read_available()
    assert isinstance(record, KmsgRecord)
    assert dict(record.fields) == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b"6,3964,2067", id="truncated"),
        pytest.param(b"\x00\x01\x02\xff binary", id="binary"),
        pytest.param(b"\xc3\x28 invalid utf-8", id="invalid-utf8"),
    ],
)
def test_device_malformed_record_is_counted_and_reading_continues(bad: bytes) -> None:
    src = KmsgDeviceSource("/unused", reader=FakeKmsg([rec(1, "a"), bad, rec(2, "b")]))
    items = src.read_available()
    assert [i.source_format for i in only_records(items)] == ["kmsg", "malformed", "kmsg"]
    assert src.parse_errors == 1
    assert not any(isinstance(i, KmsgGap) for i in items)


def test_device_max_records_bounds_one_round() -> None:
    src = KmsgDeviceSource("/unused", reader=FakeKmsg([rec(i, str(i)) for i in range(1, 6)]))
    assert [r.message for r in only_records(src.read_available(max_records=2))] == ["1", "2"]
    assert [r.message for r in only_records(src.read_available())] == ["3", "4", "5"]


def test_device_other_io_errors_propagate() -> None:
    src = KmsgDeviceSource("/unused", reader=FakeKmsg([OSError(errno.EIO, "I/O error")]))
    with pytest.raises(OSError) as info:
        src.read_available()
    assert info.value.errno == errno.EIO


def test_device_io_error_after_records_hands_them_out_first() -> None:
    src = KmsgDeviceSource("/unused", reader=FakeKmsg([rec(1, "NVRM: Xid (PCI:0000:3b:00): 48"),
                                                      OSError(errno.EIO, "I/O error"),
                                                      rec(2, "after")]))
    assert [r.seq for r in only_records(src.read_available())] == [1]
    with pytest.raises(OSError) as info:
        src.read_available()
    assert info.value.errno == errno.EIO
    assert [r.seq for r in only_records(src.read_available())] == [2]


def test_device_fileno_and_close_delegate() -> None:
    fake = FakeKmsg()
    with KmsgDeviceSource("/unused", reader=fake) as src:
        assert src.fileno() == 99
    assert fake.closed


def test_fd_reader_keeps_record_boundaries_and_polls() -> None:
    """A SEQPACKET socket behaves like /dev/kmsg: a read returns one whole record."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        ours.setblocking(False)
        src = KmsgDeviceSource("/unused", reader=FdRecordReader(ours.fileno(), owns_fd=False))
        assert src.read_available() == []
        theirs.send(rec(7, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."))
        theirs.send(b"6,8,2000,-;mlx5_core 0000:5c:00.0: link down\n SUBSYSTEM=pci\n")
        ready, _, _ = select.select([src.fileno()], [], [], 5)
        assert ready == [ours.fileno()]
        items = only_records(src.read_available())
        assert [r.seq for r in items] == [7, 8]
        assert items[1].fields == {"SUBSYSTEM": "pci"}


def test_real_dev_kmsg_when_readable() -> None:
    path = HostPaths().kmsg_path
    try:
        src = KmsgDeviceSource(path)
    except OSError as e:
        pytest.skip(f"{path} not readable here: {e}")
    with src:
        items = src.read_available(max_records=200)
    records = only_records(items)
    if not records:
        pytest.skip("kernel ring buffer is empty or hidden")
    assert src.parse_errors == 0
    assert {r.source_format for r in records} == {"kmsg"}
    assert all(r.seq is not None and r.monotonic_s is not None for r in records)


def test_read_buffer_is_larger_than_any_kernel_record() -> None:
    assert KMSG_READ_BUFFER >= 8192


# --- followed files ------------------------------------------------------------------------


def log_file(tmp_path: Path, data: bytes = b"", name: str = "dmesg.log") -> Path:
    """A kernel log file in ``tmp_path`` holding ``data``."""
    log = tmp_path / name
    log.write_bytes(data)
    return log


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def messages(items: list[KmsgRecord | KmsgGap]) -> list[str]:
    return [r.message for r in only_records(items)]


def test_file_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    log = log_file(tmp_path)
    src = KmsgFileSource(str(log))
    append(log, b"[2397166.923949] NVRM: Xid (PCI:0000:0f:00): 64, pid='<unk")
    assert src.read_available() == []
    append(log, b"nown>', name=<unknown>, Row Remapper Error\n[2397166.98")
    (first,) = only_records(src.read_available())
    assert first.message == (
        "NVRM: Xid (PCI:0000:0f:00): 64, pid='<unknown>', name=<unknown>, Row Remapper Error"
    )
    assert first.line_no == 1
    append(log, b"3093] NVRM: Xid (PCI:0000:0f:00): 94, pid=2503421, name=python3, Ch 00000008\n")
    (second,) = only_records(src.read_available())
    assert second.monotonic_s == pytest.approx(2397166.983093)
    assert second.line_no == 2
    src.close()


def test_file_from_start_false_skips_existing_lines(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"[1.0] old\n[2.0] older\n")
    with KmsgFileSource(str(log), from_start=False) as src:
        assert src.read_available() == []
        append(log, b"[3.0] new\n")
        assert messages(src.read_available()) == ["new"]


def test_file_continuation_written_with_its_record_is_attached(tmp_path: Path) -> None:
    log = log_file(tmp_path)
    with KmsgFileSource(str(log)) as src:
        append(
            log,
            b"[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
            b"               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
            b"               NVRM: fallen off the",
        )
        assert src.read_available() == []  # a continuation line is still being written
        append(log, b" bus and is not responding to commands.\n")
        (record,) = only_records(src.read_available())
        assert record.continuation == (
            "NVRM: (PCI ID: 10de:26b5) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
        )


def test_nul_in_an_indented_line_is_malformed_not_continuation(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"[1.0] NVRM: a\n    \x00\x00\x00\n    NVRM: b\n")
    records = list(iter_file(log))
    assert [(r.source_format, r.continuation) for r in records] == [
        ("dmesg", ()),
        ("malformed", ()),
        ("plain", ()),  # a malformed record takes no continuation
    ]


def test_file_record_is_handed_out_when_no_more_data_is_available(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"[1.0] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n")
    with KmsgFileSource(str(log)) as src:
        assert len(src.read_available()) == 1
        append(log, b"    late continuation\n")
        (late,) = only_records(src.read_available())
        assert late.source_format == "plain"
        assert late.message == "    late continuation"


def test_file_truncation_restarts_from_the_beginning(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"[1.0] first boot line one\n[2.0] first boot line two\n")
    with KmsgFileSource(str(log)) as src:
        assert len(src.read_available()) == 2
        log.write_bytes(b"[0.5] after truncate\n")  # shorter than what we have read
        assert messages(src.read_available()) == ["after truncate"]
        append(log, b"[0.6] appended\n")
        assert messages(src.read_available()) == ["appended"]


def test_file_rotation_drains_old_file_then_reads_new_one(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"[1.0] before rotation\n", name="kern.log")
    with KmsgFileSource(str(log)) as src:
        assert messages(src.read_available()) == ["before rotation"]
        with open(log, "ab") as old:
            os.rename(log, tmp_path / "kern.log.1")
            old.write(b"[2.0] written to the old file after rename\n[2.5] unterminated")
        log.write_bytes(b"[3.0] new file line\n")
        assert messages(src.read_available()) == [
            "written to the old file after rename",
            "unterminated",
            "new file line",
        ]
        assert os.fstat(src.fileno()).st_ino == log.stat().st_ino
        append(log, b"[4.0] more\n")
        assert messages(src.read_available()) == ["more"]


def test_file_rotated_away_without_successor_keeps_the_old_file(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"[1.0] a\n", name="kern.log")
    with KmsgFileSource(str(log)) as src:
        assert len(src.read_available()) == 1
        os.rename(log, tmp_path / "kern.log.1")
        assert src.read_available() == []
        log.write_bytes(b"[2.0] b\n")
        assert messages(src.read_available()) == ["b"]


def test_file_missing_at_start_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        KmsgFileSource(str(tmp_path / "nope.log"))


def test_file_of_raw_kmsg_records_with_dictionary_lines(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.txt"
    log.write_bytes(
        b"6,3964,206764307,-;nvidia-nvswitch2: open (major=510)\n"
        b"3,3965,206764310,-;pcieport 0000:3a:00.0: AER: error\n"
        b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
        b"[206.8] a dmesg line in the same file\n"
    )
    with KmsgFileSource(str(log)) as src:
        items = only_records(src.read_available())
    assert [r.source_format for r in items] == ["kmsg", "kmsg", "dmesg"]
    assert items[1].fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    assert items[1].continuation == ()
    assert items[2].line_no == 5


def test_file_max_records_leaves_the_rest_buffered(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"".join(b"[%d.0] line %d\n" % (i, i) for i in range(10)))
    with KmsgFileSource(str(log)) as src:
        first = src.read_available(max_records=3)
        rest = src.read_available()
    assert len(first) == 3
    assert messages(first) + messages(rest) == [f"line {i}" for i in range(10)]


GARBAGE = (
    b"[1.0] good one\n"
    b"\x00\x00\x00\x00\x00\x00\x00\x00\n"  # NUL padding left by a crash
    b"\xde\xad\xbe\xef\xff\xfe binary\n"  # not UTF-8
    b"[2.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    b"6,3964,2067\n" + b"A" * (MAX_LINE_BYTES + 10) + b"\n"  # truncated kmsg record
    b"\n"
    b"[3.0] good three\n"
)
GARBAGE_EXPECTED = [
    ("dmesg", None),
    ("malformed", "NUL byte in line"),
    ("malformed", "invalid UTF-8"),
    ("dmesg", None),
    ("malformed", "truncated kmsg record"),
    ("malformed", "line longer than 64 KiB"),
    ("dmesg", None),
]


def _shape(records: list[KmsgRecord]) -> list[tuple[str, str | None]]:
    return [(r.source_format, r.fields.get("error")) for r in records]


def test_scan_survives_garbage_binary_and_overlong_lines(tmp_path: Path) -> None:
    log = log_file(tmp_path, GARBAGE, name="damaged.log")
    records = list(iter_file(log))
    assert _shape(records) == GARBAGE_EXPECTED
    assert [r.line_no for r in records] == [1, 2, 3, 4, 5, 6, 8]
    assert records[3].message.startswith("NVRM: Xid (PCI:0000:3b:00): 79")
    assert len(records[5].message) == MAX_LINE_BYTES


def test_followed_file_survives_garbage_and_counts_parse_errors(tmp_path: Path) -> None:
    log = log_file(tmp_path, name="damaged.log")
    with KmsgFileSource(str(log)) as src:
        got: list[KmsgRecord] = []
        for i in range(0, len(GARBAGE), 4096):  # arrives in pieces
            append(log, GARBAGE[i : i + 4096])
            got += only_records(src.read_available())
        assert _shape(got) == GARBAGE_EXPECTED
        assert src.parse_errors == 4


def test_followed_overlong_line_does_not_grow_the_buffer(tmp_path: Path) -> None:
    log = log_file(tmp_path)
    with KmsgFileSource(str(log)) as src:
        append(log, b"B" * (3 * MAX_LINE_BYTES))
        (bad,) = only_records(src.read_available())
        assert bad.malformed and len(bad.raw) == MAX_LINE_BYTES
        append(log, b"B" * MAX_LINE_BYTES + b"\n[9.0] fine\n")
        assert messages(src.read_available()) == ["fine"]
        assert src.parse_errors == 1


def test_file_without_trailing_newline_scans_its_last_line(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"[1.0] a\n[2.0] b")
    assert [r.message for r in iter_file(log)] == ["a", "b"]
    assert list(iter_file(tmp_path / "dmesg.log"))[1].line_no == 2


def test_empty_file_yields_nothing(tmp_path: Path) -> None:
    log = log_file(tmp_path, name="empty.log")
    assert list(iter_file(log)) == []
    with KmsgFileSource(str(log)) as src:
        assert src.read_available() == [] and src.parse_errors == 0


# --- FIFO ------------------------------------------------------------------------------------


def _collect(src: KmsgFileSource, want: int, timeout: float = 10.0) -> list[KmsgRecord]:
    got: list[KmsgRecord] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        select.select([src.fileno()], [], [], 0.2)
        got += only_records(src.read_available())
    return got


def _writer(path: Path, pieces: list[bytes], started: threading.Event) -> Callable[[], None]:
    def run() -> None:
        with open(path, "wb", buffering=0) as w:
            started.set()
            for piece in pieces:
                w.write(piece)
                time.sleep(0.01)

    return run


def test_fifo_with_writer_thread_delivers_complete_records(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    pieces = [
        b"6,100,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, ",
        b"name=x, GPU has fallen off the bus.\n4,101,5000001,-;nvidia-nvswitch0: SXid ",
        b"(PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up\n",
        b"[5.1] dmesg line through the fifo\n",
    ]
    with KmsgFileSource(str(fifo)) as src:  # opened before any writer exists: must not block
        started = threading.Event()
        t = threading.Thread(target=_writer(fifo, pieces, started), daemon=True)
        t.start()
        got = _collect(src, 3)
        t.join(5)
        assert [(r.source_format, r.seq) for r in got] == [
            ("kmsg", 100),
            ("kmsg", 101),
            ("dmesg", None),
        ]
        assert got[0].message.endswith("GPU has fallen off the bus.")
        # The writer is gone; the source neither ends nor spins, and a new writer is heard.
        assert src.read_available() == []
        ready, _, _ = select.select([src.fileno()], [], [], 0.05)
        assert ready == []
        t2 = threading.Thread(
            target=_writer(fifo, [b"[6.0] second writer\n"], threading.Event()), daemon=True
        )
        t2.start()
        assert [r.message for r in _collect(src, 1)] == ["second writer"]
        t2.join(5)


# --- one-shot reads of a FIFO and of what is not a log ----------------------------------------


def _in_thread(fn: Callable[[], object], deadline_s: float = 20.0) -> object:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) when it does not return."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(deadline_s)
    assert not t.is_alive(), "the one-shot read blocked"
    return out[0]


def test_fifo_without_a_writer_is_read_as_empty_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    assert _in_thread(lambda: list(iter_file(fifo, fifo_idle_s=0.05))) == []


def test_fifo_read_ends_when_its_writer_closes_it(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    pieces = [b"[1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has ",
              b"fallen off the bus.\n[2.0] second\n", b"[3.0] last, no newline"]
    started = threading.Event()
    writer = threading.Thread(target=_writer(fifo, pieces, started), daemon=True)
    writer.start()  # blocks in open() until the read side below exists
    # A long idle limit: only the writer's close can end this read in time.
    got = _in_thread(lambda: [r.message for r in iter_file(fifo, fifo_idle_s=30.0)])
    writer.join(5)
    assert got == ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
                   "second", "last, no newline"]


def test_fifo_with_a_silent_writer_ends_after_the_idle_time(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer that stays attached
    try:
        os.write(fd, b"[1.0] one line, then silence\n")
        got = _in_thread(lambda: [r.message for r in iter_file(fifo, fifo_idle_s=0.05)])
    finally:
        os.close(fd)
    assert got == ["one line, then silence"]


def test_scan_of_a_fifo_says_it_idled(tmp_path: Path) -> None:
    from gpu_monitor.hw.kmsg_scan import ScanStats, iter_matching

    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    stats = ScanStats()
    assert _in_thread(lambda: list(iter_matching(fifo, (b"NVRM",), stats,
                                                 fifo_idle_s=0.05))) == []
    assert (stats.source, stats.fifo_idle, stats.text, stats.lines) == ("fifo", True, False, 0)


@pytest.mark.parametrize("kind", ["missing", "dangling-symlink", "directory", "device"])
def test_what_cannot_be_read_as_a_log_raises_naming_the_path(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "kern.log"
    expected: type[OSError] = FileNotFoundError
    if kind == "dangling-symlink":
        os.symlink(tmp_path / "gone.log", path)
    elif kind == "directory":
        path.mkdir()
        expected = IsADirectoryError
    elif kind == "device":
        path = Path(os.devnull)
        expected = OSError
    with pytest.raises(expected) as err:
        list(iter_file(path))
    assert err.value.filename == str(path)
    if kind == "device":
        assert "not a regular file or FIFO" in str(err.value)


# --- open_kmsg -------------------------------------------------------------------------------


def test_open_kmsg_uses_the_file_given_by_kmsg_override(tmp_path: Path) -> None:
    log = log_file(tmp_path, b"[1.0] a\n", name="saved.log")
    with open_kmsg(HostPaths(kmsg=str(log))) as src:
        assert isinstance(src, KmsgFileSource)
        assert src.path == str(log)
        assert messages(src.read_available()) == ["a"]
    with open_kmsg(HostPaths(kmsg=str(log)), replay=False) as src:
        assert src.read_available() == []


def test_open_kmsg_uses_the_device_under_the_dev_root(tmp_path: Path) -> None:
    opened: list[str] = []
    fake = FakeKmsg([rec(1, "from device")])

    def reader(path: str) -> FakeKmsg:
        opened.append(path)
        return fake

    paths = HostPaths().under(str(tmp_path))
    with open_kmsg(paths, replay=True, device_reader=reader) as src:
        assert isinstance(src, KmsgDeviceSource)
        assert opened == [os.path.join(str(tmp_path), "dev", "kmsg")]
        assert messages(src.read_available()) == ["from device"]
    with open_kmsg(paths, replay=False, device_reader=lambda p: FakeKmsg([rec(1, "x")])) as src:
        assert src.read_available() == []


def test_open_kmsg_device_missing_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_kmsg(HostPaths().under(str(tmp_path)))
