"""nvlink_state over the simulated node: link states, boot grace, error rates, NVML errors."""

from __future__ import annotations

import json

import pytest

from checks.nvlink_state import NvlinkState
from gpu_monitor.model import Status
from gpu_monitor.runner import run_check
from gpu_monitor.state import Store
from tests.checks.rig import enumeration_fails, healthy_poll, mig_still_judged, rig_fixture

rig = rig_fixture(NvlinkState)


def test_healthy_node_is_one_result_per_gpu(rig):
    d = healthy_poll(rig())["gpu:3"].details
    assert (d["links_expected"], d["links_found"], d["links_up"]) == (18, 18, 18)
    assert d["down_links"] == () and d["missing_links"] == ()
    assert d["window"] == "instantaneous"
    assert d["error_rate_per_min_degraded"] == 10


def test_down_link_fails_the_gpu_and_its_link_target(rig):
    r = rig("nvlink-down@gpu:0,link=4")
    results = r.poll()
    assert sorted(results) == ["gpu:0", *(f"gpu:{i}" for i in range(1, 8)), "nvlink:0:4"]
    for target in ("gpu:0", "nvlink:0:4"):
        res = results[target]
        assert (res.status, res.reason, res.action.value) == (Status.FAILED, "NvLinkDown",
                                                              "reset_gpu")
        assert res.details["uuid"] == r.gpus[0].uuid
    assert results["gpu:0"].details["down_links"] == (4,)
    assert results["gpu:0"].details["links_up"] == 17
    assert results["nvlink:0:4"].details["link"] == 4
    assert results["gpu:1"].status is Status.OK


def test_recovered_link_clears_once_then_goes_quiet(rig):
    r = rig("nvlink-down@gpu:0,link=4,after=10,for=30")
    assert "nvlink:0:4" not in r.poll()
    seen = [r.step() for _ in range(6)]
    assert [s["nvlink:0:4"].reason for s in seen[:4]] == ["NvLinkDown"] * 3 + ["Cleared"]
    assert [s["gpu:0"].reason for s in seen[:4]] == ["NvLinkDown"] * 3 + ["Cleared"]
    assert seen[3]["nvlink:0:4"].details["cleared_reason"] == "NvLinkDown"
    assert "nvlink:0:4" not in seen[4] and "nvlink:0:4" not in seen[5]
    assert seen[5]["gpu:0"].reason == "Ok"


def test_down_link_during_boot_grace_is_unknown_then_fails(rig):
    r = rig("nvlink-down@gpu:6,link=0")
    r.set_uptime(120)
    results = r.poll()
    for target in ("gpu:6", "nvlink:6:0"):
        assert (results[target].status, results[target].reason) == (Status.UNKNOWN, "BootGrace")
    assert results["gpu:6"].details["in_boot_grace"] is True
    r.set_uptime(299)
    assert r.poll()["gpu:6"].reason == "BootGrace"
    r.set_uptime(300)
    results = r.poll()
    assert (results["gpu:6"].status, results["gpu:6"].reason) == (Status.FAILED, "NvLinkDown")
    assert results["nvlink:6:0"].status is Status.FAILED


def test_up_links_are_ok_during_boot_grace(rig):
    r = rig()
    r.set_uptime(30)
    assert all(res.status is Status.OK for res in r.poll().values())


# --- link states from dcgmi nvlink -s (Meta GCM's failing sample) ------------------------------

def _dcgmi_link_states(text: str) -> dict[int, list[str]]:
    """``gpuId N:`` then a row of U / D / X per link (test input only)."""
    out: dict[int, list[str]] = {}
    lines = text.splitlines()
    for head, row in zip(lines, lines[1:], strict=False):
        if head.startswith("gpuId "):
            out[int(head.split()[1].rstrip(":"))] = row.split()
    return out


def test_real_dcgmi_link_states_on_a100(rig, fixtures_dir):
    text = (fixtures_dir / "dcgm_diag"
            / "gcm_testfixture_nvlink_status_fail_dcgmi_nvlink_-s_excerpt.txt").read_text()
    states = _dcgmi_link_states(text)
    assert states[1] == ["U", "U", "U", "U", "U", "U", "D", "U", "U", "U", "X", "X"]
    r = rig(profile="a100-sxm-8")
    for gpu, row in states.items():
        # U: up, D: down, X: not present (the GPU reports fewer links).
        r.gpus[gpu].nvlink_up = [s == "U" for s in row if s != "X"]
    results = r.poll()
    g0, g1 = results["gpu:0"], results["gpu:1"]
    assert (g0.status, g0.details["down_links"], g0.details["missing_links"]) == (
        Status.FAILED, (3,), ())
    assert (g1.status, g1.details["down_links"], g1.details["missing_links"]) == (
        Status.FAILED, (6,), (10, 11))
    assert g1.details["links_found"] == 10
    link_targets = sorted(t for t in results if t.startswith("nvlink:"))
    assert link_targets == ["nvlink:0:3", "nvlink:1:10", "nvlink:1:11", "nvlink:1:6"]
    assert "missing" in results["nvlink:1:10"].message
    assert all(results[t].reason == "NvLinkDown" for t in link_targets)
    assert results["gpu:2"].status is Status.OK


def test_gpu_with_fewer_links_than_the_profile_fails(rig):
    r = rig()
    r.gpus[5].nvlink_up = [True] * 16
    results = r.poll()
    assert results["gpu:5"].details["missing_links"] == (16, 17)
    assert {results["nvlink:5:16"].reason, results["nvlink:5:17"].reason} == {"NvLinkDown"}


def test_profile_without_nvlink_is_skipped(rig):
    for r in (rig(profile="cpu-only"), rig(overrides={"nvlink": {"links_per_gpu": 0}})):
        (res,) = r.check.poll(r.ctx())
        assert (res.target, res.status, res.reason) == ("node", Status.SKIPPED, "NotSupported")


# --- error-counter rates ------------------------------------------------------------------------

def _gcm_crc_errors(fixtures_dir) -> dict[int, dict[str, int]]:
    """``dcgmi nvlink -e -j`` (Meta GCM's failing sample): counters per link."""
    names = {"CRC Data Error": "crc_data", "CRC FLIT Error": "crc_flit",
             "Recovery Error": "recovery", "Replay Error": "replay"}
    doc = json.loads((fixtures_dir / "dcgm_diag"
                      / "gcm_testfixture_nvlink_error_fail_dcgmi_nvlink_-e_-j.json").read_text())
    return {int(link.split()[1]): {names[k]: int(v["value"]) for k, v in c["children"].items()}
            for link, c in doc["body"].items()}


@pytest.mark.parametrize("scale, degraded", [(10, True), (9, False)])
def test_error_rate_threshold_both_sides(rig, fixtures_dir, scale, degraded):
    counts = _gcm_crc_errors(fixtures_dir)
    assert counts[0]["crc_data"] == 12
    r = rig()
    r.poll()  # the baseline
    for link, counters in counts.items():
        for name, value in counters.items():
            # 12 CRC data errors in the real sample; scaled to sit on either side of 10/min.
            r.gpus[2].nvlink_errors[(link, name)] = value * scale // 12
    results = r.step(60)
    res = results["gpu:2"]
    assert res.details["window"] == "sliding"
    assert res.details["error_rates_per_min"]["0"]["crc_data"] == scale
    if degraded:
        assert (res.status, res.reason) == (Status.DEGRADED, "NvLinkErrorRate")
        link = results["nvlink:2:0"]
        assert (link.status, link.reason, link.action.value) == (
            Status.DEGRADED, "NvLinkErrorRate", "watch")
        assert "crc_data 10/min" in link.message
    else:
        assert res.status is Status.OK and "nvlink:2:0" not in results


def test_errors_right_after_start_are_divided_by_at_least_a_minute(rig):
    r = rig()
    r.poll()
    r.gpus[1].nvlink_errors[(7, "replay")] = 9
    res = r.step(10)["gpu:1"]
    assert res.details["error_rates_per_min"]["7"]["replay"] == 9  # not 54/min
    assert res.status is Status.OK


def test_counts_from_before_start_are_a_baseline_not_an_alarm(rig):
    r = rig()
    r.gpus[4].nvlink_errors[(2, "recovery")] = 100_000
    assert r.poll()["gpu:4"].status is Status.OK
    assert r.step(60)["gpu:4"].status is Status.OK


def test_error_burst_slides_out_of_the_window_and_clears(rig):
    r = rig()
    r.poll()
    r.gpus[3].nvlink_errors[(9, "replay")] = 300
    statuses = []
    for _ in range(80):
        res = r.step()
        statuses.append((r.elapsed, res["gpu:3"].reason))
    degraded = [t for t, reason in statuses if reason == "NvLinkErrorRate"]
    cleared = [t for t, reason in statuses if reason == "Cleared"]
    assert degraded == list(range(10, 670, 10))
    # The snapshot from before the burst (0 s) leaves [now - 660 s, now] at 670 s.
    assert cleared == [670]
    assert statuses[-1][1] == "Ok"


def test_counter_reset_rebases_and_never_alarms(rig):
    r = rig()
    r.gpus[0].nvlink_errors[(1, "crc_flit")] = 5000
    r.poll()
    r.step(60)
    r.gpus[0].nvlink_errors[(1, "crc_flit")] = 3  # GPU reset: counters start again
    res = r.step(60)["gpu:0"]
    assert res.status is Status.OK
    assert res.details["window"] == "instantaneous"  # the history restarted
    assert r.step(60)["gpu:0"].details["error_rates_per_min"] == {}


def test_restart_keeps_the_rate_window(rig):
    store = Store.open(":memory:")
    r = rig(store=store)
    r.poll()
    r.gpus[2].nvlink_errors[(3, "replay")] = 1000
    assert r.step(60)["gpu:2"].reason == "NvLinkErrorRate"
    r.check = NvlinkState()  # a daemon restart: a new instance, the same store
    res = r.step(20)
    assert res["gpu:2"].reason == "NvLinkErrorRate"
    assert res["gpu:2"].details["window"] == "sliding"


def test_one_shot_without_history_judges_states_not_rates(rig):
    r = rig("nvlink-down@gpu:1,link=2", one_shot=True)
    r.gpus[5].nvlink_errors[(0, "replay")] = 10**6
    results = r.poll()
    assert results["gpu:1"].reason == "NvLinkDown"
    assert results["gpu:5"].status is Status.OK
    assert results["gpu:5"].details["window"] == "instantaneous"


# --- NVML errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("error, status, reason", [
    ("GpuIsLost", Status.UNKNOWN, "GpuLost"),
    ("NotSupported", Status.SKIPPED, "NotSupported"),  # NVML says: no NVLink on this GPU
    ("InvalidArgument", Status.SKIPPED, "NotSupported"),  # link 0 does not exist
    ("Unknown", Status.UNKNOWN, "NvmlReadError"),  # every link's state unknown
    ("Timeout", Status.UNKNOWN, "NvmlReadError"),
    ("NoPermission", Status.UNKNOWN, "NvmlReadError"),
    ("Uninitialized", Status.UNKNOWN, "NvmlReadError"),
    ("DriverNotLoaded", Status.UNKNOWN, "NvmlReadError"),
    ("InsufficientResources", Status.UNKNOWN, "NvmlReadError"),
])
def test_nvml_error_on_link_state_affects_only_that_gpu(rig, error, status, reason):
    r = rig(f"nvml-error@gpu:3,call=nvmlDeviceGetNvLinkState,error={error}")
    results = r.poll()
    res = results["gpu:3"]
    assert (res.status, res.reason) == (status, reason)
    assert res.details["uuid"] == r.gpus[3].uuid
    assert not [t for t in results if t.startswith("nvlink:")]  # no 18-result flood
    assert results["gpu:2"].status is Status.OK


@pytest.mark.parametrize("error, status, reason", [
    ("NotSupported", Status.OK, "Ok"),  # counters are optional: states alone are judged
    ("Unknown", Status.UNKNOWN, "NvmlReadError"),
    ("GpuIsLost", Status.UNKNOWN, "GpuLost"),
])
def test_nvml_error_on_error_counters(rig, error, status, reason):
    r = rig(f"nvml-error@gpu:3,call=nvmlDeviceGetNvLinkErrorCounter,error={error}")
    r.poll_says("gpu:3", status, reason)


def test_error_counters_unreadable_do_not_hide_a_down_link(rig):
    r = rig("nvml-error@gpu:3,call=nvmlDeviceGetNvLinkErrorCounter,error=Unknown",
            "nvlink-down@gpu:3,link=1")
    res = r.poll_says("gpu:3", Status.FAILED, "NvLinkDown")
    assert res.details["counter_errors"]["0"] == "unknown"


def test_unreadable_error_counters_name_the_call_on_the_gpu_result_alone(rig):
    r = rig()
    r.gpus[3].nvml_errors["nvmlDeviceGetNvLinkErrorCounter"] = "InsufficientPower"
    res = r.poll_says("gpu:3", Status.UNKNOWN, "NvmlReadError")
    assert "nvmlDeviceGetNvLinkErrorCounter" in res.message
    assert "insufficient_power" in res.message
    assert not [t for t in r.poll() if t.startswith("nvlink:3:")]  # one result, not 18


def test_an_unreadable_link_state_says_why(rig):
    r = rig("nvml-error@gpu:1,call=nvmlDeviceGetNvLinkState,error=Timeout")
    res = r.poll_says("gpu:1", Status.UNKNOWN, "NvmlReadError")
    assert "nvmlDeviceGetNvLinkState" in res.message and "timeout" in res.message


def test_lost_gpu_is_unknown_gpu_lost_and_keeps_its_open_links(rig):
    r = rig("nvlink-down@gpu:4,link=9")
    assert r.poll()["nvlink:4:9"].status is Status.FAILED
    r.gpus[4].lost = True
    results = r.poll()
    assert (results["gpu:4"].status, results["gpu:4"].reason) == (Status.UNKNOWN, "GpuLost")
    assert "nvlink:4:9" not in results  # not cleared: nothing is known about it


def test_gpu_enumeration_failure_is_one_unknown_node_result(rig):
    enumeration_fails(rig())


def test_nvml_unavailable_is_skipped_by_the_runner(rig):
    r = rig()
    r.node.spec.nvml_library_missing = True
    (res,) = run_check(NvlinkState(), r.ctx(), method="poll").results
    assert (res.status, res.reason) == (Status.SKIPPED, "RequirementMissing")


def test_mig_enabled_gpus_are_still_judged(rig):
    mig_still_judged(rig("nvlink-down@gpu:0,link=17"), "nvlink:0:17", "NvLinkDown")


def test_every_emitted_reason_is_declared(rig):
    r = rig("nvlink-down@gpu:0,link=4,after=20,for=40", "nvml-error@gpu:2")
    r.gpus[1].nvlink_errors[(0, "replay")] = 10
    declared = set(NvlinkState.all_reasons())
    for _ in range(10):
        assert {res.reason for res in r.step().values()} <= declared
