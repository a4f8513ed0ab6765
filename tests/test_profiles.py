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
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.profiles import (
    COMMON_CHECK_KEYS,
    Profile,
    ProfileError,
    SchemaError,
    UndeclaredSetting,
    check_settings,
    declared_settings,
    known_checks,
    list_profiles,
    load_profile,
    match_profile,
    profile_keys,
    profile_schema,
    validate_profile,
)
from gpu_monitor.profiles.schema import MAX_SECONDS, SECONDS, SECONDS0, Int, Num, validate
from gpu_monitor.profiles.yaml_reader import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    read_text,
    read_yaml,
)
from tests.fuzz import load_any_bytes

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
    assert set(load_profile(name).get("checks")) == known_checks()


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
    for check in check_settings():
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


# --- reading the file: the shared reader and YAML loader -----------------------------------------


def _read_error(tmp_path: Path, body: str | bytes) -> ProfileError:
    path = tmp_path / "p.yaml"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert str(err.value).startswith(f"profile {path}: ")
    return err.value


def test_read_text_refuses_what_is_not_a_small_utf8_file(tmp_path):
    with pytest.raises(SchemaError, match="file not found"):
        read_text(tmp_path / "nope.yaml", "f")
    with pytest.raises(SchemaError, match="is a directory, not a file"):
        read_text(tmp_path, "f")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(SchemaError, match=f"larger than {MAX_FILE_BYTES} bytes"):
        read_text(big, "f")
    ok = tmp_path / "ok.yaml"
    ok.write_bytes(b"#" * MAX_FILE_BYTES)  # exactly at the bound: read
    assert len(read_text(ok, "f")) == MAX_FILE_BYTES


def test_a_profile_that_is_not_utf8_names_the_byte_and_line(tmp_path):
    """The issue's case: this was a UnicodeDecodeError traceback."""
    err = _read_error(tmp_path, "schema: 1\nname: caf\xe9\n".encode("latin-1"))
    assert "not UTF-8 text: invalid continuation byte at byte 19 (line 2)" in str(err)
    assert err.line == 2


def _nest(levels: int) -> str:
    return "a: " + "[" * (levels - 1) + "]" * (levels - 1) + "\n"


def test_nesting_up_to_the_bound_parses_and_beyond_it_is_refused():
    """The issue's case: deep nesting was a RecursionError. ``a: [[...]]`` with n - 1
    brackets is n levels (the top mapping is one)."""
    assert read_yaml(_nest(MAX_DEPTH), "f") is not None
    with pytest.raises(SchemaError, match=f"nested deeper than {MAX_DEPTH} levels") as err:
        read_yaml(_nest(MAX_DEPTH + 1), "f")
    assert err.value.field == "a" + "[0]" * (MAX_DEPTH - 1)
    with pytest.raises(SchemaError, match="nested deeper"):
        read_yaml(_nest(20_000), "f")


def _bomb(levels: int, width: int = 10) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_aliases_are_fine_until_they_expand_past_the_bound():
    data = read_yaml(_bomb(4), "f")  # l3 expands to 10^4 values: fine
    assert len(data["l3"]) == 10 and len(data["l3"][0][0]) == 10
    with pytest.raises(SchemaError, match="alias bomb") as err:
        read_yaml(_bomb(9), "f")  # "billion laughs": 10^9 values from 9 lines
    assert err.value.field == "l4"  # the first anchor past MAX_NODES
    assert MAX_NODES < 10**5 * 1.2


def test_an_alias_deeper_than_the_bound_through_a_chain_is_refused():
    text = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n"
                                     for i in range(1, MAX_DEPTH + 2))
    with pytest.raises(SchemaError, match="with aliases expanded"):
        read_yaml(text, "f")


@pytest.mark.parametrize("text", ["a: &a [1, *a]\n", "a: &a {b: *a}\n", "a: &a {<<: *a}\n"],
                         ids=["sequence", "mapping", "merge-key"])
def test_a_recursive_alias_is_refused(text):
    with pytest.raises(SchemaError, match="recursive alias") as err:
        read_yaml(text, "f")
    assert err.value.field == "a"


@pytest.mark.parametrize(("text", "field", "words"), [
    ("gpu:\n  count: !!int eight\n", "gpu.count", "cannot read the value 'eight'"),
    ("when: 2024-13-45\n", "when", "month must be in 1..12"),
    (f"n: {'9' * 5000}\n", "n", "an integer of 5000 digits is out of range"),
    ("rdma:\n  ports: [a, !!float x]\n", "rdma.ports[1]", "cannot read the value 'x'"),
    ("a: 1\nb:\n  c: 1\n  c: 2\n", "b.c", "duplicate key 'c' (first at line 3)"),
], ids=["bad-int-tag", "impossible-date", "huge-int", "in-a-list", "duplicate-key"])
def test_values_yaml_cannot_build_name_their_field_and_line(text, field, words):
    with pytest.raises(SchemaError) as err:
        read_yaml(text, "f")
    assert err.value.field == field
    assert words in str(err.value)
    assert err.value.line is not None


def test_only_a_document_refused_for_its_size_says_refused():
    with pytest.raises(SchemaError, match="YAML refused at line"):
        read_yaml(_bomb(9), "f")
    with pytest.raises(SchemaError, match="malformed YAML at line 2"):
        read_yaml("a: 1\n\tb: 2\n", "f")


# --- the value domains ---------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "value", "ok"), [
    (Int(0), 2**63 - 1, True),
    (Int(0), 2**63, False),
    (Int(), -(2**63), False),
    (Int(0), True, False),
    (Num(0), 2**63, False),
    (Num(0), float("nan"), False),
    (Num(0), float("inf"), False),
    (Num(0), False, False),
    (SECONDS, MAX_SECONDS, True),
    (SECONDS, MAX_SECONDS + 1, False),
    (SECONDS, 0, False),
    (SECONDS0, 0, True),
    (SECONDS0, -1, False),
    (SECONDS, "30", False),
], ids=["int64-max", "past-int64", "past-int64-negative", "bool-as-int", "num-past-int64",
        "nan", "inf", "bool-as-num", "seconds-at-max", "seconds-past-max", "seconds-zero",
        "seconds0-zero", "seconds0-negative", "seconds-as-string"])
def test_number_domains(spec, value, ok):
    _, problems = validate(spec, value, path="x")
    assert (not problems) is ok, problems


def test_declared_settings_are_the_common_own_and_section_keys():
    d = declared_settings("pcie_aer")
    assert d is not None
    assert set(COMMON_CHECK_KEYS) <= set(d)
    assert {"window_s", "correctable_per_min_degraded", "boot_grace_s"} <= set(d)  # own
    assert {"gen", "width", "h2d_floor_gb_per_s"} <= set(d)  # the pcie section
    assert "links_per_gpu" not in d  # not judged on nvlink
    assert declared_settings("vendor_plugin") is None
    fabric = declared_settings("fabric_probe")
    assert fabric["small_p95_latency_limit_s"] is profile_schema().fields["fabric"].fields[
        "small_p95_latency_limit_s"]  # fabric before nccl, as check_setting looks


def test_the_issues_profile_check_setting_is_typed(tmp_path):
    data = _shipped_dict("h100-sxm-8")
    data["checks"].setdefault("pcie_aer", {})["boot_grace_s"] = "soon"  # a default: not listed
    with pytest.raises(ProfileError) as err:
        load_profile(str(_write(tmp_path, data)))
    assert err.value.field == "checks.pcie_aer.boot_grace_s"


# --- property: nothing but ProfileError escapes the loader ---------------------------------------

# Fragments of YAML that reach every part of the loader: structure, anchors and aliases, merge
# keys, explicit tags, timestamps, special floats, directives, control characters.
_FRAGMENTS = ["a", "b", ": ", ":", " ", "  ", "\n", "- ", "[", "]", "{", "}", ", ", "? ",
              "&x ", "*x", "&y ", "*y", "<<: ", "!!int ", "!!float ", "!!bool ", "!!binary ",
              "!!timestamp ", "!!set ", "!!python/name:os.system ", "!local ", "2019-19-19",
              "2024-02-30", "12:30:61", "0x", "0o9", "1_0", "9" * 5000, ".nan", ".inf", "1e999",
              "yes", "~", "'", '"', "\t", "#", "|", ">", "%YAML 1.1\n", "%TAG ! x\n", "---\n",
              "...\n", "@", "`", "\x00", "\x85", "\ufeff", "\\"]
_YAMLISH = st.lists(st.sampled_from(_FRAGMENTS), max_size=30).map("".join)


@settings(deadline=None, derandomize=True, max_examples=300)
@given(_YAMLISH)
def test_read_yaml_raises_only_schema_errors(text):
    try:
        read_yaml(text, "f")
    except SchemaError:
        pass


@settings(deadline=None, derandomize=True, max_examples=150)
@given(st.binary(max_size=200))
def test_load_profile_raises_only_profile_errors_on_any_bytes(data):
    load_any_bytes(load_profile, data, "p.yaml", ProfileError)


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=20)


@settings(deadline=None, derandomize=True, max_examples=200)
@given(st.dictionaries(st.sampled_from([*profile_schema().fields, "zz"]), _VALUES, max_size=6))
def test_profile_validation_raises_only_profile_errors(data):
    try:
        Profile(validate_profile(data, "p"))
    except ProfileError:
        pass
