"""Parsing kernel-log records: every shipped sample log, line by line, plus the edge cases."""

from __future__ import annotations

from collections import Counter
from dataclasses import FrozenInstanceError
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpu_monitor.hw.kmsg.files import KmsgFileSource, iter_file
from gpu_monitor.hw.kmsg.record import (
    MAX_LINE_BYTES,
    SOURCE_FORMATS,
    KmsgParseError,
    KmsgRecord,
    parse_kmsg_record,
)
from gpu_monitor.hw.kmsg.text import WALLCLOCK_MAX, WALLCLOCK_MIN, parse_text_line
from tests.hw.kmsg_shapes import HUGE_SECONDS, IN_RANGE, MONOTONIC_FORMATS, wallclock_lines

UTC = timezone.utc

# Per file: how many records of each format, and how many records carry continuation lines.
# Counted independently with grep over the fixtures (e.g. `grep -c '^kernel: '`).
EXPECTED_FORMATS: dict[str, tuple[dict[str, int], int]] = {
    "azurehpc_nhc_health_log_xid119_old-format_in_nhc_report.txt": ({"plain": 8}, 0),
    "dcgm_testliterals_kmsg_raw_xid_prefix_variants.txt": ({"kmsg": 3, "plain": 5}, 0),
    "gpud_dmesg-ctime_xid119_gsp_rpc_timeout.log": ({"dmesg-ctime": 43}, 0),
    "gpud_dmesg-decode-iso_636lines_xid13_xid43.log": ({"dmesg-decode-iso": 636}, 0),
    "gpud_dmesg-decode-iso_boot_full_2381lines.log": ({"dmesg-decode-iso": 2362}, 0),
    "gpud_dmesg-decode-iso_nccl_segfault.log": ({"dmesg-decode-iso": 2}, 0),
    "gpud_dmesg-decode-iso_os.log": ({"dmesg-decode-iso": 2}, 0),
    "gpud_dmesg-decode-iso_peermem_err.log": ({"dmesg-decode-iso": 8}, 0),
    "gpud_dmesg-decode-iso_xid13_xid43_oom.log": ({"dmesg-decode-iso": 24}, 0),
    "gpud_dmesg-time-format-iso_xid48_xid63_xid94_peermem.log": ({"dmesg-iso": 41}, 0),
    # nv-fabricmanager logs are not kernel logs: plain, with its indented NVSwitch tables
    # attached to the "dumping all the detected NVSwitch information" lines.
    "gpud_fabric-manager.0.log": ({"plain": 384}, 2),
    "gpud_fabricmanager.log": ({"plain": 77}, 0),
    "gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt": (
        {"plain": 20, "dmesg": 3, "dmesg-ctime": 4, "dmesg-decode-iso": 1, "syslog": 2},
        0,
    ),
    "gpud_journalctl-short-iso_2.log": ({"journal-short-iso": 47}, 0),
    "gpud_journalctl-short-iso_a800.log": ({"journal-short-iso": 11}, 0),
    "gpud_kmsg_raw_nvswitch_open.log": ({"kmsg": 47}, 0),
    "gpud_kmsg_raw_peermem.log": ({"kmsg": 8}, 0),
    "gpud_pstore_dmesg_with_loglevel_prefix.txt": ({"pstore": 411, "plain": 4}, 0),
    # Every SXid line of the readme sample has its own stamp: no continuation here.
    "gpud_sxid-readme_dmesg_xid79_sxid20034.log": ({"dmesg": 13}, 0),
    "gpud_testliterals_xid144-150_nvlink5_composed.txt": ({"plain": 38}, 0),
    "gpud_testliterals_xid_sxid_nvlink_realistic.txt": (
        {"plain": 28, "dmesg": 17, "syslog": 1},
        0,
    ),
    "imbue_docstring_dmesg_xid64_xid94_sxid12028_pcie_limited.log": ({"dmesg": 5}, 0),
    "issue_Bumblebee677_dmesg_old2015_xid32_xid31_no_pid.log": ({"dmesg": 3}, 0),
    "issue_NVSentinel155_dmesg_fallen-off-bus_multiline_noXID.log": ({"dmesg": 3}, 1),
    "issue_gpud-pr46_dmesg-ctime_xid13_xid109_peermem.log": ({"dmesg-ctime": 5}, 0),
    "issue_open-gpu-kernel-modules1150_journal-grep_xid45_caused_by_previous_xid145_149.log": (
        {"syslog": 7},
        0,
    ),
    "issue_open-gpu-kernel-modules1230_dmesg_GSP_heartbeat_timeout_GH100_TRUNCATED.log": (
        {"dmesg": 10},
        0,
    ),
    # Line 1 is an indented continuation with nothing before it: a plain record of its own.
    "nvsentinel_testliterals_xid_sxid_realistic.txt": ({"plain": 26, "dmesg": 5, "syslog": 16}, 0),
}


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_expectation_table_covers_every_kmsg_fixture(fixtures_dir: Path) -> None:
    on_disk = {p.name for p in (fixtures_dir / "xid_kmsg").iterdir() if p.is_file()}
    assert on_disk == set(EXPECTED_FORMATS)


@pytest.mark.parametrize("name", sorted(EXPECTED_FORMATS))
def test_fixture_formats_detected_per_file(fixtures_dir: Path, name: str) -> None:
    formats, with_continuation = EXPECTED_FORMATS[name]
    records = list(iter_file(fixtures_dir / "xid_kmsg" / name))
    assert Counter(r.source_format for r in records) == Counter(formats)
    assert sum(1 for r in records if r.continuation) == with_continuation


@pytest.mark.parametrize("name", sorted(EXPECTED_FORMATS))
def test_fixture_every_line_lands_in_exactly_one_record(fixtures_dir: Path, name: str) -> None:
    path = fixtures_dir / "xid_kmsg" / name
    lines = _lines(path)
    records = list(iter_file(path))
    covered: list[int] = []
    for rec in records:
        assert rec.source_format in SOURCE_FORMATS
        assert rec.source_format != "malformed"
        raw_lines = rec.raw.split("\n")
        assert raw_lines == lines[rec.line_no - 1 : rec.line_no - 1 + len(raw_lines)]
        assert len(raw_lines) == 1 + len(rec.continuation) + len(rec.fields)
        covered.extend(range(rec.line_no, rec.line_no + len(raw_lines)))
    non_blank = [i for i, line in enumerate(lines, 1) if line.strip()]
    assert covered == non_blank


@pytest.mark.parametrize("name", sorted(EXPECTED_FORMATS))
def test_fixture_nvrm_and_sxid_text_survives_intact(fixtures_dir: Path, name: str) -> None:
    path = fixtures_dir / "xid_kmsg" / name
    lines = _lines(path)
    by_line = {r.line_no: r for r in iter_file(path)}
    owner: dict[int, KmsgRecord] = {}
    for rec in by_line.values():
        for i in range(len(rec.raw.split("\n"))):
            owner[rec.line_no + i] = rec
    checked = 0
    for no, line in enumerate(lines, 1):
        for marker in ("NVRM:", "SXid ("):
            if marker not in line:
                continue
            tail = line[line.index(marker) :]
            rec = owner[no]
            if rec.line_no == no:
                assert rec.message.endswith(tail)
            else:
                assert tail in rec.continuation
            checked += 1
    if "NVRM" in path.read_text() or "SXid" in path.read_text():
        assert checked


@pytest.mark.parametrize("name", sorted(EXPECTED_FORMATS))
def test_fixture_followed_file_gives_the_same_records_as_a_scan(
    fixtures_dir: Path, name: str
) -> None:
    path = fixtures_dir / "xid_kmsg" / name
    scanned = list(iter_file(path))
    if not path.read_bytes().endswith(b"\n"):
        scanned.pop()  # a follower waits for the newline that would end the last line
    with KmsgFileSource(str(path)) as src:
        followed = src.read_available()
        assert src.parse_errors == 0
    assert followed == scanned


@pytest.mark.parametrize("name", sorted(EXPECTED_FORMATS))
def test_fixture_lines_parse_one_by_one(fixtures_dir: Path, name: str) -> None:
    """parse_text_line alone (no continuation context) accepts every line and never fails."""
    for no, line in enumerate(_lines(fixtures_dir / "xid_kmsg" / name), 1):
        rec = parse_text_line(line, line_no=no)
        if not line.strip():
            assert rec is None
            continue
        assert rec is not None
        assert rec.line_no == no
        assert rec.raw == line
        assert rec.source_format not in ("malformed",)
        assert line.endswith(rec.message)


# (file, line number, expected attributes) for hand-checked lines.
SPOT_CHECKS = [
    pytest.param(
        "gpud_sxid-readme_dmesg_xid79_sxid20034.log",
        3,
        {
            "source_format": "dmesg",
            "monotonic_s": 6781741.548779,
            "message": "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.",
        },
        id="dmesg-monotonic-xid79",
    ),
    pytest.param(
        "issue_open-gpu-kernel-modules1230_dmesg_GSP_heartbeat_timeout_GH100_TRUNCATED.log",
        1,
        {"source_format": "dmesg", "monotonic_s": 14.650646},
        id="dmesg-monotonic-padded",
    ),
    pytest.param(
        "issue_open-gpu-kernel-modules1230_dmesg_GSP_heartbeat_timeout_GH100_TRUNCATED.log",
        9,
        {
            "message": "NVRM: GPU6 _kgspCheckIfMemsysError: Unexpected error when checking "
            "for memory subsystem error: 0x72 "
        },
        id="dmesg-trailing-space-kept",
    ),
    pytest.param(
        "gpud_dmesg-ctime_xid119_gsp_rpc_timeout.log",
        3,
        {
            "source_format": "dmesg-ctime",
            "wallclock": datetime(2025, 2, 23, 16, 24, 18, tzinfo=UTC),
            "monotonic_s": None,
        },
        id="dmesg-ctime-xid119",
    ),
    pytest.param(
        "gpud_dmesg-ctime_xid119_gsp_rpc_timeout.log",
        28,
        {"message": " <TASK>"},
        id="dmesg-ctime-message-keeps-its-own-leading-space",
    ),
    pytest.param(
        "issue_gpud-pr46_dmesg-ctime_xid13_xid109_peermem.log",
        5,
        {"wallclock": datetime(2024, 8, 30, 11, 43, 14, tzinfo=UTC)},
        id="dmesg-ctime-2024",
    ),
    pytest.param(
        "gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt",
        13,
        {
            "source_format": "dmesg-ctime",
            "wallclock": datetime(2024, 12, 1, 14, 54, 40, tzinfo=UTC),
            "host": "hostname",
            "message": "mlx5_port_module_event:1131:(pid 0): Port module event[error]: "
            "module 0, Cable error, High Temperature",
        },
        id="dmesg-ctime-single-digit-day-with-journal-host",
    ),
    pytest.param(
        "gpud_dmesg-time-format-iso_xid48_xid63_xid94_peermem.log",
        11,
        {
            "source_format": "dmesg-iso",
            "wallclock": datetime(2024, 11, 15, 12, 2, 3, 470068, tzinfo=UTC),
            "priority": None,
        },
        id="dmesg-iso-xid48",
    ),
    pytest.param(
        "gpud_dmesg-decode-iso_xid13_xid43_oom.log",
        1,
        {
            "source_format": "dmesg-decode-iso",
            "facility": 0,
            "priority": 4,
            "wallclock": datetime(2025, 1, 21, 4, 41, 44, 283302, tzinfo=UTC),
        },
        id="dmesg-decode-iso-warn",
    ),
    pytest.param(
        "gpud_dmesg-decode-iso_peermem_err.log",
        1,
        {"facility": 0, "priority": 3},
        id="dmesg-decode-iso-err",
    ),
    pytest.param(
        "gpud_dmesg-decode-iso_boot_full_2381lines.log",
        1,
        {
            "priority": 7,
            "message": "pci_bus 0000:d7: on NUMA node 5",
            "wallclock": datetime(2025, 1, 17, 15, 36, 15, 345059, tzinfo=UTC),
        },
        id="dmesg-decode-iso-debug",
    ),
    pytest.param(
        "gpud_journalctl-short-iso_a800.log",
        1,
        {
            "source_format": "journal-short-iso",
            "host": "jmsph-pro-a800-77-123",
            "wallclock": datetime(2025, 1, 2, 7, 20, 12, tzinfo=UTC),
            "message": "docker0: port 1(vetha17b2cc) entered disabled state",
        },
        id="journal-plus0800-converted-to-utc",
    ),
    pytest.param(
        "gpud_journalctl-short-iso_2.log",
        1,
        {
            "host": "exp03-ft-896z-1-lan.exp03-ft-896z-job-svc",
            "wallclock": datetime(2025, 1, 17, 17, 10, 43, tzinfo=UTC),
        },
        id="journal-plus0000",
    ),
    pytest.param(
        "issue_open-gpu-kernel-modules1150_journal-grep_xid45_caused_by_previous_xid145_149.log",
        1,
        {
            "source_format": "syslog",
            "host": None,
            "message": "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, "
            "Ch 00000001 caused by previous Xid 149",
        },
        id="syslog-bare-kernel-prefix",
    ),
    pytest.param(
        "nvsentinel_testliterals_xid_sxid_realistic.txt",
        23,
        {
            "source_format": "syslog",
            "monotonic_s": 103859.498995,
            "message": "NVRM: Xid (PCI:0002:00:00): 13, pid=2519562, name=python3, Graphics "
            "Exception: ChID 000c, Class 0000cbc0, Offset 00000000, Data 00000000",
        },
        id="syslog-with-monotonic",
    ),
    pytest.param(
        "nvsentinel_testliterals_xid_sxid_realistic.txt",
        18,
        {"source_format": "dmesg", "monotonic_s": 123.0},
        id="dmesg-integer-seconds",
    ),
    pytest.param(
        "nvsentinel_testliterals_xid_sxid_realistic.txt",
        1,
        {
            "source_format": "plain",
            "message": "               NVRM: fallen off the bus and is not responding to commands.",
        },
        id="orphan-continuation-is-plain",
    ),
    pytest.param(
        "gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt",
        29,
        {"source_format": "syslog", "host": "ny2g1r12hh2"},
        id="syslog-host-kernel-prefix",
    ),
    pytest.param(
        "gpud_pstore_dmesg_with_loglevel_prefix.txt",
        3,
        {"source_format": "pstore", "priority": 6, "facility": 0, "monotonic_s": 2.608284},
        id="pstore-kern-info",
    ),
    pytest.param(
        "gpud_pstore_dmesg_with_loglevel_prefix.txt",
        1,
        {"source_format": "plain", "message": "dmesg-erst-7530486857247752194:"},
        id="pstore-header-is-plain",
    ),
    pytest.param(
        "gpud_kmsg_raw_nvswitch_open.log",
        1,
        {
            "source_format": "kmsg",
            "seq": 3964,
            "priority": 6,
            "facility": 0,
            "monotonic_s": 206.764307,
            "message": "nvidia-nvswitch2: open (major=510)",
        },
        id="kmsg-raw",
    ),
    pytest.param(
        "gpud_kmsg_raw_nvswitch_open.log",
        47,
        {"seq": 4010, "monotonic_s": 57631.398464},
        id="kmsg-raw-large-usec",
    ),
    pytest.param(
        "dcgm_testliterals_kmsg_raw_xid_prefix_variants.txt",
        2,
        {
            "source_format": "kmsg",
            "seq": 1227,
            "priority": 4,
            "monotonic_s": 437.812449,
            "message": "NVRM: Xid (PCI:0000:01:00): 43, pid=1814139, name=cuda_assert_64b, "
            "Ch 00000018",
        },
        id="kmsg-extra-header-fields",
    ),
    pytest.param(
        "dcgm_testliterals_kmsg_raw_xid_prefix_variants.txt",
        3,
        {
            "source_format": "kmsg",
            "monotonic_s": 437812.449932,
            "message": "NVRM: Xid PCI:0000:01:00: 43, pid=1814139, name=cuda_assert_64b, "
            "Ch 00000018",
        },
        id="kmsg-malformed-xid-prefix-still-a-record",
    ),
    pytest.param(
        "dcgm_testliterals_kmsg_raw_xid_prefix_variants.txt",
        8,
        {"source_format": "plain", "seq": None},
        id="bare-nvrm-line-is-plain",
    ),
    pytest.param(
        "gpud_fabricmanager.log",
        1,
        {"source_format": "plain", "wallclock": None},
        id="fabricmanager-is-plain",
    ),
]


@pytest.mark.parametrize(("name", "line_no", "expected"), SPOT_CHECKS)
def test_fixture_spot_checks(
    fixtures_dir: Path, name: str, line_no: int, expected: dict[str, object]
) -> None:
    records = {r.line_no: r for r in iter_file(fixtures_dir / "xid_kmsg" / name)}
    rec = records[line_no]
    for attr, value in expected.items():
        got = getattr(rec, attr)
        if isinstance(value, float):
            assert got == pytest.approx(value, abs=1e-7), attr
        else:
            assert got == value, attr


def test_pstore_priority_carries_the_facility(fixtures_dir: Path) -> None:
    records = list(
        iter_file(fixtures_dir / "xid_kmsg" / "gpud_pstore_dmesg_with_loglevel_prefix.txt")
    )
    systemd = [r for r in records if r.raw.startswith("<30>")]
    warn = [r for r in records if r.raw.startswith("<28>")]
    assert systemd and warn
    assert {(r.facility, r.priority) for r in systemd} == {(3, 6)}
    assert {(r.facility, r.priority) for r in warn} == {(3, 4)}


def test_dmesg_multiline_nvrm_keeps_continuation_lines(fixtures_dir: Path) -> None:
    path = (
        fixtures_dir
        / "xid_kmsg"
        / "issue_NVSentinel155_dmesg_fallen-off-bus_multiline_noXID.log"
    )
    first, probe, loading = iter_file(path)
    assert first.message == "NVRM: The NVIDIA GPU 0000:b3:00.0"
    assert first.monotonic_s == pytest.approx(1843.308145)
    assert first.continuation == (
        "NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    )
    assert first.text == (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands."
    )
    assert (probe.line_no, loading.line_no) == (4, 5)
    assert probe.continuation == () and loading.continuation == ()


def test_sxid_triplets_stay_separate_records(fixtures_dir: Path) -> None:
    path = fixtures_dir / "xid_kmsg" / "gpud_sxid-readme_dmesg_xid79_sxid20034.log"
    sxids = [r for r in iter_file(path) if "SXid" in r.message]
    assert len(sxids) == 8
    assert all(r.continuation == () for r in sxids)
    assert sxids[3].message.endswith(
        "20034, Data {0x10000000, 0x10000000, 0x00000000, "
        "0x10000000, 0x00000000, 0x00000000, 0x00000000, "
        "0x00000000, 0x00000000}"
    )


# --- /dev/kmsg records -------------------------------------------------------------------------


def test_kmsg_record_with_dictionary_lines() -> None:
    rec = parse_kmsg_record(
        b"3,812,98765432,-;pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received\n"
        b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
        line_no=7,
    )
    assert rec.message == "pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received"
    assert dict(rec.fields) == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    assert (rec.seq, rec.priority, rec.facility, rec.line_no) == (812, 3, 0, 7)
    assert rec.monotonic_s == pytest.approx(98.765432)
    assert rec.raw.endswith("DEVICE=+pci:0000:3b:00.0")
    assert rec.continuation == ()


def test_kmsg_priority_splits_facility_and_level() -> None:
    rec = parse_kmsg_record("14,2,5,-;hello from userspace")  # user.info
    assert (rec.facility, rec.priority) == (1, 6)


def test_kmsg_escapes_are_undone_and_newlines_become_continuation() -> None:
    rec = parse_kmsg_record(
        r"4,9,1000,-;NVRM: The NVIDIA GPU 0000:b3:00.0\x0a               NVRM: fallen off the bus"
        r" C:\x5cpath"
    )
    assert rec.message == "NVRM: The NVIDIA GPU 0000:b3:00.0"
    assert rec.continuation == ("NVRM: fallen off the bus C:\\path",)


def test_kmsg_continuation_flag_record_parses() -> None:
    rec = parse_kmsg_record(b"4,1227,437812449,c;NVRM: Xid (PCI:0000:01:00): 43, Ch 00000018")
    assert rec.seq == 1227 and rec.source_format == "kmsg"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\n", id="newline-only"),
        pytest.param(b"6,3964,2067", id="truncated-header"),
        pytest.param(b"6,3964,206764307,-", id="no-semicolon"),
        pytest.param(b"x,1,2,-;msg", id="non-numeric-priority"),
        pytest.param(b"NVRM: Xid (PCI:0000:01:00): 43", id="plain-text"),
        pytest.param(b"\xff\xfe6,1,2,-;msg", id="invalid-utf8"),
        pytest.param(b"6,1,2,-;bad\x00byte", id="nul-byte"),
    ],
)
def test_parse_kmsg_record_rejects_non_records(data: bytes) -> None:
    with pytest.raises(KmsgParseError):
        parse_kmsg_record(data)


# --- text lines ------------------------------------------------------------------------------

TEXT_LINES = [
    pytest.param(
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad",
        "dmesg-ctime",
        "NVRM: GPU at PCI:0000:9b:00: GPU-509665ad",
        id="ctime",
    ),
    pytest.param(
        "Jan 21 04:41:44 gpu-node-7 kernel: [ 3606.832215] NVRM: Xid (PCI:0002:00:00): 119",
        "syslog",
        "NVRM: Xid (PCI:0002:00:00): 119",
        id="bsd-syslog",
    ),
    pytest.param(
        "kern  :warn  : [ 1843.439662] NVRM: The NVIDIA probe routine failed",
        "dmesg",
        "NVRM: The NVIDIA probe routine failed",
        id="decode-monotonic",
    ),
    pytest.param(
        "kern  :err   : NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        "dmesg",
        "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        id="decode-notime",
    ),
    pytest.param(
        "2025-01-02T15:20:12.123456+0800 node-1 kernel: NVRM: Xid (PCI:0000:19:00): 94",
        "journal-short-iso",
        "NVRM: Xid (PCI:0000:19:00): 94",
        id="journal-short-iso-precise",
    ),
    pytest.param(
        "[Feb 25 2025 13:59:45] [INFO] [tid 1803] multicast group 0 is freed.",
        "plain",
        "[Feb 25 2025 13:59:45] [INFO] [tid 1803] multicast group 0 is freed.",
        id="fabricmanager-stamp-is-not-dmesg",
    ),
    pytest.param("<unknown> thing", "plain", "<unknown> thing", id="angle-text"),
    # An impossible stamp keeps the line's shape and loses only its time (see
    # test_impossible_stamps_keep_the_shape_and_give_no_time).
    pytest.param(
        "[Sun Feb 30 16:24:18 2025] impossible date",
        "dmesg-ctime",
        "impossible date",
        id="impossible-ctime-date-keeps-the-shape",
    ),
    pytest.param(
        "2025-13-02T15:20:12+0800 node kernel: x",
        "journal-short-iso",
        "x",
        id="impossible-iso-month-keeps-the-shape",
    ),
    pytest.param(
        "[Sun Foo 12 16:24:18 2025] no month name",
        "plain",
        "[Sun Foo 12 16:24:18 2025] no month name",
        id="bracket-without-a-month-name-is-plain",
    ),
    pytest.param("[12.5] msg\r\n", "dmesg", "msg", id="crlf-stripped"),
    pytest.param(
        "2025-01-02T15:20:12+0800 node-1 systemd[1]: Started kubelet.",
        "journal-short-iso",
        "systemd[1]: Started kubelet.",
        id="journal-other-identifier-keeps-it-in-message",
    ),
    pytest.param(
        "2024-11-15T12:02:03,470068+00:00 node kernel-ish: words",
        "dmesg-iso",
        "node kernel-ish: words",
        id="comma-fraction-is-always-dmesg",
    ),
]


def test_journal_host_is_taken_off_any_identifier() -> None:
    rec = parse_text_line("2025-01-02T15:20:12+0800 node-1 systemd[1]: Started kubelet.")
    assert rec is not None and rec.host == "node-1"


@pytest.mark.parametrize(("line", "fmt", "message"), TEXT_LINES)
def test_parse_text_line_shapes(line: str, fmt: str, message: str) -> None:
    rec = parse_text_line(line)
    assert rec is not None
    assert (rec.source_format, rec.message) == (fmt, message)


def test_bsd_syslog_has_host_and_monotonic_but_no_wallclock() -> None:
    rec = parse_text_line("Jan 21 04:41:44 gpu-node-7 kernel: [ 3606.832215] NVRM: x")
    assert rec is not None
    assert rec.host == "gpu-node-7"
    assert rec.monotonic_s == pytest.approx(3606.832215)
    assert rec.wallclock is None  # no year in the stamp


def test_negative_journal_offset_converted_to_utc() -> None:
    rec = parse_text_line("2025-01-02T23:20:12-0500 node kernel: x")
    assert rec is not None
    assert rec.wallclock == datetime(2025, 1, 3, 4, 20, 12, tzinfo=UTC)
    assert rec.wallclock.utcoffset().total_seconds() == 0


@pytest.mark.parametrize("line", ["", "\n", "   ", "\t\r\n"])
def test_blank_lines_are_no_record(line: str) -> None:
    assert parse_text_line(line) is None


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        pytest.param("6,3964,2067", "truncated kmsg record", id="truncated-kmsg"),
        pytest.param(
            "6,3964,206764307,-NVRM: Xid", "truncated kmsg record", id="kmsg-no-semicolon"
        ),
        pytest.param("[1.0] NVRM:\x00\x00\x00", "NUL byte in line", id="nul"),
        pytest.param("x" * (MAX_LINE_BYTES + 1), "line longer than 64 KiB", id="over-long"),
    ],
)
def test_malformed_lines_become_malformed_records(line: str, reason: str) -> None:
    rec = parse_text_line(line, line_no=3)
    assert rec is not None
    assert rec.source_format == "malformed" and rec.malformed
    assert rec.fields["error"] == reason
    assert rec.line_no == 3
    assert len(rec.message) <= MAX_LINE_BYTES


def test_records_are_frozen_hashable_values() -> None:
    rec = parse_kmsg_record(b"6,1,2,-;x\n SUBSYSTEM=pci\n")
    with pytest.raises(FrozenInstanceError):
        rec.message = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        rec.fields["SUBSYSTEM"] = "usb"  # type: ignore[index]
    assert hash(rec) == hash(parse_kmsg_record(b"6,1,2,-;x\n SUBSYSTEM=pci\n"))
    assert rec == parse_kmsg_record(b"6,1,2,-;x\n SUBSYSTEM=pci\n")
    assert rec != parse_kmsg_record(b"6,1,2,-;x\n SUBSYSTEM=usb\n")


# --- stamps at the edge of the calendar ------------------------------------------------------

XID_TEXT = "NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off"


@pytest.mark.parametrize(
    ("line", "fmt"),
    [pytest.param(line, fmt, id=i) for i, line, fmt, _ in wallclock_lines(msg=XID_TEXT)],
)
def test_impossible_stamps_keep_the_shape_and_give_no_time(line: str, fmt: str) -> None:
    rec = parse_text_line(line)
    assert rec is not None
    assert (rec.source_format, rec.message, rec.wallclock) == (fmt, XID_TEXT, None)


@pytest.mark.parametrize(
    ("line", "stamp"),
    [pytest.param(line, s, id=i) for i, line, _, s in wallclock_lines(IN_RANGE, XID_TEXT)],
)
def test_stamps_in_range_keep_their_time(line: str, stamp) -> None:
    rec = parse_text_line(line)
    assert rec is not None and rec.message == XID_TEXT
    local = datetime(stamp.year, stamp.month, stamp.day, stamp.hour, stamp.minute,
                     stamp.second, rec.wallclock.microsecond)
    sign = -1 if stamp.offset[0] == "-" else 1
    offset = sign * timedelta(hours=int(stamp.offset[1:3]), minutes=int(stamp.offset[4:6]))
    if rec.source_format == "dmesg-ctime":
        offset = timedelta(0)  # no zone printed: taken as UTC
    assert rec.wallclock == (local - offset).replace(tzinfo=UTC)
    assert WALLCLOCK_MIN <= rec.wallclock < WALLCLOCK_MAX


def test_the_issue_line_and_the_xid_after_it_are_both_read(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.log"
    log.write_text("0001-01-01T00:00:00,000000+05:00 NVRM: Xid (PCI:0000:53:00): 79, pid=1, "
                   "name=x, GPU has fallen off the bus.\n"
                   "2024-11-15T12:02:03,470068+00:00 NVRM: Xid (PCI:0000:19:00): 48, pid=2, "
                   "name=y, An uncorrectable double bit error (DBE) has been detected\n")
    first, second = iter_file(log)
    assert (first.source_format, first.wallclock) == ("dmesg-iso", None)
    assert first.message.startswith("NVRM: Xid (PCI:0000:53:00): 79,")
    assert second.wallclock == datetime(2024, 11, 15, 12, 2, 3, 470068, tzinfo=UTC)


@pytest.mark.parametrize(
    ("render", "fmt"),
    [pytest.param(r, f, id=name) for name, (r, f) in MONOTONIC_FORMATS.items()],
)
def test_monotonic_stamp_too_big_for_a_float_gives_no_time(render, fmt: str) -> None:
    rec = parse_text_line(render(HUGE_SECONDS, XID_TEXT))
    assert rec is not None
    assert (rec.source_format, rec.message, rec.monotonic_s) == (fmt, XID_TEXT, None)
    ok = parse_text_line(render("12.5", XID_TEXT))
    assert ok is not None and ok.monotonic_s == 12.5


@pytest.mark.parametrize(
    ("data", "error"),
    [
        pytest.param(b"4,99999999999999999999999,1,-;" + XID_TEXT.encode(),
                     "truncated kmsg record", id="seq-past-20-digits"),
        pytest.param(b"4,1," + b"9" * 5000 + b",-;" + XID_TEXT.encode(),
                     "truncated kmsg record", id="usec-of-5000-digits"),
        pytest.param(b"99999,1,2,-;" + XID_TEXT.encode(), None, id="priority-past-4-digits"),
    ],
)
def test_huge_record_fields_are_malformed_lines_not_errors(data: bytes, error: str | None
                                                           ) -> None:
    rec = parse_text_line(data.decode())
    assert rec is not None
    if error is None:
        assert rec.source_format == "plain" and rec.message == data.decode()
    else:
        assert rec.fields["error"] == error
    with pytest.raises(KmsgParseError, match="not a kmsg record header"):
        parse_kmsg_record(data)


def test_a_text_line_of_megabytes_is_one_malformed_record() -> None:
    rec = parse_text_line("4,1,2,-;" + "x" * (2 * 1024 * 1024))
    assert rec is not None and rec.fields["error"] == "line longer than 64 KiB"
    assert len(rec.message) == MAX_LINE_BYTES


@pytest.mark.parametrize("name", sorted(EXPECTED_FORMATS))
@pytest.mark.parametrize("literals", [("NVRM",), ("SXid",), ("NVRM", "SXid"), ("Xid", "fallen")])
def test_followed_file_with_literals_gives_the_scans_candidates(
    fixtures_dir: Path, name: str, literals: tuple[str, ...]
) -> None:
    """A follower that pre-searches parses exactly the records the batch scan would keep: every
    record holding a literal (in its head or a continuation), equal to the full read's, in
    order, with every line counted as read or skipped."""
    path = fixtures_dir / "xid_kmsg" / name
    scanned = list(iter_file(path))
    if not path.read_bytes().endswith(b"\n"):
        scanned.pop()
    want = [r for r in scanned if any(w in r.raw for w in literals) or r.malformed]
    with KmsgFileSource(str(path)) as src:
        src.select(literals)
        got = []
        while batch := src.read_available(max_records=3):
            got += batch
        assert src.parse_errors == sum(r.malformed for r in scanned)
        assert src.lines_skipped <= sum(1 + len(r.continuation) for r in scanned) - sum(
            1 + len(r.continuation) for r in want)
    assert got == want
