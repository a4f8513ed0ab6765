"""nccl_allreduce: judgement, and gloo runs on the simulated node (wrong data named, hangs and
crashes named, one device skipped). nccl-tests' formulas on real outputs are held in
tests/test_nccl.py."""

from __future__ import annotations

import pytest

from checks.nccl_allreduce import NcclAllreduce, sweep_findings
from gpu_monitor.check import Context
from gpu_monitor.config import parse_config
from gpu_monitor.model import Status
from gpu_monitor.nccl import SweepLimits
from gpu_monitor.profiles import load_profile
from gpu_monitor.runner import run_check
from gpu_monitor.workers.faults import TEST_FAULT_ENV
from tests.checks.cuda_helpers import cuda_count
from tests.checks.rig import run_simulated

SMALL_SWEEP = {"sweep_max_bytes": 32768}  # 8 B .. 32 KiB: fast on 2 cores


def run_sim(count: int, faults=(), checks=None, env=None):
    return run_simulated(NcclAllreduce(), count, faults, settings=checks, env=env)


# --- judgement ----------------------------------------------------------------------------------


LIMITS = SweepLimits(busbw_floor_gb_per_s=100.0, large_message_min_bytes=1 << 20,
                     small_message_max_bytes=1024, small_p95_latency_limit_s=1e-4,
                     warning_band=0.05)


def row(size, busbw=200.0, p95=5e-5, wrong=0):
    return {"bytes": size, "p50_s": p95 / 2, "p95_s": p95, "busbw_gb_per_s": busbw,
            "algbw_gb_per_s": busbw / 1.75, "time_avg_s": p95 / 2, "wrong": wrong}


def test_a_healthy_sweep_has_no_findings():
    assert sweep_findings([row(8), row(1024), row(1 << 20)], None, [], LIMITS) == []


def test_wrong_data_names_the_device_whose_contribution_arrives_wrong():
    (f,) = sweep_findings([row(8, wrong=16), row(1 << 20)], [5], [0, 1, 2], LIMITS)
    assert (f.status, f.target, f.reason) == (Status.FAILED, "gpu:5", "NcclWrongData")
    assert "first at 8 B" in f.message


def test_wrong_data_nobody_contributed_fails_the_node_naming_the_ranks_that_saw_it():
    (f,) = sweep_findings([row(8), row(1 << 20, wrong=3)], [], [1], LIMITS)
    assert (f.target, f.reason) == ("node", "NcclWrongData") and "gpu:1" in f.message


@pytest.mark.parametrize("busbw, status", [(90.0, Status.FAILED), (103.0, Status.DEGRADED),
                                          (110.0, None)])
def test_busbw_at_the_large_sizes_is_held_to_the_floor(busbw, status):
    found = sweep_findings([row(8), row(1 << 20, busbw=busbw)], None, [], LIMITS)
    assert [f.status for f in found] == ([] if status is None else [status])
    assert all(f.reason == "NcclBusBwLow" for f in found)


def test_only_small_sizes_are_held_to_the_latency_limit():
    found = sweep_findings([row(8, p95=2e-4), row(1 << 20, p95=1.0)], None, [], LIMITS)
    assert [(f.reason, f.status) for f in found] == [("NcclLatencyHigh", Status.FAILED)]


def test_without_a_large_size_the_largest_swept_is_judged():
    found = sweep_findings([row(8), row(512, busbw=1.0)], None, [], LIMITS)
    assert [f.reason for f in found] == ["NcclBusBwLow"]


# --- on the simulated node (gloo) ---------------------------------------------------------------


def test_a_healthy_simulated_node_reports_a_table_per_size():
    res = run_sim(3, checks=SMALL_SWEEP)
    node = res["node"]
    assert node.status is Status.OK, node.message
    assert node.details["backend"] == "gloo" and node.details["world_size"] == 3
    sizes = [r["bytes"] for r in node.details["table"]]
    assert sizes == [8, 32, 128, 512, 2048, 8192, 32768]
    for r in node.details["table"]:
        assert set(r) >= {"bytes", "p50_s", "p95_s", "algbw_gb_per_s", "busbw_gb_per_s"}
        assert r["wrong"] == 0 and 0 < r["p50_s"] <= r["p95_s"]
        assert r["busbw_gb_per_s"] == pytest.approx(r["algbw_gb_per_s"] * 4 / 3, rel=1e-3)


def test_simulated_wrong_results_fail_naming_the_device():
    res = run_sim(2, ["wrong-results@gpu:1"], checks=SMALL_SWEEP)
    assert res["gpu:1"].status is Status.FAILED and res["gpu:1"].reason == "NcclWrongData"
    assert list(res["gpu:1"].details["suspects"]) == [1]
    assert "gpu:0" not in res
    assert "wrong data from gpu:1" in res["node"].message


def test_a_rank_that_hangs_is_killed_and_named_by_its_progress():
    # A generous budget: start-up gets a third of it, the gang's turn a share of the rest; the
    # hang is only detected at that deadline, so a tight one fails under load, not a fault
    # (45 s failed with three suites and two CPU hogs beside it).
    res = run_sim(3, checks={**SMALL_SWEEP, "timeout_s": 90},
                  env={TEST_FAULT_ENV: "hang@gpu:2,at=9"})
    r = res["gpu:2"]
    assert r.status is Status.UNKNOWN and r.reason == "WorkerTimeout"
    assert r.message.startswith("worker for gpu:2 timed out after ")
    assert "the other ranks had reached step 9" in r.message
    assert sorted(r.details["stopped_ranks"]) == ["gpu:0", "gpu:1"]
    assert set(res) == {"gpu:2"}


def test_a_rank_that_crashes_is_named_and_the_others_are_stopped():
    res = run_sim(2, checks=SMALL_SWEEP, env={TEST_FAULT_ENV: "crash@gpu:0,at=4"})
    assert res["gpu:0"].status is Status.UNKNOWN and res["gpu:0"].reason == "WorkerCrashed"
    assert "signal 11" in res["gpu:0"].message
    assert set(res) == {"gpu:0"}


def test_a_single_device_has_nothing_to_reduce():
    res = run_sim(1)
    assert res["node"].status is Status.SKIPPED and res["node"].reason == "NothingToReduce"


@pytest.mark.slow
def test_the_simulated_h100_node_sweeps_to_16_mib_and_fails_a_wrong_device():
    res = run_sim(8, ["wrong-results@gpu:3"])
    assert {t for t, r in res.items() if r.status is Status.FAILED} == {"gpu:3"}
    assert res["node"].details["table"][-1]["bytes"] == 8 << 20


# --- CUDA ---------------------------------------------------------------------------------------



@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() < 2, reason="needs two CUDA devices")
def test_nccl_allreduce_on_real_gpus_uses_nccl_and_is_exact():
    from gpu_monitor.host import Host
    from gpu_monitor.hw.paths import HostPaths

    host = Host.real(HostPaths())
    config = parse_config({"checks": {"nccl_allreduce": {
        "sweep_max_bytes": 64 << 20, "allreduce_busbw_floor_gb_per_s": 1.0}}})
    ctx = Context(host=host, profile=load_profile("h100-sxm-8"), config=config, force=True)
    try:
        outcome = run_check(NcclAllreduce(), ctx)
    finally:
        host.close()
    node = next(r for r in outcome.results if r.target == "node")
    assert node.details["backend"] == "nccl"
    assert all(r["wrong"] == 0 for r in node.details["table"])
