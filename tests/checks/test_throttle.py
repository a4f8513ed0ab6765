"""throttle over the simulated node: windows, thresholds, restarts, NVML errors, real bitmasks."""

from __future__ import annotations

import re

import pytest

from checks.throttle import EVENT_BITS, Throttle, window_credit
from gpu_monitor.model import Status
from gpu_monitor.runner import run_check
from gpu_monitor.state import Store
from tests.checks.rig import (
    NVML_READ_ERRORS,
    enumeration_fails,
    healthy_poll,
    mig_still_judged,
    rig_fixture,
)

rig = rig_fixture(Throttle)


def test_healthy_node_reports_every_gpu_ok_with_uuid_and_events(rig):
    for res in healthy_poll(rig()).values():
        assert res.details["active_events"] == ("gpu_idle",)
        assert res.details["window"] == "instantaneous"
        assert res.details["fraction_source"]["hw_thermal_slowdown"] == "violation_counter"
        assert res.details["fraction_source"]["hw_slowdown"] == "sampled_bitmask"


@pytest.mark.parametrize("one_shot", [True, False])
def test_no_history_judges_the_instantaneous_sample_and_says_so(rig, one_shot):
    r = rig("throttle@gpu:5,event=hw_slowdown", one_shot=one_shot)
    res = r.poll_says("gpu:5", Status.DEGRADED, "HwSlowdown")
    assert res.details["window"] == "instantaneous"
    assert res.details["active_fraction"]["hw_slowdown"] is None
    assert "instantaneous" in res.message
    assert "hw_slowdown" in res.details["active_events"]
    assert r.poll()["gpu:4"].status is Status.OK


def test_degraded_threshold_both_sides_from_the_violation_counter(rig):
    # The window is fully observed first; the event starts between two samples, so only the
    # thermal violation counter knows it started at 601 s (29 s at 630 s, 30 s at 631 s).
    r = rig("throttle@gpu:5,event=hw_thermal_slowdown,after=601")
    res = r.run_until(630)["gpu:5"]
    assert res.details["window"] == "sliding"
    assert res.details["active_s"]["hw_thermal_slowdown"] == 29.0
    assert res.status is Status.OK  # 4.8% < 5%, although active right now
    res = r.run_until(631)["gpu:5"]
    assert res.details["active_fraction"]["hw_thermal_slowdown"] == 0.05
    assert (res.status, res.reason) == (Status.DEGRADED, "HwThermalSlowdown")
    assert res.details["degraded_fraction"] == 0.05
    assert res.details["failed_fraction"] == 0.25


def test_failed_threshold_both_sides(rig):
    r = rig("throttle@gpu:5,event=hw_thermal_slowdown,after=601")
    res = r.run_until(750)["gpu:5"]
    assert res.details["active_s"]["hw_thermal_slowdown"] == 149.0
    assert res.status is Status.DEGRADED
    res = r.run_until(751)["gpu:5"]
    assert (res.status, res.reason) == (Status.FAILED, "HwThermalSlowdown")
    assert res.action.value == "replace"
    assert "150 s of the last 600 s" in res.message


def test_window_slides_past_an_event_then_clears_once(rig):
    r = rig("throttle@gpu:2,event=hw_power_brake,for=200")
    seen = []
    for t in range(10, 900, 10):
        res = r.run_until(t)["gpu:2"]
        seen.append((t, res.status, res.reason))
    by_t = {t: (s, reason) for t, s, reason in seen}
    assert by_t[190] == (Status.FAILED, "HwPowerBrake")
    assert by_t[640] == (Status.FAILED, "HwPowerBrake")  # 195 s still in [40, 640]
    assert by_t[660] == (Status.DEGRADED, "HwPowerBrake")  # 140 s left in the window
    cleared = [t for t, _, reason in seen if reason == "Cleared"]
    assert cleared == [770]  # < 30 s of the 200 left in [170, 770]
    assert all(s is Status.OK and reason == "Ok" for t, s, reason in seen if t > 770)
    last = r.poll()["gpu:2"]
    assert last.details["active_fraction"]["hw_power_brake"] == 0.0


def test_restart_keeps_the_window(rig):
    store = Store.open(":memory:")
    r = rig("throttle@gpu:1,event=hw_slowdown", store=store)
    before = r.run_until(300)["gpu:1"]
    assert before.status is Status.FAILED
    r.check = Throttle()  # a daemon restart: same store, a new instance, 30 s later
    r.clock.advance(30)
    r.elapsed += 30
    r.node.advance(r.elapsed)
    after = r.poll()["gpu:1"]
    assert after.status is Status.FAILED
    assert after.details["window"] != "instantaneous"
    assert after.details["active_s"]["hw_slowdown"] == 320.0  # first sample at 10 s


def test_a_fresh_store_starts_a_new_window(rig):
    r = rig("throttle@gpu:1,event=hw_slowdown")
    r.run_until(300)
    r.check = Throttle()
    r.store = Store.open(":memory:")
    res = r.poll()["gpu:1"]
    assert res.details["window"] == "instantaneous"
    assert res.status is Status.DEGRADED


def test_a_gap_longer_than_three_intervals_is_not_observed(rig):
    r = rig("throttle@gpu:1,event=hw_slowdown")
    r.run_until(100)
    r.clock.advance(400)  # the daemon was down for 400 s
    r.elapsed += 400
    r.node.advance(r.elapsed)
    res = r.poll()["gpu:1"]
    assert res.details["observed_s"] == 90.0  # samples at 10 ... 100 s, then 500 s
    assert res.details["active_s"]["hw_slowdown"] == 90.0
    assert res.details["window"] == "partial"


def test_non_fault_events_are_reported_never_judged(rig):
    r = rig()
    benign = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "sync_boost",
              "sw_thermal_slowdown", "display_clock_setting")
    r.node.spec.gpus[3].clock_event_reasons = sum(EVENT_BITS[e] for e in benign)
    res = r.run_until(700)["gpu:3"]
    assert res.status is Status.OK
    assert set(res.details["active_events"]) == set(benign)
    # The thermal policy counter grew all along (SW thermal), yet no HW thermal time.
    assert r.node.spec.gpus[3].violation_ns["thermal"] >= 600 * 10**9
    assert res.details["active_s"]["hw_thermal_slowdown"] == 0.0
    assert "sw_power_cap" in res.message


def test_hw_umbrella_bit_names_the_specific_cause(rig):
    r = rig("throttle@gpu:6,event=hw_slowdown", "throttle@gpu:6,event=hw_power_brake")
    res = r.run_until(200)["gpu:6"]
    assert (res.status, res.reason) == (Status.FAILED, "HwPowerBrake")


# --- real bitmasks from nvidia-smi -q ---------------------------------------------------------

_SMI_NAMES = {
    "Idle": "gpu_idle", "Applications Clocks Setting": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap", "HW Slowdown": "hw_slowdown", "Sync Boost": "sync_boost",
    "HW Thermal Slowdown": "hw_thermal_slowdown", "HW Power Brake Slowdown": "hw_power_brake",
    "SW Thermal Slowdown": "sw_thermal_slowdown", "Display Clock Setting": "display_clock_setting",
}


def _smi_masks(text: str) -> list[int]:
    """One bitmask per 'Clocks Event Reasons' block of ``nvidia-smi -q`` (test input only)."""
    masks = []
    for block in re.findall(r"Clocks Event Reasons\n((?:\s{8,}.*\n)+)", text):
        mask = 0
        for name, state in re.findall(r"^\s+(.+?)\s+:\s+(Active|Not Active)$", block, re.M):
            if state == "Active":
                mask |= EVENT_BITS[_SMI_NAMES[name]]
        masks.append(mask)
    return masks


@pytest.mark.parametrize("fixture, reasons", [
    # 8x H100, driver 535.161.08: HW Slowdown + HW Power Brake active on every GPU (0x88).
    ("gpud_nvidia-smi-q_535.161.08_8xH100-80GB-HBM3.txt", ["HwPowerBrake"] * 8),
    # 8x H100, driver 535.183.01: idle, but GPU 2 shows SW power cap + SW thermal + HW power
    # brake without the HW slowdown umbrella bit (0xa4).
    ("gpud_nvidia-smi-q_535.183.01_8xH100-80GB-HBM3.txt",
     ["Ok", "Ok", "HwPowerBrake", "Ok", "Ok", "Ok", "Ok", "Ok"]),
    # 8x RTX 4090: no reason at all (0x0) or idle (0x1).
    ("gpud_nvidia-smi-q_535.154.05_8xRTX4090_0.txt", ["Ok"] * 8),
])
def test_real_clock_event_bitmasks(rig, fixtures_dir, fixture, reasons):
    masks = _smi_masks((fixtures_dir / "nvidia_smi" / fixture).read_text())
    assert len(masks) == 8
    r = rig()
    for gpu, mask in zip(r.node.spec.gpus, masks, strict=True):
        gpu.clock_event_reasons = mask
    results = r.poll()
    for i, (mask, reason) in enumerate(zip(masks, reasons, strict=True)):
        res = results[f"gpu:{i}"]
        assert res.reason == reason
        assert res.status is (Status.OK if reason == "Ok" else Status.DEGRADED)
        assert res.details["clock_event_reasons"] == mask
        assert set(res.details["active_events"]) == {
            e for e, bit in EVENT_BITS.items() if mask & bit}


# --- NVML errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("error, status, reason", [
    ("GpuIsLost", Status.UNKNOWN, "GpuLost"),
    ("NotSupported", Status.SKIPPED, "NotSupported"),
    *NVML_READ_ERRORS,
])
def test_nvml_error_on_clock_events_affects_only_that_gpu(rig, error, status, reason):
    r = rig(f"nvml-error@gpu:2,call=nvmlDeviceGetCurrentClocksEventReasons,error={error}",
            "throttle@gpu:3,event=hw_slowdown")
    results = r.poll()
    res = results["gpu:2"]
    assert (res.status, res.reason) == (status, reason)
    assert res.details["uuid"] == r.node.spec.gpus[2].uuid
    assert res.details["nvml_error_kind"]
    assert results["gpu:3"].status is Status.DEGRADED
    assert results["gpu:1"].status is Status.OK


def test_pre_r535_driver_falls_back_to_the_throttle_reasons_call(rig):
    r = rig("throttle@gpu:2,event=hw_slowdown")
    errors = r.node.spec.gpus[2].nvml_errors
    errors["nvmlDeviceGetCurrentClocksEventReasons"] = "FunctionNotFound"
    assert r.poll()["gpu:2"].reason == "HwSlowdown"
    errors["nvmlDeviceGetCurrentClocksThrottleReasons"] = "FunctionNotFound"
    r.poll_says("gpu:2", Status.SKIPPED, "NotSupported")


def test_lost_gpu_is_unknown_gpu_lost(rig):
    r = rig("nvml-error@gpu:4")
    r.poll_says("gpu:4", Status.UNKNOWN, "GpuLost")


@pytest.mark.parametrize("error", ["NotSupported", "Unknown", "FunctionNotFound"])
def test_violation_counter_errors_fall_back_to_sampled_bits(rig, error):
    r = rig("throttle@gpu:2,event=hw_thermal_slowdown")
    r.node.spec.gpus[2].nvml_errors["nvmlDeviceGetViolationStatus"] = error
    res = r.run_until(200)["gpu:2"]
    assert (res.status, res.reason) == (Status.FAILED, "HwThermalSlowdown")
    assert res.details["fraction_source"]["hw_thermal_slowdown"] == "sampled_bitmask"
    assert res.details["violation_counter_error"]


@pytest.mark.parametrize("error, status, reason", [
    ("Unknown", Status.UNKNOWN, "NvmlReadError"),
    ("InsufficientPower", Status.UNKNOWN, "NvmlReadError"),
    ("NotSupported", Status.OK, "Ok"),  # a driver without the counter: the sampled bits alone
    ("FunctionNotFound", Status.OK, "Ok"),
])
def test_a_violation_counter_that_fails_leaves_a_quiet_gpu_unknown(rig, error, status, reason):
    r = rig()
    r.node.spec.gpus[2].nvml_errors["nvmlDeviceGetViolationStatus"] = error
    res = r.poll_says("gpu:2", status, reason)
    assert "nvmlDeviceGetViolationStatus" in res.details["violation_counter_error"]
    if status is Status.UNKNOWN:
        assert "nvmlDeviceGetViolationStatus" in res.message


def test_gpu_enumeration_failure_is_one_unknown_node_result(rig):
    enumeration_fails(rig())


def test_cpu_only_node_is_skipped(rig):
    r = rig(profile="cpu-only")
    (res,) = r.check.poll(r.ctx())
    assert res.status is Status.SKIPPED
    (res,) = run_check(Throttle(), r.ctx(), method="poll").results
    assert (res.status, res.reason) == (Status.SKIPPED, "RequirementMissing")


def test_mig_enabled_gpus_are_still_judged(rig):
    results = mig_still_judged(rig("throttle@gpu:0,event=hw_slowdown"), "gpu:0", "HwSlowdown",
                               until=200)
    assert (results["gpu:0"].status, results["gpu:0"].reason) == (Status.FAILED, "HwSlowdown")


def test_a_replaced_gpu_starts_a_new_window(rig):
    r = rig("throttle@gpu:1,event=hw_slowdown")
    r.run_until(300)
    r.node.spec.gpus[1].uuid = "GPU-00000000-0000-0000-0000-000000000001"
    r.node.spec.gpus[1].clock_event_reasons = EVENT_BITS["gpu_idle"]
    r.host.nvml.close()  # a GPU swap means a new driver session
    res = r.run_until(310)["gpu:1"]
    assert res.details["window"] == "instantaneous"
    assert res.details["uuid"] == "GPU-00000000-0000-0000-0000-000000000001"


def test_works_without_a_store(rig):
    r = rig("throttle@gpu:1,event=hw_slowdown")
    r.store = None
    assert r.run_until(200)["gpu:1"].status is Status.FAILED


def test_every_emitted_reason_is_declared(rig):
    r = rig("throttle@gpu:1,event=hw_slowdown,for=100", "nvml-error@gpu:2")
    declared = set(Throttle.all_reasons())
    for t in range(10, 800, 10):
        assert {res.reason for res in r.run_until(t).values()} <= declared


# --- the window arithmetic itself ---------------------------------------------------------------

HW = EVENT_BITS["hw_slowdown"]
THERM = EVENT_BITS["hw_thermal_slowdown"]
SW_THERM = EVENT_BITS["sw_thermal_slowdown"]


@pytest.mark.parametrize("samples, start, event, credit, observed", [
    # active at both ends: the whole interval; at one end: half of it
    ([[0, HW, None], [10, HW, None]], -1, "hw_slowdown", 10.0, 10.0),
    ([[0, 0, None], [10, HW, None]], -1, "hw_slowdown", 5.0, 10.0),
    # the window start cuts an interval proportionally
    ([[0, HW, None], [10, HW, None]], 4, "hw_slowdown", 6.0, 6.0),
    # a gap longer than max_gap is not observed
    ([[0, HW, None], [100, HW, None]], -1, "hw_slowdown", 0.0, 0.0),
    # the thermal counter refines the sampled guess...
    ([[0, 0, 0], [10, THERM, 3 * 10**9]], -1, "hw_thermal_slowdown", 3.0, 10.0),
    # ... never beyond the interval ...
    ([[0, THERM, 0], [10, THERM, 30 * 10**9]], -1, "hw_thermal_slowdown", 10.0, 10.0),
    # ... never erases sampled evidence (counter flat or reset) ...
    ([[0, THERM, 5], [10, THERM, 5]], -1, "hw_thermal_slowdown", 10.0, 10.0),
    ([[0, THERM, 9 * 10**9], [10, THERM, 0]], -1, "hw_thermal_slowdown", 10.0, 10.0),
    # ... and SW thermal time on the same counter is not HW thermal time.
    ([[0, SW_THERM, 0], [10, SW_THERM, 10 * 10**9]], -1, "hw_thermal_slowdown", 0.0, 10.0),
])
def test_window_credit(samples, start, event, credit, observed):
    got, seen = window_credit(samples, start, max_gap_s=60)
    assert got[event] == pytest.approx(credit)
    assert seen == pytest.approx(observed)


def test_event_names_are_the_ones_the_metrics_layer_renders():
    from checks.throttle import CLOCK_EVENTS

    assert set(CLOCK_EVENTS) <= set(EVENT_BITS)
