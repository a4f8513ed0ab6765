"""Per-SKU profiles: the shipped files load exactly as the daemon loads them, carry the public
per-SKU numbers, match real NVML names, and every malformed profile is refused with the field
named."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from gpu_monitor.profiles import (
    CHECK_SETTINGS,
    COMMON_CHECK_KEYS,
    KNOWN_CHECKS,
    Profile,
    ProfileError,
    list_profiles,
    load_profile,
    match_profile,
    profile_keys,
)

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("a100-sxm-8", "cpu-only", "h100-sxm-8", "h200-sxm-8")
GPU_PROFILES = ("a100-sxm-8", "h100-sxm-8", "h200-sxm-8")
PROFILE_DIR = REPO / "gpu_monitor" / "profiles"


def _shipped_dict(name: str) -> dict:
    return yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())


def _write(tmp_path: Path, data, name: str = "custom.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


# --- the shipped profiles ------------------------------------------------------------------------


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
    copy = _write(tmp_path, src.read_text(), f"{name}.yaml")
    assert load_profile(str(copy)) == load_profile(name)


@pytest.mark.parametrize("name", list_profiles())
def test_every_shipped_simulation_block_merges_into_a_valid_profile(name):
    sim = load_profile(name).for_simulation()
    assert sim.simulated
    assert sim.get("nccl.sweep_max_bytes") <= 16 * 1024 * 1024


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_gpu_profiles_declare_every_known_check(name):
    assert set(load_profile(name).get("checks")) == KNOWN_CHECKS


# The SPEC-CHECKS per-SKU table, row by row, plus the facts beside it.
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


# --- --profile auto ------------------------------------------------------------------------------

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
    data = _shipped_dict("h100-sxm-8")
    data.update(name="h100-site", match=["NVIDIA H100 80GB HBM3"])
    site = load_profile(str(_write(tmp_path, data)))
    shipped = [load_profile(n) for n in SHIPPED]
    assert match_profile(["NVIDIA H100 80GB HBM3"], [*shipped, site]).name == "h100-site"


# --- the Profile value ---------------------------------------------------------------------------


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
    assert p.check_setting("burn_in", "no_such_key") is None
    assert p.check_setting("xid", "links_per_gpu") is None  # xid is not judged on nvlink
    assert p.check_setting("unknown_check", "duration_s") is None


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


# --- refusing bad profiles -----------------------------------------------------------------------


def _mutate(path: str, value):
    def apply(data):
        *parents, last = path.split(".")
        cur = data
        for p in parents:
            cur = cur.setdefault(p, {})
        if value is _DELETE:
            del cur[last]
        else:
            cur[last] = value
        return data
    return apply


_DELETE = object()

BAD_PROFILES = [
    # (id, mutation, field path in the error, words in the message)
    ("links_not_int", _mutate("nvlink.links_per_gpu", "x"), "nvlink.links_per_gpu",
     "expected a non-negative integer, got 'x'"),
    ("unknown_section", _mutate("nvlinks", {}), "nvlinks", "did you mean 'nvlink'"),
    ("unknown_key", _mutate("pcie.widht", 16), "pcie.widht", "did you mean 'width'"),
    ("negative_floor", _mutate("pcie.h2d_floor_gb_per_s", -1), "pcie.h2d_floor_gb_per_s",
     "expected a number >= 0"),
    ("pcie_gen_out_of_range", _mutate("pcie.gen", 9), "pcie.gen", "from 1 to 7"),
    ("missing_required", _mutate("gpu.count", _DELETE), "gpu.count", "required key is missing"),
    ("missing_section", _mutate("nccl", _DELETE), "nccl", "required key is missing"),
    ("null_not_allowed", _mutate("nvlink.links_per_gpu", None), "nvlink.links_per_gpu",
     "got null"),
    ("bool_is_not_a_count", _mutate("gpu.count", True), "gpu.count", "got True"),
    ("warning_band_above_1", _mutate("warning_band", 1.5), "warning_band", "in [0, 1]"),
    ("unquoted_version", _mutate("gpu.min_cuda_version", 12.2), "gpu.min_cuda_version",
     'quote it: "12.2"'),
    ("bad_dtype", _mutate("checks.burn_in.dtypes", ["int8"]), "checks.burn_in.dtypes[0]",
     "one of 'bf16'"),
    ("empty_dtypes", _mutate("checks.burn_in.dtypes", []), "checks.burn_in.dtypes",
     "at least 1 item"),
    ("check_name_typo", _mutate("checks.burnin", {"duration_s": 1}), "checks.burnin",
     "did you mean 'burn_in'"),
    ("check_key_typo", _mutate("checks.burn_in.duration", 1), "checks.burn_in.duration",
     "did you mean 'duration_s'"),
    ("bad_rdma_port", _mutate("rdma.ports", ["mlx5_0"]), "rdma.ports[0]", "device:port"),
    ("degraded_above_failed", _mutate("checks.throttle.degraded_fraction", 0.5),
     "checks.throttle.degraded_fraction", "above checks.throttle.failed_fraction"),
    ("sweep_inverted", _mutate("nccl.sweep_min_bytes", 2**40), "nccl.sweep_min_bytes",
     "above nccl.sweep_max_bytes"),
    ("bad_simulation_value", _mutate("simulation.nccl.sweep_factor", 1),
     "simulation.nccl.sweep_factor", "an integer >= 2"),
    ("unknown_simulation_key", _mutate("simulation.gpus", {}), "simulation.gpus",
     "did you mean 'gpu'"),
    ("simulation_breaks_an_order", _mutate("simulation.nccl.sweep_max_bytes", 4),
     "nccl.sweep_min_bytes", "after merging the simulation block"),
    ("ib_timeout_range", _mutate("checks.rdma_ports.nccl_ib_timeout", 40),
     "checks.rdma_ports.nccl_ib_timeout", "from 1 to 31"),
    ("match_not_list", _mutate("match", "H100"), "match", "expected a list"),
    ("bad_name", _mutate("name", "H100 SXM"), "name", "lower-case name"),
]


@pytest.mark.parametrize(("mutate", "field", "words"), [b[1:] for b in BAD_PROFILES],
                         ids=[b[0] for b in BAD_PROFILES])
def test_invalid_profile_is_refused_naming_the_field(tmp_path, mutate, field, words):
    path = _write(tmp_path, mutate(_shipped_dict("h100-sxm-8")))
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    problems = dict(err.value.problems)
    assert field in problems, str(err.value)
    assert words in problems[field]
    assert str(err.value).startswith(f"profile {path}: ")


def test_every_problem_is_reported_at_once(tmp_path):
    data = _shipped_dict("h100-sxm-8")
    data["nvlink"]["links_per_gpu"] = "x"
    data["pcie"]["gen"] = 0
    path = _write(tmp_path, data)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert {p for p, _ in err.value.problems} == {"nvlink.links_per_gpu", "pcie.gen"}
    assert len(str(err.value).splitlines()) == 2


def test_plugin_check_settings_are_accepted_in_a_profile(tmp_path):
    data = _shipped_dict("h100-sxm-8")
    data["checks"]["vendor_fan_speed"] = {"min_rpm": 3000, "fans": ["a", "b"]}
    p = load_profile(str(_write(tmp_path, data)))
    assert p.check_setting("vendor_fan_speed", "min_rpm") == 3000


def test_unsupported_schema_version_is_named(tmp_path):
    data = _shipped_dict("h100-sxm-8")
    data["schema"] = 2
    with pytest.raises(ProfileError, match=r"schema: unsupported schema version 2"):
        load_profile(str(_write(tmp_path, data)))


@pytest.mark.parametrize(("text", "line"), [
    ("schema: 1\nname: x\n  gpu: 3\n", 3),
    ("schema: 1\nname: [unclosed\n", 3),
    ("schema: 1\nname: a\nname: b\n", 3),  # duplicate key
], ids=["bad-indent", "unclosed-list", "duplicate-key"])
def test_malformed_profile_yaml_names_the_line(tmp_path, text, line):
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert err.value.line == line
    assert f"line {line}" in str(err.value)


def test_empty_profile_file_is_refused(tmp_path):
    with pytest.raises(ProfileError, match="empty profile"):
        load_profile(str(_write(tmp_path, "")))


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
    p = load_profile(str(_write(tmp_path, block.group(1), "b200.yaml")))
    assert p.name == "b200-baseline"
    assert match_profile(["NVIDIA B200"] * 8, [p]) == p
    assert match_profile(["NVIDIA GB200"], [p]) is None


# --- docs and import hygiene ---------------------------------------------------------------------


def test_docs_list_every_profile_key():
    text = (REPO / "docs" / "configuration.md").read_text()
    dtype_children = re.compile(r"\.(peak_tflops|reference_tolerance)\.")
    missing = []
    for key in profile_keys():
        if key.startswith("simulation.") or dtype_children.search(key):
            continue
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "checks" and parts[2] in COMMON_CHECK_KEYS:
            continue  # documented once for every check block
        if f"`{key}`" not in text:
            missing.append(key)
    assert not missing, f"docs/configuration.md does not document: {missing}"


def test_every_known_check_has_a_settings_entry_and_a_docs_mention():
    text = (REPO / "docs" / "configuration.md").read_text()
    for check in CHECK_SETTINGS:
        assert check in text, check


def test_importing_profiles_and_config_loads_no_heavy_module():
    code = textwrap.dedent("""
        import sys
        import gpu_monitor.profiles, gpu_monitor.config
        gpu_monitor.profiles.load_profile("h100-sxm-8")
        heavy = [m for m in ("torch", "pynvml", "kubernetes") if m in sys.modules]
        assert not heavy, heavy
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_profile_is_constructible_from_plain_data_for_tests():
    data = load_profile("cpu-only").to_dict()
    data["gpu"]["count"] = 2
    p = Profile(data)
    assert p.expected_gpus == 2
    with pytest.raises(TypeError):
        p.data["gpu"]["count"] = 3  # type: ignore[index]
