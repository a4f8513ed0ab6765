"""checks/nvswitch.py: SXid lines, NVML fabric state and Fabric Manager liveness, through the real
readers over the simulated node (sysfs NVSwitch functions, FakeNvml) and procfs trees on disk."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from checks.nvswitch import NvSwitch
from gpu_monitor.hw.kmsg.files import iter_file
from gpu_monitor.hw.kmsg.text import parse_text_line
from gpu_monitor.model import Action, Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.sim.inject import parse as fault
from gpu_monitor.sim.spec import FABRIC_STATE_IN_PROGRESS
from tests.checks.rig import CheckRig, by_target
from tests.hw.kmsg_shapes import PATH_SHAPES, deny_open, make_log_path, unreadable_needs_faking

H100 = load_profile("h100-sxm-8")
CPU_ONLY = load_profile("cpu-only")


class Sim(CheckRig):
    """The simulated HGX node: NVSwitches at 0000:05..08:00.0 in sysfs, FakeNvml fabric state,
    and the Fabric Manager process; one-shot contexts (the tests call the entry points)."""

    def __init__(self, clock, faults=(), profile=H100, fabric_manager=True):
        super().__init__(None, *faults, profile=profile, clock=clock, one_shot=True)
        if not fabric_manager:
            self.stop_fabric_manager()

    def start_fabric_manager(self) -> None:
        # The simulated node renders proc/<pid>/comm as the kernel does: cut to 15
        # characters, so "nv-fabricmanager" reads "nv-fabricmanage".
        self.node.spec.fabric_manager_running = True
        self.sync()

    def stop_fabric_manager(self) -> None:
        self.node.spec.fabric_manager_running = False
        self.sync()

    def reboot(self, boot: str = "boot-b") -> None:
        self.node.spec.boot_id = boot
        self.sync()  # re-renders procfs (and drops processes it does not know)
        self.start_fabric_manager()

    def set_uptime(self, seconds: float) -> None:
        super().set_uptime(seconds)
        self.start_fabric_manager()


@pytest.fixture
def sim(fake_clock):
    s = Sim(fake_clock)
    yield s
    s.close()


def rec(line: str, n: int = 1):
    return parse_text_line(line, line_no=n)



# --- SXid lines ----------------------------------------------------------------------------


def test_fatal_sxid_fails_the_switch_named_in_the_prefix(sim):
    [r] = NvSwitch().on_kmsg(rec("[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): "
                                 "20034, Fatal, Link 48 LTSSM Fault Up"), sim.ctx())
    assert (r.target, r.status, r.reason, r.action) == ("nvswitch:1", Status.FAILED, "SXid20034",
                                                        Action.REBOOT)
    assert (r.details["link"], r.details["fatal_class"], r.details["name"]) == (
        48, "potential_fatal", "LTSSM Fault Up")
    [event] = sim.store.xid_events(kind="sxid")
    assert (event.code, event.pci_bus_id, event.fatal) == (20034, "0000:06:00.0", True)


def test_non_fatal_sxid_degrades(sim):
    [r] = NvSwitch().on_kmsg(rec("[186965.348898] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): "
                                 "12028, Non-fatal, Link 61 egress non-posted PRIV error (First)"),
                             sim.ctx())
    assert (r.target, r.status, r.action) == ("nvswitch:2", Status.DEGRADED, Action.WATCH)


def test_without_a_prefix_the_pci_address_is_mapped_through_sysfs_order(sim):
    [r] = NvSwitch().on_kmsg(rec("SXid (PCI:0000:07:00.0): 20034, Fatal, Link 37 LTSSM Fault Up"),
                             sim.ctx())
    assert r.target == "nvswitch:2"
    [r] = NvSwitch().on_kmsg(rec("SXid (PCI:0000:e1:00.0): 20034, Fatal, Link 1 LTSSM Fault Up"),
                             sim.ctx())
    assert r.target == "pcie:0000:e1:00.0"


def test_the_lines_of_one_error_give_one_result(sim, fixtures_dir):
    path = fixtures_dir / "xid_kmsg" / "gpud_history_testliterals_xid94_95_119_sxid_mlx5.txt"
    check = NvSwitch()
    ctx = sim.ctx()
    out = [r for item in list(iter_file(path))[9:12] for r in check.on_kmsg(item, ctx)]
    assert [(r.target, r.reason) for r in out] == [("nvswitch:0", "SXid20034")]
    assert len(sim.store.xid_events(kind="sxid")) == 1


def test_run_groups_each_errors_lines(sim, fixtures_dir, tmp_path):
    from gpu_monitor.hw.paths import HostPaths

    sim.host.paths = HostPaths(sysfs=sim.node.paths.sysfs, procfs=sim.node.paths.procfs,
                               dev=sim.node.paths.dev, kmsg=str(
                                   fixtures_dir / "xid_kmsg" /
                                   "gpud_sxid-readme_dmesg_xid79_sxid20034.log"))
    results = NvSwitch().run(sim.ctx())
    sx = [r for r in results if r.reason == "SXid20034"]
    assert [(r.target, r.details["link"], len(r.details["lines"]), r.details["orphan"])
            for r in sx] == [("nvswitch:1", 48, 1, False), ("nvswitch:0", 63, 2, False),
                             ("nvswitch:2", 60, 1, True), ("nvswitch:2", 37, 2, False),
                             ("nvswitch:0", 62, 2, False)]
    assert all(r.status is Status.FAILED for r in sx)
    assert by_target(results)["nvswitch:3"].status is Status.OK
    assert sim.store.xid_events() == []  # a saved file is analysed, not added to history


def test_unknown_sxid_codes_and_garbage_are_counted(sim):
    check = NvSwitch()
    ctx = sim.ctx()
    out = []
    for i, line in enumerate([
        "nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED",
        "nvidia-nvswitch0: SXid (PCI:zz): 1",
        "nvidia-nvswitch0: SXid \x00\xff",
    ]):
        out += check.on_kmsg(rec(line, i + 1), ctx)
    assert dict(check.parse_error_kinds) == {"unknown_code": 1, "garbage": 2}
    assert check.parse_errors == 3
    assert [(r.target, r.reason, r.status) for r in out] == [
        ("nvswitch:0", "SXid26006", Status.DEGRADED)]



def test_without_a_store_events_leave_no_growing_history(sim):
    """Off a store (one-shot runs, `check --once`) nothing reads SXid history back, so the
    check keeps none: a daemon without a store must not grow with every event."""
    check = NvSwitch()
    ctx = dataclasses.replace(sim.ctx(), store=None)
    for i in range(300):
        check.on_kmsg(rec(f"[{100 + i}.0] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20009, "
                          f"Non-fatal, Link {i % 64:02d} RX Short Error Rate", i + 1), ctx)
    sizes = {k: len(v) for k, v in vars(check).items() if isinstance(v, (list, dict, set))}
    assert all(n < 100 for n in sizes.values()), sizes

def test_a_ring_buffer_gap_is_not_a_record(sim):
    from gpu_monitor.hw.kmsg.record import KmsgGap

    assert NvSwitch().on_kmsg(KmsgGap(None, "overrun"), sim.ctx()) == ()


def test_fatal_switch_state_lasts_until_reboot(sim):
    check = NvSwitch()
    ctx = sim.ctx()
    check.on_kmsg(rec("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 28 "
                      "sourcetrack timeout error (First)"), ctx)
    sim.clock.advance(3 * 86400)
    assert by_target(check.poll(ctx))["nvswitch:0"].status is Status.FAILED
    sim.reboot()
    sw0 = by_target(check.poll(ctx))["nvswitch:0"]
    assert (sw0.status, sw0.reason) == (Status.OK, "Cleared")


def test_non_fatal_switch_state_expires(sim):
    check = NvSwitch()
    ctx = sim.ctx()
    check.on_kmsg(rec("nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 20009, Non-fatal, Link 04 RX "
                      "Short Error Rate"), ctx)
    assert by_target(check.poll(ctx))["nvswitch:3"].status is Status.DEGRADED
    sim.clock.advance(3601)
    sw3 = by_target(check.poll(ctx))["nvswitch:3"]
    assert (sw3.status, sw3.reason) == (Status.OK, "Cleared")


def test_injected_sxid_on_the_simulated_node_reaches_the_check(fake_clock):
    s = Sim(fake_clock, [fault("sxid@nvswitch:0,code=20034,fatal=1")])
    try:
        check = NvSwitch()
        ctx = s.ctx()
        source = s.host.open_kmsg(replay=True)
        try:
            out = [r for item in source.read_available() for r in check.on_kmsg(item, ctx)]
        finally:
            source.close()
        assert [(r.target, r.reason, r.status) for r in out] == [
            ("nvswitch:0", "SXid20034", Status.FAILED)]
        assert by_target(check.poll(ctx))["nvswitch:0"].status is Status.FAILED
        scanned = by_target(NvSwitch().run(ctx))
        assert scanned["nvswitch:0"].reason == "SXid20034"
    finally:
        s.close()


# --- a log nobody read -------------------------------------------------------------------------


def _with_log(sim: Sim, path) -> None:
    sim.host.paths = dataclasses.replace(sim.node.paths, kmsg=str(path))


@pytest.mark.parametrize("shape", list(PATH_SHAPES))
def test_a_log_nobody_read_makes_every_switch_unknown_never_ok(sim, tmp_path, monkeypatch, shape):
    path = make_log_path(tmp_path, shape)
    if shape == "unreadable" and unreadable_needs_faking():
        deny_open(monkeypatch, path)
    _with_log(sim, path)
    results = by_target(NvSwitch().run(sim.ctx()))
    for i in range(4):
        r = results[f"nvswitch:{i}"]
        assert (r.status, r.reason) == (Status.UNKNOWN, "KmsgReadError")
        assert str(path) in r.message and PATH_SHAPES[shape] in r.message
        assert r.details["pci_bus_id"] == f"0000:0{5 + i}:00.0"
    # What does not come from the kernel log is still read and judged.
    assert (results["gpu:0"].status, results["node"].status) == (Status.OK, Status.OK)


def test_without_switches_the_node_carries_the_read_error(fake_clock, tmp_path):
    s = Sim(fake_clock, profile=CPU_ONLY, fabric_manager=False)
    try:
        _with_log(s, tmp_path / "missing.log")
        [r] = NvSwitch().run(s.ctx())
        assert (r.target, r.status, r.reason) == ("node", Status.UNKNOWN, "KmsgReadError")
        assert "missing.log" in r.message
    finally:
        s.close()


def test_switches_are_ok_after_reading_the_simulated_boot_records(sim):
    results = by_target(NvSwitch().run(sim.ctx()))
    assert [results[f"nvswitch:{i}"].status for i in range(4)] == [Status.OK] * 4


# --- fabric state -----------------------------------------------------------------------------


def test_healthy_fabric_and_fabric_manager(sim):
    results = NvSwitch().poll(sim.ctx())
    statuses = Counter((r.status, r.reason) for r in results)
    assert statuses == {(Status.OK, "Ok"): 4 + 8 + 1}  # 4 switches, 8 GPUs, Fabric Manager
    assert by_target(results)["node"].details["fabric_manager_pid"] == 2101


def test_fabric_not_completed_and_fabric_error(sim):
    sim.node.spec.gpus[2].fabric_state = FABRIC_STATE_IN_PROGRESS
    sim.node.spec.gpus[5].fabric_status = 9  # an NVML error code after registration
    results = by_target(NvSwitch().poll(sim.ctx()))
    g2, g5 = results["gpu:2"], results["gpu:5"]
    assert (g2.status, g2.reason, g2.action) == (Status.FAILED, "FabricNotReady", Action.REBOOT)
    assert g2.details["fabric_state"] == "in_progress"
    assert (g5.status, g5.reason, g5.details["fabric_status"]) == (Status.FAILED, "FabricError",
                                                                  9)
    assert results["gpu:0"].status is Status.OK


def test_fabric_problems_during_boot_grace_are_unknown(sim):
    sim.node.spec.gpus[0].fabric_state = FABRIC_STATE_IN_PROGRESS
    sim.set_uptime(30.0)
    g0 = by_target(NvSwitch().poll(sim.ctx()))["gpu:0"]
    assert (g0.status, g0.reason, g0.details["problem"]) == (Status.UNKNOWN, "BootGrace",
                                                             "FabricNotReady")


def test_gpus_without_fabric_support_are_skipped(fake_clock):
    s = Sim(fake_clock, profile=H100)
    try:
        for g in s.node.spec.gpus:
            g.fabric_supported = False
        results = NvSwitch().poll(s.ctx())
        gpus = [r for r in results if r.target.startswith("gpu:")]
        assert {(r.status, r.reason) for r in gpus} == {(Status.SKIPPED, "NotSupported")}
    finally:
        s.close()


def test_a_gpu_list_nvml_cannot_give_is_an_unknown_beside_the_fabric_manager(sim):
    sim.node.spec.nvml_errors["nvmlDeviceGetCount"] = "Unknown"
    results = NvSwitch().poll(sim.ctx())
    node = [r for r in results if r.target == "node"]
    assert sorted((r.status, r.reason) for r in node) == [(Status.OK, "Ok"),
                                                          (Status.UNKNOWN, "NvmlReadError")]
    unknown = next(r for r in node if r.status is Status.UNKNOWN)
    assert "nvmlDeviceGetCount" in unknown.message
    assert unknown.details["nvml_error_kind"] == "unknown"
    assert not [r for r in results if r.target.startswith("gpu:")]  # no GPU is said fine


@pytest.mark.parametrize("call", ["nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo",
                                  "nvmlDeviceGetHandleByIndex"])
def test_a_gpu_nvml_cannot_identify_has_an_unknown_fabric_state(sim, call):
    sim.node.spec.gpus[3].nvml_errors[call] = "Unknown"
    g3 = by_target(NvSwitch().poll(sim.ctx()))["gpu:3"]
    assert (g3.status, g3.reason, g3.details["nvml_call"]) == (Status.UNKNOWN, "NvmlReadError",
                                                               call)


def test_unsupported_fabric_info_names_the_call_that_said_so(sim):
    sim.node.spec.gpus[1].nvml_errors["nvmlDeviceGetGpuFabricInfoV"] = "NotSupported"
    g1 = by_target(NvSwitch().poll(sim.ctx()))["gpu:1"]
    assert (g1.status, g1.reason) == (Status.SKIPPED, "NotSupported")
    assert "nvmlDeviceGetGpuFabricInfoV" in g1.message


# --- Fabric Manager ---------------------------------------------------------------------------


def test_fabric_manager_down_is_degraded(sim):
    sim.stop_fabric_manager()
    node = by_target(NvSwitch().poll(sim.ctx()))["node"]
    assert (node.status, node.reason, node.action) == (Status.DEGRADED, "FabricManagerDown",
                                                       Action.WATCH)


def test_fabric_manager_is_not_expected_without_nvswitch(fake_clock):
    s = Sim(fake_clock, profile=CPU_ONLY, fabric_manager=False)
    try:
        results = NvSwitch().poll(s.ctx())
        assert results == []  # no switches, no GPUs, no Fabric Manager expected
    finally:
        s.close()


def test_fabric_manager_down_during_boot_grace_is_unknown(sim):
    sim.set_uptime(10.0)
    sim.stop_fabric_manager()
    node = by_target(NvSwitch().poll(sim.ctx()))["node"]
    assert (node.status, node.reason) == (Status.UNKNOWN, "BootGrace")
