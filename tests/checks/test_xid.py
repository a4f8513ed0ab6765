"""checks/xid.py through the real readers: a FakeNvml-backed NvmlReader, procfs trees on disk,
the simulated node, and the real kernel-log fixtures."""

from __future__ import annotations

import errno
from collections import Counter
from pathlib import Path

import pytest

from checks.xid import Xid
from gpu_monitor.check import Context
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.host import Host
from gpu_monitor.hw.command import CommandRunner
from gpu_monitor.hw.kmsg.device import KmsgDeviceSource
from gpu_monitor.hw.kmsg.files import iter_file
from gpu_monitor.hw.kmsg.text import parse_text_line
from gpu_monitor.hw.nvml_reader import NvmlReader
from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.hw.procfs import ProcfsReader
from gpu_monitor.hw.sysfs import SysfsReader
from gpu_monitor.model import Action, Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.rules import xid_catalog
from gpu_monitor.sim.fake_nvml import FakeNvml
from gpu_monitor.sim.inject import parse as fault
from gpu_monitor.sim.node import SimulatedNode, build_spec
from gpu_monitor.state import Store
from tests.hw.kmsg_shapes import PATH_SHAPES, deny_open, make_log_path, unreadable_needs_faking

PROFILE = load_profile("h100-sxm-8")
# build_spec puts the 8 GPUs at the buses of a real HGX H100 board: 53 64 75 86 97 a8 b9 ca.
GPU3_BUS = "0000:86:00"


class Node:
    """A host with a FakeNvml, a procfs tree we control (boot id, uptime), and a store."""

    def __init__(self, tmp: Path, clock, *, kmsg: str | None = "unused", store: Store | None = None,
                 profile=PROFILE, boot: str = "boot-a", uptime: float = 86400.0):
        self.tmp = tmp
        self.spec = build_spec(profile)
        self.paths = HostPaths(sysfs=str(tmp / "sys"), procfs=str(tmp / "proc"),
                               dev=str(tmp / "dev"), kmsg=kmsg)
        self.set_boot(boot)
        self.set_uptime(uptime)
        self.host = Host(paths=self.paths, nvml=NvmlReader(FakeNvml(self.spec)),
                         sysfs=SysfsReader(self.paths), procfs=ProcfsReader(self.paths),
                         commands=CommandRunner())
        self.clock = clock
        self.store = store if store is not None else Store.open(":memory:", clock)
        self.profile = profile

    def set_boot(self, boot: str) -> None:
        p = self.tmp / "proc" / "sys" / "kernel" / "random"
        p.mkdir(parents=True, exist_ok=True)
        (p / "boot_id").write_text(boot + "\n")

    def set_uptime(self, seconds: float) -> None:
        (self.tmp / "proc").mkdir(parents=True, exist_ok=True)
        (self.tmp / "proc" / "uptime").write_text(f"{seconds:.2f} 1.00\n")

    def record_reset(self, outcome: str = "ok", details: dict | None = None) -> None:
        """The remediator's record, now, of a reset of gpu:3 (by index unless ``details``)."""
        self.store.record_action("reset_gpu", outcome, self.clock.now(),
                                 {"gpu_index": 3} if details is None else details)

    def ctx(self, **overrides) -> Context:
        profile = self.profile.with_overrides({"checks": {"xid": overrides}}) if overrides \
            else self.profile
        return Context(host=self.host, profile=profile, config=DEFAULT_CONFIG, clock=self.clock,
                       store=self.store)


def rec(line: str, n: int = 1):
    return parse_text_line(line, line_no=n)


def xid_line(code: int, bus: str = GPU3_BUS, seq: int = 1, text: str = "text",
             pid: str = "pid=7, name=python, ") -> str:
    """A raw /dev/kmsg record as the driver writes it (seq makes it a distinct record)."""
    return f"4,{seq},1000,-;NVRM: Xid (PCI:{bus}): {code}, {pid}{text}"


@pytest.fixture
def node(tmp_path, fake_clock):
    return Node(tmp_path, fake_clock)


# --- mapping ------------------------------------------------------------------------------


def test_pci_address_maps_to_gpu_index_and_uuid(node):
    check = Xid()
    [r] = check.on_kmsg(rec(xid_line(79, text="GPU has fallen off the bus.")), node.ctx())
    assert (r.target, r.status, r.reason, r.action) == ("gpu:3", Status.FAILED, "Xid79",
                                                        Action.REBOOT)
    assert r.details["uuid"] == node.spec.gpus[3].uuid
    assert r.details["pci_bus_id"] == "0000:86:00.0"
    assert r.details["catalog_version"] == xid_catalog().version


def test_unknown_pci_address_goes_to_a_pcie_target(node):
    [r] = Xid().on_kmsg(rec(xid_line(48, bus="0000:3b:00")), node.ctx())
    assert (r.target, r.status, r.action) == ("pcie:0000:3b:00.0", Status.FAILED,
                                              Action.RESET_GPU)
    assert r.details["uuid"] is None


def test_xids_are_reported_without_nvml(tmp_path, fake_clock):
    n = Node(tmp_path, fake_clock)
    n.spec.nvml_library_missing = True
    n.host.nvml = NvmlReader(FakeNvml(n.spec))
    [r] = Xid().on_kmsg(rec(xid_line(79)), n.ctx())
    assert (r.target, r.reason, r.status) == ("pcie:0000:86:00.0", "Xid79", Status.FAILED)


def test_gpu_map_is_cached(node, monkeypatch):
    calls = Counter()
    real = node.host.nvml.gpus

    def counting():
        calls["gpus"] += 1
        return real()

    monkeypatch.setattr(node.host.nvml, "gpus", counting)
    check = Xid()
    ctx = node.ctx()
    for seq in range(1, 6):
        check.on_kmsg(rec(xid_line(13, seq=seq, bus="0000:53:00")), ctx)
    assert calls["gpus"] == 1


def test_every_event_is_stored_once_even_when_replayed(node):
    check = Xid()
    ctx = node.ctx()
    line = xid_line(119, seq=42)
    check.on_kmsg(rec(line), ctx)
    check.on_kmsg(rec(line), ctx)  # the ring buffer replayed after a restart
    events = node.store.xid_events()
    assert [(e.code, e.seq, e.boot_id, e.gpu_index, e.pci_bus_id) for e in events] == [
        (119, 42, "boot-a", 3, "0000:86:00.0")]
    assert node.store.xid_counts(kind="xid") == {(3, node.spec.gpus[3].uuid, 119): 1}


# --- application XIDs ---------------------------------------------------------------------


def test_application_xid_fails_once_it_repeats_beyond_the_threshold(node):
    check = Xid()
    ctx = node.ctx()
    statuses = []
    for seq in range(1, 7):
        [r] = check.on_kmsg(rec(xid_line(13, seq=seq)), ctx)
        statuses.append((r.status, r.action, r.details["occurrences_in_window"]))
        node.clock.advance(200)  # beyond app_xid_dedup_s (180): a new burst each time
    assert statuses[:4] == [(Status.OK, Action.NONE, n) for n in range(1, 5)]
    assert statuses[4:] == [(Status.FAILED, Action.RESET_GPU, 5), (Status.FAILED,
                                                                    Action.RESET_GPU, 6)]
    [gpu3] = [r for r in check.poll(ctx) if r.target == "gpu:3"]
    assert (gpu3.status, gpu3.reason, gpu3.details["occurrences_in_window"]) == (
        Status.FAILED, "Xid13", 6)
    node.clock.advance(86400)  # the window (app_xid_window_s) has passed
    [gpu3] = [r for r in check.poll(ctx) if r.target == "gpu:3"]
    assert (gpu3.status, gpu3.reason) == (Status.OK, "Cleared")


def test_an_application_xid_reads_only_its_windows_history(node, monkeypatch):
    check = Xid()
    ctx = node.ctx()
    for seq in range(1, 4):
        check.on_kmsg(rec(xid_line(13, seq=seq)), ctx)
        node.clock.advance(200)
    node.clock.advance(86400)  # the window (app_xid_window_s) has passed
    read_back = []
    real = node.store.xid_events

    def spy(*args, **kwargs):
        events = real(*args, **kwargs)
        read_back.append(len(events))
        return events

    monkeypatch.setattr(node.store, "xid_events", spy)
    [r] = check.on_kmsg(rec(xid_line(13, seq=4)), ctx)
    assert r.details["occurrences_in_window"] == 1
    assert read_back == []  # the check holds its window in memory (checks/_xid_history.py)
    # A restarted check seeds that state from the store, and a recount reads the same: only
    # the window, where the three earlier events are not.
    for fresh, seq in ((Xid(), 5), (Xid(recount=True), 6)):
        read_back.clear()
        [r] = fresh.on_kmsg(rec(xid_line(13, seq=seq)), ctx)
        assert r.details["occurrences_in_window"] == 1
        assert read_back == [seq - 4]  # the events after seq 3, all in its window
    assert len(real()) == 6


def test_threshold_comes_from_settings(node):
    check = Xid()
    ctx = node.ctx(app_xid_repeat_count=2)
    [r1] = check.on_kmsg(rec(xid_line(31, seq=1)), ctx)
    node.clock.advance(600)
    [r2] = check.on_kmsg(rec(xid_line(31, seq=2)), ctx)
    assert (r1.status, r2.status) == (Status.OK, Status.FAILED)
    assert r2.details["app_xid_repeat_count"] == 2


def test_a_storm_within_the_dedup_window_counts_once(node):
    check = Xid()
    ctx = node.ctx()
    for seq in range(1, 40):
        [r] = check.on_kmsg(rec(xid_line(13, seq=seq)), ctx)
        node.clock.advance(1)
    assert r.status is Status.OK and r.details["occurrences_in_window"] == 1


def test_sympathetic_xid45_never_counts(node):
    check = Xid()
    ctx = node.ctx(app_xid_repeat_count=2)
    for seq in range(1, 5):
        [r] = check.on_kmsg(rec(xid_line(45, seq=seq, text="Ch 00000001 caused by previous "
                                                           "Xid 149")), ctx)
        assert (r.status, r.details["caused_by"]) == (Status.OK, 149)
        node.clock.advance(600)
    assert all(r.status is Status.OK for r in check.poll(ctx))


# --- hardware XIDs: escalation and standing state --------------------------------------------


def test_hardware_xid_after_a_reboot_escalates_to_replace(node):
    [first] = Xid().on_kmsg(rec(xid_line(48, seq=7)), node.ctx())
    assert first.action is Action.RESET_GPU
    node.clock.advance(3600)
    node.set_boot("boot-b")  # rebooted: same store, new boot id, sequence numbers restart
    [again] = Xid().on_kmsg(rec(xid_line(48, seq=7)), node.ctx())
    assert (again.status, again.action) == (Status.FAILED, Action.REPLACE)
    assert again.details["escalated_from"] == "reset_gpu"
    assert again.details["recoveries"] == 1
    assert len(node.store.xid_events(code=48)) == 2


def test_a_harmless_payload_before_a_reboot_does_not_escalate(node):
    nonfatal = ("NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 0x00000001 0x00000000 "
                "0x00000000 0x00000000 0x00000000)")
    fatal = ("NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 "
             "0x00000000 0x00000000 0x00000000)")
    [r] = Xid().on_kmsg(rec(xid_line(149, seq=1, text=nonfatal, pid="")), node.ctx())
    assert (r.status, r.action) == (Status.OK, Action.NONE)
    node.set_boot("boot-b")
    [r] = Xid().on_kmsg(rec(xid_line(149, seq=1, text=fatal, pid="")), node.ctx())
    assert (r.status, r.action, r.details["recoveries"]) == (Status.FAILED, Action.RESET_GPU, 0)
    assert r.details["nvlink5_decode"]["investigatory"] == "INVESTIGATE_PEER_DEVICE"


def test_repeats_within_one_boot_do_not_escalate(node):
    check = Xid()
    for seq in (1, 2, 3):
        [r] = check.on_kmsg(rec(xid_line(119, seq=seq)), node.ctx())
        node.clock.advance(60)
    assert r.action is Action.RESET_GPU and "escalated_from" not in r.details
    assert r.details["previous_occurrences"] == 2


def test_repeat_after_a_recorded_reset_climbs_the_ladder(node):
    check = Xid()
    ctx = node.ctx(replace_after_resets=3)
    [r] = check.on_kmsg(rec(xid_line(95, seq=1)), ctx)
    assert r.action is Action.RESET_GPU
    node.clock.advance(60)
    node.record_reset(details={"gpu_uuid": node.spec.gpus[3].uuid, "target": "gpu:3"})
    node.clock.advance(60)
    [r] = check.on_kmsg(rec(xid_line(95, seq=2)), ctx)
    assert (r.action, r.details["recoveries"]) == (Action.REBOOT, 1)
    node.clock.advance(60)
    node.set_boot("boot-b")
    [r] = Xid().on_kmsg(rec(xid_line(95, seq=3)), ctx)
    assert (r.action, r.details["recoveries"]) == (Action.REPLACE, 2)


def test_a_dry_run_reset_does_not_count(node):
    check = Xid()
    ctx = node.ctx()
    check.on_kmsg(rec(xid_line(95, seq=1)), ctx)
    node.clock.advance(60)
    node.record_reset("dry-run")
    node.clock.advance(60)
    [r] = check.on_kmsg(rec(xid_line(95, seq=2)), ctx)
    assert r.action is Action.RESET_GPU


def test_poll_keeps_a_hardware_problem_until_reboot(node):
    check = Xid()
    ctx = node.ctx()
    check.on_kmsg(rec(xid_line(79)), ctx)
    results = check.poll(ctx)
    assert len(results) == 8
    by_target = {r.target: r for r in results}
    assert (by_target["gpu:3"].status, by_target["gpu:3"].reason) == (Status.FAILED, "Xid79")
    assert all(r.status is Status.OK for t, r in by_target.items() if t != "gpu:3")
    node.clock.advance(7 * 86400)
    assert {r.target: r.status for r in check.poll(ctx)}["gpu:3"] is Status.FAILED
    node.set_boot("boot-b")
    gpu3 = {r.target: r for r in check.poll(ctx)}["gpu:3"]
    assert (gpu3.status, gpu3.reason, gpu3.details["cleared_reason"]) == (Status.OK, "Cleared",
                                                                         "Xid79")


def test_poll_state_survives_a_restart_through_the_store(node):
    Xid().on_kmsg(rec(xid_line(64)), node.ctx())
    gpu3 = {r.target: r for r in Xid().poll(node.ctx())}["gpu:3"]  # a new daemon process
    assert (gpu3.status, gpu3.action) == (Status.FAILED, Action.REPLACE)


def test_a_recorded_reset_closes_the_problem(node):
    check = Xid()
    ctx = node.ctx()
    check.on_kmsg(rec(xid_line(119)), ctx)
    node.clock.advance(30)
    node.record_reset()
    assert {r.target: r.reason for r in check.poll(ctx)}["gpu:3"] == "Ok"


def test_a_resolved_problem_does_not_hide_a_later_milder_one(node):
    check = Xid()
    ctx = node.ctx()
    check.on_kmsg(rec(xid_line(79, seq=1)), ctx)
    node.clock.advance(30)
    node.record_reset()
    node.clock.advance(30)
    check.on_kmsg(rec(xid_line(94, seq=2)), ctx)
    gpu3 = {r.target: r for r in check.poll(ctx)}["gpu:3"]
    assert (gpu3.status, gpu3.reason) == (Status.DEGRADED, "Xid94")


def test_watch_class_xid_is_degraded_for_the_window(node):
    check = Xid()
    ctx = node.ctx()
    [r] = check.on_kmsg(rec(xid_line(94, text="Contained: SM (0x1). RST: No, D-RST: No")), ctx)
    assert (r.status, r.action) == (Status.DEGRADED, Action.WATCH)
    assert {t.target: t.status for t in check.poll(ctx)}["gpu:3"] is Status.DEGRADED
    node.clock.advance(86401)
    gpu3 = {t.target: t for t in check.poll(ctx)}["gpu:3"]
    assert (gpu3.status, gpu3.reason) == (Status.OK, "Cleared")


def test_replayed_old_device_records_are_history(tmp_path, fake_clock):
    n = Node(tmp_path, fake_clock, kmsg=None, uptime=100000.0)  # reading /dev/kmsg
    [old] = Xid().on_kmsg(rec(xid_line(79, seq=1).replace(",1000,", ",1000000000,")), n.ctx())
    assert (old.status, old.action) == (Status.OK, Action.NONE)
    assert old.details["history"] is True and old.details["suggested_action"] == "reboot"
    assert old.details["age_s"] == pytest.approx(99000.0)
    [new] = Xid().on_kmsg(rec(xid_line(79, seq=2).replace(",1000,", ",99000000000,")), n.ctx())
    assert new.status is Status.FAILED


# --- fallen off the bus ---------------------------------------------------------------------


def test_fallen_off_the_bus_without_an_xid_line(node):
    check = Xid()
    lines = ["[ 1843.308145] NVRM: The NVIDIA GPU 0000:86:00.0",
             "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
             "               NVRM: fallen off the bus and is not responding to commands."]
    path = node.tmp / "bus.log"
    path.write_text("\n".join(lines) + "\n")
    [r] = [x for rec_ in iter_file(path) for x in check.on_kmsg(rec_, node.ctx())]
    assert (r.target, r.reason, r.status, r.action) == ("gpu:3", "GpuFallenOffBus",
                                                        Status.FAILED, Action.REBOOT)
    assert node.store.xid_events()[0].code == 79


def test_split_fallen_off_message_in_a_followed_file_is_joined(node):
    check = Xid()
    ctx = node.ctx()
    out = []
    for i, line in enumerate(["NVRM: The NVIDIA GPU 0000:86:00.0",
                              "NVRM: (PCI ID: 10de:26b5) installed in this system has",
                              "NVRM: fallen off the bus and is not responding to commands."]):
        out += check.on_kmsg(rec(line, i + 1), ctx)
    assert [(r.target, r.reason) for r in out] == [("gpu:3", "GpuFallenOffBus")]
    assert check.parse_errors == 0


def test_xid79_and_its_fallen_off_message_are_one_event(node):
    check = Xid()
    ctx = node.ctx()
    out = check.on_kmsg(rec("[6781741.548779] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', "
                            "name=<unknown>, GPU has fallen off the bus.", 1), ctx)
    out += check.on_kmsg(rec("[6781741.548783] NVRM: GPU 0000:86:00.0: GPU has fallen off the "
                             "bus.", 2), ctx)
    assert [r.reason for r in out] == ["Xid79"]


# --- bad input --------------------------------------------------------------------------------


def test_garbage_unknown_codes_and_missing_addresses_are_counted(node):
    check = Xid()
    ctx = node.ctx()
    out = []
    for i, line in enumerate([
        "NVRM: Xid (PCI:0000:86:00): abc, pid=1",           # garbage
        "NVRM: Xid (PCI:0000:86",                           # truncated
        "NVRM: fallen off the bus and is not responding",   # fragment with no header
        "NVRM: Xid: 79, pid=1, name=x, no address",         # no PCI address
        "NVRM: Xid (PCI:0000:86:00): 999, pid=1, name=x, new code",  # unknown code
        "\x00\x01 NVRM: Xid \udcff",                        # binary
    ]):
        out += check.on_kmsg(rec(line, i + 1), ctx)
    assert dict(check.parse_error_kinds) == {"garbage": 3, "fragment": 1, "no_pci": 1,
                                             "unknown_code": 1}
    assert check.parse_errors == 6
    assert [(r.target, r.reason, r.status) for r in out] == [
        ("node", "Xid79", Status.FAILED), ("gpu:3", "Xid999", Status.DEGRADED)]
    assert out[1].details["category"] == "unknown" and out[1].action is Action.WATCH


def test_a_ring_buffer_gap_is_not_a_record(node):
    from gpu_monitor.hw.kmsg.record import KmsgGap

    assert Xid().on_kmsg(KmsgGap(12, "overrun"), node.ctx()) == ()


def test_binary_file_through_run(tmp_path, fake_clock):
    path = tmp_path / "kmsg.bin"
    path.write_bytes(b"\xff\xfe\x00garbage\n" + b"B" * 100000 + b"\n"
                     b"[5.0] NVRM: Xid (PCI:0000:86:00): 79, pid=1, name=a, GPU has fallen off\n"
                     b"NVRM: Xid (PCI:0000:86:00): \xff\xff\n")
    n = Node(tmp_path, fake_clock, kmsg=str(path))
    check = Xid()
    results = check.run(n.ctx())
    assert [(r.target, r.reason) for r in results if r.reason != "Ok"] == [("gpu:3", "Xid79")]
    assert check.parse_errors == 1
    assert sum(r.reason == "Ok" for r in results) == 7


# --- a log nobody read -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", list(PATH_SHAPES))
def test_a_log_nobody_read_makes_every_gpu_unknown_never_ok(tmp_path, fake_clock, monkeypatch,
                                                            shape):
    path = make_log_path(tmp_path, shape)
    if shape == "unreadable" and unreadable_needs_faking():
        deny_open(monkeypatch, path)
    results = Xid().run(Node(tmp_path, fake_clock, kmsg=str(path)).ctx())
    assert [(r.target, r.status, r.reason) for r in results] == [
        (f"gpu:{i}", Status.UNKNOWN, "KmsgReadError") for i in range(8)]
    for r in results:
        assert str(path) in r.message and PATH_SHAPES[shape] in r.message
        assert r.details["path"] == str(path) and PATH_SHAPES[shape] in r.details["error"]


@pytest.mark.skipif(unreadable_needs_faking(), reason="root reads mode-000 files anyway; the "
                    "monkeypatched case above covers it")
def test_a_mode_000_log_is_unknown_for_a_reader_without_root(tmp_path, fake_clock):
    path = make_log_path(tmp_path, "unreadable")
    results = Xid().run(Node(tmp_path, fake_clock, kmsg=str(path)).ctx())
    assert {(r.status, r.reason) for r in results} == {(Status.UNKNOWN, "KmsgReadError")}


def test_without_gpus_the_node_carries_the_read_error(tmp_path, fake_clock):
    n = Node(tmp_path, fake_clock, kmsg=str(tmp_path / "missing.log"))
    n.spec.nvml_library_missing = True
    n.host.nvml = NvmlReader(FakeNvml(n.spec))
    [r] = Xid().run(n.ctx())
    assert (r.target, r.status, r.reason) == ("node", Status.UNKNOWN, "KmsgReadError")
    assert "missing.log" in r.message and "No such file or directory" in r.message


class ScriptedDevice:
    """/dev/kmsg through its read(2) semantics: one record per read, then what the script
    says (an OSError, any exception), then EAGAIN."""

    def __init__(self, *script):
        self.script = list(script)

    def read(self, size):
        if not self.script:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def seek_end(self):
        self.script.clear()

    def fileno(self):
        return -1

    def close(self):
        pass


def _device_node(tmp_path, fake_clock, monkeypatch, *script) -> Node:
    n = Node(tmp_path, fake_clock, kmsg=None)
    monkeypatch.setattr(n.host, "open_kmsg", lambda replay=True: KmsgDeviceSource(
        n.paths.kmsg_path, replay=replay, reader=ScriptedDevice(*script)))
    return n


def test_an_io_error_part_way_keeps_the_events_read_and_says_unknown_for_the_rest(
        tmp_path, fake_clock, monkeypatch):
    recent = xid_line(48).replace(",1000,", ",86390000000,")  # 10 s before "now" (uptime)
    n = _device_node(tmp_path, fake_clock, monkeypatch, (recent + "\n").encode(),
                     OSError(errno.EIO, "Input/output error"))
    results = {r.target: r for r in Xid().run(n.ctx())}
    assert (results["gpu:3"].status, results["gpu:3"].reason) == (Status.FAILED, "Xid48")
    others = [results[f"gpu:{i}"] for i in range(8) if i != 3]
    assert {(r.status, r.reason) for r in others} == {(Status.UNKNOWN, "KmsgReadError")}
    assert all("Input/output error" in r.message and n.paths.kmsg_path in r.message
               for r in others)


def test_a_reader_that_crashes_is_unknown_not_a_crashed_check(tmp_path, fake_clock, monkeypatch):
    n = _device_node(tmp_path, fake_clock, monkeypatch, RuntimeError("reader bug"))
    results = Xid().run(n.ctx())
    assert {(r.status, r.reason) for r in results} == {(Status.UNKNOWN, "KmsgReadError")}
    assert "RuntimeError: reader bug" in results[0].message


def test_a_device_that_returns_no_record_proves_nothing(tmp_path, fake_clock, monkeypatch):
    n = _device_node(tmp_path, fake_clock, monkeypatch)
    results = Xid().run(n.ctx())
    assert {(r.status, r.reason) for r in results} == {(Status.UNKNOWN, "KmsgReadError")}
    assert "no record" in results[0].message


def test_the_healthy_simulated_node_is_ok_after_reading_its_boot_records(fake_clock):
    sim = SimulatedNode(PROFILE)
    host = sim.host()
    try:
        ctx = Context(host=host, profile=PROFILE, config=DEFAULT_CONFIG, clock=fake_clock)
        results = Xid().run(ctx)
        assert [(r.target, r.status) for r in results] == [(f"gpu:{i}", Status.OK)
                                                           for i in range(8)]
        assert results[0].details["lines_scanned"] == 2
    finally:
        host.close()


# --- one-shot scans of the real fixtures -----------------------------------------------------


def _run_fixture(tmp_path, fake_clock, fixtures_dir, name):
    n = Node(tmp_path, fake_clock, kmsg=str(fixtures_dir / "xid_kmsg" / name))
    check = Xid()
    return n, check, check.run(n.ctx())


@pytest.mark.parametrize("name, expected", [
    ("issue_NVSentinel155_dmesg_fallen-off-bus_multiline_noXID.log",
     {("failed", "GpuFallenOffBus"): 1}),
    ("gpud_sxid-readme_dmesg_xid79_sxid20034.log", {("failed", "Xid79"): 1}),
    ("gpud_dmesg-time-format-iso_xid48_xid63_xid94_peermem.log",
     {("failed", "Xid48"): 1, ("failed", "Xid63"): 1, ("degraded", "Xid94"): 9}),
    ("issue_open-gpu-kernel-modules1150_journal-grep_xid45_caused_by_previous_xid145_149.log",
     {("ok", "Xid45"): 7}),
    ("imbue_docstring_dmesg_xid64_xid94_sxid12028_pcie_limited.log",
     {("failed", "Xid64"): 1, ("degraded", "Xid94"): 1}),
    ("gpud_dmesg-decode-iso_boot_full_2381lines.log", {}),
])
def test_run_reports_every_event_of_a_saved_log(tmp_path, fake_clock, fixtures_dir, name,
                                                 expected):
    _n, _check, results = _run_fixture(tmp_path, fake_clock, fixtures_dir, name)
    events = Counter((r.status.value, r.reason) for r in results if r.reason != "Ok")
    assert events == expected
    quiet = [r for r in results if r.reason == "Ok"]
    busy = {r.target for r in results if r.reason != "Ok" and r.target.startswith("gpu:")}
    assert len(quiet) + len(busy) == 8  # one ok result per GPU without events
    assert all(r.status is Status.OK and r.details["lines_scanned"] > 0 for r in quiet)


def test_run_over_the_xid13_storm_flags_the_repeating_gpu(tmp_path, fake_clock, fixtures_dir):
    _n, _check, results = _run_fixture(tmp_path, fake_clock, fixtures_dir,
                                       "gpud_dmesg-decode-iso_636lines_xid13_xid43.log")
    events = [r for r in results if r.reason in ("Xid13", "Xid43")]
    assert len(events) == 636
    assert {r.target for r in events} == {"pcie:0000:38:00.0"}
    assert events[0].status is Status.OK
    assert events[-1].status is Status.FAILED and events[-1].details["repeated"] is True


def test_run_of_every_fixture_never_crashes(tmp_path, fake_clock, fixtures_dir):
    allowed = set(Xid.all_reasons())
    for path in sorted((fixtures_dir / "xid_kmsg").iterdir()):
        n = Node(tmp_path / path.name, fake_clock, kmsg=str(path))
        results = Xid().run(n.ctx())
        assert results, path.name
        assert {r.reason for r in results} <= allowed, path.name


def test_run_on_a_file_leaves_the_node_history_alone(tmp_path, fake_clock, fixtures_dir):
    n, _check, results = _run_fixture(tmp_path, fake_clock, fixtures_dir,
                                      "gpud_sxid-readme_dmesg_xid79_sxid20034.log")
    assert any(r.reason == "Xid79" for r in results)
    assert n.store.xid_events() == [] and n.store.get_kv("xid", "open") is None


# --- the simulated node ----------------------------------------------------------------------


def test_injected_xid_on_the_simulated_node_reaches_the_check(fake_clock):
    sim = SimulatedNode(PROFILE, [fault("xid@gpu:3,code=79")])
    host = sim.host()
    try:
        store = Store.open(":memory:", fake_clock)
        ctx = Context(host=host, profile=PROFILE, config=DEFAULT_CONFIG, clock=fake_clock,
                      store=store)
        check = Xid()
        source = host.open_kmsg(replay=True)
        try:
            out = [r for item in source.read_available() for r in check.on_kmsg(item, ctx)]
        finally:
            source.close()
        assert [(r.target, r.reason, r.status, r.action) for r in out] == [
            ("gpu:3", "Xid79", Status.FAILED, Action.REBOOT)]
        assert out[0].details["uuid"] == sim.spec.gpus[3].uuid
        assert [e.boot_id for e in store.xid_events()] == [sim.spec.boot_id]
        scanned = Xid().run(ctx)
        assert [(r.target, r.reason) for r in scanned if r.reason != "Ok"] == [("gpu:3",
                                                                                "Xid79")]
    finally:
        host.close()
