"""``gpu-monitor status`` on stores written the way the remediator and the gate write them."""

from __future__ import annotations

import json

import pytest

from gpu_monitor.cli import main
from gpu_monitor.clock import FakeClock
from gpu_monitor.config import load_config
from gpu_monitor.model import Action, Result, RunOutcome, Status, iso
from gpu_monitor.nodeview.status import node_status
from gpu_monitor.remediate.breaker import BreakerStatus, Slot
from gpu_monitor.remediate.policy import Op
from gpu_monitor.remediate.record import KV_BREAKER, KV_NAMESPACE, QuarantineRecord, save_record
from gpu_monitor.state import Store
from gpu_monitor.state.readonly import open_read_only

NODE = "gpu-node-1"


def _xid79(clock: FakeClock) -> Result:
    return Result("xid", Status.FAILED, "gpu:3", reason="Xid79", message="fell off the bus",
                  action=Action.REBOOT, observed_at=clock.now())


@pytest.fixture
def quarantined(tmp_path):
    """A store of a node quarantined for an Xid 79, drained, its breaker slot held."""
    path = str(tmp_path / "state.db")
    clock = FakeClock()
    with Store.open(path, clock) as s:
        s.record_run(RunOutcome("xid", (_xid79(clock),), clock.now(), 0.01, True))
        s.set_node_state("quarantined", "Xid79", clock.now())
        save_record(s, QuarantineRecord(op=Op.REBOOT, reason="Xid79", since=clock.now(),
                                        slot=True, applied=True, drain="succeeded"))
        s.set_kv(KV_NAMESPACE, KV_BREAKER, BreakerStatus(
            slots={NODE: Slot(iso(clock.now()), iso(clock.now()), "Xid79")},
            budget=2).to_dict())
        s.set_kv("bootstrap", "passed", iso(clock.now()))
    return path, clock


def test_a_quarantined_node_shows_its_state_breaker_gate_and_next_step(quarantined):
    path, clock = quarantined
    with open_read_only(path, clock) as store:
        doc = node_status(store, load_config(None), clock.now())
    assert doc["lifecycle"]["state"] == "quarantined"
    assert doc["lifecycle"]["since"] == iso(clock.now())
    assert doc["lifecycle"]["history"][-1]["to"] == "quarantined"
    assert doc["breaker"]["slots_held"] == 1 and doc["breaker"]["holders"] == [NODE]
    assert doc["bootstrap"]["passed"] is True
    assert doc["quarantine"]["op"] == "reboot"
    assert doc["next"]["step"] == "wait for the requested reboot, then retest"


def test_the_table_has_each_part_on_a_line(quarantined, capsys):
    path, _ = quarantined
    assert main(["status", "--state", path]) == 0
    out = capsys.readouterr().out
    assert "lifecycle: quarantined since " in out and "(Xid79)" in out
    assert "breaker: closed, 1/2 slots held" in out
    assert "bootstrap gate: passed at " in out
    assert "next remediation step" in out and "wait for the requested reboot" in out
    assert "FAILED    gpu:3" in out and "Xid79" in out


@pytest.mark.parametrize(("record", "step"), [
    (dict(applied=False), "cordon and taint the node"),
    (dict(applied=True, drain="none"), "drain the node"),
    (dict(applied=True, drain="failed", drain_detail="PDB blocks"), "try the failed drain"),
    (dict(applied=True, drain="succeeded", op=Op.REPLACE, replaced=True),
     "only `gpu-monitor quarantine release`"),
    (dict(applied=True, drain="succeeded", releasing=True), "finish returning"),
])
def test_the_next_step_of_a_quarantine_follows_its_record(tmp_path, record, step):
    path = str(tmp_path / "state.db")
    clock = FakeClock()
    fields = {"op": Op.REBOOT, "reason": "Xid79", "since": clock.now(), **record}
    with Store.open(path, clock) as s:
        save_record(s, QuarantineRecord(**fields))
    with open_read_only(path, clock) as store:
        doc = node_status(store, load_config(None), clock.now())
    assert step in doc["next"]["step"]


def test_without_the_remediators_memory_the_latest_results_are_judged(tmp_path, capsys):
    path = str(tmp_path / "state.db")
    clock = FakeClock()
    with Store.open(path, clock) as s:
        s.record_run(RunOutcome("xid", (_xid79(clock),), clock.now(), 0.01, True))
    assert main(["status", "--state", path, "-o", "json"]) == 0
    nxt = json.loads(capsys.readouterr().out)["next"]
    assert nxt["from"] == "the latest results"
    assert nxt["op"] == "reboot" and nxt["reason"] == "Xid79" and nxt["dry_run"] is True


def test_an_unknown_result_is_never_acted_on_and_says_why(tmp_path, capsys):
    path = str(tmp_path / "state.db")
    clock = FakeClock()
    r = Result("nvlink_state", Status.UNKNOWN, "gpu:0", reason="NvmlReadError",
               observed_at=clock.now())
    with Store.open(path, clock) as s:
        s.record_run(RunOutcome("nvlink_state", (r,), clock.now(), 0.01, True))
    assert main(["status", "--state", path]) == 0
    out = capsys.readouterr().out
    assert "nothing: no finding asks for an operation" in out
    assert "not acted on: nvlink_state gpu:0 NvmlReadError (unknown" in out


def test_the_state_file_defaults_to_the_configs_state_path(quarantined, tmp_path, capsys):
    path, _ = quarantined
    config = tmp_path / "config.yaml"
    config.write_text(f"state_path: {path}\n")
    assert main(["status", "--config", str(config), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["state_file"] == path
