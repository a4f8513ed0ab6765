"""ecc_memory through the simulated node: the real NVML reader over the fake pynvml."""

from __future__ import annotations

import shutil

import pytest

from checks.ecc_memory import EccMemory
from gpu_monitor.check import Context
from gpu_monitor.config import DEFAULT_CONFIG, Config
from gpu_monitor.model import Action, Status
from gpu_monitor.profiles import load_profile
from tests.checks.rig import judged_fixture, run_once


def run(ctx, check=None):
    return run_once(check or EccMemory(), ctx)


judged = judged_fixture(EccMemory)


def test_healthy_node_is_ok_on_every_gpu_with_the_values_in_details(judged):
    res = judged()
    assert sorted(res) == [f"gpu:{i}" for i in range(8)]
    assert {r.status for r in res.values()} == {Status.OK}
    d = res["gpu:0"].details
    assert d["ecc_enabled"] is True and d["volatile_uncorrected"] == 0
    assert d["remap_histogram"] == {"max": 640, "high": 0, "partial": 0, "low": 0, "none": 0}
    assert d["remap_pending"] is False and d["remap_failure"] is False
    assert d["uuid"].startswith("GPU-")
    assert d["not_supported"] == ()  # H100 supports all; page retirement is not asked


@pytest.mark.parametrize("fault, target, reason, action", [
    ("row-remap-pending@gpu:2", "gpu:2", "RowRemapPending", Action.RESET_GPU),
    ("row-remap-failure@gpu:3", "gpu:3", "RowRemapFailure", Action.REPLACE),
    ("ecc-uncorrectable@gpu:5,count=3", "gpu:5", "EccUncorrectable", Action.RESET_GPU),
    ("remap-headroom@gpu:1,low=33", "gpu:1", "RemapHeadroomExhausted", Action.REPLACE),
    ("remap-headroom@gpu:1,none=8", "gpu:1", "RemapHeadroomExhausted", Action.REPLACE),
])
def test_injected_memory_faults_fail_the_right_gpu(judged, fault, target, reason, action):
    res = judged(fault)
    bad = {t: r for t, r in res.items() if r.status is not Status.OK}
    assert list(bad) == [target]
    assert (bad[target].status, bad[target].reason, bad[target].action) == (
        Status.FAILED, reason, action)


@pytest.mark.parametrize("fault, status", [
    ("remap-headroom@gpu:4,low=8", Status.OK),          # 8 is not "more than 8"
    ("remap-headroom@gpu:4,low=9", Status.DEGRADED),
    ("remap-headroom@gpu:4,low=32", Status.DEGRADED),
    ("remap-headroom@gpu:4,none=1", Status.DEGRADED),   # any bank without spare rows
    ("remap-headroom@gpu:4,none=7", Status.DEGRADED),
])
def test_remap_headroom_thresholds(judged, fault, status):
    r = judged(fault)["gpu:4"]
    assert r.status is status
    if status is Status.DEGRADED:
        assert (r.reason, r.action) == ("RemapHeadroomLow", Action.WATCH)
        assert r.details["remap_low_banks_degraded"] == 8
        assert r.details["remap_none_banks_failed"] == 8


def test_thresholds_come_from_config_over_profile(judged):
    config = Config(checks={"ecc_memory": {"remap_low_banks_degraded": 20}})
    r = judged("remap-headroom@gpu:4,low=9", config=config)["gpu:4"]
    assert r.status is Status.OK
    assert r.details["remap_low_banks_degraded"] == 20


def test_several_problems_on_one_gpu_are_all_listed(judged):
    r = judged("row-remap-pending@gpu:2", "row-remap-failure@gpu:2",
               "remap-headroom@gpu:2,none=2")["gpu:2"]
    assert r.status is Status.FAILED
    assert r.action is Action.REPLACE  # the strongest action of the findings
    reasons = [p["reason"] for p in r.details["problems"]]
    assert sorted(reasons) == ["RemapHeadroomLow", "RowRemapFailure", "RowRemapPending"]


def test_ecc_disabled_fails(node):
    sim, ctx = node()
    sim.spec.gpus[6].ecc_enabled = False
    r = run(ctx)["gpu:6"]
    assert (r.status, r.reason) == (Status.FAILED, "EccDisabled")


@pytest.mark.parametrize("count, status", [
    (20_000_000, Status.OK), (20_000_001, Status.DEGRADED), (50_000_001, Status.FAILED)])
def test_corrected_error_totals_against_the_high_thresholds(node, count, status):
    sim, ctx = node()
    sim.spec.gpus[0].ecc_aggregate_corrected = count
    r = run(ctx)["gpu:0"]
    assert r.status is status
    assert r.details["corrected_total"] == count
    if status is not Status.OK:
        assert r.reason == "EccCorrectedHigh"


def test_pre_ampere_gpu_is_judged_by_retired_pages(node):
    sim, ctx = node()
    sim.spec.gpus[7].name = "Tesla V100-SXM2-32GB"
    sim.spec.gpus[7].retired_pages = 11
    r = run(ctx)["gpu:7"]
    assert (r.status, r.reason) == (Status.FAILED, "RetiredPagesLimit")
    assert r.details["retired_pages_double_bit"] == 11
    assert set(r.details["not_supported"]) == {"row_remap", "remap_histogram"}
    sim.spec.gpus[7].retired_pages = 10
    assert run(ctx)["gpu:7"].status is Status.OK


def test_an_unsupported_feature_is_skipped_per_feature(judged):
    r = judged("nvml-error@gpu:1,call=nvmlDeviceGetRowRemapperHistogram,error=NotSupported")["gpu:1"]
    assert r.status is Status.OK
    assert "remap_histogram" in r.details["not_supported"]


def test_a_gpu_supporting_nothing_is_skipped(judged):
    r = judged(*(f"nvml-error@gpu:3,call={c},error=NotSupported" for c in (
     "nvmlDeviceGetEccMode", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRowRemapperHistogram")))["gpu:3"]
    assert (r.status, r.reason) == (Status.SKIPPED, "NotSupported")


@pytest.mark.parametrize("fault", [
    "nvml-error@gpu:1,call=nvmlDeviceGetRemappedRows,error=Unknown",
    "nvml-error@gpu:1,call=nvmlDeviceGetEccMode,error=Timeout",
    "nvml-error@gpu:1,error=GpuIsLost",
])
def test_nvml_errors_make_the_gpu_unknown_never_ok(judged, fault):
    res = judged(fault)
    assert (res["gpu:1"].status, res["gpu:1"].reason) == (Status.UNKNOWN, "NvmlReadError")
    assert res["gpu:0"].status is Status.OK


def test_a_read_error_does_not_hide_a_real_failure(judged):
    r = judged("row-remap-pending@gpu:1",
               "nvml-error@gpu:1,call=nvmlDeviceGetEccMode,error=Unknown")["gpu:1"]
    assert (r.status, r.reason) == (Status.FAILED, "RowRemapPending")
    assert r.details["nvml_errors"]


def test_passive_poll_reports_cleared_when_a_pending_remap_is_applied(node):
    sim, ctx = node("row-remap-pending@gpu:2")
    check = EccMemory()
    assert run(ctx, check)["gpu:2"].reason == "RowRemapPending"
    sim.spec.gpus[2].remap_pending = False  # the GPU was reset
    r = run(ctx, check)["gpu:2"]
    assert (r.status, r.reason) == (Status.OK, "Cleared")
    assert r.details["cleared_reason"] == "RowRemapPending"


def test_declaration():
    assert EccMemory.name == "ecc_memory"
    assert {"nvml"} == set(EccMemory.requires)
    assert EccMemory.interval > 0
    for reason in ("RowRemapPending", "RowRemapFailure", "RemapHeadroomLow",
                   "RemapHeadroomExhausted", "EccUncorrectable"):
        assert reason in EccMemory.reasons


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA driver")
def test_real_gpus_are_judged_never_crashed():
    from gpu_monitor.host import Host
    from gpu_monitor.hw.paths import HostPaths

    host = Host.real(HostPaths())
    ctx = Context(host=host, profile=load_profile("h100-sxm-8"), config=DEFAULT_CONFIG)
    try:
        res = run(ctx)
    finally:
        host.close()
    assert res and all(t.startswith("gpu:") for t in res)
    for r in res.values():
        assert r.reason != "NvmlReadError", r.message
        assert "ecc_enabled" in r.details or "ecc" in r.details["not_supported"]
