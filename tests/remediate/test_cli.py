"""`gpu-monitor breaker ...` and `gpu-monitor quarantine ...` against the fake apiserver."""

from __future__ import annotations

import argparse
import json

import pytest

from gpu_monitor.remediate.cli import register
from gpu_monitor.remediate.k8s.node import ANNOTATIONS
from tests.kube.client_helpers import kube_for
from tests.remediate.remediate_helpers import (
    NODE,
    FakeApiServer,
    breaker_data,
    remediator,
    seed_breaker,
    xid,
)


@pytest.fixture
def fake(cluster):
    return cluster(*(f"gpu-{i}" for i in range(20)), NODE)


def run(fake, *argv):
    parser = argparse.ArgumentParser(prog="gpu-monitor")
    sub = parser.add_subparsers(dest="command")
    register(sub, api_factory=lambda args: kube_for(fake))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_breaker_status_shows_budget_and_slots(fake, capsys):
    assert run(fake, "breaker", "status") == 0
    out = capsys.readouterr().out
    assert "breaker gpu-monitor/gpu-monitor-breaker: closed" in out
    assert "slots: 0/3 used (21 GPU nodes" in out
    assert run(fake, "breaker", "status", "-o", "json") == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["state"], data["budget"], data["gpuNodes"]) == ("closed", 3, 21)


def test_breaker_pause_resume_and_reset(fake, capsys):
    assert run(fake, "breaker", "pause") == 0
    assert breaker_data(fake)["paused"] == "true"
    assert run(fake, "breaker", "resume") == 0
    assert breaker_data(fake)["paused"] == "false"
    seed_breaker(fake, state="tripped", trippedBy="gpu-3", trippedAt="2026-01-01T00:00:00Z")
    assert run(fake, "breaker", "status") == 0
    assert "tripped at 2026-01-01T00:00:00Z by gpu-3" in capsys.readouterr().out
    assert run(fake, "breaker", "reset") == 0
    data = breaker_data(fake)
    assert data["state"] == "closed" and data["resetAt"] and data["trippedBy"] == ""
    assert "storm cooldown until" in capsys.readouterr().out


def test_breaker_without_its_configmap_fails(capsys):
    with FakeApiServer() as server:
        assert run(server, "breaker", "status") == 1
    assert "does not exist" in capsys.readouterr().err


def test_quarantine_status_release_and_retest(fake, tmp_path, capsys):
    assert run(fake, "quarantine", "release", "--node", NODE) == 1  # healthy: nothing to do
    assert run(fake, "quarantine", "retest", "--node", NODE) == 1
    r = remediator(fake, tmp_path, node_sync_s=0.0)
    r.on_results([xid(79)])
    r.tick()
    capsys.readouterr()
    assert run(fake, "quarantine", "status", "--node", NODE) == 0
    out = capsys.readouterr().out
    assert f"{NODE}: reboot-required" in out and "taint: gpu-monitor.io/unhealthy=Xid79" in out
    assert "condition GPUXidError=True Xid79" in out
    assert run(fake, "quarantine", "status", "-o", "json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [x["node"] for x in rows] == [NODE]
    assert run(fake, "quarantine", "retest", "--node", NODE) == 0
    ann = fake.node(NODE)["metadata"]["annotations"]
    assert ANNOTATIONS.RETEST_REQUESTED in ann
    assert run(fake, "quarantine", "release", "--node", NODE) == 0
    r.tick()
    assert r.store.node_state().state == "healthy"
    assert not fake.node(NODE)["spec"].get("unschedulable")


def test_release_needs_a_node(fake):
    with pytest.raises(SystemExit):
        run(fake, "quarantine", "release")


def test_no_cluster_configuration_is_a_usage_error(capsys):
    def nowhere(args):
        raise RuntimeError("no kubeconfig")

    parser = argparse.ArgumentParser(prog="gpu-monitor")
    register(parser.add_subparsers(dest="command"), api_factory=nowhere)
    args = parser.parse_args(["breaker", "status"])
    assert args.func(args) == 2
    assert "cannot configure a Kubernetes client" in capsys.readouterr().err
