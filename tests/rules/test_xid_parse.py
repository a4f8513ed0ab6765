"""Parsing and classifying real Xid / SXid kernel-log lines (tests/fixtures/xid_kmsg)."""

from __future__ import annotations

from collections import Counter

import pytest

from gpu_monitor.hw.kmsg.files import iter_file
from gpu_monitor.hw.kmsg.text import parse_text_line
from gpu_monitor.model import Action, Status
from gpu_monitor.rules.sxid import ParsedSxid, SxidGrouper, parse_sxid, status_of
from gpu_monitor.rules.xid import (
    GpuHeader,
    ParsedXid,
    XidParseError,
    burst_count,
    classify,
    count_recoveries,
    escalate,
    join_fallen_off,
    parse_xid,
)

BUS = "bus"  # the "GPU has fallen off the bus" message without an Xid line


def c(addr: str) -> str:
    """Kernel-log form (domain:bus:dev) -> canonical PCI address."""
    return addr + ".0"


# Every file of xid_kmsg/: the Xid events its lines give, in order (small files) or counted.
FIXTURE_XIDS: dict[str, list | dict] = {
    "azurehpc_nhc_health_log_xid119_old-format_in_nhc_report.txt": [(119, "0002:00:00")],
    "dcgm_testliterals_kmsg_raw_xid_prefix_variants.txt": [
        (43, "0000:01:00"), (43, "0000:01:00"), (43, "0000:01:00"), (119, "0000:00:16"),
        (43, "0000:01:00"), (79, "0000:2a:00")],
    "gpud_dmesg-ctime_xid119_gsp_rpc_timeout.log": [(119, "0000:9b:00")] * 5,
    "gpud_dmesg-decode-iso_636lines_xid13_xid43.log": {
        (13, "0000:38:00"): 629, (43, "0000:38:00"): 7},
    "gpud_dmesg-decode-iso_boot_full_2381lines.log": [],
    "gpud_dmesg-decode-iso_nccl_segfault.log": [],
    "gpud_dmesg-decode-iso_os.log": [],
    "gpud_dmesg-decode-iso_peermem_err.log": [],
    "gpud_dmesg-decode-iso_xid13_xid43_oom.log": {(13, "0000:38:00"): 16, (43, "0000:38:00"): 1},
    "gpud_dmesg-time-format-iso_xid48_xid63_xid94_peermem.log": [
        (48, "0000:19:00"), (63, "0000:19:00")] + [(94, "0000:19:00")] * 9,
    "gpud_fabric-manager.0.log": [],
    "gpud_fabricmanager.log": [],
    "gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt": [
        (94, "0000:01:00"), (94, "0000:01:00"), (95, "0000:01:00"), (119, "0000:19:00"),
        (119, "0000:19:00"), (119, "0000:19:00"), (119, "0000:19:00"), (13, "0000:38:00"),
        (119, "0000:40:00"), (13, "0000:38:00")],
    "gpud_journalctl-short-iso_2.log": [],
    "gpud_journalctl-short-iso_a800.log": [],
    "gpud_kmsg_raw_nvswitch_open.log": [],
    "gpud_kmsg_raw_peermem.log": [],
    "gpud_pstore_dmesg_with_loglevel_prefix.txt": [],
    "gpud_sxid-readme_dmesg_xid79_sxid20034.log": [(79, "0000:91:00"), (BUS, "0000:91:00")],
    "gpud_testliterals_xid144-150_nvlink5_composed.txt": {
        (144, "0000:04:00"): 5, (145, "0000:04:00"): 12, (146, "0000:04:00"): 10,
        (147, "0000:04:00"): 1, (148, "0000:04:00"): 1, (149, "0000:04:00"): 8,
        (150, "0000:04:00"): 1},
    "gpud_testliterals_xid_sxid_nvlink_realistic.txt": {
        (BUS, "0000:29:00"): 1, (BUS, "0000:18:00"): 1, (14, "0000:03:00"): 1,
        (149, "0000:04:00"): 3, (79, "0000:05:00"): 1, (145, "0008:01:00"): 3,
        (149, "0008:01:00"): 5, (145, "0018:01:00"): 2, (149, "0018:01:00"): 3,
        (145, "0019:01:00"): 2, (149, "0019:01:00"): 1, (149, "0009:01:00"): 3,
        (154, "0009:01:00"): 1, (154, "0019:01:00"): 1, (154, "0018:01:00"): 1,
        (154, "0008:01:00"): 1},
    "imbue_docstring_dmesg_xid64_xid94_sxid12028_pcie_limited.log": [
        (64, "0000:0f:00"), (94, "0000:0f:00")],
    "issue_Bumblebee677_dmesg_old2015_xid32_xid31_no_pid.log": [
        (32, "0000:01:00"), (32, "0000:01:00"), (31, "0000:01:00")],
    "issue_NVSentinel155_dmesg_fallen-off-bus_multiline_noXID.log": [(BUS, "0000:b3:00")],
    "issue_gpud-pr46_dmesg-ctime_xid13_xid109_peermem.log": [
        (13, "0000:cb:00"), (13, "0000:cb:00"), (13, "0000:cb:00"), (109, "0000:cb:00")],
    "issue_open-gpu-kernel-modules1150_journal-grep_xid45_caused_by_previous_xid145_149.log": [
        (45, "0000:dc:00"), (45, "0000:ed:00"), (45, "0000:ba:00"), (45, "0000:97:00"),
        (45, "0000:dc:00"), (45, "0000:ba:00"), (45, "0000:ed:00")],
    "issue_open-gpu-kernel-modules1230_dmesg_GSP_heartbeat_timeout_GH100_TRUNCATED.log": [],
    "nvsentinel_testliterals_xid_sxid_realistic.txt": {
        (BUS, "0000:b3:00"): 1, (BUS, "0000:b4:00"): 1, (145, "0000:00:08"): 2,
        (32, "0000:66:00"): 1, (8, "0000:9b:00"): 1, (79, "0000:b3:00"): 2,
        (13, "0000:b5:00"): 2, (69, "0001:ab:cd"): 1, (119, "0002:00:00"): 2,
        (74, "0003:00:00"): 2, (154, "0008:01:00"): 1, (149, "0018:01:00"): 1,
        (94, "0000:17:00"): 2, (79, "0001:00:00"): 1, (13, "0002:00:00"): 1,
        (145, "0001:00:00"): 1, (145, "0002:00:00"): 1, (119, "0000:17:00"): 1,
        (119, "0000:19:00"): 1, (119, "0001:00:00"): 1, (31, "0001:00:00"): 1,
        (94, "0001:00:00"): 1, (94, "0002:00:00"): 1, (31, "0000:b5:00"): 1,
        (13, "0009:01:00"): 1, (48, "0000:03:00"): 1},
}


def _xids_of(path) -> list[tuple]:
    out = []
    for rec in iter_file(path):
        p = parse_xid(rec.text)
        if isinstance(p, ParsedXid):
            out.append((BUS if p.fallen_off_bus else p.code, p.pci))
    return out


def test_the_table_covers_every_xid_kmsg_fixture(fixtures_dir):
    files = sorted(p.name for p in (fixtures_dir / "xid_kmsg").iterdir())
    assert sorted(FIXTURE_XIDS) == files


@pytest.mark.parametrize("name", sorted(FIXTURE_XIDS))
def test_fixture_file_gives_the_expected_code_and_pci_per_line(fixtures_dir, name):
    got = _xids_of(fixtures_dir / "xid_kmsg" / name)
    want = FIXTURE_XIDS[name]
    if isinstance(want, dict):
        assert Counter(got) == {(code, c(pci)): n for (code, pci), n in want.items()}
    else:
        assert got == [(code, c(pci)) for code, pci in want]


# --- single lines, every shape -----------------------------------------------------------------

# (fixture it comes from, the line as the file has it, code, pci, pid, process, message start)
LINES = [
    ("gpud_sxid-readme_dmesg_xid79_sxid20034.log",
     "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
     "GPU has fallen off the bus.", 79, "0000:91:00.0", None, None, "GPU has fallen off"),
    ("dcgm_testliterals_kmsg_raw_xid_prefix_variants.txt",
     "4,1227,437812449,c,1,-;NVRM: Xid (PCI:0000:01:00): 43, pid=1814139, name=cuda_assert_64b, "
     "Ch 00000018", 43, "0000:01:00.0", 1814139, "cuda_assert_64b", "Ch 00000018"),
    ("dcgm_testliterals_kmsg_raw_xid_prefix_variants.txt",
     "4,1227,437812449932,c;NVRM: Xid PCI:0000:01:00: 43, pid=1814139, name=cuda_assert_64b, "
     "Ch 00000018", 43, "0000:01:00.0", 1814139, "cuda_assert_64b", "Ch 00000018"),
    ("gpud_dmesg-ctime_xid119_gsp_rpc_timeout.log",
     "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, "
     "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 "
     "(GSP_RM_ALLOC) (0x2081 0x4).", 119, "0000:9b:00.0", 2024380, "nvidia-smi", "Timeout after"),
    ("gpud_dmesg-time-format-iso_xid48_xid63_xid94_peermem.log",
     "2024-11-15T12:02:03,470068+00:00 NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', "
     "name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the "
     "framebuffer at physAddr 0x12bac1c3e0 partition 2, subpartition 1.",
     48, "0000:19:00.0", None, None, "An uncorrectable double bit"),
    ("gpud_dmesg-decode-iso_xid13_xid43_oom.log",
     "kern  :warn  : 2025-01-21T04:41:44,287197+00:00 NVRM: Xid (PCI:0000:38:00): 43, "
     "pid=2924364, name=pt_main_thread, Ch 00000008",
     43, "0000:38:00.0", 2924364, "pt_main_thread", "Ch 00000008"),
    ("issue_open-gpu-kernel-modules1150_journal-grep_xid45_caused_by_previous_xid145_149.log",
     "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by "
     "previous Xid 149", 45, "0000:dc:00.0", 1818990, "python3", "Ch 00000001 caused"),
    ("gpud_testliterals_xid_sxid_nvlink_realistic.txt",
     "NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "0000:03:00.0", None, None,
     "Channel 00000001"),
    ("issue_Bumblebee677_dmesg_old2015_xid32_xid31_no_pid.log",
     "[24128.834365] NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, "
     "intr 10000000", 31, "0000:01:00.0", None, None, "Ch 00000003, engmask"),
    ("nvsentinel_testliterals_xid_sxid_realistic.txt",
     "NVRM: Xid (PCI:0002:00:00): 119, pid=1582259, name=nvc:[driver]", 119, "0002:00:00.0",
     1582259, "nvc:[driver]", ""),
    ("gpud_testliterals_xid_sxid_nvlink_realistic.txt",
     "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 "
     "i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
     145, "0018:01:00.0", 876767, "ray::WorkerDict", "RLW_RXPIPE Nonfatal"),
    ("nvsentinel_testliterals_xid_sxid_realistic.txt",
     "NVRM: Xid (PCI:0000:b3:00.0): 79, GPU has fallen off the bus and is not responding to "
     "commands.", 79, "0000:b3:00.0", None, None, "GPU has fallen off"),
    ("azurehpc_nhc_health_log_xid119_old-format_in_nhc_report.txt",
     "mynode-066 | ERROR: nhc: Health check failed: check_gpu_xid: GPU Xid errors detected: "
     "[ 3606.832215] NVRM: Xid (PCI:0002:00:00): 119, pid=67769, name=nvidia-smi, Timeout "
     "waiting for RPC from GSP1! Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5).",
     119, "0002:00:00.0", 67769, "nvidia-smi", "Timeout waiting"),
]


@pytest.mark.parametrize("fixture, line, code, pci, pid, process, msg", LINES,
                         ids=[f"{i}-{t[2]}" for i, t in enumerate(LINES)])
def test_real_line_fields(fixtures_dir, fixture, line, code, pci, pid, process, msg):
    assert line in (fixtures_dir / "xid_kmsg" / fixture).read_text()
    rec = parse_text_line(line)
    p = parse_xid(rec.text)
    assert isinstance(p, ParsedXid)
    assert (p.code, p.pci, p.pid, p.process) == (code, pci, pid, process)
    assert p.message.startswith(msg)
    assert p.reason == f"Xid{code}"
    assert p.raw.startswith("NVRM: Xid")


def test_mig_gpu_instance_and_compute_instance():
    # gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt
    p = parse_xid("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User "
                  "Channel (0x9). RST: No, D-RST: No")
    assert (p.code, p.pci, p.gpu_instance, p.compute_instance, p.pid) == (
        94, "0000:01:00.0", 5, None, 7194)
    assert p.message.startswith("Contained: CE User Channel")
    # The driver's format for an XID attributed to both instances:
    # "NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, %s"
    p = parse_xid("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 43, pid=55, name=train, "
                  "Ch 00000010")
    assert (p.code, p.pci, p.gpu_instance, p.compute_instance, p.process) == (
        43, "0000:3b:00.0", 1, 2, "train")


def test_xid_154_recovery_action():
    # gpud_testliterals_xid_sxid_nvlink_realistic.txt
    p = parse_xid("NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) "
                  "to 0x4 (Drain and Reset)")
    assert (p.recovery.from_code, p.recovery.to_code, p.recovery.to_name) == (
        0, 4, "Drain and Reset")
    assert classify(p).action is Action.RESET_GPU
    # nvsentinel_testliterals_xid_sxid_realistic.txt
    p = parse_xid("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) "
                  "to 0x1 (GPU Reset Required)")
    assert classify(p).action is Action.RESET_GPU and classify(p).basis == "recovery_action"
    reboot = parse_xid("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 "
                       "(None) to 0x2 (Node Reboot Required)")
    assert classify(reboot).action is Action.REBOOT
    done = parse_xid("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x1 "
                     "(GPU Reset Required) to 0x0 (None)")
    assert classify(done).status is Status.OK


def test_xid_45_caused_by_previous_xid_is_sympathetic():
    p = parse_xid("NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused "
                  "by previous Xid 145")
    assert p.caused_by == 145
    cls = classify(p)
    assert cls.sympathetic and cls.entry.category == "application" and cls.status is Status.OK
    plain = parse_xid("NVRM: Xid (PCI:0000:ed:00): 45, pid=1, name=python3, Ch 0000000c")
    assert plain.caused_by is None and not classify(plain).sympathetic


# (line from the fixtures, unit, link, registers, decoded action, basis)
NVLINK5 = [
    # odd spacing, V1 IntrInfo: link-down reason 0x04 -> RESET_GPU, INVESTIGATE_LINK_SI
    ("NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 "
     "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)", "NETIR_LINK_EVT", 1,
     6, Action.RESET_GPU, "nvlink5_decode"),
    ("NVRM: Xid (PCI:0008:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 "
     "0x00000000 0x00000000 0x00000000 0x00000000)", "NETIR", -1, 6, Action.RESET_GPU,
     "nvlink5_decode"),
    # status 0x8 of RLW_SRC_TRACK: XID_154_EVAL (follow the accompanying 154)
    ("NVRM: Xid (PCI:0008:01:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 "
     "0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)", "RLW_SRC_TRACK", 12, 6,
     Action.WATCH, "nvlink5_decode"),
    ("NVRM: Xid (PCI:0019:01:00): 145, pid=876766, name=ray::WorkerDict, RLW_RXPIPE Nonfatal "
     "XC0 i0 Link 12 (0x040980c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
     "RLW_RXPIPE", 12, 6, Action.NONE, "nvlink5_decode"),
    ("NVRM: Xid (PCI:0008:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 "
     "0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)", "NETIR_BER_EVENT", 1, 6,
     Action.NONE, "nvlink5_decode"),
    # 4-word composed payloads, V2 IntrInfo
    ("NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Fatal XC0 i0 Link 00 (0x00000001 0x00000002 "
     "0x00000000 0x00000000)", "SAW_MVB", 0, 4, Action.RESET_GPU, "nvlink5_decode"),
    ("NVRM: Xid (PCI:0000:04:00): 144, SAW_MVB Nonfatal XC0 i0 Link 00 (0x00000001 0x00000001 "
     "0x00000000 0x00000000)", "SAW_MVB", 0, 4, Action.NONE, "nvlink5_decode"),
    ("NVRM: Xid (PCI:0000:04:00): 149, NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 "
     "(0x02500011 0x00000000 0x00000000 0x00000000)", "NETIR_LINK_EVT/NETIR_LINK_DOWN", 0, 4,
     Action.RESET_GPU, "nvlink5_decode"),
    ("NVRM: Xid (PCI:0000:04:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 "
     "0x00000000 0x00000000)", "MSE_WATCHDOG", 0, 4, Action.RESET_GPU, "nvlink5_decode"),
    # not in the decode sheet: the line's own severity decides
    ("NVRM: Xid (PCI:0000:04:00): 144, SAW_EGR Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 "
     "0x00000000 0x00000000)", "SAW_EGR", 0, 4, Action.WATCH, "nvlink5_line"),
]


@pytest.mark.parametrize("line, unit, link, nregs, action, basis", NVLINK5,
                         ids=[f"{i}-{t[1]}" for i, t in enumerate(NVLINK5)])
def test_nvlink5_payload_is_parsed_and_decoded(fixtures_dir, line, unit, link, nregs, action,
                                               basis):
    texts = "".join(p.read_text() for p in (fixtures_dir / "xid_kmsg").iterdir())
    assert line in texts
    p = parse_xid(line)
    assert (p.nvlink5.unit, p.nvlink5.link, len(p.nvlink5.registers)) == (unit, link, nregs)
    cls = classify(p)
    assert (cls.action, cls.basis, cls.entry.category) == (action, basis, "hardware")


def test_fallen_off_the_bus_multiline_without_xid(fixtures_dir):
    path = fixtures_dir / "xid_kmsg" / "issue_NVSentinel155_dmesg_fallen-off-bus_multiline_noXID.log"
    rec = next(iter_file(path))
    assert len(rec.continuation) == 2
    p = parse_xid(rec.text)
    assert (p.code, p.pci, p.fallen_off_bus, p.reason) == (79, "0000:b3:00.0", True,
                                                         "GpuFallenOffBus")
    cls = classify(p)
    assert (cls.reason, cls.action, cls.entry.category) == ("GpuFallenOffBus", Action.REBOOT,
                                                      "hardware")


def test_fallen_off_the_bus_split_across_records_joins():
    head = parse_xid("NVRM: The NVIDIA GPU 0000:b3:00.0")
    assert head == GpuHeader("0000:b3:00.0")
    assert parse_xid("NVRM: (PCI ID: 10de:26b5) installed in this system has") is None
    frag = parse_xid("NVRM: fallen off the bus and is not responding to commands.")
    assert isinstance(frag, XidParseError) and frag.kind == "fragment"
    joined = join_fallen_off(head, frag)
    assert (joined.pci, joined.fallen_off_bus, joined.code) == ("0000:b3:00.0", True, 79)


def test_short_fallen_off_forms_with_and_without_domain():
    assert parse_xid("NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.").pci == "0000:29:00.0"
    assert parse_xid("NVRM: GPU 18:00.0: GPU has fallen off the bus.").pci == "0000:18:00.0"


@pytest.mark.parametrize("text, kind", [
    ("NVRM: Xid (PCI:0000:3b:00): abc, pid=1", "garbage"),
    ("NVRM: Xid (PCI:0000:3b", "garbage"),
    ("NVRM: Xid (PCI:0000:3b:00): 79abc", "garbage"),
    ("NVRM: Xid \x00\x01\x02", "garbage"),
    ("NVRM: Xid (PCI:000fffff:3b:00): 79, pid=1", "no_pci"),
])
def test_garbage_is_an_error_value_never_an_exception(text, kind):
    p = parse_xid(text)
    assert isinstance(p, XidParseError) and p.kind == kind


def test_xid_without_pci_keeps_its_code():
    p = parse_xid("NVRM: Xid: 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    assert (p.code, p.pci) == (79, None)


@pytest.mark.parametrize("text", [
    "", "hello", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
    "check_gpu_xid: GPU Xid errors detected", "\udcff\udcfe" * 10, "x" * 70000,
    "nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
])
def test_non_xid_lines_are_none(text):
    assert parse_xid(text) is None


def test_unknown_code_is_category_unknown_action_watch():
    p = parse_xid("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, name=x, something new")
    cls = classify(p)
    assert (cls.reason, cls.entry.category, cls.action, cls.entry.known, cls.status) == (
        "Xid999", "unknown", Action.WATCH, False, Status.DEGRADED)


def test_binary_and_overlong_lines_in_a_file_do_not_break_parsing(tmp_path):
    path = tmp_path / "bad.log"
    path.write_bytes(
        b"[1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
        b"\x00\x01\xff\xfe NVRM: Xid garbage\n" + b"A" * 70000 + b"\n"
        b"[2.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=a, DBE\n")
    assert _xids_of(path) == [(79, "0000:3b:00.0"), (48, "0000:3b:00.0")]


def test_extra_fields_gpc_and_nvlink():
    p = parse_xid("NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM "
                  "Warp Exception on (GPC 9, TPC 1, SM 1): Out Of Range Address")
    assert dict(p.extra) == {"gpc": 9, "tpc": 1, "sm": 1}
    p = parse_xid("NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: "
                  "fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    assert p.extra["nvlink"] == 14 and len(p.extra["registers"]) == 7


# --- classification of the spec's codes ---------------------------------------------------------

CLASSES = [
    (13, "application", Action.NONE, Status.OK),
    (31, "application", Action.NONE, Status.OK),
    (43, "application", Action.NONE, Status.OK),
    (45, "application", Action.NONE, Status.OK),
    (48, "hardware", Action.RESET_GPU, Status.FAILED),
    (63, "hardware", Action.RESET_GPU, Status.FAILED),
    (64, "hardware", Action.REPLACE, Status.FAILED),
    (74, "hardware", Action.RESET_GPU, Status.FAILED),
    (79, "hardware", Action.REBOOT, Status.FAILED),
    (92, "hardware", Action.WATCH, Status.DEGRADED),
    (94, "hardware", Action.WATCH, Status.DEGRADED),
    (95, "hardware", Action.RESET_GPU, Status.FAILED),
    (119, "hardware", Action.RESET_GPU, Status.FAILED),
    (120, "hardware", Action.RESET_GPU, Status.FAILED),
    (140, "hardware", Action.RESET_GPU, Status.FAILED),
    (14, "driver", Action.NONE, Status.OK),
]


@pytest.mark.parametrize("code, category, action, status", CLASSES)
def test_classification_table(code, category, action, status):
    cls = classify(parse_xid(f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=p, text"))
    assert (cls.entry.category, cls.action, cls.status, cls.reason) == (category, action, status,
                                                                  f"Xid{code}")


# --- repeat and escalation arithmetic ---------------------------------------------------------


def test_burst_count_merges_a_storm(fake_clock):
    t0 = fake_clock.now()
    from datetime import timedelta
    storm = [t0 + timedelta(seconds=s) for s in (0, 1, 2, 100, 250, 1000, 1001)]
    assert burst_count(storm, 180) == 2  # 0..250 is one storm (gaps < 180), 1000.. another
    assert burst_count(storm, 0) == 7


def test_count_recoveries_and_escalation(fake_clock):
    from datetime import timedelta
    t = fake_clock.now()
    same_boot = [(t, "a"), (t + timedelta(seconds=10), "a")]
    assert count_recoveries(same_boot) == 0
    assert count_recoveries(same_boot, [t + timedelta(seconds=5)]) == 1
    assert count_recoveries([(t, "a"), (t + timedelta(seconds=10), "b")]) == 1
    assert escalate(Action.RESET_GPU, 0, 1) is Action.RESET_GPU
    assert escalate(Action.RESET_GPU, 1, 1) is Action.REPLACE
    assert escalate(Action.RESET_GPU, 1, 3) is Action.REBOOT
    assert escalate(Action.RESET_GPU, 2, 3) is Action.REPLACE
    assert escalate(Action.REBOOT, 1, 3) is Action.REPLACE
    assert escalate(Action.WATCH, 5, 1) is Action.WATCH


# --- SXid -------------------------------------------------------------------------------------


SXID_LINES = [
    ("nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
     20034, "0000:a9:00.0", 0, "header", True, 30),
    ("nvidia-nvswitch1: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 57 Minion Link DLREQ "
     "interrupt", 22013, "0000:0a:00.0", 1, "header", False, 57),
    ("nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Severity 1 Engine instance 30 "
     "Sub-engine instance 00", 20034, "0000:a9:00.0", 0, "severity", True, None),
    ("nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Data {0x50610002, 0x10100030, 0x00000000,"
     " 0x10100030, 0x00000000, 0x00000000, 0x00000000, 0x00000000}p", 20034, "0000:a9:00.0", 0,
     "data", None, None),
    ("nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED", 26006, "0004:00:00.0", 0,
     "other", None, None),
]


@pytest.mark.parametrize("line, code, pci, sw, kind, fatal, link", SXID_LINES)
def test_sxid_line_shapes(fixtures_dir, line, code, pci, sw, kind, fatal, link):
    texts = "".join(p.read_text() for p in (fixtures_dir / "xid_kmsg").iterdir())
    assert line in texts
    p = parse_sxid(parse_text_line(line).text)
    assert isinstance(p, ParsedSxid)
    assert (p.code, p.pci, p.switch_index, p.kind, p.fatal, p.link) == (code, pci, sw, kind,
                                                                        fatal, link)


def _sxid_events(path):
    g = SxidGrouper()
    events: dict[int, object] = {}
    for rec in iter_file(path):
        p = parse_sxid(rec.text)
        if isinstance(p, ParsedSxid):
            eid, ev, _new = g.feed(p)
            events[eid] = ev
    return list(events.values())


def test_sxid_triplet_is_one_event(fixtures_dir):
    evs = _sxid_events(fixtures_dir / "xid_kmsg" /
                       "gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt")
    first = evs[0]
    assert (first.code, first.fatal, first.severity_level, len(first.data), len(first.lines)) == (
        20034, True, 1, 8, 3)
    assert status_of(first) == (Status.FAILED, Action.REBOOT)


def test_interleaved_switches_group_by_switch_and_link(fixtures_dir):
    evs = _sxid_events(fixtures_dir / "xid_kmsg" / "gpud_sxid-readme_dmesg_xid79_sxid20034.log")
    summary = [(e.switch_index, e.link, e.severity_level, bool(e.data), e.orphan) for e in evs]
    assert summary == [
        (1, 48, None, False, False),
        (0, 63, None, True, False),    # its Data line came before the next header
        (2, 60, 1, False, True),       # a Severity line whose header is not in the excerpt
        (2, 37, 1, False, False),
        (0, 62, 1, False, False),      # Severity "Engine instance 62" joins link 62
    ]
    assert all(e.fatal for e in evs)


def test_sxid_fatality_and_unknown_codes(fixtures_dir):
    evs = _sxid_events(fixtures_dir / "xid_kmsg" / "nvsentinel_testliterals_xid_sxid_realistic.txt")
    by_code = {}
    for e in evs:
        by_code.setdefault(e.code, []).append(e)
    assert all(e.fatal for e in by_code[24007])
    assert not any(e.fatal for e in by_code[20009])
    assert by_code[12033][0].fatal and by_code[12033][0].fatal_basis == "severity"
    assert [e.fatal_basis for e in by_code[26006]] == ["default"]
    assert status_of(by_code[20009][0]) == (Status.DEGRADED, Action.WATCH)


@pytest.mark.parametrize("text", ["nvidia-nvswitch0: SXid (PCI:zz): 1", "SXid \x00\xff"])
def test_sxid_garbage_is_an_error_value(text):
    assert isinstance(parse_sxid(text), XidParseError)


# --- numeric fields past any real value ---------------------------------------------------------
# More digits than int() converts (4300): such a field must not match, and the event on the line
# must survive without it.
HUGE = "9" * 5000
BUS53 = "0000:53:00.0"


@pytest.mark.parametrize(("text", "code", "absent"), [
    pytest.param(f"NVRM: Xid (PCI:0000:53:00): 79, pid={HUGE}, name=x, GPU has fallen off the "
                 "bus.", 79, "pid", id="pid"),
    pytest.param(f"NVRM: Xid (PCI:0000:53:00): 13, pid=1, name=x, Graphics SM Warp Exception on "
                 f"(GPC {HUGE}, TPC 1, SM 1): Out Of Range Address", 13, "gpc", id="gpc"),
    pytest.param(f"NVRM: Xid (PCI:0000:53:00): 45, pid=1, name=x, Ch 00000001 caused by previous "
                 f"Xid {HUGE}", 45, "caused_by", id="caused-by"),
    pytest.param(f"NVRM: Xid (PCI:0000:53:00): 74, pid=1, name=x, NVLink: fatal error detected "
                 f"on link {HUGE}(0x0, 0x0)", 74, "nvlink", id="xid74-link"),
    pytest.param(f"NVRM: Xid (PCI:0000:53:00): 145, RLW_REMAP Nonfatal XC0 i0 Link {HUGE} (0x1 "
                 "0x2)", 145, "nvlink5", id="nvlink5-link"),
])
def test_a_huge_field_is_dropped_and_the_xid_kept(text, code, absent):
    x = parse_xid(text)
    assert isinstance(x, ParsedXid) and (x.code, x.pci) == (code, BUS53)
    fields = {"pid": x.pid, "caused_by": x.caused_by, "nvlink5": x.nvlink5,
              **dict(x.extra)}
    assert fields.get(absent) is None
    classify(x)


def test_a_caused_by_code_longer_than_any_xid_is_not_cut_to_fit():
    x = parse_xid("NVRM: Xid (PCI:0000:53:00): 45, pid=1, name=x, Ch 00000001 caused by previous "
                  "Xid 1450000001")
    assert isinstance(x, ParsedXid) and x.caused_by is None


def test_a_huge_gpu_instance_makes_the_line_garbage():
    x = parse_xid(f"NVRM: Xid (PCI:0000:53:00 GPU-I:{HUGE}): 94, pid=1, x")
    assert isinstance(x, XidParseError) and x.kind == "garbage"


@pytest.mark.parametrize(("text", "switch", "link", "kind"), [
    pytest.param(f"nvidia-nvswitch{HUGE}: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM "
                 "Fault Up", None, 30, "header", id="switch-index"),
    pytest.param(f"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link {HUGE} LTSSM "
                 "Fault Up", 0, None, "header", id="link"),
    pytest.param(f"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Severity {HUGE} Engine "
                 "instance 30 Sub-engine instance 00", 0, None, "other", id="severity"),
])
def test_a_huge_sxid_field_is_dropped_and_the_line_kept(text, switch, link, kind):
    s = parse_sxid(text)
    assert isinstance(s, ParsedSxid)
    assert (s.code, s.pci, s.switch_index, s.link, s.kind) == (20034, "0000:05:00.0", switch,
                                                              link, kind)


def test_a_huge_engine_instance_is_not_cut_to_fit():
    s = parse_sxid(f"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Severity 1 Engine instance "
                   f"{HUGE}")
    assert isinstance(s, ParsedSxid) and s.kind == "other" and s.engine_instance is None
