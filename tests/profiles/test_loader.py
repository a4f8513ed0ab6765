"""Finding and loading profiles (profiles/loader.py): the shipped files load exactly as the daemon
loads them and carry the public per-SKU numbers, ``auto`` matches real NVML names, and a file that
cannot be read is refused naming it."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.profiles import (
    ProfileError,
    known_checks,
    list_profiles,
    load_profile,
    match_profile,
)
from tests.conftest import REPO
from tests.fuzz import load_any_bytes
from tests.profiles.profile_files import (
    GPU_PROFILES,
    PROFILE_DIR,
    SHIPPED,
    shipped_dict,
    write_profile,
)


def test_the_four_profiles_ship():
    assert set(SHIPPED) <= set(list_profiles())


@pytest.mark.parametrize("name", list_profiles())
def test_every_shipped_profile_loads_and_validates(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.expected_gpus == profile.get("gpu.count")
    assert not profile.simulated


@pytest.mark.parametrize("name", list_profiles())
def test_every_shipped_profile_validates_as_a_user_file_too(name, tmp_path):
    """The same bytes through the file path (the B200-baseline route) give the same profile."""
    src = PROFILE_DIR / f"{name}.yaml"
    copy = write_profile(tmp_path, src.read_text(), f"{name}.yaml")
    assert load_profile(str(copy)) == load_profile(name)


@pytest.mark.parametrize("name", list_profiles())
def test_every_shipped_simulation_block_merges_into_a_valid_profile(name):
    sim = load_profile(name).for_simulation()
    assert sim.simulated
    assert sim.get("nccl.sweep_max_bytes") <= 16 * 1024 * 1024


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_gpu_profiles_declare_every_known_check(name):
    assert set(load_profile(name).get("checks")) == known_checks()


SPEC_TABLE = [
    # (dotted key, A100, H100, H200)
    ("nccl.allreduce_busbw_floor_gb_per_s", 228, 460, 431),
    ("pcie.h2d_floor_gb_per_s", 21, 48, 48),
    ("pcie.d2h_floor_gb_per_s", 21, 48, 48),
    ("nvlink.p2p_floor_gb_per_s", 238, 335, 335),
    ("rdma.loopback_floor_gbit_per_s", 180, 380, 360),
    ("rdma.rate_gbit_per_s", 200, 400, 400),
    ("rdma.message_bytes", 8388608, 8388608, 8388608),
    ("nvlink.links_per_gpu", 12, 18, 18),
    ("pcie.gen", 4, 5, 5),
    ("pcie.width", 16, 16, 16),
    ("gpu.peak_tflops.bf16", 312, 989, 989),
    ("dcgm.targeted_power_w", 399, 700, 700),
    ("gpu.pci_device_id", 0x20B2, 0x2330, 0x2335),
    ("gpu.count", 8, 8, 8),
    ("nvlink.nvswitch", True, True, True),
    ("warning_band", 0.05, 0.05, 0.05),
]


@pytest.mark.parametrize(("key", "a100", "h100", "h200"), SPEC_TABLE, ids=[r[0] for r in SPEC_TABLE])
def test_spec_table_values_are_in_the_right_profiles(key, a100, h100, h200):
    got = {n: load_profile(n).get(key) for n in GPU_PROFILES}
    assert got == {"a100-sxm-8": a100, "h100-sxm-8": h100, "h200-sxm-8": h200}


def test_cpu_only_expects_no_gpu_nvlink_or_rdma():
    p = load_profile("cpu-only")
    assert p.expected_gpus == 0
    assert p.get("nvlink.links_per_gpu") == 0
    assert p.get("nvlink.nvswitch") is False
    assert p.get("rdma.ports") == ()
    for key in ("gpu.product_name", "pcie.gen", "rdma.loopback_floor_gbit_per_s",
                "nccl.allreduce_busbw_floor_gb_per_s", "nvlink.p2p_floor_gb_per_s"):
        assert p.get(key) is None, key


def test_default_nccl_sweep_reaches_exactly_2_gib_and_judges_only_that_size():
    for name in GPU_PROFILES:
        p = load_profile(name)
        lo, hi, f = (p.get(f"nccl.sweep_{k}") for k in ("min_bytes", "max_bytes", "factor"))
        sizes = []
        size = lo
        while size <= hi:
            sizes.append(size)
            size *= f
        assert sizes[0] == 8 and sizes[-1] == 2 * 1024**3
        assert [s for s in sizes if s >= p.get("nccl.large_message_min_bytes")] == [2 * 1024**3]


def test_rdma_ports_expected_at_ndr_are_eight_device_port_pairs():
    ports = load_profile("h100-sxm-8").get("rdma.ports")
    assert len(ports) == 8
    assert all(re.fullmatch(r"mlx5_\d+:1", p) for p in ports)


MATCH_TABLE = [
    (["NVIDIA H100 80GB HBM3"] * 8, "h100-sxm-8"),
    (["NVIDIA H100 80GB HBM3"] * 4, "h100-sxm-8"),  # partial machine: config sets expected_gpus
    (["NVIDIA A100-SXM4-80GB"] * 8, "a100-sxm-8"),
    (["NVIDIA H200"] * 8, "h200-sxm-8"),
    (["nvidia h100 80gb hbm3"], "h100-sxm-8"),
    ([], "cpu-only"),
    (["NVIDIA H100 PCIe"], None),
    (["NVIDIA H100 NVL"], None),
    (["NVIDIA H200 NVL"], None),
    (["NVIDIA GH200 480GB"], None),
    (["NVIDIA A100-SXM4-40GB"], None),
    (["NVIDIA A100 80GB PCIe"], None),
    (["NVIDIA B200"], None),
    (["NVIDIA H100 80GB HBM3", "NVIDIA H200"], None),  # mixed node
    (["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"], None),
]


@pytest.mark.parametrize(("names", "want"), MATCH_TABLE,
                         ids=[f"{'+'.join(sorted(set(n))) or 'no-gpu'}" for n, _ in MATCH_TABLE])
def test_auto_match_by_nvml_product_name(names, want):
    found = match_profile(names)
    assert (found.name if found else None) == want


def _fixture_names(fixtures_dir: Path) -> list[tuple[str, str]]:
    """(file, product name) pairs from real nvidia-smi captures."""
    out = []
    smi = fixtures_dir / "nvidia_smi"
    for path in sorted(smi.glob("*nvidia-smi-q_*H100*")):
        for m in re.finditer(r"Product Name\s*:\s*(.+)", path.read_text(errors="replace")):
            out.append((path.name, m.group(1).strip()))
    for path in sorted(smi.glob("*A100-SXM4-80GB*.xml")):
        for m in re.finditer(r"<product_name>(.+?)</product_name>", path.read_text()):
            out.append((path.name, m.group(1).strip()))
    return out


def test_auto_match_on_product_names_from_real_nvidia_smi_output(fixtures_dir):
    pairs = _fixture_names(fixtures_dir)
    names = {n for _, n in pairs}
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"} <= names
    expected = {"NVIDIA H100 80GB HBM3": "h100-sxm-8", "NVIDIA A100-SXM4-80GB": "a100-sxm-8"}
    for name in names:
        assert match_profile([name]).name == expected[name], name


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_each_profile_matches_its_own_product_name_and_no_other(name):
    p = load_profile(name)
    product = p.get("gpu.product_name")
    assert match_profile([product] * p.expected_gpus) == p
    others = [load_profile(n) for n in SHIPPED if n != name]
    assert match_profile([product], others) is None


def test_auto_match_prefers_a_user_profile_with_a_more_specific_pattern(tmp_path):
    data = shipped_dict("h100-sxm-8")
    data.update(name="h100-site", match=["NVIDIA H100 80GB HBM3"])
    site = load_profile(str(write_profile(tmp_path, data)))
    shipped = [load_profile(n) for n in SHIPPED]
    assert match_profile(["NVIDIA H100 80GB HBM3"], [*shipped, site]).name == "h100-site"


@pytest.mark.parametrize(("text", "line"), [
    ("schema: 1\nname: x\n  gpu: 3\n", 3),
    ("schema: 1\nname: [unclosed\n", 3),
    ("schema: 1\nname: a\nname: b\n", 3),  # duplicate key
], ids=["bad-indent", "unclosed-list", "duplicate-key"])
def test_malformed_profile_yaml_names_the_line(tmp_path, text, line):
    path = write_profile(tmp_path, text)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert err.value.line == line
    assert f"line {line}" in str(err.value)


def test_empty_profile_file_is_refused(tmp_path):
    with pytest.raises(ProfileError, match="empty profile"):
        load_profile(str(write_profile(tmp_path, "")))


def test_missing_profile_file_and_unknown_name(tmp_path):
    with pytest.raises(ProfileError, match="file not found"):
        load_profile(str(tmp_path / "b200.yaml"))
    with pytest.raises(ProfileError, match=r"unknown profile 'h100'.*did you mean 'h100-sxm-8'"):
        load_profile("h100")


def test_a_measured_baseline_profile_from_the_docs_loads(tmp_path):
    """docs/configuration.md's B200 example is a valid user profile (docs cannot drift)."""
    text = (REPO / "docs" / "configuration.md").read_text()
    block = re.search(r"<!-- example: profile -->\s*```yaml\n(.*?)```", text, re.S)
    assert block, "docs/configuration.md lost its profile example"
    p = load_profile(str(write_profile(tmp_path, block.group(1), "b200.yaml")))
    assert p.name == "b200-baseline"
    assert match_profile(["NVIDIA B200"] * 8, [p]) == p
    assert match_profile(["NVIDIA GB200"], [p]) is None


def test_importing_profiles_and_config_loads_no_heavy_module():
    code = textwrap.dedent("""
        import sys
        import gpu_monitor.profiles, gpu_monitor.config
        gpu_monitor.profiles.load_profile("h100-sxm-8")
        heavy = [m for m in ("torch", "pynvml", "kubernetes") if m in sys.modules]
        assert not heavy, heavy
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@settings(deadline=None, derandomize=True, max_examples=150)
@given(st.binary(max_size=200))
def test_load_profile_raises_only_profile_errors_on_any_bytes(data):
    load_any_bytes(load_profile, data, "p.yaml", ProfileError)
