"""fabric/probe_settings.py: the sweep and its limits from the profile, then the flags."""

from __future__ import annotations

from gpu_monitor.fabric.probe_settings import CPU_MAX_BYTES, ProbeSettings, resolve_settings
from gpu_monitor.profiles import load_profile


def test_settings_come_from_the_profile_and_cpu_caps_the_sweep():
    h100 = load_profile("h100-sxm-8")
    s = resolve_settings(h100, device_type="cuda", overrides={}, multi_node=True)
    assert s.sizes[0] == 8 and s.sizes[-1] == 1 << 31 and s.expect_transport == "rdma"
    assert s.busbw_floor_gb_per_s == 250 and s.small_p95_latency_limit_s == 0.001
    assert s.warning_band == 0.05
    s = resolve_settings(h100, device_type="cpu", overrides={}, multi_node=True)
    assert s.sizes[-1] <= CPU_MAX_BYTES and s.expect_transport == "any"
    s = resolve_settings(h100, device_type="cuda", overrides={"expect_transport": "auto"},
                         multi_node=False)
    assert s.expect_transport == "any"  # one node: nothing crosses the fabric
    s = resolve_settings(load_profile("cpu-only"), device_type="cpu",
                         overrides={"busbw_floor_gb_per_s": 2.0}, multi_node=True)
    assert s.busbw_floor_gb_per_s == 2.0 and s.small_p95_latency_limit_s is None
    assert ProbeSettings.from_dict(s.to_dict()) == s

