"""pcie_aer over the simulated node (real sysfs files, real reader) on a fake clock."""

from __future__ import annotations

import os
import shutil

import pytest

from checks.pcie_aer import PcieAer, correctable_increase
from gpu_monitor.model import Action, Status
from gpu_monitor.state import Store
from tests.checks.rig import CheckRig, rig_fixture

GPU0 = "pcie:0000:53:00.0"  # gpu 0 of the simulated HGX board


rig = rig_fixture(PcieAer, watch=GPU0)


def aer_file(r: CheckRig, address: str, kind: str) -> str:
    return os.path.join(r.node.paths.sys("bus", "pci", "devices", address), f"aer_dev_{kind}")


# --- pure window arithmetic ---------------------------------------------------------------------


@pytest.mark.parametrize("samples, current, expected", [
    ([], 5, (0.0, 0.0)),
    ([[0, 10]], 10, (0.0, 100.0)),              # sampled before the window: covers all of it
    ([[0, 10], [500, 40]], 70, (60.0, 100.0)),  # the value at the window start was 10
    ([[200, 10]], 30, (20.0, 200.0)),           # we started watching inside the window
    ([[0, 10], [50, 20], [300, 25]], 25, (5.0, 100.0)),
])
def test_correctable_increase_uses_the_value_at_the_window_start(samples, current, expected):
    assert correctable_increase(samples, window_start=100.0, current=current) == expected


# --- the daemon -----------------------------------------------------------------------------------


def test_healthy_node_watches_gpus_nvswitches_and_nics(rig):
    r = rig()
    res = r.run_to(0)
    kinds = sorted(x.details["device_kind"] for x in res.values())
    assert kinds == ["gpu"] * 8 + ["nic"] * 8 + ["nvswitch"] * 4
    assert all(x.status is Status.OK for x in res.values())
    gpu0 = res[GPU0]
    assert gpu0.details["gpu_index"] == 0 and gpu0.details["uuid"] == r.node.spec.gpu(0).uuid
    nic = next(x for x in res.values() if x.details["device_kind"] == "nic")
    assert list(nic.details["rdma_devices"]) == ["mlx5_0"]


def test_fatal_increase_fails_with_reboot_and_stays_until_the_counter_resets(rig):
    r = rig("aer@gpu:0,kind=fatal,after=60")
    r.run_to(3000)
    assert r.history() == [(0, Status.OK, "Ok"), (60, Status.FAILED, "AerFatal")]
    res = r.log[-1][1][GPU0]
    assert res.action is Action.REBOOT
    assert res.details["fatal_increase"] == 1 and res.details["fatal_total"] == 1
    assert res.details["fatal_counters"] == {"DLP": 1}
    assert res.details["gpu_index"] == 0
    # A reboot / driver reload resets the counter: rebase, clear, no alarm.
    r.node.spec.gpu(0).aer_fatal = 0
    r.run_to(3060)
    assert [h[1:] for h in r.history()][-2:] == [(Status.OK, "Cleared"), (Status.OK, "Ok")]


def test_nonfatal_increase_fails_with_watch_then_ages_out(rig):
    r = rig("aer@gpu:0,kind=nonfatal,count=2,after=60")
    r.run_to(1200)
    assert r.history() == [(0, Status.OK, "Ok"), (60, Status.FAILED, "AerNonFatal"),
                           (960, Status.OK, "Cleared"), (990, Status.OK, "Ok")]
    failed = r.log[2][1][GPU0]
    assert failed.action is Action.WATCH and failed.details["nonfatal_increase"] == 2
    assert failed.details["nonfatal_counters"] == {"CmpltTO": 2}


def test_new_nonfatal_error_restarts_the_window(rig):
    r = rig("aer@gpu:0,kind=nonfatal,after=60")
    r.run_to(600)
    r.node.spec.gpu(0).aer_nonfatal += 1
    r.run_to(1600)  # the second error is seen at 630: failed until 630 + 900
    assert r.history() == [(0, Status.OK, "Ok"), (60, Status.FAILED, "AerNonFatal"),
                           (1530, Status.OK, "Cleared"), (1560, Status.OK, "Ok")]


@pytest.mark.parametrize("count, expected", [
    (300, (Status.OK, "Ok")),                           # 20/min over 15 min
    (600, (Status.DEGRADED, "AerCorrectableRate")),     # 40/min > 32/min (DCGM's 480/15 min)
])
def test_correctable_rate_over_the_window(rig, count, expected):
    r = rig(f"aer@gpu:0,kind=correctable,count={count},after=60")
    res = r.run_to(120)[GPU0]
    assert (res.status, res.reason) == expected
    assert res.details["correctable_increase"] == count
    assert res.details["correctable_per_min_degraded"] == 32


def test_correctable_burst_clears_when_it_leaves_the_window(rig):
    r = rig("aer@gpu:0,kind=correctable,count=1000,after=60")
    r.run_to(1200)
    assert r.history() == [(0, Status.OK, "Ok"), (60, Status.DEGRADED, "AerCorrectableRate"),
                           (960, Status.OK, "Cleared"), (990, Status.OK, "Ok")]


def test_baseline_survives_a_restart(rig):
    r = rig("aer@gpu:0,kind=nonfatal,after=60")
    r.run_to(1200)  # failed at 60, aged out at 960
    assert r.log[-1][1][GPU0].status is Status.OK
    r.check = PcieAer()  # daemon restart, same store: the old error is not news
    assert r.run_to(1230)[GPU0].status is Status.OK
    r.check, r.store = PcieAer(), Store.open(":memory:", r.clock)  # without the store, it would be
    assert r.run_to(1260)[GPU0].reason == "AerNonFatal"


def test_fatal_alarm_continues_across_a_restart(rig):
    r = rig("aer@gpu:0,kind=fatal,after=60")
    r.run_to(90)
    r.check = PcieAer()
    res = r.run_to(120)[GPU0]
    assert (res.status, res.reason) == (Status.FAILED, "AerFatal")
    assert res.details["fatal_baseline"] == 0


def test_counter_going_backwards_rebases_without_alarm(rig):
    r = rig()
    r.run_to(0)
    r.node.spec.gpu(0).aer_nonfatal = 5
    r.node.spec.gpu(0).aer_correctable = 10_000
    r.run_to(30)
    assert r.log[-1][1][GPU0].reason == "AerNonFatal"
    r.node.spec.gpu(0).aer_nonfatal = 0  # driver reload: the counters start over
    r.node.spec.gpu(0).aer_correctable = 0
    res = r.run_to(60)[GPU0]
    assert (res.status, res.reason) == (Status.OK, "Cleared")
    assert res.details["nonfatal_baseline"] == 0 and res.details["correctable_increase"] == 0
    r.node.spec.gpu(0).aer_nonfatal = 1  # counting resumes from the new base
    assert r.run_to(90)[GPU0].reason == "AerNonFatal"


def test_reboot_rebases_everything(rig):
    r = rig("aer@gpu:0,kind=fatal,after=0")
    r.run_to(30)
    assert r.log[-1][1][GPU0].reason == "AerFatal"
    r.node.spec.boot_id = "0c5b1d7e-2222-4c1f-9e7a-000000000001"
    r.node.spec.gpu(0).aer_fatal = 0
    res = r.run_to(60)[GPU0]
    assert (res.status, res.reason) == (Status.OK, "Cleared")


# --- devices without AER, junk, boot grace --------------------------------------------------------


def test_missing_aer_files_skip_that_device_only(rig):
    r = rig()
    r.run_to(0)
    for kind in ("correctable", "nonfatal", "fatal"):
        os.unlink(aer_file(r, "0000:53:00.0", kind))
    res = {x.target: x for x in r.check.poll(r.ctx())}
    assert (res[GPU0].status, res[GPU0].reason) == (Status.SKIPPED, "NotSupported")
    assert sum(x.status is Status.OK for x in res.values()) == 19


def test_junk_aer_file_is_unknown(rig):
    r = rig()
    r.run_to(0)
    with open(aer_file(r, "0000:53:00.0", "fatal"), "w") as f:
        f.write("TOTAL_ERR_FATAL lots\n")
    res = {x.target: x for x in r.check.poll(r.ctx())}[GPU0]
    assert (res.status, res.reason) == (Status.UNKNOWN, "SysfsReadError")
    assert any("aer_dev_fatal" in e for e in res.details["read_errors"])


def test_junk_file_does_not_hide_real_evidence(rig):
    r = rig()
    r.run_to(0)
    r.node.spec.gpu(0).aer_nonfatal = 1
    r.node.advance(0)
    with open(aer_file(r, "0000:53:00.0", "correctable"), "w") as f:
        f.write("\x00\x01binary\n")
    res = {x.target: x for x in r.check.poll(r.ctx())}[GPU0]
    assert (res.status, res.reason) == (Status.FAILED, "AerNonFatal")
    assert res.details["read_errors"]


def test_errors_during_boot_grace_are_unknown(rig):
    r = rig("aer@gpu:0,kind=fatal,after=0")
    r.node.spec.uptime_s = 120.0
    res = r.run_to(0)[GPU0]
    assert (res.status, res.reason) == (Status.UNKNOWN, "BootGrace")
    r.node.spec.uptime_s = 400.0
    assert r.run_to(30)[GPU0].reason == "AerFatal"


def test_real_kernel_aer_files_parse_as_clean(rig, fixtures_dir):
    r = rig()
    src = (fixtures_dir / "sysfs" / "node_exporter" / "sys" / "devices" / "pci0000:00"
           / "0000:00:02.1" / "0000:01:00.0")
    for kind in ("correctable", "nonfatal", "fatal"):
        shutil.copyfile(src / f"aer_dev_{kind}", aer_file(r, "0000:53:00.0", kind))
    res = {x.target: x for x in r.check.poll(r.ctx())}[GPU0]
    assert res.status is Status.OK
    assert (res.details["fatal_total"], res.details["nonfatal_total"],
            res.details["correctable_total"]) == (0, 0, 0)


def test_node_without_watched_devices_is_skipped(rig):
    r = rig(profile="cpu-only")
    res = r.run_to(0)
    assert [(x.status, x.reason) for x in res.values()] == [(Status.SKIPPED, "NoDevice")]


# --- one-shot (bootstrap) ---------------------------------------------------------------------------


def test_one_shot_reports_any_uncorrectable_since_boot(rig):
    r = rig("aer@gpu:0,kind=fatal", "aer@gpu:1,kind=nonfatal", "aer@gpu:2,kind=correctable,count=7")
    res = r.one_shot_run()
    assert (res[GPU0].status, res[GPU0].reason, res[GPU0].action) == (
        Status.FAILED, "AerFatal", Action.REBOOT)
    assert "since boot" in res[GPU0].message
    gpu1 = res["pcie:0000:64:00.0"]
    assert (gpu1.status, gpu1.reason) == (Status.FAILED, "AerNonFatal")
    gpu2 = res["pcie:0000:75:00.0"]
    assert gpu2.status is Status.OK and gpu2.details["correctable_total"] == 7
    assert gpu2.details["window"] == "instantaneous"
    assert r.store.kv_items("pcie_aer") == {}  # a one-shot writes nothing


def test_one_shot_judges_the_correctable_rate_from_daemon_history(rig):
    r = rig("aer@gpu:0,kind=correctable,count=900,after=60")
    r.run_to(300)
    res = r.one_shot_run()[GPU0]
    assert (res.status, res.reason) == (Status.DEGRADED, "AerCorrectableRate")
    assert res.details["window"] == "history"
