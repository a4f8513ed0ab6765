"""The Profile value (profiles/profile.py): read-only all the way down, its lookups, overrides and
the simulated node's merge, comparison by content."""

from __future__ import annotations

import pytest

from gpu_monitor.profiles import (
    Profile,
    ProfileError,
    UndeclaredSetting,
    load_profile,
)


def test_profile_data_is_read_only_all_the_way_down():
    p = load_profile("h100-sxm-8")
    with pytest.raises(TypeError):
        p.data["name"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        p.data["nvlink"]["links_per_gpu"] = 1  # type: ignore[index]
    assert isinstance(p.get("rdma.ports"), tuple)
    with pytest.raises(AttributeError):
        p.simulated = True  # type: ignore[misc]


def test_get_returns_default_for_missing_keys_and_nulls():
    p = load_profile("h100-sxm-8")
    assert p.get("pcie.gen") == 5
    assert p.get("pcie.gpu_numa", "unset") == "unset"
    assert p.get("no.such.key", 7) == 7
    assert load_profile("cpu-only").get("pcie.gen", 4) == 4  # explicit null -> default
    assert p.get("rdma.ports.0") == "mlx5_0:1"


def test_check_setting_looks_in_the_check_block_then_its_sections_then_warning_band():
    p = load_profile("h100-sxm-8")
    assert p.check_setting("burn_in", "duration_s") == 60
    assert p.check_setting("nccl_allreduce", "allreduce_busbw_floor_gb_per_s") == 460
    assert p.check_setting("fabric_probe", "small_p95_latency_limit_s") == 0.001  # fabric first
    assert p.check_setting("fabric_probe", "sweep_max_bytes") == 2 * 1024**3  # then nccl
    assert p.check_setting("dcgm_diag", "level") == 2
    assert p.check_setting("rdma_loopback", "warning_band") == 0.02  # per-check band
    assert p.check_setting("pcie", "warning_band") == 0.05  # profile-wide band
    assert p.check_setting("inventory", "boot_grace_s") is None  # declared, set nowhere
    assert p.check_setting("unknown_check", "duration_s") is None  # a plugin's: free-form


@pytest.mark.parametrize(("check", "key"), [
    ("burn_in", "no_such_key"),
    ("xid", "links_per_gpu"),  # xid is not judged on nvlink: not its setting
    ("pcie_aer", "boot_grace"),
], ids=["unknown-key", "another-sections-key", "typo"])
def test_check_setting_refuses_a_key_the_check_does_not_declare(check, key):
    with pytest.raises(UndeclaredSetting, match=f"{check!r} reads setting {key!r}"):
        load_profile("h100-sxm-8").check_setting(check, key)


def test_with_overrides_deep_merges_into_a_new_validated_profile():
    base = load_profile("h100-sxm-8")
    new = base.with_overrides({"nvlink": {"links_per_gpu": 16},
                               "rdma": {"ports": ["mlx5_3:1"]},
                               "checks": {"burn_in": {"duration_s": 5}}})
    assert new.get("nvlink.links_per_gpu") == 16
    assert new.get("nvlink.p2p_floor_gb_per_s") == 335  # sibling kept
    assert new.get("rdma.ports") == ("mlx5_3:1",)  # lists replace
    assert new.check_setting("burn_in", "duration_s") == 5
    assert new.check_setting("burn_in", "dtypes") == ("bf16", "tf32")
    assert base.get("nvlink.links_per_gpu") == 18  # the original is untouched
    assert base.with_overrides({}) is base


def test_with_overrides_names_the_bad_field():
    with pytest.raises(ProfileError) as err:
        load_profile("h100-sxm-8").with_overrides({"nvlink": {"links_per_gpu": "x"}})
    assert str(err.value) == ("profile h100-sxm-8 (with overrides): nvlink.links_per_gpu: "
                              "expected a non-negative integer, got 'x'")
    assert err.value.field == "nvlink.links_per_gpu"


def test_for_simulation_merges_cpu_calibrated_numbers_and_keeps_the_hardware():
    real = load_profile("h100-sxm-8")
    sim = real.for_simulation()
    assert sim.simulated and sim.name == real.name
    assert sim.check_setting("burn_in", "duration_s") <= 5
    assert sim.check_setting("burn_in", "dtypes") == ("fp32",)
    assert sim.get("nccl.allreduce_busbw_floor_gb_per_s") < 1
    assert sim.get("gpu.peak_tflops.fp32") < 1
    # the node described is the same node
    for key in ("gpu.count", "nvlink.links_per_gpu", "rdma.ports", "pcie.gen",
                "gpu.product_name", "rdma.loopback_floor_gbit_per_s"):
        assert sim.get(key) == real.get(key), key
    assert sim.for_simulation() is sim
    assert real.get("nccl.allreduce_busbw_floor_gb_per_s") == 460


def test_profiles_compare_by_content():
    a = load_profile("h100-sxm-8")
    b = a.with_overrides({"checks": {"burn_in": {"duration_s": 60}}})  # same value
    assert a == b and hash(a) == hash(b)
    assert a != a.for_simulation()
    assert a != load_profile("h200-sxm-8")


def test_profile_is_constructible_from_plain_data_for_tests():
    data = load_profile("cpu-only").to_dict()
    data["gpu"]["count"] = 2
    p = Profile(data)
    assert p.expected_gpus == 2
    with pytest.raises(TypeError):
        p.data["gpu"]["count"] = 3  # type: ignore[index]
