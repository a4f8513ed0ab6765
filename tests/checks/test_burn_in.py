"""burn_in: cross-device comparison, speed vs floor and median, telemetry, worker failures."""

from __future__ import annotations

import pytest

from checks.burn_in import (
    BurnIn,
    DeviceTelemetry,
    Finding,
    Limits,
    Telemetry,
    burn_findings,
    headline_finding,
    split_by_hash,
)
from gpu_monitor.check import Context
from gpu_monitor.config import parse_config
from gpu_monitor.hw.nvml import NvmlError, NvmlErrorKind
from gpu_monitor.model import Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.runner import run_check
from gpu_monitor.workers.faults import TEST_FAULT_ENV
from tests.checks.cuda_helpers import cuda_count
from tests.checks.rig import run_simulated


def run_sim(count: int, faults=(), checks=None, **kw):
    """Run burn_in on a simulated h100 node with ``count`` devices; results by target."""
    return run_simulated(BurnIn(), count, faults, settings=checks, **kw)


def run(tflops=1.0, sha="a", **extra):
    return {"tflops": tflops, "fingerprint": sha, "self_mismatches": 0, "self_checks": 3,
            "reference_error": 1e-7, **extra}


LIMITS = Limits(min_fraction_of_peak=0.5, median_tolerance=0.1, warning_band=0.05,
                max_temp_celsius=85, peak_tflops={"bf16": 1.6},
                reference_tolerance={"bf16": 0.02})


def measured(*runs):
    return {i: {"dtypes": {"bf16": r}} for i, r in enumerate(runs)}


# --- judgement -----------------------------------------------------------------------------------


@pytest.mark.parametrize("hashes, majority, odd", [
    ({0: "a", 1: "a", 2: "a"}, "a", []),
    ({0: "a", 1: "a", 2: "b"}, "a", [2]),
    ({0: "a", 1: "b"}, None, [0, 1]),
    ({0: "a", 1: "a", 2: "b", 3: "b"}, None, [0, 1, 2, 3]),
    ({0: "a", 1: "b", 2: "a", 3: "c", 4: "a"}, "a", [1, 3]),
    ({0: "a"}, "a", []),
], ids=["unanimous", "one-odd", "two-differ", "tie", "two-odd-of-five", "single"])
def test_the_majority_hash_wins_and_an_unattributable_split_names_everyone(hashes, majority,
                                                                          odd):
    assert split_by_hash(hashes) == (majority, odd)


def test_a_device_wrong_the_same_way_every_time_fails_on_the_cross_device_comparison():
    per, node, _ = burn_findings(measured(run(sha="a"), run(sha="a"), run(sha="bad")), {}, LIMITS)
    assert [f.reason for f in per[2]] == ["BurnInMismatch"]
    assert per[2][0].status is Status.FAILED and per[2][0].action.value == "replace"
    assert not per[0] and not per[1] and not node


def test_with_two_devices_a_mismatch_fails_the_node_naming_both():
    per, node, _ = burn_findings(measured(run(sha="a"), run(sha="b")), {}, LIMITS)
    assert not per[0] and not per[1]
    assert node[0].reason == "BurnInMismatch" and "gpu:0, gpu:1" in node[0].message


def test_results_that_change_between_iterations_fail_even_when_hashes_agree():
    per, _, _ = burn_findings(measured(run(), run(self_mismatches=2)), {}, LIMITS)
    assert per[1][0].reason == "BurnInMismatch" and "changed between iterations" in \
        per[1][0].message


def test_a_result_off_the_fp64_reference_fails():
    per, _, _ = burn_findings(measured(run(), run(), run(reference_error=0.5)), {}, LIMITS)
    assert [f.reason for f in per[2]] == ["BurnInReferenceMismatch"]


@pytest.mark.parametrize("rate, status, why", [
    (1.0, None, ""),
    (0.93, Status.DEGRADED, "within 0.05"),
    (0.85, Status.FAILED, "node median"),
], ids=["at-median", "in-warning-band", "below-median"])
def test_speed_is_held_to_the_node_median(rate, status, why):
    per, _, summary = burn_findings(measured(run(1.0), run(1.0), run(rate)), {}, LIMITS)
    assert summary["required_tflops"]["bf16"] == pytest.approx(0.9)
    if status is None:
        assert not per[2]
    else:
        assert per[2][0].reason == "BurnInSlow" and per[2][0].status is status
        assert why in per[2][0].message


def test_speed_below_the_fraction_of_peak_fails_every_device():
    per, _, summary = burn_findings(measured(run(0.5), run(0.5)), {}, LIMITS)
    assert summary["floor_tflops"]["bf16"] == pytest.approx(0.8)
    assert all(per[i][0].reason == "BurnInSlow" and "peak" in per[i][0].message for i in per)


def test_throttling_heat_and_unreadable_telemetry_are_findings_of_their_own():
    tele = {0: DeviceTelemetry(3, {"hw_power_brake"}, 40, 45),
            1: DeviceTelemetry(3, set(), 91, 70),
            2: DeviceTelemetry(0, set(), None, None, "nvmlDeviceGetTemperature: gone")}
    per, _, _ = burn_findings(measured(run(), run(), run()), tele, LIMITS)
    assert [(f.status, f.reason) for f in per[0]] == [(Status.FAILED, "BurnInThrottled")]
    assert [(f.status, f.reason) for f in per[1]] == [(Status.FAILED, "BurnInHot")]
    assert [(f.status, f.reason) for f in per[2]] == [(Status.UNKNOWN, "BurnInTelemetryError")]


def test_a_device_shows_its_most_serious_finding():
    findings = [Finding(Status.FAILED, "BurnInHot", "h"),
                Finding(Status.UNKNOWN, "BurnInTelemetryError", "t"),
                Finding(Status.FAILED, "BurnInMismatch", "m")]
    assert headline_finding(findings).reason == "BurnInMismatch"
    assert headline_finding([Finding(Status.DEGRADED, "BurnInSlow", "s"),
                  Finding(Status.UNKNOWN, "WorkerTimeout", "w")]).reason == "WorkerTimeout"
    assert headline_finding([]) is None


class _Temps:
    core_c, memory_c = 50, 55


class _StubNvml:
    def __init__(self, reasons):
        self.reasons = reasons

    def clock_event_reasons(self, i):
        if self.reasons[i] is None:
            raise NvmlError(NvmlErrorKind.GPU_LOST, "nvmlDeviceGetCurrentClocksEventReasons", i)
        return self.reasons[i]

    def temperatures(self, i):
        return _Temps()


def test_telemetry_names_hw_clock_events_and_ignores_idle_and_sw_power_cap():
    t = Telemetry(_StubNvml({0: 0x1 | 0x4, 1: 0x8 | 0x40, 2: None}), [0, 1, 2])
    t.sample()
    t.sample()
    assert t.devices[0].events == set() and t.devices[0].samples == 2
    assert t.devices[1].events == {"hw_slowdown", "hw_thermal_slowdown"}
    assert "gpu:2" in t.devices[2].error and t.devices[2].samples == 0


# --- on the simulated node ------------------------------------------------------------------------


def test_simulated_slow_and_wrong_devices_fail_by_name_and_the_rest_pass():
    res = run_sim(3, ["slow@gpu:1,factor=4", "wrong-results@gpu:2"])
    assert res["gpu:0"].status is Status.OK
    assert res["gpu:1"].status is Status.FAILED and res["gpu:1"].reason == "BurnInSlow"
    assert res["gpu:2"].status is Status.FAILED and res["gpu:2"].reason == "BurnInMismatch"
    assert set(res["gpu:0"].details["tflops"]) == {"fp32"}
    assert res["gpu:1"].details["tflops"]["fp32"] < res["gpu:0"].details["tflops"]["fp32"]
    node = res["node"]
    assert node.status is Status.OK and node.details["mode"] == "sequential"
    assert set(node.details["tflops"]) == {"gpu:0", "gpu:1", "gpu:2"}
    assert "findings on gpu:1, gpu:2" in node.message


class _FlakyNvml:
    """The simulated NVML, with temperatures of gpu:0 failing after the first few reads."""

    def __init__(self, inner):
        self.inner, self.reads = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def temperatures(self, index):
        if index == 0:
            self.reads += 1
            if self.reads > 2:
                raise NvmlError(NvmlErrorKind.UNKNOWN, "nvmlDeviceGetTemperature", 0, "boom")
        return self.inner.temperatures(index)


def test_with_two_simulated_devices_a_mismatch_fails_the_node_and_telemetry_faults_show():
    res = run_sim(2, ["wrong-results@gpu:1", "throttle@gpu:1,event=hw_power_brake"],
                  nvml_wrapper=_FlakyNvml)
    assert res["node"].status is Status.FAILED and res["node"].reason == "BurnInMismatch"
    assert "gpu:0, gpu:1" in res["node"].message
    assert res["gpu:0"].status is Status.UNKNOWN
    assert res["gpu:0"].reason == "BurnInTelemetryError" and "boom" in res["gpu:0"].message
    assert res["gpu:1"].reason == "BurnInThrottled"
    assert list(res["gpu:1"].details["clock_events"]) == ["hw_power_brake"]


def test_a_crashed_and_a_hung_worker_are_unknown_with_the_cause_and_others_are_judged():
    # A 90 s budget: each of the 9 sequential turns may use at most a fair share of it, which
    # must hold a healthy turn on a loaded machine; the hung turn waits out its share.
    res = run_sim(3, checks={"timeout_s": 90},
                  env={TEST_FAULT_ENV: "crash@gpu:0,at=turn;hang@gpu:1,at=turn"})
    assert res["gpu:0"].status is Status.UNKNOWN and res["gpu:0"].reason == "WorkerCrashed"
    assert "exited with signal 11 (SIGSEGV)" in res["gpu:0"].message
    assert res["gpu:1"].status is Status.UNKNOWN and res["gpu:1"].reason == "WorkerTimeout"
    assert res["gpu:1"].message.startswith("gpu:1: worker for gpu:1 timed out after ")
    assert res["gpu:2"].status is Status.OK
    assert res["node"].details["note"].startswith("fewer than two devices measured")


@pytest.mark.slow
def test_the_issue_examples_on_the_full_simulated_h100_node():
    res = run_sim(8, ["slow@gpu:4,factor=3", "wrong-results@gpu:6"])
    bad = {t: r.reason for t, r in res.items() if r.status is not Status.OK}
    assert bad == {"gpu:4": "BurnInSlow", "gpu:6": "BurnInMismatch"}


# --- CUDA ---------------------------------------------------------------------------------------



@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() == 0, reason="needs CUDA")
def test_burn_in_on_real_gpus_runs_bf16_and_tf32_and_agrees_across_them():
    from gpu_monitor.host import Host
    from gpu_monitor.hw.paths import HostPaths

    host = Host.real(HostPaths())
    prof = load_profile("h100-sxm-8")
    config = parse_config({"checks": {"burn_in": {
        "duration_s": 4, "matrix_size": 4096, "min_fraction_of_peak": 0.01,
        "median_tolerance": 0.5, "max_temp_celsius": 200}}})
    ctx = Context(host=host, profile=prof, config=config, force=True)
    try:
        outcome = run_check(BurnIn(), ctx)
    finally:
        host.close()
    gpus = [r for r in outcome.results if r.target.startswith("gpu:")]
    assert gpus and all(r.status is Status.OK for r in gpus), [r.message for r in gpus]
    for r in gpus:
        assert set(r.details["tflops"]) == {"bf16", "tf32"}
        assert r.details["tflops"]["bf16"] > r.details["tflops"]["tf32"] > 0
    node = next(r for r in outcome.results if r.target == "node")
    assert node.details["mode"] == "concurrent"
