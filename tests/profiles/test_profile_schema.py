"""The profile schema (profiles/profile_schema.py): every malformed profile is refused with the
field named, every problem at once, and the docs list every key it has."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_monitor.profiles import (
    COMMON_CHECK_KEYS,
    Profile,
    ProfileError,
    check_settings,
    load_profile,
    profile_keys,
    profile_schema,
    validate_profile,
)
from tests.conftest import REPO
from tests.profiles.profile_files import (
    shipped_dict,
    write_profile,
)


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
    path = write_profile(tmp_path, mutate(shipped_dict("h100-sxm-8")))
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    problems = dict(err.value.problems)
    assert field in problems, str(err.value)
    assert words in problems[field]
    assert str(err.value).startswith(f"profile {path}: ")


def test_every_problem_is_reported_at_once(tmp_path):
    data = shipped_dict("h100-sxm-8")
    data["nvlink"]["links_per_gpu"] = "x"
    data["pcie"]["gen"] = 0
    path = write_profile(tmp_path, data)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert {p for p, _ in err.value.problems} == {"nvlink.links_per_gpu", "pcie.gen"}
    assert len(str(err.value).splitlines()) == 2


def test_plugin_check_settings_are_accepted_in_a_profile(tmp_path):
    data = shipped_dict("h100-sxm-8")
    data["checks"]["vendor_fan_speed"] = {"min_rpm": 3000, "fans": ["a", "b"]}
    p = load_profile(str(write_profile(tmp_path, data)))
    assert p.check_setting("vendor_fan_speed", "min_rpm") == 3000


def test_unsupported_schema_version_is_named(tmp_path):
    data = shipped_dict("h100-sxm-8")
    data["schema"] = 2
    with pytest.raises(ProfileError, match=r"schema: unsupported schema version 2"):
        load_profile(str(write_profile(tmp_path, data)))


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
