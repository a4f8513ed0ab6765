"""A check's declared settings (profiles/settings.py): the common, own and section keys, each typed
in a profile."""

from __future__ import annotations

import pytest

from gpu_monitor.profiles import (
    COMMON_CHECK_KEYS,
    ProfileError,
    declared_settings,
    load_profile,
    profile_schema,
)
from tests.profiles.profile_files import (
    shipped_dict,
    write_profile,
)


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
    data = shipped_dict("h100-sxm-8")
    data["checks"].setdefault("pcie_aer", {})["boot_grace_s"] = "soon"  # a default: not listed
    with pytest.raises(ProfileError) as err:
        load_profile(str(write_profile(tmp_path, data)))
    assert err.value.field == "checks.pcie_aer.boot_grace_s"
