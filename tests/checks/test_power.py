"""power over the simulated node: the window at the power limit, NVML errors, and the walkthrough
in docs/architecture.md ("Adding a check"): the check is listed, documented and exported."""

from __future__ import annotations

import json

from prometheus_client.exposition import generate_latest

from checks.power import Power, at_limit_seconds
from gpu_monitor import docs_gen
from gpu_monitor.daemon import Daemon, build_registry
from gpu_monitor.model import Status
from tests.checks.rig import healthy_poll, rig_fixture

rig = rig_fixture(Power)


def test_a_healthy_node_is_ok_with_the_draw_and_the_limit_in_details(rig):
    r = healthy_poll(rig())
    assert len(r) == 8 and all(x.status is Status.OK for x in r.values())
    d = r["gpu:0"].details
    assert d["power_watts"] == 70.0 and d["power_limit_watts"] == 700.0
    assert d["window"] == "instantaneous" and d["at_limit_now"] is False


def test_a_gpu_held_at_its_limit_for_most_of_the_window_is_degraded(rig):
    r = rig("power-limit@gpu:4")
    first = r.poll()
    # One sample is a moment, not "most of a window".
    assert first["gpu:4"].status is Status.OK and first["gpu:4"].details["at_limit_now"]
    early = r.run_until(290)
    assert early["gpu:4"].status is Status.OK  # 290 s of 600: not more than half yet
    late = r.run_until(320)
    res = late["gpu:4"]
    assert res.status is Status.DEGRADED and res.reason == "PowerAtLimit"
    assert res.details["at_limit_fraction"] > 0.5 and res.details["window"] == "partial"
    assert "700 W power limit" in res.message
    assert all(late[f"gpu:{i}"].status is Status.OK for i in range(8) if i != 4)


def test_the_fraction_is_a_setting(rig):
    r = rig("power-limit@gpu:1", overrides={"checks": {"power": {"at_limit_fraction": 0.1}}})
    r.poll()
    res = r.run_until(70)
    assert res["gpu:1"].status is Status.DEGRADED
    assert res["gpu:1"].details["at_limit_fraction_degraded"] == 0.1


def test_below_the_ratio_is_not_at_the_limit(rig):
    r = rig("power-limit@gpu:2,pct=90")
    r.poll()
    res = r.run_until(600)
    assert res["gpu:2"].status is Status.OK and res["gpu:2"].details["at_limit_s"] == 0


def test_gaps_credit_nothing_and_the_window_clips():
    assert at_limit_seconds([[0, 1.0], [10, 1.0], [200, 1.0]], 0, 60) == (10.0, 10.0)
    assert at_limit_seconds([[0, 1.0], [10, 0.0]], 5, 60) == (2.5, 5.0)


def test_an_unreadable_draw_is_unknown_naming_the_call(rig):
    r = rig("nvml-error@gpu:3,call=nvmlDeviceGetPowerUsage,error=Unknown").poll()
    assert r["gpu:3"].status is Status.UNKNOWN and r["gpu:3"].reason == "NvmlReadError"
    assert "nvmlDeviceGetPowerUsage" in r["gpu:3"].details["nvml_call"]


def test_no_power_reading_or_no_limit_is_skipped_not_supported(rig):
    r = rig("nvml-error@gpu:3,call=nvmlDeviceGetPowerUsage,error=NotSupported",
            "nvml-error@gpu:5,call=nvmlDeviceGetEnforcedPowerLimit,error=NotSupported").poll()
    for target in ("gpu:3", "gpu:5"):
        assert r[target].status is Status.SKIPPED and r[target].reason == "NotSupported"
    assert r["gpu:5"].details["power_watts"] == 70.0  # the draw is still exported


# --- the walkthrough: listed, documented, exported ----------------------------------------------

def test_the_check_is_listed(capsys):
    from gpu_monitor.cli import main

    assert main(["list-checks", "--output", "json"]) == 0
    listed = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert "power" in listed and "PowerAtLimit" in listed["power"]["reasons"]


def test_the_check_is_in_the_generated_docs():
    assert "\n## power\n" in docs_gen.checks_md()
    config = docs_gen.configuration_md()
    assert "`checks.power.at_limit_fraction`" in config and "`checks.power.window_s`" in config
    assert "`gpu_monitor_gpu_power_watts`" in docs_gen.metrics_md()


def test_the_check_is_on_metrics(rig):
    r = rig("power-limit@gpu:4")
    daemon = Daemon([r.check], r.ctx())
    try:
        daemon.tick(wait=True)
        text = generate_latest(build_registry(daemon, r.store, [Power], r.clock)).decode()
    finally:
        daemon.shutdown()
    assert "# TYPE gpu_monitor_gpu_power_watts gauge" in text
    assert [line for line in text.splitlines()
            if line.startswith("gpu_monitor_gpu_power_watts{gpu=\"4\"")][0].endswith(" 700.0")
    assert "gpu_monitor_gpu_power_limit_watts{gpu=\"0\"" in text
