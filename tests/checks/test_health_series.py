"""The health series the checks export (ECC, row remapping, NVLink, PCIe links and AER, the
throttle window): each built from a real check's results on the simulated node, through the real
collector, so a fault shows up as its value and a reading that failed shows up as no sample.
"""

from __future__ import annotations

from datetime import timezone

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from checks.ecc_memory import EccMemory
from checks.nvlink_state import (
    COUNTERS,
    NvlinkState,
    link_error_samples,
    link_errors,
    link_up_samples,
)
from checks.pcie_aer import PcieAer
from checks.throttle import Throttle
from gpu_monitor.metric_families import LatestResult
from gpu_monitor.metrics import StoreCollector
from gpu_monitor.model import RunOutcome
from tests.checks.rig import CheckRig

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def series(rig: CheckRig, results) -> Series:
    """What /metrics serves for the rig's check after ``results`` were stored."""
    now = rig.clock.now().astimezone(timezone.utc)
    rig.store.record_run(RunOutcome(rig.check.name, tuple(results.values()), now, 0.0, True))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(rig.store, [type(rig.check)], now=rig.clock.now))
    out: Series = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "uuid")))] = \
                s.value
    return out


def named(out: Series, name: str) -> dict[tuple, float]:
    return {labels: v for (n, labels), v in out.items() if n == name}


# --- ECC and row remapping -----------------------------------------------------------------------


def test_ecc_counts_are_counters_per_type_and_a_fault_shows_its_count(check_rig):
    rig = check_rig(EccMemory, "ecc-uncorrectable@gpu:1,count=3")
    out = series(rig, rig.poll())
    vol = named(out, "gpu_monitor_gpu_ecc_volatile_errors_total")
    assert vol[(("gpu", "1"), ("type", "uncorrected"))] == 3.0
    assert vol[(("gpu", "0"), ("type", "uncorrected"))] == 0.0
    assert len(vol) == 16 and len(named(out, "gpu_monitor_gpu_ecc_aggregate_errors_total")) == 16


def test_ecc_counts_nvml_could_not_read_have_no_sample(check_rig):
    rig = check_rig(EccMemory, "nvml-error@gpu:2,call=nvmlDeviceGetTotalEccErrors,error=Unknown")
    out = series(rig, rig.poll())
    for name in ("gpu_monitor_gpu_ecc_volatile_errors_total",
                 "gpu_monitor_gpu_ecc_aggregate_errors_total"):
        gpus = {dict(labels)["gpu"] for labels in named(out, name)}
        assert "2" not in gpus and "3" in gpus, name


def test_row_remap_pending_failure_and_a_gauge_per_availability_level(check_rig):
    rig = check_rig(EccMemory, "row-remap-pending@gpu:2", "row-remap-failure@gpu:4",
                    "remap-headroom@gpu:5,low=9,none=2")
    out = series(rig, rig.poll())
    pending = named(out, "gpu_monitor_gpu_row_remap_pending")
    failure = named(out, "gpu_monitor_gpu_row_remap_failure")
    assert pending[(("gpu", "2"),)] == 1.0 and pending[(("gpu", "3"),)] == 0.0
    assert failure[(("gpu", "4"),)] == 1.0 and failure[(("gpu", "2"),)] == 0.0
    banks = named(out, "gpu_monitor_gpu_row_remap_banks")
    assert banks[(("gpu", "5"), ("level", "none"))] == 2.0
    assert banks[(("gpu", "5"), ("level", "low"))] == 9.0
    assert {dict(k)["level"] for k in banks} == {"max", "high", "partial", "low", "none"}
    assert not any(n.startswith("gpu_monitor_gpu_row_remap_banks_bucket") for n, _ in out)


# --- NVLink --------------------------------------------------------------------------------------


def test_link_errors_keep_only_links_with_a_count_or_a_counter_not_read():
    counters = {0: dict.fromkeys(COUNTERS, 0), 1: {**dict.fromkeys(COUNTERS, 0), "replay": 7},
                2: {"replay": 0, "recovery": 0, "crc_flit": 0}}
    assert link_errors(counters) == {"1": [7, 0, 0, 0], "2": [0, 0, 0, None]}


def _gpu_result(**details) -> LatestResult:
    base = {"uuid": "GPU-x", "links_found": 3, "links_expected": 3, "down_links": [],
            "missing_links": [], "unknown_links": []}
    return LatestResult("nvlink_state", "gpu:0", "ok", "Ok", {**base, **details})


def test_an_unsupported_counter_and_a_result_from_before_the_counters_were_kept_have_no_sample():
    r = _gpu_result(link_errors={"1": [4, 0, 0, None]})
    got = {tuple(labels[2:]): v for labels, v in link_error_samples([r], None)}
    assert got[("1", "replay")] == 4.0 and got[("0", "crc_data")] == 0.0
    assert ("1", "crc_data") not in got and len(got) == 3 * 4 - 1
    older = _gpu_result()  # no link_errors key: an older daemon's stored result
    assert list(link_error_samples([older], None)) == []
    assert len(list(link_up_samples([older], None))) == 3


def test_nvlink_state_and_counters_per_link(check_rig):
    rig = check_rig(NvlinkState, "nvlink-down@gpu:0,link=4")
    out = series(rig, rig.poll())
    up = named(out, "gpu_monitor_nvlink_link_up")
    assert len(up) == 8 * 18
    assert up[(("gpu", "0"), ("link", "4"))] == 0.0
    assert up[(("gpu", "0"), ("link", "5"))] == 1.0
    errors = named(out, "gpu_monitor_nvlink_errors_total")
    assert len(errors) == (8 * 18 - 1) * len(COUNTERS)  # the down link's counters: no sample
    assert errors[(("gpu", "0"), ("link", "5"), ("type", "crc_flit"))] == 0.0
    assert not any(dict(k)["link"] == "4" and dict(k)["gpu"] == "0" for k in errors)


def test_nvlink_counters_grow_with_the_nvml_counters(check_rig):
    rig = check_rig(NvlinkState)
    rig.node.spec.gpus[3].nvlink_errors.update({(2, "replay"): 11, (2, "crc_data"): 2})
    rig.sync()
    errors = named(series(rig, rig.poll()), "gpu_monitor_nvlink_errors_total")
    assert errors[(("gpu", "3"), ("link", "2"), ("type", "replay"))] == 11.0
    assert errors[(("gpu", "3"), ("link", "2"), ("type", "crc_data"))] == 2.0
    assert errors[(("gpu", "3"), ("link", "2"), ("type", "recovery"))] == 0.0


def test_an_nvlink_gpu_that_cannot_be_read_has_no_link_series(check_rig):
    rig = check_rig(NvlinkState, "nvml-error@gpu:6,call=nvmlDeviceGetNvLinkState,error=Unknown")
    out = series(rig, rig.poll())
    for name in ("gpu_monitor_nvlink_link_up", "gpu_monitor_nvlink_errors_total"):
        assert not any(dict(k)["gpu"] == "6" for k in named(out, name)), name


# --- PCIe ----------------------------------------------------------------------------------------


def test_pcie_links_aer_and_replays_per_function(check_rig):
    rig = check_rig(PcieAer, "pcie-downgrade@gpu:2,gen=3,width=8", "aer@gpu:1,kind=fatal")
    out = series(rig, rig.poll())
    gen = named(out, "gpu_monitor_pcie_link_generation")
    width = named(out, "gpu_monitor_pcie_link_width")
    gpu2 = next(k for k in gen if dict(k)["gpu"] == "2")
    assert gen[gpu2] == 3.0 and width[gpu2] == 8.0
    assert named(out, "gpu_monitor_pcie_link_max_generation")[gpu2] == 5.0
    assert named(out, "gpu_monitor_pcie_link_max_width")[gpu2] == 16.0
    assert len(gen) == 8 + 4 + 8  # GPUs, NVSwitches, NICs
    aer = named(out, "gpu_monitor_pcie_aer_errors_total")
    fatal = {dict(k)["gpu"]: v for k, v in aer.items() if dict(k)["severity"] == "fatal"}
    assert fatal["1"] >= 1.0 and fatal["0"] == 0.0
    non_gpu = [k for k in gen if dict(k)["gpu"] == ""]
    assert len(non_gpu) == 12  # an NVSwitch or NIC function: gpu and uuid empty
    replays = named(out, "gpu_monitor_pcie_replays_total")
    assert sorted(dict(k)["gpu"] for k in replays) == [str(i) for i in range(8)]


def test_a_replay_counter_nvml_could_not_read_has_no_sample(check_rig):
    rig = check_rig(PcieAer, "nvml-error@gpu:3,call=nvmlDeviceGetPcieReplayCounter,error=Unknown")
    results = rig.poll()
    out = series(rig, results)
    replays = {dict(k)["gpu"] for k in named(out, "gpu_monitor_pcie_replays_total")}
    assert "3" not in replays and "4" in replays
    gpu3 = next(r for r in results.values() if r.details.get("gpu_index") == 3)
    assert "replay_counter_error" in gpu3.details


# --- throttle ------------------------------------------------------------------------------------


def test_the_throttle_fraction_is_absent_until_the_window_has_history(check_rig):
    rig = check_rig(Throttle, "throttle@gpu:5,event=hw_thermal_slowdown")
    first = named(series(rig, rig.poll()), "gpu_monitor_gpu_clock_event_active_ratio")
    assert first == {}  # one instantaneous sample: no fraction to report (not 0)
    rig.run_until(120)
    ratio = named(series(rig, rig.step()), "gpu_monitor_gpu_clock_event_active_ratio")
    hot = ratio[(("event", "hw_thermal_slowdown"), ("gpu", "5"))]
    assert 0.2 <= hot <= 0.23  # ~130 s of a 600 s window
    assert ratio[(("event", "hw_thermal_slowdown"), ("gpu", "4"))] == 0.0
    assert {dict(k)["event"] for k in ratio} == {"hw_slowdown", "hw_thermal_slowdown",
                                                 "hw_power_brake"}
