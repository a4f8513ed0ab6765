import threading
import time

import pytest

from gpu_monitor.check import Check, Context
from gpu_monitor.model import Kind, Status
from gpu_monitor.runner import run_check, run_suite


class _Nvml:
    def __init__(self, gpus=(), procs=None, mig=()):
        self._gpus = list(gpus)
        self._procs = procs or {}
        self._mig = set(mig)

    def available(self):
        return True

    def gpus(self):
        return self._gpus

    def processes(self, i):
        return self._procs.get(i, [])

    def mig_enabled(self, i):
        return i in self._mig


class _Gpu:
    def __init__(self, index):
        self.index = index
        self.lost = False


class _Proc:
    def __init__(self, pid):
        self.pid = pid
        self.used_memory_bytes = 1 << 30


class _Procfs:
    def comm(self, pid):
        return "python"


class StubHost:
    """Stands in for Host in runner tests: only the requirement gate and NVML process list."""

    def __init__(self, unmet="", nvml=None):
        self._unmet = unmet
        self.nvml = nvml or _Nvml()
        self.procfs = _Procfs()

    def unmet(self, requires, ctx=None, invasive=False):
        return self._unmet if requires else ""

    def gpu_holders(self, own_pids=()):
        from gpu_monitor.host import Host

        return Host.gpu_holders(self, own_pids)  # type: ignore[arg-type]


class _Profile:
    name = "test"

    def check_setting(self, check, key):
        return None


class _Config:
    def check_setting(self, check, key):
        return None


def ctx(host=None, force=False, clock=None):
    from gpu_monitor.clock import Clock

    return Context(host=host or StubHost(), profile=_Profile(), config=_Config(),
                   clock=clock or Clock(), force=force)


class Good(Check):
    name = "good"
    kinds = frozenset({Kind.BOOTSTRAP})
    reasons = ("Fine",)

    def run(self, c):
        return [self.ok(c, "gpu:0", "fine")]


class Crashes(Check):
    name = "crashes"
    kinds = frozenset({Kind.BOOTSTRAP})

    def run(self, c):
        raise ZeroDivisionError("boom")


class Hangs(Check):
    name = "hangs"
    kinds = frozenset({Kind.BOOTSTRAP})
    timeout = 0.2

    def __init__(self):
        self.release = threading.Event()

    def run(self, c):
        self.release.wait(30)
        return []


class NeedsDcgm(Check):
    name = "needs_dcgm"
    kinds = frozenset({Kind.BOOTSTRAP})
    requires = frozenset({"dcgm"})

    def run(self, c):  # pragma: no cover - must not be entered
        raise AssertionError("entered despite a missing requirement")


class Failing(Check):
    name = "failing"
    kinds = frozenset({Kind.BOOTSTRAP})
    reasons = ("Bad",)

    def run(self, c):
        return [self.result(c, Status.FAILED, "gpu:1", "Bad", "bad")]


class Invasive(Check):
    name = "invasive"
    kinds = frozenset({Kind.BOOTSTRAP})
    invasive = True

    def run(self, c):
        return [self.ok(c, "gpu:0")]


def test_crash_becomes_unknown_naming_the_exception():
    out = run_check(Crashes(), ctx())
    (r,) = out.results
    assert r.status is Status.UNKNOWN and r.reason == "CheckCrashed"
    assert "ZeroDivisionError" in r.message and "boom" in r.message
    assert not out.success


def test_timeout_becomes_unknown_and_returns_promptly():
    check = Hangs()
    t0 = time.monotonic()
    out = run_check(check, ctx())
    check.release.set()
    assert time.monotonic() - t0 < 10
    (r,) = out.results
    assert r.status is Status.UNKNOWN and r.reason == "Timeout"
    assert r.details["timeout_s"] == pytest.approx(2.2)  # 0.2 s budget + the 2 s backstop
    assert not out.success


def test_missing_requirement_skips_without_entering_the_check():
    out = run_check(NeedsDcgm(), ctx(StubHost(unmet="DCGM not installed")))
    (r,) = out.results
    assert r.status is Status.SKIPPED and r.reason == "RequirementMissing"
    assert "DCGM" in r.message
    assert out.success


def test_successful_run_records_duration_and_success():
    out = run_check(Good(), ctx())
    assert out.success and out.duration_s >= 0
    assert out.results[0].status is Status.OK


def test_empty_result_list_reports_no_result():
    class Empty(Check):
        name = "empty"

        def run(self, c):
            return []

    (r,) = run_check(Empty(), ctx()).results
    assert r.reason == "NoResult" and r.status is Status.OK


def test_suite_fail_fast_stops_after_first_failure():
    outcomes, report = run_suite([Good(), Failing(), Good()], ctx(), fail_fast=True)
    assert [o.check for o in outcomes] == ["good", "failing"]
    assert report.verdict.value == "unhealthy" and report.exit_code == 1


def test_suite_without_fail_fast_runs_everything_and_survives_crashes():
    outcomes, report = run_suite([Crashes(), Good()], ctx())
    assert [o.check for o in outcomes] == ["crashes", "good"]
    assert report.verdict.value == "unknown" and report.exit_code == 3


def test_invasive_check_refuses_beside_foreign_gpu_process_and_names_it():
    host = StubHost(nvml=_Nvml([_Gpu(0), _Gpu(1)], {1: [_Proc(1234)]}))
    (r,) = run_check(Invasive(), ctx(host)).results
    assert r.status is Status.UNKNOWN and r.reason == "GpuBusy" and r.target == "gpu:1"
    assert "1234" in r.message and list(r.details["pids"]) == [1234]


def test_invasive_check_runs_beside_foreign_process_with_force():
    host = StubHost(nvml=_Nvml([_Gpu(0)], {0: [_Proc(1234)]}))
    (r,) = run_check(Invasive(), ctx(host, force=True)).results
    assert r.status is Status.OK


def test_invasive_check_skipped_on_mig_gpus():
    host = StubHost(nvml=_Nvml([_Gpu(0), _Gpu(1)], mig={0}))
    (r,) = run_check(Invasive(), ctx(host)).results
    assert r.status is Status.SKIPPED and r.reason == "MigEnabled" and r.target == "gpu:0"


# --- the invasive gate over the real NVML reader (the simulated node's fake pynvml) -------------


@pytest.fixture
def sim_ctx():
    from gpu_monitor.config import DEFAULT_CONFIG
    from gpu_monitor.profiles import load_profile
    from gpu_monitor.sim.node import SimulatedNode

    node = SimulatedNode(load_profile("h100-sxm-8"), [])
    host = node.host()
    yield node, Context(host=host, profile=load_profile("h100-sxm-8").for_simulation(),
                        config=DEFAULT_CONFIG)
    host.close()


class InvasiveGpu(Invasive):
    name = "invasive_gpu"
    requires = frozenset({"gpu"})


@pytest.mark.parametrize("call", ["nvmlDeviceGetMigMode", "nvmlDeviceGetComputeRunningProcesses",
                                  "nvmlDeviceGetGraphicsRunningProcesses"])
def test_a_gpu_the_gate_cannot_prove_free_refuses_the_check_naming_the_call(sim_ctx, call):
    node, c = sim_ctx
    node.spec.gpus[3].nvml_errors[call] = "Unknown"
    outcome = run_check(InvasiveGpu(), c)
    (r,) = outcome.results
    assert (r.status, r.reason, r.target) == (Status.UNKNOWN, "GpuBusy", "gpu:3")
    assert call in r.message and r.details["nvml_call"] == call


def test_an_unsupported_mig_mode_is_no_mig(sim_ctx):
    node, c = sim_ctx
    node.spec.gpus[3].nvml_errors["nvmlDeviceGetMigMode"] = "NotSupported"
    (r,) = run_check(InvasiveGpu(), c).results
    assert r.status is Status.OK


def test_a_gpu_list_nvml_cannot_give_passes_the_gates_to_the_check(sim_ctx):
    node, c = sim_ctx
    node.spec.nvml_errors["nvmlDeviceGetCount"] = "Unknown"
    outcome = run_check(InvasiveGpu(), c)  # neither requirement nor gate raises
    assert outcome.success and [r.reason for r in outcome.results] == ["Ok"]
    assert c.host.unmet({"gpu"}, c) == ""
