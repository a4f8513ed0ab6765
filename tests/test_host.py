"""Host.requirement_gap: a missing tool or runtime is told apart from "not applicable here".

Hosts are simulated nodes (the real Host over a fake NVML, a sysfs tree and fake tools); the
missing things are taken away with ``missing@node`` as a CLI user would.
"""

from __future__ import annotations

import shutil

import pytest

no_real_dcgmi = pytest.mark.skipif(shutil.which("dcgmi") is not None,
                                   reason="this host has a real dcgmi")
no_real_perftest = pytest.mark.skipif(shutil.which("ib_write_bw") is not None,
                                      reason="this host has a real ib_write_bw")


@pytest.fixture
def host_for(check_rig):
    """``host_for(profile, *faults, overrides=)`` -> (the simulated node's Host, the Context a
    check gets there), built by the check rig; ``overrides`` change what the profile expects,
    not the hardware."""

    def build(profile_name="h100-sxm-8", *faults, overrides=None):
        rig = check_rig(None, *faults, profile=profile_name, expect=overrides)
        return rig.host, rig.ctx()

    return build


def gap_without(host_for, what, requires, profile="h100-sxm-8", **kw):
    """The gap ``requires`` leaves on a simulated ``profile`` node whose ``what`` is taken away
    (``missing@node``): (host, ctx, gap)."""
    host, ctx = host_for(profile, f"missing@node,what={what}", **kw)
    return host, ctx, host.requirement_gap(requires, ctx)


@no_real_dcgmi
def test_no_dcgmi_on_a_gpu_node_is_missing_and_names_dcgmi(host_for):
    host, ctx, gap = gap_without(host_for, "dcgmi", {"dcgm", "gpu"})
    assert (gap.requirement, gap.missing) == ("dcgm", True)
    assert "dcgmi" in gap.message
    assert host.unmet({"dcgm", "gpu"}, ctx) == gap.message  # the old string API agrees


def test_no_torch_on_a_gpu_node_is_missing_and_names_torch(host_for):
    host, ctx, gap = gap_without(host_for, "torch", {"gpu", "torch"})
    assert (gap.requirement, gap.missing) == ("torch", True)
    assert "torch is not installed" in gap.message


def test_a_cpu_only_torch_on_cuda_workers_is_missing_cuda(host_for):
    host, ctx = host_for("h100-sxm-8")
    host.worker.device_type = "cuda"  # a real GPU node whose workers would run this torch
    rt = host.torch_runtime()
    if not rt.cpu_only:
        pytest.skip(f"this interpreter's torch has CUDA ({rt.build})")
    gap = host.requirement_gap({"gpu", "torch"}, ctx)
    assert (gap.requirement, gap.missing) == ("torch", True)
    assert "without CUDA" in gap.message and rt.build.version in gap.message


def test_cpu_workers_of_the_simulated_node_need_no_cuda(host_for):
    host, ctx = host_for("h100-sxm-8")
    assert host.requirement_gap({"gpu", "torch"}, ctx) is None


def test_a_cpu_only_profile_makes_gpu_tools_not_applicable(host_for):
    host, ctx = host_for("cpu-only", "missing@node,what=torch")
    for requires in ({"gpu", "torch"}, {"dcgm", "gpu"}, {"nvml"}, {"torch"}):
        gap = host.requirement_gap(requires, ctx)
        assert gap is not None and not gap.missing, (requires, gap)


@no_real_perftest
def test_no_perftest_where_no_rdma_port_is_expected_is_not_applicable(host_for):
    # The simulated HCAs are still there: only the profile's expectation changed.
    _, _, gap = gap_without(host_for, "ib_write_bw", {"perftest", "infiniband"},
                            overrides={"rdma": {"ports": []}})
    assert (gap.requirement, gap.missing) == ("perftest", False)


@no_real_perftest
def test_no_perftest_where_rdma_ports_are_expected_is_missing(host_for):
    _, _, gap = gap_without(host_for, "ib_write_bw", {"perftest", "infiniband"})
    assert (gap.requirement, gap.missing) == ("perftest", True)
    assert "ib_write_bw" in gap.message


@no_real_dcgmi
def test_not_applicable_wins_over_missing(host_for):
    # cpu-only: no GPU to test, so the missing dcgmi is not what keeps dcgm_diag from running.
    _, _, gap = gap_without(host_for, "dcgmi", {"dcgm", "gpu"}, profile="cpu-only")
    assert not gap.missing


@no_real_dcgmi
def test_without_a_profile_every_gap_counts_as_missing(host_for):
    host, _ = host_for("cpu-only", "missing@node,what=dcgmi")
    gap = host.requirement_gap({"dcgm"})
    assert gap.missing


def test_an_unknown_requirement_is_missing_never_ignored(host_for):
    host, ctx = host_for("h100-sxm-8")
    gap = host.requirement_gap({"quantum"}, ctx)
    assert gap.missing and "quantum" in gap.message


def test_the_torch_probe_runs_once_per_host(host_for):
    host, ctx = host_for("h100-sxm-8", "missing@node,what=torch")
    first = host.torch_runtime()
    assert host.torch_runtime() is first


def test_a_requirement_probe_that_raises_lets_the_check_run_and_report_it(host_for):
    from gpu_monitor.hw.nvml import NvmlError, NvmlErrorKind

    host, ctx = host_for("h100-sxm-8")

    def broken():
        raise NvmlError(NvmlErrorKind.UNKNOWN, "nvmlDeviceGetCount", message="Unknown Error")

    host.nvml.gpus = broken
    assert host.requirement_gap({"gpu", "torch"}, ctx) is None
