import threading
import time

import pytest

from gpu_monitor.check import Check, Context
from gpu_monitor.model import Kind, Result, Status
from gpu_monitor.runner import run_check, run_on_kmsg, run_suite


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

    def __init__(self, unmet="", nvml=None, missing=True):
        self._unmet = unmet
        self._missing = missing
        self.nvml = nvml or _Nvml()
        self.procfs = _Procfs()

    def requirement_gap(self, requires, ctx=None):
        from gpu_monitor.host import Unmet

        if not (requires and self._unmet):
            return None
        return Unmet(sorted(requires)[0], self._unmet, self._missing)

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


# --- bootstrap mode: a required check that cannot run is not a pass --------------------------


class RequiredDcgm(NeedsDcgm):
    name = "required_dcgm"
    required = True


class NoEngine(Check):
    """Runs, and finds its tool's service missing (dcgm_diag without a host engine)."""

    name = "no_engine"
    kinds = frozenset({Kind.BOOTSTRAP})
    required = True
    reasons = ("EngineDown", "NotHere")
    unavailable_reasons = ("EngineDown",)

    def run(self, c):
        return [self.result(c, Status.SKIPPED, "node", "EngineDown", "no host engine"),
                self.result(c, Status.SKIPPED, "gpu:0", "NotHere", "not applicable")]


class _Settings:
    """A profile or config whose ``checks.<name>.required`` is set."""

    name = "test"

    def __init__(self, required=None):
        self.required = required or {}

    def check_setting(self, check, key):
        return self.required.get(check) if key == "required" else None


def test_bootstrap_makes_a_missing_tool_of_a_required_check_unknown_naming_it():
    out = run_check(RequiredDcgm(), ctx(StubHost(unmet="DCGM not installed (dcgmi ...)")),
                    bootstrap=True)
    (r,) = out.results
    assert (r.status, r.reason) == (Status.UNKNOWN, "RequirementMissing")
    assert "required for the bootstrap" in r.message and "dcgmi" in r.message
    assert r.details["requirement"] == "dcgm" and r.details["required"] is True
    assert not out.success


def test_outside_a_bootstrap_a_missing_tool_is_still_skipped():
    (r,) = run_check(RequiredDcgm(), ctx(StubHost(unmet="DCGM not installed"))).results
    assert (r.status, r.reason) == (Status.SKIPPED, "RequirementMissing")


def test_a_not_applicable_requirement_is_skipped_even_when_required():
    host = StubHost(unmet="no NVIDIA GPU on this node", missing=False)
    (r,) = run_check(RequiredDcgm(), ctx(host), bootstrap=True).results
    assert (r.status, r.reason) == (Status.SKIPPED, "RequirementMissing")
    assert r.details["not_applicable"] is True


def test_a_check_not_required_by_declaration_is_skipped_in_a_bootstrap():
    (r,) = run_check(NeedsDcgm(), ctx(StubHost(unmet="DCGM not installed")),
                     bootstrap=True).results
    assert r.status is Status.SKIPPED


@pytest.mark.parametrize("where", ["profile", "config"])
def test_profile_or_config_may_make_a_declared_requirement_optional(where):
    c = ctx(StubHost(unmet="DCGM not installed"))
    setattr(c, where, _Settings({"required_dcgm": False}))
    (r,) = run_check(RequiredDcgm(), c, bootstrap=True).results
    assert r.status is Status.SKIPPED
    c = ctx(StubHost(unmet="DCGM not installed"))
    c.profile = _Settings({"needs_dcgm": True})
    (r,) = run_check(NeedsDcgm(), c, bootstrap=True).results
    assert r.status is Status.UNKNOWN


def test_a_required_checks_own_unavailable_skip_is_unknown_in_a_bootstrap():
    res = {r.target: r for r in run_check(NoEngine(), ctx(), bootstrap=True).results}
    assert (res["node"].status, res["node"].reason) == (Status.UNKNOWN, "EngineDown")
    assert "required for the bootstrap" in res["node"].message
    assert res["gpu:0"].status is Status.SKIPPED  # a reason not declared unavailable stays
    plain = {r.target: r for r in run_check(NoEngine(), ctx()).results}
    assert plain["node"].status is Status.SKIPPED


def test_a_config_disabled_check_is_reported_skipped_not_run_and_the_rest_decides():
    outcomes, report = run_suite([Crashes(), Good()], ctx(), bootstrap=True,
                                 disabled={"crashes": "checks.crashes.enabled: false"})
    assert [o.check for o in outcomes] == ["crashes", "good"]
    (r,) = outcomes[0].results
    assert (r.status, r.reason) == (Status.SKIPPED, "DisabledByConfig")
    assert "disabled by config" in r.message and "checks.crashes.enabled" in r.message
    assert report.verdict.value == "healthy"


def test_the_bootstrap_suite_verdict_is_unknown_when_a_required_tool_is_missing():
    _, report = run_suite([Good(), RequiredDcgm()], ctx(StubHost(unmet="DCGM not installed")),
                          bootstrap=True)
    assert report.verdict.value == "unknown" and report.exit_code == 3


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


class Reports(Check):
    name = "reports"
    kinds = frozenset({Kind.BOOTSTRAP})
    reasons = ("Fine",)

    def on_kmsg(self, record, c):
        return [Result(check=self.name, status=Status.OK, target="node", reason=record)]


def test_run_on_kmsg_warns_of_an_undeclared_reason_and_sees_a_reasons_change(monkeypatch):
    """The declared reasons are built once per class (the follower's hot path), still from
    the class's reasons as they are now: replacing them is seen at the next call."""
    c = ctx()
    warned: list[tuple] = []
    monkeypatch.setattr(c.log, "warning", lambda *a: warned.append(a))
    for reason in ("Fine", "CheckCrashed", "Surprise"):
        assert run_on_kmsg(Reports(), c, reason).success
    assert [a[2] for a in warned] == ["Surprise"]
    monkeypatch.setattr(Reports, "reasons", ("Fine", "Surprise"))
    assert run_on_kmsg(Reports(), c, "Surprise").success
    assert len(warned) == 1
