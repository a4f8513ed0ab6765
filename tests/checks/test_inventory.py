import os

import pytest

from checks.inventory import Inventory, version_tuple
from gpu_monitor.check import Context
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.model import Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.runner import run_check
from gpu_monitor.sim.inject import parse
from gpu_monitor.sim.node import SimulatedNode


@pytest.fixture
def sim(request):
    nodes = []

    def make(profile="h100-sxm-8", *faults, expect=None):
        node = SimulatedNode(load_profile(profile), [parse(f) for f in faults])
        nodes.append(node)
        host = node.host()
        prof = load_profile(expect or profile).for_simulation()
        return node, Context(host=host, profile=prof, config=DEFAULT_CONFIG)

    yield make
    for n in nodes:
        n.close()


def by_target(results):
    return {r.target: r for r in results}


def test_healthy_node_all_gpus_ok_with_uuids(sim):
    node, ctx = sim()
    results = run_check(Inventory(), ctx).results
    assert all(r.status is Status.OK for r in results)
    targets = by_target(results)
    assert set(targets) == {f"gpu:{i}" for i in range(8)} | {"node"}
    assert targets["gpu:0"].details["uuid"] == node.spec.gpu(0).uuid
    assert targets["node"].details["found_gpus"] == 8


@pytest.mark.parametrize("index", [0, 3, 7])
def test_gpu_missing_from_nvml_but_on_bus_is_named_by_slot(sim, index):
    _, ctx = sim("h100-sxm-8", f"gpu-missing@gpu:{index}")
    results = run_check(Inventory(), ctx).results
    failed = [r for r in results if r.status is Status.FAILED]
    assert [(r.target, r.reason) for r in failed] == [(f"gpu:{index}", "GpuMissing")]
    # Every other slot is reported ok under its own, un-shifted name.
    oks = {r.target for r in results if r.status is Status.OK}
    assert oks == {f"gpu:{i}" for i in range(8) if i != index} | {"node"}


def test_gpu_gone_from_bus_and_nvml_counts_against_profile(sim):
    _, ctx = sim("h100-sxm-8", "gpu-missing@gpu:7,bus=0")
    failed = [r for r in run_check(Inventory(), ctx).results if r.status is Status.FAILED]
    assert [(r.target, r.reason) for r in failed] == [("gpu:7", "GpuMissing")]


def test_gpus_on_bus_with_nvml_unavailable_fail_nvml_unavailable(sim):
    node, ctx = sim()
    node.spec.nvml_library_missing = True
    (r,) = run_check(Inventory(), ctx).results
    assert r.status is Status.FAILED and r.reason == "NvmlUnavailable" and r.target == "node"
    assert len(r.details["pci_bus_ids"]) == 8
    assert "not found" in r.details["nvml_error"].lower()


def test_cpu_only_node_is_healthy_without_nvml(sim):
    _, ctx = sim("cpu-only")
    (r,) = run_check(Inventory(), ctx).results
    assert r.status is Status.OK and r.details["found_gpus"] == 0


@pytest.mark.parametrize("name,content", [("class", "banana\n"), ("vendor", b"\xff\xfe"),
                                          ("class", None)])
def test_without_nvml_a_pci_function_that_cannot_be_identified_is_not_no_gpu(sim, name,
                                                                             content):
    node, ctx = sim("cpu-only")
    fn = os.path.join(node.paths.sys("bus", "pci", "devices"), "0000:53:00.0")
    os.makedirs(fn)
    files = {"vendor": "0x10de\n", "device": "0x2330\n", "class": "0x030200\n", name: content}
    for n, c in files.items():
        if c is not None:
            with open(os.path.join(fn, n), "wb") as f:
                f.write(c.encode() if isinstance(c, str) else c)
    (r,) = run_check(Inventory(), ctx).results
    assert (r.status, r.reason, r.target) == (Status.UNKNOWN, "SysfsReadError", "node")
    assert f"0000:53:00.0/{name}" in r.message


def test_profile_expecting_gpus_on_gpu_less_node_fails(sim):
    _, ctx = sim("cpu-only", expect="h100-sxm-8")
    (r,) = run_check(Inventory(), ctx).results
    assert r.status is Status.FAILED and r.reason == "GpuMissing"


def test_lost_gpu_fails_with_its_slot(sim):
    _, ctx = sim("a100-sxm-8", "nvml-error@gpu:2,error=GpuIsLost")
    failed = [r for r in run_check(Inventory(), ctx).results if r.status is Status.FAILED]
    assert [(r.target, r.reason) for r in failed] == [("gpu:2", "GpuLost")]


def test_wrong_model_fails(sim):
    _, ctx = sim("a100-sxm-8", expect="h100-sxm-8")
    results = run_check(Inventory(), ctx).results
    assert {r.reason for r in results if r.status is Status.FAILED} == {"GpuModelMismatch"}


def test_old_driver_fails(sim):
    node, ctx = sim()
    node.spec.driver_version = "470.57.02"
    results = by_target(run_check(Inventory(), ctx).results)
    assert results["node"].reason == "DriverTooOld"
    assert results["node"].details["min_driver_version"]


def test_more_gpus_than_expected_is_degraded(sim):
    node, ctx = sim()
    ctx.profile = ctx.profile.with_overrides({"gpu": {"count": 4}})
    results = [r for r in run_check(Inventory(), ctx).results if r.reason == "GpuCountUnexpected"]
    assert results and results[0].status is Status.DEGRADED


def test_enumeration_error_is_unknown(sim):
    node, ctx = sim()
    ctx.host.nvml.start()
    ctx.host.nvml._module.system_errors["nvmlDeviceGetCount"] = "Unknown"  # type: ignore[attr-defined]
    (r,) = run_check(Inventory(), ctx).results
    assert r.status is Status.UNKNOWN and r.reason == "NvmlReadError"


@pytest.mark.parametrize("call", ["nvmlDeviceGetName", "nvmlDeviceGetHandleByIndex",
                                  "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo",
                                  "nvmlDeviceGetSerial", "nvmlDeviceGetMemoryInfo"])
def test_a_gpu_nvml_cannot_identify_is_unknown_naming_the_call(sim, call):
    # The issue: a failing nvmlDeviceGetName crashed the check (None.lower()); a failing
    # nvmlDeviceGetUUID reported the GPU ok with a None UUID.
    node, ctx = sim("h100-sxm-8", f"nvml-error@gpu:2,call={call},error=Unknown")
    outcome = run_check(Inventory(), ctx)
    assert outcome.success
    results = by_target(outcome.results)
    gpu2 = results["gpu:2"]
    assert (gpu2.status, gpu2.reason) == (Status.UNKNOWN, "NvmlReadError")
    assert call in gpu2.message and gpu2.details["nvml_call"] == call
    assert gpu2.details["pci_bus_id"] == node.spec.gpus[2].pci_bus_id  # its slot, still
    assert all(results[f"gpu:{i}"].status is Status.OK for i in range(8) if i != 2)
    assert results["node"].status is Status.OK  # 8 GPUs counted, driver read


def test_an_unreadable_driver_version_is_an_unknown_node_and_the_gpus_are_still_judged(sim):
    node, ctx = sim()
    node.spec.nvml_errors["nvmlSystemGetDriverVersion"] = "Unknown"
    results = by_target(run_check(Inventory(), ctx).results)
    assert (results["node"].status, results["node"].reason) == (Status.UNKNOWN, "NvmlReadError")
    assert "nvmlSystemGetDriverVersion" in results["node"].message
    assert all(results[f"gpu:{i}"].status is Status.OK for i in range(8))


def test_a_lost_gpu_names_the_call_that_said_so(sim):
    _, ctx = sim("h100-sxm-8", "nvml-error@gpu:6,call=nvmlDeviceGetUUID,error=GpuIsLost")
    gpu6 = by_target(run_check(Inventory(), ctx).results)["gpu:6"]
    assert (gpu6.status, gpu6.reason) == (Status.FAILED, "GpuLost")
    assert (gpu6.details["nvml_call"], gpu6.details["nvml_error_kind"]) == (
        "nvmlDeviceGetUUID", "gpu_lost")


@pytest.mark.parametrize("text, want", [("535.104.05", (535, 104, 5)), ("12.4", (12, 4)),
                                        ("550.54.15-rc1", (550, 54, 15)), ("", ())])
def test_version_tuple(text, want):
    assert version_tuple(text) == want


def test_missing_gpu_right_after_boot_is_unknown_boot_grace_then_failed(sim):
    node, ctx = sim("h100-sxm-8", "gpu-missing@gpu:5")
    node.spec.uptime_s = 30.0
    node.advance(0.0)
    check = Inventory()
    r = next(x for x in run_check(check, ctx).results if x.target == "gpu:5")
    assert (r.status, r.reason) == (Status.UNKNOWN, "BootGrace")
    assert r.details["pending_reason"] == "GpuMissing"
    node.spec.uptime_s = 600.0
    node.advance(0.0)
    r = next(x for x in run_check(check, ctx).results if x.target == "gpu:5")
    assert (r.status, r.reason) == (Status.FAILED, "GpuMissing")


def test_gpu_back_after_a_problem_is_cleared(sim):
    # A lost GPU that answers again (after a reset): its slot reports Cleared once.
    node, ctx = sim("h100-sxm-8", "nvml-error@gpu:5,error=GpuIsLost")
    check = Inventory()
    assert any(r.status is Status.FAILED for r in run_check(check, ctx).results)
    node.spec.gpu(5).lost = False
    r = next(x for x in run_check(check, ctx).results if x.target == "gpu:5")
    assert (r.status, r.reason) == (Status.OK, "Cleared")
