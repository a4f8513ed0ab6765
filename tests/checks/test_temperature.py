"""temperature over the simulated node: NVML limits, gradient, peers, NVML errors, real values."""

from __future__ import annotations

import re

import pytest

from checks.temperature import Temperature
from gpu_monitor.model import Status
from gpu_monitor.runner import run_check
from tests.checks.rig import (
    NVML_READ_ERRORS,
    enumeration_fails,
    healthy_poll,
    mig_still_judged,
    rig_fixture,
)

rig = rig_fixture(Temperature)


def test_healthy_node_reports_temperatures_and_thresholds(rig):
    d = healthy_poll(rig())["gpu:0"].details
    assert (d["core_celsius"], d["memory_celsius"]) == (32, 36)
    assert (d["slowdown_celsius"], d["shutdown_celsius"], d["memory_max_celsius"]) == (90, 92, 95)
    assert d["slowdown_source"] == "nvml"
    assert d["gradient_celsius"] == 4
    assert (d["gradient_limit_celsius"], d["peer_deviation_celsius"]) == (20, 20)
    assert d["peer_median_core_celsius"] == 32 and d["comparable_peers_core"] == 7


@pytest.mark.parametrize("core, status, reason", [
    (90, Status.FAILED, "TempAboveSlowdown"),  # at the NVML slowdown threshold
    (95, Status.FAILED, "TempAboveSlowdown"),  # past shutdown, still this reason
    (89, Status.DEGRADED, "TempOutlier"),      # one below: only far from its peers
])
def test_core_at_the_slowdown_threshold_fails(rig, core, status, reason):
    r = rig(f"hot@gpu:3,core={core},memory={core}")
    res = r.poll_says("gpu:3", status, reason)
    assert res.details["slowdown_celsius"] == 90
    if status is Status.FAILED:
        assert res.action.value == "none"


@pytest.mark.parametrize("memory, failed", [(95, True), (94, False)])
def test_hbm_at_its_max_threshold_fails(rig, memory, failed):
    r = rig()
    for g in r.gpus:  # every GPU equally hot: no outlier, no gradient
        g.temperature_core_c, g.temperature_memory_c = 80, memory
    res = r.poll()["gpu:5"]
    assert (res.status, res.reason) == ((Status.FAILED, "MemTempAboveMax") if failed
                                        else (Status.OK, "Ok"))
    assert res.details["memory_max_celsius"] == 95


@pytest.mark.parametrize("core, memory, degraded", [
    (40, 60, False),  # exactly the limit: fine
    (40, 61, True),
    (61, 40, True),   # core hotter than HBM counts too
])
def test_core_hbm_gradient_above_the_limit_degrades(rig, core, memory, degraded):
    r = rig()
    for g in r.gpus:
        g.temperature_core_c, g.temperature_memory_c = core, memory
    res = r.poll()["gpu:0"]
    if degraded:
        assert (res.status, res.reason) == (Status.DEGRADED, "TempGradient")
        assert res.action.value == "watch"
    else:
        assert res.status is Status.OK
    assert res.details["gradient_celsius"] == memory - core


@pytest.mark.parametrize("delta, outlier", [(20, True), (19, False), (-30, False)])
def test_gpu_far_hotter_than_its_peers_degrades(rig, delta, outlier):
    r = rig()
    r.gpus[6].temperature_core_c = 32 + delta
    r.gpus[6].temperature_memory_c = 36 + delta
    res = r.poll()["gpu:6"]
    assert (res.status is Status.DEGRADED) == outlier
    assert res.details["core_above_peers_celsius"] == delta
    if outlier:
        assert res.reason == "TempOutlier"
        assert "median of 7 comparable peers" in res.message


def test_busy_gpu_is_not_compared_with_idle_peers(rig):
    r = rig()
    busy = r.gpus[1]
    busy.temperature_core_c, busy.temperature_memory_c, busy.power_usage_mw = 70, 72, 650_000
    hot_idle = r.gpus[2]
    hot_idle.temperature_core_c, hot_idle.temperature_memory_c = 60, 62
    results = r.poll()
    assert results["gpu:1"].status is Status.OK
    assert results["gpu:1"].details["comparable_peers_core"] == 0
    assert results["gpu:1"].details["peer_median_core_celsius"] is None
    # An idle GPU as hot as that is compared with the busy one too, and is still an outlier.
    assert (results["gpu:2"].status, results["gpu:2"].reason) == (Status.DEGRADED, "TempOutlier")


def test_without_power_readings_every_peer_is_comparable(rig):
    r = rig()
    for g in r.gpus:
        g.power_usage_mw = None  # NotSupported
    r.gpus[1].temperature_core_c, r.gpus[1].temperature_memory_c = 70, 72
    res = r.poll_says("gpu:1", Status.DEGRADED, "TempOutlier")
    assert res.details["power_w"] is None


@pytest.mark.parametrize("error", ["Unknown", "InsufficientPower", "Timeout"])
def test_an_unreadable_power_draw_leaves_a_fine_gpu_unknown_and_out_of_the_peers(rig, error):
    r = rig()
    r.gpus[3].nvml_errors["nvmlDeviceGetPowerUsage"] = error
    r.gpus[3].temperature_core_c = 59  # an outlier below slowdown: only the peers would tell
    results = r.poll()
    res = results["gpu:3"]
    assert (res.status, res.reason) == (Status.UNKNOWN, "NvmlReadError")
    assert "nvmlDeviceGetPowerUsage" in res.message
    assert res.details["nvml_call"] == "nvmlDeviceGetPowerUsage"
    assert results["gpu:0"].details["comparable_peers_core"] == 6  # gpu:3 is nobody's peer
    assert all(results[f"gpu:{i}"].status is Status.OK for i in range(8) if i != 3)


def test_an_unreadable_power_draw_does_not_hide_a_hard_limit(rig):
    r = rig()
    r.gpus[3].nvml_errors["nvmlDeviceGetPowerUsage"] = "Unknown"
    r.gpus[3].temperature_core_c = 95
    res = r.poll_says("gpu:3", Status.FAILED, "TempAboveSlowdown")
    assert res.details["nvml_call"] == "nvmlDeviceGetPowerUsage"


def test_unsupported_hbm_temperature_judges_the_core_only_and_says_so(rig):
    r = rig()
    for g in r.gpus:
        g.temperature_memory_c = None
    results = r.poll()
    res = results["gpu:0"]
    assert res.status is Status.OK
    assert res.details["memory_supported"] is False
    assert res.details["memory_celsius"] is None and "gradient_celsius" not in res.details
    assert "core only" in res.message
    r.gpus[4].temperature_core_c = 91
    res = r.poll_says("gpu:4", Status.FAILED, "TempAboveSlowdown")
    assert "core only" in res.message


@pytest.mark.parametrize("nvml_value", [None, 0, -2])
def test_missing_nvml_slowdown_threshold_uses_the_profile_fallback(rig, nvml_value):
    r = rig(overrides={"gpu": {"slowdown_temp_celsius": 85}})
    for g in r.gpus:
        g.slowdown_threshold_c = nvml_value
        g.temperature_core_c, g.temperature_memory_c = 85, 85
    res = r.poll_says("gpu:0", Status.FAILED, "TempAboveSlowdown")
    assert (res.details["slowdown_celsius"], res.details["slowdown_source"]) == (85, "profile")


def test_no_slowdown_threshold_anywhere_is_not_judged(rig):
    r = rig()
    for g in r.gpus:
        g.slowdown_threshold_c = None
        g.temperature_core_c, g.temperature_memory_c = 99, 90
    res = r.poll()["gpu:0"]
    assert res.status is Status.OK
    assert (res.details["slowdown_celsius"], res.details["slowdown_source"]) == (None, None)


def test_cleared_when_a_hot_spell_ends(rig):
    r = rig("hot@gpu:3,core=70,memory=72,after=10,for=30")
    assert r.poll()["gpu:3"].status is Status.OK
    seen = [r.step()["gpu:3"] for _ in range(6)]
    assert [s.reason for s in seen] == ["TempOutlier"] * 3 + ["Cleared", "Ok", "Ok"]
    assert seen[3].details["cleared_reason"] == "TempOutlier"


# --- real temperatures from nvidia-smi ------------------------------------------------------------

def _smi_temps(text: str) -> dict[str, int | None]:
    """The first GPU's Temperature block of ``nvidia-smi -q`` (test input only)."""
    block = re.search(r"\n    Temperature\n((?:\s{8,}.*\n)+)", text).group(1)

    def value(label: str) -> int | None:
        m = re.search(rf"^\s+{label}\s+:\s+(-?\d+) C$", block, re.M)
        return int(m.group(1)) if m else None

    return {"core": value("GPU Current Temp"), "memory": value("Memory Current Temp"),
            "slowdown": value("GPU Slowdown Temp"), "shutdown": value("GPU Shutdown Temp"),
            "memory_max": value("Memory Max Operating Temp")}


def _xml_temps(text: str) -> dict[str, int | None]:
    def value(tag: str) -> int | None:
        m = re.search(rf"<{tag}>(-?\d+) C</{tag}>", text)
        return int(m.group(1)) if m else None

    return {"core": value("gpu_temp"), "memory": value("memory_temp"),
            "slowdown": value("gpu_temp_slow_threshold"),
            "shutdown": value("gpu_temp_max_threshold"),
            "memory_max": value("gpu_temp_max_mem_threshold")}


@pytest.mark.parametrize("fixture, memory_supported, slowdown", [
    ("telegraf_nvidia-smi_-q_-x_A100-SXM4-80GB_MIG_v12.xml", True, 89),  # 27 C / HBM 44 C
    ("gpud_nvidia-smi-q_560.35.03_TITAN-V.txt", True, 97),  # 44 C / HBM 41 C
    ("gpud_nvidia-smi-q_535.129.03_A10.txt", False, 98),  # GDDR: no memory temperature
    ("gpud_nvidia-smi-q_535.183.01_8xH100-80GB-HBM3.txt", True, None),  # T.Limit offsets only
])
def test_real_temperatures_are_healthy(rig, fixtures_dir, fixture, memory_supported,
                                       slowdown):
    text = (fixtures_dir / "nvidia_smi" / fixture).read_text()
    t = _xml_temps(text) if fixture.endswith(".xml") else _smi_temps(text)
    r = rig()
    for g in r.gpus:
        g.temperature_core_c, g.temperature_memory_c = t["core"], t["memory"]
        g.slowdown_threshold_c, g.shutdown_threshold_c = t["slowdown"], t["shutdown"]
        g.memory_max_threshold_c = t["memory_max"]
    res = r.poll()["gpu:0"]
    assert res.status is Status.OK
    assert res.details["core_celsius"] == t["core"]
    assert res.details["memory_supported"] is memory_supported
    assert res.details["slowdown_celsius"] == slowdown
    # The same GPU pushed to its own slowdown threshold fails (where there is one).
    if slowdown is not None:
        r.gpus[0].temperature_core_c = slowdown
        assert r.poll()["gpu:0"].reason == "TempAboveSlowdown"


# --- NVML errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("error, status, reason", [
    ("GpuIsLost", Status.UNKNOWN, "GpuLost"),
    ("NotSupported", Status.SKIPPED, "NotSupported"),
    ("FunctionNotFound", Status.SKIPPED, "NotSupported"),
    *NVML_READ_ERRORS,
])
def test_nvml_error_affects_only_that_gpu_and_removes_it_from_the_peers(rig, error, status,
                                                                        reason):
    r = rig()
    r.gpus[2].nvml_errors["nvmlDeviceGetTemperature"] = error
    r.gpus[2].temperature_core_c = 99  # unreadable, so it must not pull the median anywhere
    results = r.poll()
    res = results["gpu:2"]
    assert (res.status, res.reason) == (status, reason)
    assert res.details["uuid"] == r.gpus[2].uuid
    assert res.details["nvml_error_kind"]
    assert results["gpu:3"].details["comparable_peers_core"] == 6
    assert all(results[f"gpu:{i}"].status is Status.OK for i in range(8) if i != 2)


def test_hbm_field_error_makes_the_gpu_unknown(rig):
    r = rig()
    r.gpus[1].nvml_errors["NVML_FI_DEV_MEMORY_TEMP"] = "Unknown"
    r.poll_says("gpu:1", Status.UNKNOWN, "NvmlReadError")


def test_lost_gpu_is_unknown_gpu_lost(rig):
    r = rig("nvml-error@gpu:7")
    r.poll_says("gpu:7", Status.UNKNOWN, "GpuLost")


def test_gpu_enumeration_failure_is_one_unknown_node_result(rig):
    enumeration_fails(rig(), "Timeout")


def test_cpu_only_node_is_skipped(rig):
    r = rig(profile="cpu-only")
    (res,) = run_check(Temperature(), r.ctx(), method="poll").results
    assert (res.status, res.reason) == (Status.SKIPPED, "RequirementMissing")
    (res,) = r.check.poll(r.ctx())
    assert res.status is Status.SKIPPED


def test_mig_enabled_gpus_are_still_judged(rig):
    mig_still_judged(rig("hot@gpu:0,core=91,memory=80"), "gpu:0", "TempAboveSlowdown")
