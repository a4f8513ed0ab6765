"""The provisioning gate: bootstrap until a recorded pass, then release the bootstrap taint."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kube"))

from fake_apiserver import FakeApiServer  # noqa: E402

from gpu_monitor.clock import FakeClock  # noqa: E402
from gpu_monitor.model import Report, Result, Status  # noqa: E402
from gpu_monitor.remediate.bootstrap_gate import BOOTSTRAP_TAINT, CONDITION, BootstrapGate  # noqa: E402
from gpu_monitor.remediate.kube import Kube, NodeClient  # noqa: E402
from gpu_monitor.state import Store  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def report(status: Status) -> Report:
    return Report(node="n1", profile="h100-sxm-8", started_at=T0, finished_at=T0,
                  results=(Result(check="burn_in", status=status, target="gpu:3",
                                  reason="Ok" if status is Status.OK else "BurnInSlow",
                                  observed_at=T0),))


@pytest.fixture
def api():
    server = FakeApiServer(node_lifecycle_controller=False)
    server.start()
    server.add_node("n1", taints=[{"key": BOOTSTRAP_TAINT, "effect": "NoSchedule"}])
    yield server
    server.stop()


def node_client(api, clock):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = api.url
    return NodeClient(Kube(client.ApiClient(cfg), clock), "n1")


def taint_keys(api):
    return [t["key"] for t in api.node("n1")["spec"].get("taints") or []]


def conditions(api):
    return {c["type"]: c for c in api.node("n1").get("status", {}).get("conditions", [])}


def test_failed_suite_keeps_taint_sets_condition_and_retries_later(api):
    clock = FakeClock()
    store = Store.open(":memory:", clock)
    outcomes = [report(Status.FAILED), report(Status.OK)]
    nc = node_client(api, clock)
    gate = BootstrapGate(store, lambda: outcomes.pop(0), clock, node_client=lambda: nc,
                         dry_run=False, retry_s=600)
    assert gate.step() == "failed"
    assert BOOTSTRAP_TAINT in taint_keys(api)
    cond = conditions(api)[CONDITION]
    assert cond["status"] == "True" and cond["reason"] == "BootstrapFailed"
    assert "burn_in/BurnInSlow@gpu:3" in cond["message"]
    assert gate.step() == "waiting"  # not due before the retry period
    clock.advance(600)
    assert gate.step() == "passed"
    assert BOOTSTRAP_TAINT not in taint_keys(api)
    assert conditions(api)[CONDITION]["status"] == "False"
    assert store.get_kv("bootstrap", "passed")


def test_recorded_pass_skips_the_suite_and_releases_a_new_taint(api):
    clock = FakeClock()
    store = Store.open(":memory:", clock)
    store.set_kv("bootstrap", "passed", "2026-01-01T00:00:00Z")
    nc = node_client(api, clock)

    def never():
        raise AssertionError("suite must not run again after a recorded pass")

    gate = BootstrapGate(store, never, clock, node_client=lambda: nc, dry_run=False)
    assert gate.step() == "passed"
    assert BOOTSTRAP_TAINT not in taint_keys(api)


def test_dry_run_changes_nothing_on_the_node(api):
    clock = FakeClock()
    store = Store.open(":memory:", clock)
    nc = node_client(api, clock)
    gate = BootstrapGate(store, lambda: report(Status.OK), clock, node_client=lambda: nc,
                         dry_run=True)
    assert gate.step() == "passed"
    assert BOOTSTRAP_TAINT in taint_keys(api)
    assert CONDITION not in conditions(api)


def test_undecided_suite_is_unknown_and_without_api_nothing_breaks():
    clock = FakeClock()
    store = Store.open(":memory:", clock)

    def no_api():
        raise RuntimeError("no in-cluster config")

    gate = BootstrapGate(store, lambda: report(Status.UNKNOWN), clock, node_client=no_api,
                         dry_run=False)
    assert gate.step() == "unknown"
    assert store.get_kv("bootstrap", "last")["verdict"] == "unknown"
    assert not gate.passed()
