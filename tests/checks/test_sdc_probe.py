"""sdc_probe: the sdc seam, the worker's tables, the judgement, the reference, the simulated node."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from checks.sdc_probe import SdcProbe
from gpu_monitor.check import Context
from gpu_monitor.config import parse_config
from gpu_monitor.model import Action, Status
from gpu_monitor.profiles import load_profile
from gpu_monitor.runner import run_check
from gpu_monitor.sdc.probe_judge import judge
from gpu_monitor.sdc.probe_reference import (
    REFERENCE_KIND,
    ReferenceUnreadable,
    find_reference,
    read_reference,
    reference_key,
    write_reference,
)
from gpu_monitor.sdc.probe_worker import TEST_NONDETERMINISM_ENV
from gpu_monitor.sim.worker import SDC_FACTOR, Seam, sdc_forward_hook
from gpu_monitor.workers.faults import TEST_FAULT_ENV
from tests.checks.cuda_helpers import cuda_count
from tests.checks.rig import run_simulated
from tests.conftest import REPO

SETTINGS = {"seed": 1234, "batch_size": 8, "hidden_size": 64, "layers": 2}


def run_sim(count: int, faults=(), checks=None, env=None):
    """Run sdc_probe on a simulated h100 node with ``count`` devices; results by target."""
    return run_simulated(SdcProbe(), count, faults, settings=checks, env=env)


def details(result):
    """A result's details as plain JSON data (lists, dicts)."""
    return json.loads(json.dumps(result.to_dict()["details"]))


def not_ok(res):
    return {t: (r.status, r.reason) for t, r in res.items() if r.status is not Status.OK}


# --- the sdc seam (gpu_monitor/sim/worker.py) ----------------------------------------------------


def test_the_sdc_hook_exists_only_for_a_device_with_the_sdc_flag():
    assert sdc_forward_hook(None) is None
    assert sdc_forward_hook(Seam("GPU-x", 0, wrong_results=True)) is None
    assert callable(sdc_forward_hook(Seam("GPU-x", 0, sdc=True)))


def test_the_sdc_hook_multiplies_one_element_and_lets_the_gradient_through():
    import torch

    layer = torch.nn.Linear(4, 6)
    x = torch.randn(3, 4)
    clean = layer(x)
    layer.register_forward_hook(sdc_forward_hook(Seam("GPU-x", 0, sdc=True)))
    out = layer(x)
    diff = (out != clean).reshape(-1).nonzero().reshape(-1).tolist()
    i = clean.numel() // 3
    assert diff == [i]
    got, was = float(out.detach().reshape(-1)[i]), float(clean.detach().reshape(-1)[i])
    assert got == pytest.approx(was * SDC_FACTOR + 1.0)
    out.sum().backward()  # autograd still works through the corrupted output
    assert layer.weight.grad is not None


# --- the worker, in process -----------------------------------------------------------------------


def _probe(index, ring, sdc=False, environ=None, label=""):
    from gpu_monitor.sdc.probe_worker import Probe
    from gpu_monitor.workers.device import Device

    dev = Device("cpu", index, f"GPU-{index}", seam=Seam(f"GPU-{index}", index, sdc=sdc))
    return Probe(dev, index, ring, seed=1234, batch_size=8, hidden=64, layers=2, label=label,
                 environ=environ or {}).run()


def test_healthy_devices_compute_identical_tables_and_reproduce_themselves():
    a, b = _probe(0, [0, 1, 2]), _probe(2, [0, 1, 2])
    assert a["rows"] == b["rows"] and set(a["rows"]) == {"0", "1", "2"}
    assert a["again"] == a["rows"]["0"] and b["again"] == b["rows"]["2"]
    assert len({tuple(r) for r in a["rows"].values()}) == 3  # three different micro-batches
    assert a["dtype"] == "fp32" and all(len(r) == 6 for r in a["rows"].values())


def test_an_sdc_device_is_wrong_on_every_micro_batch_and_the_same_way_every_time():
    good, bad = _probe(0, [0, 1, 2]), _probe(1, [0, 1, 2], sdc=True)
    assert all(good["rows"][k] != bad["rows"][k] for k in good["rows"])
    assert bad["again"] == bad["rows"]["1"]
    assert _probe(1, [0, 1, 2], sdc=True)["rows"] == bad["rows"]


def test_the_test_only_nondeterminism_makes_a_device_disagree_with_itself():
    env = {TEST_NONDETERMINISM_ENV: "gpu:1"}
    assert _probe(0, [0, 1], environ=env, label="gpu:0")["again"] == \
        _probe(0, [0, 1])["again"]
    out = _probe(1, [0, 1], environ=env, label="gpu:1")
    assert out["again"] != out["rows"]["1"]


def test_importing_the_check_loads_no_torch():
    code = ("import sys, checks.sdc_probe, gpu_monitor.sdc.probe_worker; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


# --- the judgement (pure) -------------------------------------------------------------------------

GOOD = {b: (b, 100 + b, 0, 0, 0, 0) for b in range(8)}


def row(b, wrong=0):
    return list(GOOD[b]) if not wrong else [b, 100 + b, wrong, 0, 0, 0]


def table(n, wrong_on=None, again=None):
    """``runs`` for n devices; ``wrong_on[d]`` = the owners device d computes wrong."""
    wrong_on = wrong_on or {}
    runs = {}
    for d in range(n):
        rows = {str(b): row(b, 7 + d if b in wrong_on.get(d, ()) else 0) for b in range(n)}
        runs[d] = {"rows": rows, "again": list(rows[str(d)])}
    for d, value in (again or {}).items():
        runs[d]["again"] = value
    return runs


def findings(j):
    return {d: [(f.status, f.reason) for f in fs] for d, fs in j.devices.items() if fs}


def test_agreeing_devices_have_no_findings_and_their_rows_may_become_the_reference():
    j = judge(range(4), table(4))
    assert not findings(j) and not j.node
    assert j.agreed == {b: tuple(GOOD[b]) for b in range(4)}
    assert j.peers[0] == [1, 2, 3]


@pytest.mark.parametrize("bad", [3, 0, 7], ids=["middle", "first-wraps", "last-wraps"])
def test_a_persistently_wrong_device_is_a_culprit_in_two_pairs(bad):
    j = judge(range(8), table(8, {bad: range(8)}))
    assert findings(j) == {bad: [(Status.FAILED, "SdcDetected")]}
    f = j.devices[bad][0]
    assert f.action is Action.REPLACE and f.evidence["sdc"][0]["kind"] == "culprit"
    assert sorted(j.evidence["mismatched_pairs"]) == sorted(
        [[f"gpu:{bad}", f"gpu:{(bad - 1) % 8}"], [f"gpu:{(bad + 1) % 8}", f"gpu:{bad}"]])
    assert j.agreed is None and not j.node


def test_a_device_wrong_on_its_own_micro_batch_once_is_transient():
    runs = table(4, {2: [2]})
    runs[2]["again"] = row(2)  # right on recompute
    j = judge(range(4), runs)
    assert findings(j) == {2: [(Status.FAILED, "SdcDetected")]}
    assert j.evidence["verdicts"] == [{"pair": ["gpu:2", "gpu:1"], "third": "gpu:3",
                                       "suspect": "gpu:2", "kind": "transient"}]
    assert j.devices[2][0].evidence["sdc"][0]["kind"] == "transient"


def test_a_device_wrong_only_on_its_own_micro_batch_every_time_is_persistent():
    j = judge(range(4), table(4, {1: [1]}))
    assert j.evidence["verdicts"][0]["kind"] == "persistent"
    assert findings(j) == {1: [(Status.FAILED, "SdcDetected")]}


def test_a_replayer_wrong_only_on_its_replay_is_named_not_its_target():
    j = judge(range(4), table(4, {1: [2]}))  # gpu:1 replays gpu:2 wrong
    assert j.evidence["verdicts"] == [{"pair": ["gpu:2", "gpu:1"], "third": "gpu:3",
                                       "suspect": "gpu:1", "kind": "replayer computed wrong"}]
    assert findings(j) == {1: [(Status.FAILED, "SdcDetected")]}


def test_a_wrong_result_outside_the_ring_is_outvoted():
    j = judge(range(5), table(5, {0: [3]}))  # gpu:0 computes gpu:3's batch wrong; not a ring pair
    assert j.evidence["mismatched_pairs"] == []
    assert findings(j) == {0: [(Status.FAILED, "SdcDetected")]}
    assert j.devices[0][0].evidence["sdc"] == [{"kind": "outvoted",
                                                 "micro_batches": ["gpu:3"]}]


def test_the_vote_clears_a_healthy_device_between_two_faulty_ones():
    j = judge(range(8), table(8, {2: range(8), 4: range(8)}))
    assert sorted(j.evidence["culprits"]) == ["gpu:2", "gpu:3", "gpu:4"]  # the ring alone
    assert findings(j) == {2: [(Status.FAILED, "SdcDetected")],
                           4: [(Status.FAILED, "SdcDetected")]}
    assert j.evidence["cleared_by_vote"] == ["gpu:3"]


def test_two_devices_that_disagree_fail_the_node_and_blame_neither():
    j = judge(range(2), table(2, {1: range(2)}))
    assert [(f.status, f.reason, f.action) for f in j.node] == [
        (Status.FAILED, "SdcDetected", Action.NONE)]
    assert "gpu:0 and gpu:1" in j.node[0].message and "no third device" in j.node[0].message
    assert findings(j) == {0: [(Status.UNKNOWN, "SdcUnattributable")],
                           1: [(Status.UNKNOWN, "SdcUnattributable")]}
    assert {v["kind"] for v in j.evidence["verdicts"]} == {"unattributable"}


def test_three_different_answers_are_unattributable():
    runs = table(3, {1: [2], 2: []})
    runs[2]["rows"]["2"] = runs[2]["again"] = [2, 102, 99, 0, 0, 0]  # gpu:2 wrong on its own
    runs[0]["rows"]["2"] = [2, 102, 55, 0, 0, 0]  # gpu:0 (the third) wrong on it too
    j = judge(range(3), runs)
    assert {v["kind"] for v in j.evidence["verdicts"]} == {"unattributable"}
    assert [f.reason for f in j.node] == ["SdcDetected"] and not any(
        f.status is Status.FAILED for fs in j.devices.values() for f in fs)


def test_a_platform_that_does_not_reproduce_itself_is_unknown_and_nothing_is_compared():
    runs = table(4, {0: range(4)})  # gpu:0 wrong, but that must not be judged
    for d in range(2):
        runs[d]["again"] = [9, 9, 9, 9, 9, d]
    j = judge(range(4), runs)
    assert [(f.status, f.reason) for f in j.node] == [
        (Status.UNKNOWN, "SdcProbeNondeterministic")]
    assert all(fs == [(Status.UNKNOWN, "SdcProbeNondeterministic")]
               for fs in findings(j).values()) and len(findings(j)) == 4
    assert "mismatched_pairs" not in j.evidence


def test_one_device_that_does_not_reproduce_itself_among_reproducible_ones_is_unknown():
    runs = table(4)
    runs[3]["again"] = [9, 9, 9, 9, 9, 9]
    j = judge(range(4), runs)
    assert findings(j) == {3: [(Status.UNKNOWN, "SdcProbeNondeterministic")]}
    assert "intermittent" in j.devices[3][0].message and not j.node


def test_devices_that_disagree_almost_everywhere_point_at_software_and_nobody_is_named():
    runs = {d: {"rows": {str(b): [b, d, 1, 1, 1, 1] for b in range(4)}} for d in range(4)}
    for d in runs:
        runs[d]["again"] = runs[d]["rows"][str(d)]
    j = judge(range(4), runs)
    assert [f.reason for f in j.node] == ["SdcProbeNondeterministic"]
    assert not any(f.status is Status.FAILED for fs in j.devices.values() for f in fs)


def test_devices_whose_worker_failed_are_left_out_of_the_ring():
    runs = table(4, {2: range(4)})
    del runs[1]  # hung: gpu:0 now replays gpu:2
    j = judge(range(4), runs)
    assert findings(j) == {2: [(Status.FAILED, "SdcDetected")]}
    assert j.evidence["compared"] == ["gpu:0", "gpu:2", "gpu:3"]


def _ref(n=8):
    return {b: tuple(GOOD[b]) for b in range(n)}


def test_a_single_device_is_checked_against_the_reference():
    assert not findings(judge([0], table(1), _ref()))
    j = judge([0], table(1, {0: [0]}), _ref())
    assert findings(j) == {0: [(Status.FAILED, "SdcReferenceMismatch")]}
    assert j.devices[0][0].action is Action.NONE  # nobody on the node vouches for the reference


def test_a_device_off_the_reference_that_others_reproduce_is_replaced():
    runs = table(3)
    runs[2]["rows"] = {b: row(int(b), 5) for b in runs[2]["rows"]}
    runs[2]["again"] = runs[2]["rows"]["2"]
    j = judge(range(3), runs, _ref())
    assert (Status.FAILED, "SdcReferenceMismatch") in findings(j)[2]
    ref = next(f for f in j.devices[2] if f.reason == "SdcReferenceMismatch")
    assert ref.action is Action.REPLACE


def test_the_reference_attributes_what_two_devices_cannot():
    j = judge(range(2), table(2, {1: range(2)}), _ref())
    assert findings(j) == {1: [(Status.FAILED, "SdcReferenceMismatch")]}
    assert not j.node


def test_a_node_wrong_everywhere_the_same_way_fails_on_the_reference():
    stored = {b: (b, 100 + b, 1, 1, 1, 1) for b in range(8)}
    j = judge(range(3), table(3), stored)
    assert [(f.status, f.reason) for f in j.node] == [(Status.FAILED, "SdcReferenceMismatch")]
    assert all(fs == [(Status.FAILED, "SdcReferenceMismatch")] for fs in findings(j).values())


# --- the reference file ----------------------------------------------------------------------------


def test_the_reference_file_round_trips_and_is_keyed(tmp_path):
    path = tmp_path / "sub" / "ref.json"
    doc = read_reference(str(path))
    assert doc["entries"] == []
    key = reference_key("NVIDIA H100 80GB HBM3", "550.90.07", "2.13.0", "12.4", "bf16", SETTINGS)
    write_reference(str(path), doc, key, _ref(2), "2026-11-30T00:00:00Z", "node-a")
    doc = read_reference(str(path))
    assert doc["kind"] == REFERENCE_KIND and doc["entries"][0]["node"] == "node-a"
    assert find_reference(doc, key) == _ref(2)
    other = reference_key("NVIDIA H100 80GB HBM3", "560.28.03", "2.13.0", "12.4", "bf16",
                          SETTINGS)
    assert find_reference(doc, other) is None
    write_reference(str(path), doc, other, _ref(1), "2026-11-30T00:00:00Z", "node-b")
    assert len(read_reference(str(path))["entries"]) == 2


@pytest.mark.parametrize("text", ["{not json", "[]", '{"kind": "Other", "entries": []}',
                                  '{"kind": "SdcProbeReference", "schema": 9, "entries": []}'])
def test_an_unreadable_reference_raises(tmp_path, text):
    path = tmp_path / "ref.json"
    path.write_text(text)
    with pytest.raises(ReferenceUnreadable):
        read_reference(str(path))


# --- on the simulated node --------------------------------------------------------------------------


def test_a_healthy_simulated_node_passes():
    res = run_sim(8)
    assert not_ok(res) == {}
    assert details(res["node"])["evidence"]["mismatched_pairs"] == []
    assert details(res["node"])["reference"] == {"state": "not configured"}
    assert res["gpu:5"].details["reproduced"] is True


@pytest.mark.parametrize("bad, pairs", [
    (3, [["gpu:3", "gpu:2"], ["gpu:4", "gpu:3"]]),
    (0, [["gpu:0", "gpu:7"], ["gpu:1", "gpu:0"]]),
], ids=["gpu3", "gpu0-wraps"])
def test_sdc_on_one_simulated_device_fails_naming_that_device_only(bad, pairs):
    res = run_sim(8, [f"sdc@gpu:{bad}"])
    assert not_ok(res) == {f"gpu:{bad}": (Status.FAILED, "SdcDetected")}
    r = res[f"gpu:{bad}"]
    assert r.action is Action.REPLACE
    assert details(r)["sdc"] == [{"kind": "culprit", "pairs": pairs}]
    assert details(res["node"])["evidence"]["mismatched_pairs"] == pairs
    assert f"gpu:{bad}" in res["node"].message


def test_two_simulated_devices_detect_but_cannot_attribute():
    res = run_sim(2, ["sdc@gpu:1"])
    assert not_ok(res) == {"node": (Status.FAILED, "SdcDetected"),
                           "gpu:0": (Status.UNKNOWN, "SdcUnattributable"),
                           "gpu:1": (Status.UNKNOWN, "SdcUnattributable")}
    assert res["node"].action is Action.NONE
    assert "unattributable" in res["node"].message


def test_a_platform_that_is_not_bit_reproducible_is_unknown():
    res = run_sim(3, env={TEST_NONDETERMINISM_ENV: "*"})
    assert not_ok(res) == {t: (Status.UNKNOWN, "SdcProbeNondeterministic")
                           for t in ("node", "gpu:0", "gpu:1", "gpu:2")}


def test_the_reference_is_recorded_then_matched_then_catches_a_wrong_single_device(tmp_path):
    path = tmp_path / "refs" / "sdc-reference.json"
    checks = {"reference_path": str(path)}
    res = run_sim(2, checks=checks)
    assert not_ok(res) == {} and res["node"].details["reference"]["state"] == "recorded"
    entry = json.loads(path.read_text())["entries"][0]
    assert entry["key"]["gpu_name"] == "NVIDIA H100 80GB HBM3" and set(entry["rows"]) == {"0",
                                                                                          "1"}
    res = run_sim(2, checks=checks)
    assert not_ok(res) == {} and res["node"].details["reference"]["state"] == "matched"
    assert "matches the stored reference" in res["gpu:1"].message
    res = run_sim(1, ["sdc@gpu:0"], checks=checks)  # alone: only the reference can tell
    assert not_ok(res) == {"gpu:0": (Status.FAILED, "SdcReferenceMismatch")}
    assert "single device" in res["node"].details["note"]
    res = run_sim(2, ["sdc@gpu:1"], checks=checks)  # the reference attributes the pair
    assert not_ok(res) == {"gpu:1": (Status.FAILED, "SdcReferenceMismatch")}
    assert res["gpu:1"].action is Action.REPLACE


def test_a_reference_every_device_disagrees_with_fails_the_node(tmp_path):
    path = tmp_path / "ref.json"
    run_sim(2, checks={"reference_path": str(path)})
    doc = json.loads(path.read_text())
    doc["entries"][0]["rows"]["0"][2] += 1
    doc["entries"][0]["rows"]["1"][2] += 1
    path.write_text(json.dumps(doc))
    res = run_sim(2, checks={"reference_path": str(path)})
    assert not_ok(res) == {t: (Status.FAILED, "SdcReferenceMismatch")
                           for t in ("node", "gpu:0", "gpu:1")}
    assert res["gpu:0"].action is Action.NONE


def test_an_unreadable_reference_makes_the_node_unknown_and_is_left_alone(tmp_path):
    path = tmp_path / "ref.json"
    path.write_text("{broken")
    res = run_sim(2, checks={"reference_path": str(path)})
    assert not_ok(res) == {"node": (Status.UNKNOWN, "SdcReferenceUnreadable")}
    assert path.read_text() == "{broken"


def test_a_hung_worker_is_unknown_and_the_others_are_still_compared():
    res = run_sim(3, ["sdc@gpu:2"], checks={"timeout_s": 60},
                  env={TEST_FAULT_ENV: "hang@gpu:1,at=turn"})
    assert res["gpu:1"].status is Status.UNKNOWN and res["gpu:1"].reason == "WorkerTimeout"
    assert "timed out" in res["gpu:1"].message
    # gpu:0 and gpu:2 remain: they disagree and no third device can decide.
    assert res["node"].reason == "SdcDetected" and res["node"].status is Status.FAILED
    assert details(res["node"])["compared"] == ["gpu:0", "gpu:2"]


def test_a_crashed_worker_is_unknown_and_never_ok():
    res = run_sim(3, env={TEST_FAULT_ENV: "crash@gpu:0,at=turn"})
    assert not_ok(res) == {"gpu:0": (Status.UNKNOWN, "WorkerCrashed")}
    assert details(res["node"])["compared"] == ["gpu:1", "gpu:2"]


def test_bootstrap_cli_names_the_sdc_device(monkeypatch, capsys):
    import checks
    from gpu_monitor.cli import main

    if SdcProbe not in checks.ALL_CHECKS:
        monkeypatch.setattr(checks, "ALL_CHECKS", (*checks.ALL_CHECKS, SdcProbe))
    rc = main(["bootstrap", "--simulate", "h100-sxm-8", "--inject", "sdc@gpu:3",
               "--checks", "sdc_probe", "--output", "json"])
    report = json.loads(capsys.readouterr().out)
    bad = {(r["check"], r["target"], r["reason"]) for r in report["results"]
           if r["status"] != "ok"}
    assert rc != 0 and bad == {("sdc_probe", "gpu:3", "SdcDetected")}


@pytest.mark.slow
def test_the_full_simulated_bootstrap_fails_naming_gpu3_and_nothing_else(monkeypatch, capsys):
    import checks
    from gpu_monitor.cli import main

    if SdcProbe not in checks.ALL_CHECKS:
        monkeypatch.setattr(checks, "ALL_CHECKS", (*checks.ALL_CHECKS, SdcProbe))
    rc = main(["bootstrap", "--simulate", "h100-sxm-8", "--inject", "sdc@gpu:3",
               "--output", "json"])
    report = json.loads(capsys.readouterr().out)
    bad = {(r["check"], r["target"]) for r in report["results"]
           if r["status"] not in ("ok", "skipped")}
    assert rc != 0 and bad == {("sdc_probe", "gpu:3")}


# --- CUDA ---------------------------------------------------------------------------------------



@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() == 0, reason="needs CUDA")
def test_the_probe_on_a_real_gpu_is_bit_reproducible_in_bf16(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as the worker pool sets it
    import torch

    from gpu_monitor.sdc.probe_worker import Probe
    from gpu_monitor.workers.device import Device, cuda_uuids

    dev = Device("cuda", 0, cuda_uuids()[0], 0)
    torch.cuda.set_device(0)
    runs = [Probe(dev, 0, [0, 1, 2], seed=1234, batch_size=32, hidden=1024, layers=4,
                  environ={}).run() for _ in range(2)]
    assert runs[0]["dtype"] == "bf16"
    assert runs[0]["again"] == runs[0]["rows"]["0"]
    assert runs[0]["rows"] == runs[1]["rows"]


@pytest.mark.gpu
@pytest.mark.skipif(cuda_count() == 0, reason="needs CUDA")
def test_the_sdc_probe_on_real_gpus_passes(tmp_path):
    from gpu_monitor.host import Host
    from gpu_monitor.hw.paths import HostPaths

    host = Host.real(HostPaths())
    prof = load_profile("h100-sxm-8")
    config = parse_config({"checks": {"sdc_probe": {"reference_path": str(tmp_path / "r.json")}}})
    ctx = Context(host=host, profile=prof, config=config, force=True)
    try:
        first = run_check(SdcProbe(), ctx)
        second = run_check(SdcProbe(), ctx)
    finally:
        host.close()
    for outcome, state in ((first, "recorded"), (second, "matched")):
        gpus = [r for r in outcome.results if r.target.startswith("gpu:")]
        assert gpus and all(r.status is Status.OK for r in gpus), [r.message for r in gpus]
        node = next(r for r in outcome.results if r.target == "node")
        assert node.details["dtype"] == "bf16" and node.details["reference"]["state"] == state
