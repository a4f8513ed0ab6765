"""pcie through the simulated node: NVML link state, the sysfs tree, AER and topology."""

from __future__ import annotations

import pytest

import checks.pcie as pcie_check
from checks.pcie import Pcie
from gpu_monitor.check import Context
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.host import WorkerSettings
from gpu_monitor.model import Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.runner import run_check
from gpu_monitor.workers.pool import DeviceRef, Outcome, Task, WorkerPool
from tests.checks.cuda_helpers import claim_cuda_torch, cuda_count
from tests.checks.rig import judged_fixture, run_once

NICS = [f"pcie:0000:{b:02x}:00.0" for b in (0x4F, 0x60, 0x71, 0x82, 0x93, 0xA4, 0xB5, 0xC6)]


def run(ctx):
    return run_once(Pcie(), ctx)


judged = judged_fixture(Pcie)


def problems(res):
    return {t: (r.status, r.reason) for t, r in res.items()
            if r.status not in (Status.OK, Status.SKIPPED)}


def test_healthy_node_every_gpu_and_nic_ok(judged):
    res = judged()
    assert sorted(t for t in res if t.startswith("gpu:")) == [f"gpu:{i}" for i in range(8)]
    assert sorted(t for t in res if t.startswith("pcie:")) == NICS
    assert problems(res) == {}
    g = res["gpu:0"].details
    assert (g["link_gen"], g["link_gen_max"], g["link_width"], g["link_width_max"]) == (5, 5, 16, 16)
    assert (g["sysfs_link_speed_gts"], g["sysfs_link_width"]) == (32.0, 16)
    assert g["pci_bus_id"] == "0000:53:00.0" and g["uuid"].startswith("GPU-")
    assert g["numa_node"] == 0 and g["nearest_nic"] == "mlx5_0"
    assert res["gpu:7"].details["nearest_nic"] == "mlx5_7"
    assert g["aer_fatal_total"] == 0 and g["replay_counter"] == 0
    n = res[NICS[1]].details
    assert n["rdma_devices"] == ("mlx5_1",)


def test_copy_bandwidth_is_skipped_not_faked_without_cuda(judged):
    r = judged()["node"]
    assert (r.status, r.reason) == (Status.SKIPPED, "CopyTestSkipped")
    assert "cpu" in r.message
    assert r.details["h2d_floor_gb_per_s"] == 0.05  # the simulation block's floor


@pytest.fixture
def cuda_torch(fixtures_dir, tmp_path):
    """Makes a host's workers see a CUDA build of torch (recorded version file)."""
    version = fixtures_dir / "torch_version" / "torch-2.7.1-700_cuda12.9_version.txt"
    return lambda host: claim_cuda_torch(host, tmp_path / "site", version)


def test_a_torch_without_cuda_on_cuda_workers_is_a_missing_requirement(node):
    _, ctx = node()
    ctx.host.worker.device_type = "cuda"
    if not ctx.host.torch_runtime().cpu_only:
        pytest.skip("this interpreter's torch is built for CUDA")
    res = run(ctx)
    r = res["node"]
    assert (r.status, r.reason) == (Status.SKIPPED, "RequirementMissing")
    assert "without CUDA" in r.message and r.details["requirement"] == "torch"
    assert "h2d_gb_per_s" not in res["gpu:0"].details
    # In a bootstrap the copy test is required: not measured is not a pass.
    (b,) = [x for x in run_check(Pcie(), ctx, bootstrap=True).results if x.target == "node"]
    assert (b.status, b.reason) == (Status.UNKNOWN, "RequirementMissing")
    assert "required for the bootstrap" in b.message


def test_the_passive_image_leaves_the_copy_test_unmeasured_naming_torch(node):
    _, ctx = node("missing@node,what=torch")
    ctx.host.worker.device_type = "cuda"
    r = run(ctx)["node"]
    assert (r.status, r.reason) == (Status.SKIPPED, "RequirementMissing")
    assert "torch is not installed" in r.message


@pytest.mark.skipif(cuda_count() > 0, reason="CUDA is available here")
def test_copy_worker_without_cuda_is_unknown_never_ok(node):
    _, ctx = node()
    ctx.host.worker.device_type = "cuda"
    if ctx.host.torch_runtime().cpu_only:
        pytest.skip("this torch has no CUDA: the requirement gate stops it (test above)")
    res = run(ctx)
    r = res["node"]
    assert (r.status, r.reason) == (Status.UNKNOWN, "WorkerCrashed")
    assert "CUDA is not available" in r.message
    assert "h2d_gb_per_s" not in res["gpu:0"].details


def test_copy_test_is_skipped_while_a_gpu_is_in_use(node, cuda_torch):
    _, ctx = node("gpu-process@gpu:3,pid=4242,name=trainer")
    cuda_torch(ctx.host)
    r = run(ctx)["node"]
    assert (r.status, r.reason) == (Status.SKIPPED, "CopyTestSkipped")
    assert "pid 4242" in r.message and "gpu:3" in r.message


def test_copy_worker_measures_and_verifies_the_round_trip():
    """The worker function itself, on CPU devices (the check runs it only on CUDA)."""
    pool = WorkerPool(WorkerSettings(device_type="cpu"))
    task = Task("checks.pcie:copy_worker", (DeviceRef(0, "GPU-a"), DeviceRef(1, "GPU-b")),
                {"copy_bytes": 1 << 20, "repeats": 2})
    (outcome,) = pool.run([task], timeout_s=60, rounds=1)
    assert outcome.ok, outcome.message
    copies = outcome.value["copies"]
    assert [c["index"] for c in copies] == [0, 1]
    for c in copies:
        assert c["bytes"] == 1 << 20 and c["mismatches"] == 0
        assert len(c["h2d_times_s"]) == 2 and c["h2d_gb_per_s"] > 0 and c["d2h_gb_per_s"] > 0


class FakePool:
    """Stands in for the worker pool with fixed copy results (floors are judged here)."""

    copies: list = []

    def __init__(self, settings):
        pass

    def run(self, tasks, **kw):
        return [Outcome(tasks[0], {"copies": self.copies})]


def copy(index, h2d, d2h, mismatches=0):
    return {"index": index, "bytes": 1 << 20, "h2d_gb_per_s": h2d, "d2h_gb_per_s": d2h,
            "mismatches": mismatches}


def test_copy_bandwidth_against_the_floors(node, monkeypatch, cuda_torch):
    _, ctx = node()
    cuda_torch(ctx.host)
    FakePool.copies = [copy(0, 20.0, 20.0), copy(1, 0.01, 20.0), copy(2, 20.0, 0.051),
                       copy(3, 20.0, 20.0, mismatches=7)] + [copy(i, 9, 9) for i in range(4, 8)]
    monkeypatch.setattr(pcie_check, "WorkerPool", FakePool)
    res = run(ctx)
    assert "node" not in res  # measured: no "skipped" note
    assert problems(res) == {"gpu:1": (Status.FAILED, "CopyBandwidthLow"),
                             "gpu:2": (Status.DEGRADED, "CopyBandwidthNearFloor"),
                             "gpu:3": (Status.FAILED, "PcieCopyMismatch")}
    d = res["gpu:1"].details
    assert (d["h2d_gb_per_s"], d["h2d_floor_gb_per_s"]) == (0.01, 0.05)
    assert "below the floor 0.05 GB/s" in res["gpu:1"].message
    assert res["gpu:0"].details["d2h_gb_per_s"] == 20.0


@pytest.mark.parametrize("fault", [
    "pcie-downgrade@gpu:1,gen=3,width=8",
    "pcie-downgrade@gpu:1,gen=4",
    "pcie-downgrade@gpu:1,width=8",
])
def test_downgraded_gpu_link_fails_naming_the_gpu(judged, fault):
    res = judged(fault)
    assert problems(res) == {"gpu:1": (Status.FAILED, "PcieLinkDowngraded")}
    d = res["gpu:1"].details
    assert d["pci_bus_id"] == "0000:64:00.0"
    assert d["expected_gen"] == 5 and d["expected_width"] == 16
    assert "below its capability" in res["gpu:1"].message


def test_gpu_in_a_slot_below_the_profile_generation_fails(node):
    sim, ctx = node()
    sim.spec.gpus[4].pcie_gen_max = 4  # a Gen4-only riser: max = current = 4
    sim.spec.gpus[4].pcie_gen_current = 4
    res = run(ctx)
    assert problems(res) == {"gpu:4": (Status.FAILED, "PcieLinkDowngraded")}
    assert "profile Gen5" in res["gpu:4"].message


def test_downgraded_nic_link_fails_naming_its_pci_function(node):
    _, ctx = node()
    path = ctx.host.paths.sys("bus", "pci", "devices", "0000:60:00.0", "current_link_width")
    with open(path, "w") as fh:
        fh.write("8\n")
    res = run(ctx)
    assert problems(res) == {NICS[1]: (Status.FAILED, "PcieLinkDowngraded")}
    assert res[NICS[1]].message.startswith(f"{NICS[1]}: NIC mlx5_1: ")


@pytest.mark.parametrize("kind, status, reason", [
    ("fatal", Status.FAILED, "PcieAerFatal"),
    ("nonfatal", Status.DEGRADED, "PcieAerNonFatal"),
])
def test_aer_errors_since_boot(judged, kind, status, reason):
    res = judged(f"aer@gpu:6,kind={kind},count=2")
    assert problems(res) == {"gpu:6": (status, reason)}
    assert res["gpu:6"].details[f"aer_{kind}_total"] == 2


def test_correctable_aer_errors_are_only_recorded(judged):
    res = judged("aer@gpu:6,kind=correctable,count=5")
    assert problems(res) == {}
    assert res["gpu:6"].details["aer_correctable_total"] == 5


def test_a_nonfatal_aer_increase_during_the_check_fails(node):
    sim, ctx = node()
    reader = ctx.host.sysfs
    real = reader.pci_device
    seen: set[str] = set()

    def pci_device(address):
        if address == "0000:75:00.0" and address in seen:
            sim.spec.gpus[2].aer_nonfatal += 1
            sim.advance(0.0)  # rewrites the sysfs tree
        seen.add(address)
        return real(address)

    reader.pci_device = pci_device
    res = run(ctx)
    assert problems(res) == {"gpu:2": (Status.FAILED, "PcieAerNonFatal")}
    assert "during the check" in res["gpu:2"].message


def test_replays_during_the_check_degrade(node):
    _, ctx = node()
    nvml = ctx.host.nvml
    real = nvml.pcie_replay_counter
    calls = {"n": 0}

    def counter(index):
        value = real(index)
        if index == 3:
            calls["n"] += 1
            return value + (200 if calls["n"] > 1 else 0)
        return value

    nvml.pcie_replay_counter = counter
    res = run(ctx)
    assert problems(res) == {"gpu:3": (Status.DEGRADED, "PcieReplays")}
    assert res["gpu:3"].details["replay_increase"] == 200
    assert res["gpu:3"].details["replay_increase_degraded"] == 80


def test_numa_and_nic_pairing_match_the_profile(judged):
    numa = [0, 0, 0, 0, 1, 1, 1, 1]
    nics = [f"mlx5_{i}" for i in range(8)]
    res = judged(expect={"pcie": {"gpu_numa": numa, "gpu_nic": nics}})
    assert problems(res) == {}
    assert res["gpu:5"].details["expected_nic"] == "mlx5_5"


def test_numa_and_nic_mismatch_degrade_the_gpu(judged):
    numa = [1, 0, 0, 0, 1, 1, 1, 1]
    nics = ["mlx5_0", "mlx5_1", "mlx5_3", "mlx5_2", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]
    res = judged(expect={"pcie": {"gpu_numa": numa, "gpu_nic": nics}})
    assert problems(res) == {f"gpu:{i}": (Status.DEGRADED, "PcieTopologyMismatch")
                             for i in (0, 2, 3)}
    assert "NUMA node 0, profile expects 1" in res["gpu:0"].message
    assert "nearest RDMA NIC is mlx5_2, profile expects mlx5_3" in res["gpu:2"].message


@pytest.mark.parametrize("fault", [
    "nvml-error@gpu:2,call=nvmlDeviceGetCurrPcieLinkGeneration,error=Unknown",
    "nvml-error@gpu:2,error=GpuIsLost",
])
def test_nvml_errors_make_the_gpu_unknown(judged, fault):
    res = judged(fault)
    assert problems(res) == {"gpu:2": (Status.UNKNOWN, "NvmlReadError")}


@pytest.mark.parametrize("call", ["nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetNumaNodeId",
                                  "nvmlDeviceGetPciInfo", "nvmlDeviceGetUUID"])
def test_an_nvml_read_the_gpu_result_rests_on_that_fails_makes_it_unknown(judged, call):
    res = judged(f"nvml-error@gpu:3,call={call},error=InsufficientPower")
    assert problems(res) == {"gpu:3": (Status.UNKNOWN, "NvmlReadError")}
    assert call in res["gpu:3"].message
    assert "insufficient_power" in res["gpu:3"].message


@pytest.mark.parametrize("call", ["nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetNumaNodeId"])
def test_an_unsupported_replay_counter_or_numa_query_is_no_error(judged, call):
    res = judged(f"nvml-error@gpu:3,call={call},error=NotSupported")
    assert problems(res) == {}
    assert res["gpu:3"].status is Status.OK


def test_a_gpu_nvml_cannot_place_on_the_bus_is_never_matched_to_a_sysfs_device(judged):
    # Its sysfs link is downgraded, but without its PCI address nothing can say it is its own.
    res = judged("pcie-downgrade@gpu:4,width=8",
                 "nvml-error@gpu:4,call=nvmlDeviceGetPciInfo,error=Unknown")["gpu:4"]
    assert (res.status, res.reason) == (Status.UNKNOWN, "NvmlReadError")
    assert res.details["nvml_call"] == "nvmlDeviceGetPciInfo"
    assert "sysfs_link_width" not in res.details


def test_unsupported_link_query_still_judges_sysfs(judged):
    res = judged("pcie-downgrade@gpu:1,width=4",
                 "nvml-error@gpu:1,call=nvmlDeviceGetCurrPcieLinkWidth,error=NotSupported")
    assert problems(res) == {"gpu:1": (Status.FAILED, "PcieLinkDowngraded")}
    assert "x4 of x16" in res["gpu:1"].message


@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() < 1, reason="needs a CUDA device")
def test_pinned_copies_on_real_gpus_are_measured_and_verified():
    from gpu_monitor.host import Host
    from gpu_monitor.hw.paths import HostPaths

    host = Host.real(HostPaths())
    ctx = Context(host=host, profile=load_profile("h100-sxm-8"), config=DEFAULT_CONFIG,
                  force=True)
    try:
        outcome = run_check(Pcie(), ctx)
    finally:
        host.close()
    gpus = [r for r in outcome.results if r.target.startswith("gpu:")]
    assert len(gpus) == cuda_count()
    for r in gpus:
        assert r.details["h2d_gb_per_s"] > 1 and r.details["d2h_gb_per_s"] > 1, r.details
        assert r.reason != "PcieCopyMismatch"
    assert not [r for r in outcome.results if r.reason in ("WorkerCrashed", "WorkerTimeout")]


def test_a_hung_copy_worker_is_unknown_naming_where_it_hung(node, monkeypatch, cuda_torch):
    _, ctx = node()
    cuda_torch(ctx.host)

    class HungPool(FakePool):
        def run(self, tasks, **kw):
            return [Outcome(tasks[0], None, "timeout", "worker for pcie copies timed out "
                            "after 120 s (at pinned copies gpu:5)", steps=6,
                            phase="pinned copies gpu:5")]

    monkeypatch.setattr(pcie_check, "WorkerPool", HungPool)
    res = run(ctx)
    assert (res["node"].status, res["node"].reason) == (Status.UNKNOWN, "WorkerTimeout")
    assert "gpu:5" in res["node"].message
    assert res["node"].details["phase"] == "pinned copies gpu:5"
    assert problems(res) == {"node": (Status.UNKNOWN, "WorkerTimeout")}
