"""``gpu-monitor history``: the changes of each check and target, from a read-only store."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from gpu_monitor.cli import main
from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Action, Result, RunOutcome, Status, iso
from gpu_monitor.nodeview.history import parse_since
from gpu_monitor.state import Store

# One port's polls: ok, ok, down, down, ok again (a real outage's shape in rdma_ports).
POLLS = [(Status.OK, "Ok"), (Status.OK, "Ok"), (Status.FAILED, "PortDown"),
         (Status.FAILED, "PortDown"), (Status.OK, "Cleared")]


@pytest.fixture
def outage(tmp_path):
    path = str(tmp_path / "state.db")
    clock = FakeClock()
    with Store.open(path, clock) as s:
        for status, reason in POLLS:
            rs = (Result("rdma_ports", status, "ib:mlx5_0:1", reason=reason,
                         action=Action.NONE, observed_at=clock.now()),
                  Result("rdma_ports", Status.OK, "ib:mlx5_1:1", observed_at=clock.now()))
            s.record_run(RunOutcome("rdma_ports", rs, clock.now(), 0.01, True))
            clock.advance(30)
        s.set_node_state("suspect", "PortDown", clock.now())
        s.record_action("event", "dry-run", clock.now(), {"reason": "PortDown"})
    return path


def _history(capsys, *argv) -> dict:
    assert main(["history", *argv, "--since", "3000d", "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_history_keeps_the_first_result_and_every_change(outage, capsys):
    doc = _history(capsys, "--state", outage, "--target", "ib:mlx5_0:1")
    assert [r["reason"] for r in doc["results"]] == ["Ok", "PortDown", "Cleared"]
    assert doc["results_in_window"] == 5
    assert "lifecycle" not in doc  # a target was named: only its results


def test_all_lists_every_result_and_limit_keeps_the_newest(outage, capsys):
    doc = _history(capsys, "--state", outage, "--target", "ib:mlx5_0:1", "--all",
                   "--limit", "2")
    assert [r["reason"] for r in doc["results"]] == ["PortDown", "Cleared"]
    assert doc["truncated"] == 3


def test_the_whole_node_comes_with_its_lifecycle_and_actions(outage, capsys):
    doc = _history(capsys, "--state", outage)
    assert {r["target"] for r in doc["results"]} == {"ib:mlx5_0:1", "ib:mlx5_1:1"}
    assert [h["to"] for h in doc["lifecycle"]] == ["suspect"]
    assert [a["result"] for a in doc["actions"]] == ["dry-run"]
    assert main(["history", "--state", outage, "--since", "3000d"]) == 0
    out = capsys.readouterr().out
    assert "LIFECYCLE healthy -> suspect (PortDown)" in out and "ACTION    event: dry-run" in out


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30), ("15m", 900), ("1h", 3600), ("1h30m", 5400), ("2d", 172800), ("1w", 604800)])
def test_since_takes_durations(text, seconds):
    now = FakeClock().now()
    assert parse_since(text, now) == now - timedelta(seconds=seconds)


def test_since_takes_an_rfc3339_time():
    now = FakeClock().now()
    assert iso(parse_since("2026-01-01T00:00:00Z", now)) == "2026-01-01T00:00:00Z"
