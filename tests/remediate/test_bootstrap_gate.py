"""The provisioning gate: bootstrap until a recorded pass, then release the bootstrap taint."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.kube.client import Kube
from gpu_monitor.model import Report, Result, Status
from gpu_monitor.remediate.bootstrap_gate import BOOTSTRAP_TAINT, CONDITION, BootstrapGate
from gpu_monitor.remediate.k8s.delivery import KubeDelivery
from gpu_monitor.state import Store
from tests.kube.fake_apiserver import FakeApiServer

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
    return KubeDelivery(lambda: Kube(client.ApiClient(cfg), clock), "n1", clock)


def gate_for(api, suite, *, passed: str | None = None, **kw):
    """A BootstrapGate running ``suite`` over a fresh store on a fake clock, delivering to the
    fake apiserver ``api`` (a ``delivery`` in ``kw`` replaces it), not a dry run unless ``kw``
    says so; ``passed``: a pass recorded before. (gate, clock, store)"""
    clock = FakeClock()
    store = Store.open(":memory:", clock)
    if passed is not None:
        store.set_kv("bootstrap", "passed", passed)
    kw.setdefault("dry_run", False)
    if "delivery" not in kw:
        nc = node_client(api, clock)
        kw["delivery"] = lambda: nc
    return BootstrapGate(store, suite, clock, **kw), clock, store


def taint_keys(api):
    return [t["key"] for t in api.node("n1")["spec"].get("taints") or []]


def conditions(api):
    return {c["type"]: c for c in api.node("n1").get("status", {}).get("conditions", [])}


def test_failed_suite_keeps_taint_sets_condition_and_retries_later(api):
    outcomes = [report(Status.FAILED), report(Status.OK)]
    gate, clock, store = gate_for(api, lambda: outcomes.pop(0), retry_s=600)
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
    def never():
        raise AssertionError("suite must not run again after a recorded pass")

    gate, _, _ = gate_for(api, never, passed="2026-01-01T00:00:00Z")
    assert gate.step() == "passed"
    assert BOOTSTRAP_TAINT not in taint_keys(api)


def test_dry_run_changes_nothing_on_the_node(api):
    gate, _, _ = gate_for(api, lambda: report(Status.OK), dry_run=True)
    assert gate.step() == "passed"
    assert BOOTSTRAP_TAINT in taint_keys(api)
    assert CONDITION not in conditions(api)


def test_undecided_suite_is_unknown_and_without_api_nothing_breaks():
    def no_api():
        raise RuntimeError("no in-cluster config")

    gate, _, store = gate_for(None, lambda: report(Status.UNKNOWN), delivery=no_api)
    assert gate.step() == "unknown"
    assert store.get_kv("bootstrap", "last")["verdict"] == "unknown"
    assert not gate.passed()


# --- contract 5: only an image that can run the active checks lifts the taint -----------------


NO_TORCH = "torch is not installed (install gpu-monitor[active])"


def test_a_healthy_suite_on_an_image_without_torch_keeps_the_taint_and_records_no_pass(api):
    gate, _, store = gate_for(api, lambda: report(Status.OK), active_runtime=lambda: NO_TORCH)
    assert gate.step() == "unknown"
    assert BOOTSTRAP_TAINT in taint_keys(api)
    assert not gate.passed() and store.get_kv("bootstrap", "passed") is None
    cond = conditions(api)[CONDITION]
    assert cond["status"] == "True" and cond["reason"] == "BootstrapUndecided"
    assert "torch is not installed" in cond["message"]
    assert store.get_kv("bootstrap", "last")["verdict"] == "unknown"


def test_a_recorded_pass_is_not_acted_on_by_an_image_without_torch(api):
    def never():
        raise AssertionError("a recorded pass is not re-run")

    gate, _, store = gate_for(api, never, passed="2026-01-01T00:00:00Z",
                              active_runtime=lambda: NO_TORCH)
    assert gate.step() == "blocked"
    assert BOOTSTRAP_TAINT in taint_keys(api)
    assert store.get_kv("bootstrap", "passed")  # the full image's pass stays recorded
    gate.active_runtime = lambda: ""  # the full image again
    assert gate.step() == "passed" and BOOTSTRAP_TAINT not in taint_keys(api)


def test_a_runtime_probe_that_raises_earns_no_pass(api):
    def broken():
        raise OSError("permission denied")

    gate, _, _ = gate_for(api, lambda: report(Status.OK), active_runtime=broken)
    assert gate.step() == "unknown" and BOOTSTRAP_TAINT in taint_keys(api)
    assert "permission denied" in conditions(api)[CONDITION]["message"]


# --- the daemon's gate on a simulated node: the real suite, the real runtime probe ------------

# The active checks that take a while on CPU workers, and the two that drive fake tools.
_SLOW = ["burn_in", "nccl_allreduce", "nvlink_peer", "sdc_probe", "rdma_loopback", "dcgm_diag"]


@pytest.fixture
def daemon_env(tmp_path):
    from gpu_monitor.cli import build_env, build_parser

    made = []

    def build(*injects, disabled=()):
        cfg = tmp_path / "config.yaml"
        cfg.write_text("remediation: {dry_run: false}\n"
                       + (f"disabled_checks: [{', '.join(disabled)}]\n" if disabled else ""))
        argv = ["daemon", "--simulate", "h100-sxm-8", "--node-name", "n1", "--config", str(cfg)]
        for spec in injects:
            argv += ["--inject", spec]
        env = build_env(build_parser().parse_args(argv), clock=FakeClock())
        made.append(env)
        return env

    yield build
    for env in made:
        env.close()


def test_the_passive_image_keeps_the_taint_and_records_no_pass(api, daemon_env):
    env = daemon_env("missing@node,what=torch", disabled=["rdma_loopback", "dcgm_diag"])
    gate = daemon_gate(api, env)
    assert gate.step() == "unknown"
    assert BOOTSTRAP_TAINT in taint_keys(api)
    assert store_pass(env) is None
    cond = conditions(api)[CONDITION]
    assert cond["reason"] == "BootstrapUndecided"
    assert "burn_in/RequirementMissing@node" in cond["message"]
    assert "torch is not installed" in cond["message"]


def test_the_passive_image_cannot_pass_even_with_every_active_check_disabled(api, daemon_env):
    env = daemon_env("missing@node,what=torch", disabled=_SLOW)
    gate = daemon_gate(api, env)
    assert gate.step() == "unknown"
    assert BOOTSTRAP_TAINT in taint_keys(api) and store_pass(env) is None
    last = env.store.get_kv("bootstrap", "last")
    assert last["verdict"] == "unknown"
    assert last["problems"].startswith("this image cannot run the active checks: torch")


def test_the_full_image_with_the_same_checks_disabled_passes_and_lifts_the_taint(api, daemon_env):
    """The control for the two above: the same suite where torch is there."""
    env = daemon_env(disabled=_SLOW)
    gate = daemon_gate(api, env)
    assert gate.step() == "passed"
    assert BOOTSTRAP_TAINT not in taint_keys(api) and store_pass(env)


def daemon_gate(api, env):
    """The daemon's own gate (make_bootstrap_gate) for ``env``, delivering to ``api``."""
    from gpu_monitor.daemon import make_bootstrap_gate

    nc = node_client(api, env.clock)
    return make_bootstrap_gate(env, lambda: nc)


def store_pass(env):
    return env.store.get_kv("bootstrap", "passed")
