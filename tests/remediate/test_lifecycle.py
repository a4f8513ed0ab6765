"""The quarantine lifecycle end to end, on the stateful fake apiserver with the real client."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Result, Status
from gpu_monitor.remediate.k8s.node import ANNOTATIONS, LABEL_REPLACE, LABEL_STATE
from tests.remediate.remediate_helpers import (
    FAST_DRAIN,
    NODE,
    TAINT_KEY,
    JumpClock,
    Resets,
    breaker_data,
    config,
    event_reasons,
    events_for,
    ok,
    our_conditions,
    our_taints,
    patch_as_human,
    remediator,
    seed_breaker,
    set_boot_id,
    writes_to,
    xid,
)

NODE_PATH = f"/api/v1/nodes/{NODE}"


def gpu_job(fake, name="train-0", ns="train", grace=1, stop_after=0.2, **kw):
    return fake.add_pod(ns, name, node=NODE, owner=("ReplicaSet", f"{name}-rs"), gpus=8,
                        grace_period=grace, stop_after=stop_after, **kw)


def passing():
    return [Result(check="dcgm_diag", status=Status.OK, target="gpu:0")]


def failing():
    return [Result(check="dcgm_diag", status=Status.FAILED, target="gpu:3", reason="DiagFailed")]


def ann(fake):
    return fake.node(NODE)["metadata"].get("annotations") or {}


def labels(fake):
    return fake.node(NODE)["metadata"].get("labels") or {}


# --- XID -> quarantine -----------------------------------------------------------------------------


def test_xid79_on_a_simulated_node_quarantines_drains_reboots_and_returns(fake, tmp_path):
    from checks.xid import Xid
    from gpu_monitor.check import Context
    from gpu_monitor.config import DEFAULT_CONFIG
    from gpu_monitor.profiles import load_profile
    from gpu_monitor.runner import run_check
    from gpu_monitor.sim.inject import parse as fault
    from gpu_monitor.sim.node import SimulatedNode

    gpu_job(fake)
    fake.add_pod("web", "web-0", node=NODE, owner=("ReplicaSet", "web"))
    fake.add_pod("kube-system", "device-plugin", node=NODE, daemonset="nvidia-device-plugin",
                 gpus=1)
    fake.add_pod("kube-system", f"etcd-{NODE}", node=NODE, mirror=True)
    profile = load_profile("h100-sxm-8")
    sim = SimulatedNode(profile, [fault("xid@gpu:3,code=79")], hostname=NODE)
    r = remediator(fake, tmp_path, retest=passing)
    try:
        ctx = Context(host=sim.host(), profile=profile, config=DEFAULT_CONFIG, clock=r.clock,
                      store=r.store, node=NODE)
        results = run_check(Xid(), ctx, method="run").results
    finally:
        sim.close()
    assert [(x.target, x.reason) for x in results if x.status is Status.FAILED] == \
        [("gpu:3", "Xid79")]

    r.on_results(results)
    r.tick()

    node = fake.node(NODE)
    cond = our_conditions(node)["GPUXidError"]
    assert (cond["status"], cond["reason"]) == ("True", "Xid79")
    assert our_taints(node) == [{"key": TAINT_KEY, "value": "Xid79", "effect": "NoSchedule"}]
    assert node["spec"]["unschedulable"] is True
    a = node["metadata"]["annotations"]
    assert a[ANNOTATIONS.PRE_EXISTING] == "false" and a[ANNOTATIONS.REASON] == "Xid79"
    assert a[ANNOTATIONS.DRAIN] == "succeeded" and ANNOTATIONS.CORDONED in a
    assert a[ANNOTATIONS.TAINT] == f"{TAINT_KEY}=Xid79:NoSchedule"
    assert node["metadata"]["labels"][LABEL_STATE] == "reboot-required"
    assert fake.pod("train", "train-0") is None  # the GPU job was evicted
    for ns, name in (("web", "web-0"), ("kube-system", "device-plugin"),
                     ("kube-system", f"etcd-{NODE}")):
        assert fake.pod(ns, name) is not None, name  # CPU, DaemonSet and mirror pods stay
    reasons = event_reasons(fake, NODE)
    for want in ("Xid79", "Quarantined", "DrainSucceeded", "RebootRequested"):
        assert want in reasons
    ev = events_for(fake, NODE)[0]
    assert ev["involvedObject"]["kind"] == "Node" and ev["source"]["component"] == "gpu-monitor"
    assert (tmp_path / "root" / "var" / "run" / "reboot-required").exists()
    assert list(json.loads(breaker_data(fake)["slots"])) == [NODE]
    assert r.store.node_state().state == "reboot-required"
    counts = r.store.action_counts()
    assert counts[("quarantine", "ok")] == counts[("cordon", "ok")] == 1
    assert counts[("eviction", "evicted")] == 1

    # Kured reboots the node; the daemon comes back with the same store and retests.
    set_boot_id(r.actuator.paths, "boot-2")
    r.tick()
    node = fake.node(NODE)
    assert r.store.node_state().state == "healthy"
    assert not node["spec"].get("unschedulable") and our_taints(node) == []
    assert not any(k.startswith("gpu-monitor.io/") for k in node["metadata"]["annotations"])
    assert node["metadata"]["labels"][LABEL_STATE] == "healthy"
    assert our_conditions(node)["GPUXidError"]["status"] == "False"
    assert json.loads(breaker_data(fake)["slots"]) == {}
    assert "ReturnedToService" in event_reasons(fake, NODE)
    assert r.store.action_counts()[("reboot", "ok")] == 1


def test_repeated_ticks_write_nothing_new(fake, tmp_path):
    r = remediator(fake, tmp_path, node_sync_s=0.0)
    r.on_results([xid(79)])
    r.tick()
    n = len(fake.requests)
    writes = [q for q in fake.requests if q.method != "GET"]
    for _ in range(3):
        r.on_results([xid(79)])
        r.tick()
    later = [q for q in fake.requests[n:] if q.method != "GET"]
    assert later == [] and writes  # only reads while nothing changes
    assert len(our_taints(fake.node(NODE))) == 1


# --- drain -----------------------------------------------------------------------------------------


def test_pdb_blocks_the_eviction_then_allows_it(fake, tmp_path):
    fake.add_pod("ns", "web-1", node=NODE, labels={"app": "web"}, owner=("ReplicaSet", "web"),
                 gpus=1, grace_period=1, stop_after=0.1)
    fake.set_pdb("ns", "web-pdb", match_labels={"app": "web"}, min_available=1)

    def second_replica_after_the_refusal():
        fake.wait_for_request("POST", r"/api/v1/namespaces/ns/pods/web-1/eviction", timeout=20)
        fake.add_node("gpu-node-2", gpus=8)
        fake.add_pod("ns", "web-2", node="gpu-node-2", labels={"app": "web"},
                     owner=("ReplicaSet", "web"))

    t = threading.Thread(target=second_replica_after_the_refusal, daemon=True)
    t.start()
    r = remediator(fake, tmp_path)
    r.on_results([xid(79)])
    r.tick()
    t.join(5)
    evictions = [q.status for q in fake.requests if q.path.endswith("/web-1/eviction")]
    assert evictions[0] == 429 and evictions[-1] == 201
    assert fake.pod("ns", "web-1") is None
    assert ann(fake)[ANNOTATIONS.DRAIN] == "succeeded"
    assert r.store.action_counts()[("eviction", "blocked")] >= 1


def test_pod_stuck_terminating_past_the_deadline_fails_the_drain_and_stays_quarantined(
        fake, tmp_path):
    gpu_job(fake, grace=30, stop_after=None)
    fake.hang_pod_deletion("train", "train-0")
    r = remediator(fake, tmp_path, drain=replace(FAST_DRAIN, timeout_s=1.0))
    r.on_results([xid(79)])
    t0 = time.monotonic()
    r.tick()
    assert time.monotonic() - t0 < 10
    node = fake.node(NODE)
    assert node["spec"]["unschedulable"] is True and len(our_taints(node)) == 1
    assert ann(fake)[ANNOTATIONS.DRAIN].startswith("failed: ")
    assert "still terminating" in ann(fake)[ANNOTATIONS.DRAIN]
    pod = fake.pod("train", "train-0")
    assert pod is not None and pod["metadata"].get("deletionTimestamp")  # never force-deleted
    assert r.store.node_state().state == "quarantined"  # no reboot while the drain failed
    assert "DrainFailed" in event_reasons(fake, NODE)
    assert r.store.action_counts()[("drain", "failed")] == 1
    r.tick()  # the retry waits for the drain timeout: nothing is evicted again meanwhile
    assert r.store.action_counts()[("drain", "failed")] == 1


def test_force_delete_only_when_configured(fake, tmp_path):
    gpu_job(fake, grace=30, stop_after=None)
    fake.hang_pod_deletion("train", "train-0")
    r = remediator(fake, tmp_path, drain=replace(FAST_DRAIN, timeout_s=0.5, force_delete=True))
    r.on_results([xid(79)])
    r.tick()
    assert fake.pod("train", "train-0") is None
    assert r.store.action_counts()[("eviction", "force_deleted")] == 1
    assert r.store.node_state().state == "reboot-required"


# --- API server faults -----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["outage", "503s", "dropped"])
def test_api_server_down_during_cordon_is_retried_and_ends_right(fake, tmp_path, fault):
    gpu_job(fake)
    r = remediator(fake, tmp_path)
    r.tick()  # started, nothing to do
    if fault == "outage":
        fake.stop()
        threading.Timer(1.0, fake.start).start()
    elif fault == "503s":
        fake.inject("PATCH", NODE_PATH, 503, times=3)
    else:
        fake.drop_connections(times=2, method="PATCH", path_regex=NODE_PATH)
    r.on_results([xid(79)])
    r.tick()
    assert r.last_error is None
    node = fake.node(NODE)
    assert node["spec"]["unschedulable"] is True
    assert our_taints(node) == [{"key": TAINT_KEY, "value": "Xid79", "effect": "NoSchedule"}]
    assert ann(fake)[ANNOTATIONS.PRE_EXISTING] == "false"
    assert ann(fake)[ANNOTATIONS.DRAIN] == "succeeded"
    assert r.store.node_state().state == "reboot-required"
    if fault != "outage":
        failed = [q for q in fake.requests if q.method == "PATCH" and q.path == NODE_PATH
                  and q.status in (0, 503)]
        assert failed, "the fault was never hit"


def test_a_tick_that_cannot_reach_the_api_server_resumes_on_the_next(fake, tmp_path):
    from gpu_monitor.kube.client import Kube

    r = remediator(fake, tmp_path)
    r.tick()
    r.delivery.kube.retry_deadline_s = 0.5
    assert isinstance(r.delivery.kube, Kube)
    fake.stop()
    r.on_results([xid(79)])
    r.tick()
    assert r.last_error and r.store.node_state().state in ("healthy", "suspect", "quarantined")
    fake.start()
    r.tick()
    assert r.last_error is None and r.store.node_state().state == "reboot-required"
    assert len(our_taints(fake.node(NODE))) == 1


# --- ownership: only our own cordon is undone -------------------------------------------------------


def test_a_node_cordoned_by_a_human_is_never_uncordoned(fake, tmp_path):
    fake.add_node(NODE, gpus=8, unschedulable=True)
    resets = Resets()
    r = remediator(fake, tmp_path, resets=resets, retest=passing)
    r.on_results([xid(48)])  # reset_gpu: quarantine, drain, reset, retest, release
    r.tick()
    assert resets.calls == [[3]]
    node = fake.node(NODE)
    assert r.store.node_state().state == "healthy"
    assert node["spec"]["unschedulable"] is True  # the human's cordon stays
    assert our_taints(node) == []
    assert not any("unschedulable" in q.body for q in writes_to(fake, NODE_PATH))
    assert any("not uncordoned" in e["message"] for e in events_for(fake, NODE)
               if e["reason"] == "ReturnedToService")


def test_a_human_uncordon_during_the_quarantine_is_respected(fake, tmp_path):
    clock = JumpClock()
    cfg = config(hysteresis_s=60.0)
    cfg = replace(cfg, checks={"xid": {"remediation": {"Xid79": "cordon"}}})
    r = remediator(fake, tmp_path, cfg=cfg, clock=clock, node_sync_s=0.0)
    r.on_results([xid(79)])
    r.tick()
    assert fake.node(NODE)["spec"]["unschedulable"] is True
    patch_as_human(fake, NODE, {"spec": {"unschedulable": None}})
    r.tick()
    r.tick()
    node = fake.node(NODE)
    assert not node["spec"].get("unschedulable")  # not cordoned again
    assert ANNOTATIONS.UNCORDONED_MANUALLY in ann(fake) and len(our_taints(node)) == 1
    assert "ManualUncordonRespected" in event_reasons(fake, NODE)
    assert r.store.action_counts()[("uncordon", "human")] == 1
    cordons = [q for q in writes_to(fake, NODE_PATH) if '"unschedulable": true' in q.body]
    assert len(cordons) == 1
    r.on_results([ok()])
    r.tick()
    clock.advance(61)
    r.tick()
    assert r.store.node_state().state == "healthy" and our_taints(fake.node(NODE)) == []


def test_a_human_untaint_is_respected_and_the_cordon_kept(fake, tmp_path):
    cfg = replace(config(), checks={"xid": {"remediation": {"Xid79": "cordon"}}})
    r = remediator(fake, tmp_path, cfg=cfg, node_sync_s=0.0)
    r.on_results([xid(79)])
    r.tick()
    node = fake.node(NODE)
    i = next(i for i, t in enumerate(node["spec"]["taints"]) if t["key"] == TAINT_KEY)
    patch_as_human(fake, NODE, [{"op": "remove", "path": f"/spec/taints/{i}"}])
    r.tick()
    r.tick()
    assert our_taints(fake.node(NODE)) == [] and ANNOTATIONS.UNTAINTED_MANUALLY in ann(fake)
    assert fake.node(NODE)["spec"]["unschedulable"] is True


# --- gates: breaker, dry-run, exclusion -------------------------------------------------------------


def test_no_breaker_slot_means_no_cordon_and_a_tripped_breaker(fake, tmp_path):
    stamp = "2099-01-01T00:00:00Z"
    seed_breaker(fake, slots=json.dumps({"other": {"since": stamp, "renewed": stamp}}))
    r = remediator(fake, tmp_path, breaker_retry_s=0.0)
    r.on_results([xid(79)])
    r.tick()
    node = fake.node(NODE)
    assert not node["spec"].get("unschedulable") and our_taints(node) == []
    assert our_conditions(node)["GPUXidError"]["status"] == "True"  # still reported
    data = breaker_data(fake)
    assert data["state"] == "tripped" and data["trippedBy"] == NODE
    assert "BreakerTripped" in event_reasons(fake, NODE)
    assert r.store.node_state().state == "suspect"
    assert r.store.action_counts()[("quarantine", "breaker_tripped")] == 1
    r.tick()  # still tripped: refused again, no cordon
    assert not fake.node(NODE)["spec"].get("unschedulable")
    assert "RemediationSkipped" in event_reasons(fake, NODE)
    # an operator resets it (no cooldown here) and the other node returned to service
    seed_breaker(fake, resetAt="2000-01-01T00:00:00Z")
    r.tick()
    assert fake.node(NODE)["spec"]["unschedulable"] is True


def test_dry_run_decides_events_and_counts_but_changes_nothing(fake, tmp_path):
    gpu_job(fake)
    r = remediator(fake, tmp_path, cfg=config(dry_run=True))
    before = fake.node(NODE)
    r.on_results([xid(79)])
    r.tick()
    r.tick()
    after = fake.node(NODE)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert our_conditions(after) == {}
    assert [q for q in fake.requests if q.method != "GET" and not q.path.endswith("/events")] == []
    assert fake.pod("train", "train-0") is not None
    msgs = [e["message"] for e in events_for(fake, NODE) if e["reason"] == "DryRunQuarantine"]
    assert len(msgs) == 1 and msgs[0].startswith("[dry-run] would quarantine for Xid79")
    assert "breaker would grant" in msgs[0]
    assert r.store.action_counts()[("reboot", "dry_run")] == 1
    assert r.store.node_state().state == "suspect"
    assert not (tmp_path / "root" / "var" / "run" / "reboot-required").exists()
    assert json.loads(breaker_data(fake)["slots"]) == {}


def test_an_excluded_node_is_only_reported(fake, tmp_path):
    fake.add_node(NODE, gpus=8, labels={"gpu-monitor.io/exclude": "true"})
    r = remediator(fake, tmp_path)
    r.on_results([xid(79)])
    r.tick()
    node = fake.node(NODE)
    assert not node["spec"].get("unschedulable") and our_taints(node) == []
    assert our_conditions(node)["GPUXidError"]["status"] == "True"
    assert any("excluded" in e["message"] for e in events_for(fake, NODE))
    assert r.store.node_state().state == "suspect"


def test_remediation_disabled_makes_no_request(fake, tmp_path):
    r = remediator(fake, tmp_path, cfg=config(enabled=False))
    r.on_results([xid(79)])
    r.tick()
    assert fake.requests == []


def test_a_degraded_signal_quarantines_only_once_it_persisted(fake, tmp_path):
    clock = JumpClock()
    r = remediator(fake, tmp_path, clock=clock)  # 2 polls and 60 s
    remap = Result(check="ecc_memory", status=Status.DEGRADED, target="gpu:1",
                   reason="RowRemapPending", action="reset_gpu", observed_at=clock.now())
    r.on_results([remap])
    r.tick()
    assert r.store.node_state().state == "suspect" and not fake.node(NODE)["spec"].get(
        "unschedulable")
    clock.advance(61)
    r.on_results([replace(remap, observed_at=clock.now())])
    r.tick()
    assert fake.node(NODE)["spec"]["unschedulable"] is True


# --- GPU reset, retest, reboot, replace -------------------------------------------------------------


def test_gpu_reset_blocked_by_holders_names_them_and_escalates_to_reboot(fake, tmp_path):
    resets = Resets()
    holders = ["nvidia-persistenced (pid 812)", "dcgm-exporter (pid 901)"]
    r = remediator(fake, tmp_path, resets=resets, holders=lambda: holders, retest=passing)
    r.on_results([xid(48)])
    r.tick()
    assert resets.calls == []
    assert r.store.node_state().state == "reboot-required"
    assert r.store.node_state().retest_failures == 0  # a blocked reset is not a failed retest
    msg = next(e["message"] for e in events_for(fake, NODE) if e["reason"] == "GpuResetBlocked")
    assert "nvidia-persistenced (pid 812)" in msg and "dcgm-exporter (pid 901)" in msg
    assert r.store.action_counts()[("reset_gpu", "blocked")] == 1


def test_failed_reset_escalates_to_reboot(fake, tmp_path):
    r = remediator(fake, tmp_path, resets=Resets(ok=False), retest=passing)
    r.on_results([xid(48)])
    r.tick()
    assert r.store.node_state().state == "reboot-required"
    assert "GpuResetFailed" in event_reasons(fake, NODE)


def test_nvswitch_systems_reset_every_gpu_together(fake, tmp_path):
    resets = Resets()
    r = remediator(fake, tmp_path, resets=resets, retest=passing, nvswitch=True)
    r.on_results([xid(48, gpu=2)])
    r.tick()
    assert resets.calls == [None]
    assert r.store.node_state().state == "healthy"
    recorded = [a.details.get("gpu_index") for a in r.store.actions(action="reset_gpu")]
    assert recorded == list(range(8))  # what the xid check reads as "this GPU was reset"


def test_retests_that_keep_failing_end_in_replace_until_an_operator_releases(fake, tmp_path):
    r = remediator(fake, tmp_path, resets=Resets(), retest=failing)  # retest_max_failures 2
    r.on_results([xid(48)])
    r.tick()
    assert r.store.node_state().state == "reboot-required"
    assert r.store.node_state().retest_failures == 1
    set_boot_id(r.actuator.paths, "boot-2")
    r.tick()
    st = r.store.node_state()
    assert (st.state, st.retest_failures) == ("replace", 2)
    node = fake.node(NODE)
    assert node["metadata"]["labels"][LABEL_REPLACE] == "true"
    assert node["metadata"]["labels"][LABEL_STATE] == "replace"
    assert node["spec"]["unschedulable"] is True and len(our_taints(node)) == 1
    data = breaker_data(fake)
    assert json.loads(data["slots"]) == {} and data["replacements"] == "1"
    assert r.store.action_counts()[("replace", "labelled")] == 1
    r.on_results([ok()])
    r.tick()
    assert r.store.node_state().state == "replace"  # permanent: clean results do not release
    patch_as_human(fake, NODE, {"metadata": {"annotations": {ANNOTATIONS.RELEASE_REQUESTED: "x"}}})
    r.timing = replace(r.timing, node_sync_s=0.0)
    r.tick()
    node = fake.node(NODE)
    assert r.store.node_state().state == "healthy"
    assert not node["spec"].get("unschedulable") and our_taints(node) == []
    assert LABEL_REPLACE not in node["metadata"]["labels"]
    assert ANNOTATIONS.RELEASE_REQUESTED not in node["metadata"]["annotations"]


def test_an_undecided_retest_keeps_the_node_quarantined_and_is_run_again_later(fake, tmp_path):
    # Nothing failed but a required check could not run (e.g. the passive image has no torch):
    # no pass, and no evidence to reboot or replace on either.
    answers = [[Result(check="burn_in", status=Status.UNKNOWN, target="node",
                       reason="RequirementMissing", message="torch is not installed")],
               passing()]
    calls = []

    def retest():
        calls.append(1)
        return answers[len(calls) - 1]

    clock = FakeClock()
    r = remediator(fake, tmp_path, clock=clock, resets=Resets(), retest=retest)
    r.on_results([xid(48)])
    r.tick()
    st = r.store.node_state()
    assert (st.state, st.retest_failures) == ("retesting", 0)
    assert "RetestUndecided" in event_reasons(fake, NODE)
    assert r.store.action_counts()[("retest", "undecided")] == 1
    r.tick()
    assert len(calls) == 1  # not again at once: the suite loads the GPUs
    clock.advance(r.settings.retest_retry_s + 1)
    r.tick()
    assert len(calls) == 2 and r.store.node_state().state == "healthy"


def test_operator_retest_of_a_quarantined_node(fake, tmp_path):
    cfg = replace(config(), checks={"xid": {"remediation": {"Xid79": "drain"}}})
    resets = Resets()
    r = remediator(fake, tmp_path, cfg=cfg, resets=resets, retest=passing, node_sync_s=0.0)
    r.on_results([xid(79)])
    r.tick()
    assert r.store.node_state().state == "quarantined"
    patch_as_human(fake, NODE, {"metadata": {"annotations": {ANNOTATIONS.RETEST_REQUESTED: "x"}}})
    r.tick()
    r.tick()
    assert resets.calls == [[3]] and r.store.node_state().state == "healthy"


def test_without_a_suite_the_retest_waits_for_the_passive_checks(fake, tmp_path):
    clock = JumpClock()
    r = remediator(fake, tmp_path, clock=clock, resets=Resets(), retest=None)
    r.on_results([xid(48)])
    r.tick()
    assert r.store.node_state().state == "retesting"
    r.on_results([ok()])
    r.tick()
    assert r.store.node_state().state == "retesting"  # not yet settled
    clock.advance(61)
    r.tick()
    assert r.store.node_state().state == "healthy"


def test_a_cordon_only_quarantine_returns_after_the_healthy_delay(fake, tmp_path):
    clock = JumpClock()
    cfg = replace(config(), checks={"xid": {"remediation": {"Xid79": "cordon"}}})
    gpu_job(fake)
    r = remediator(fake, tmp_path, cfg=cfg, clock=clock)
    r.on_results([xid(79)])
    r.tick()
    assert fake.pod("train", "train-0") is not None  # cordon: no drain
    r.on_results([ok()])
    r.tick()
    clock.advance(30)
    r.tick()
    assert r.store.node_state().state == "quarantined"
    clock.advance(31)
    r.tick()
    node = fake.node(NODE)
    assert r.store.node_state().state == "healthy" and not node["spec"].get("unschedulable")
    assert our_conditions(node)["GPUXidError"]["status"] == "False"


def test_a_slot_left_by_a_crash_on_a_healthy_node_is_given_back(fake, tmp_path):
    stamp = "2099-01-01T00:00:00Z"
    seed_breaker(fake, slots=json.dumps({NODE: {"since": stamp, "renewed": stamp}}))
    r = remediator(fake, tmp_path)
    r.tick()
    assert json.loads(breaker_data(fake)["slots"]) == {}


def test_unreachable_api_backs_off_and_logs_once(tmp_path, caplog):
    """No kubeconfig, no API server: the remediator keeps running, retries with backoff and
    does not flood the log with a traceback per tick."""
    import logging
    import time as _time

    from gpu_monitor.config import Config, RemediationConfig
    from gpu_monitor.host_actuator import HostActuator
    from gpu_monitor.remediate.k8s.delivery import KubeDelivery
    from gpu_monitor.remediate.remediator import Remediator
    from gpu_monitor.remediate.settings import Timing
    from gpu_monitor.state import Store

    calls = []

    def no_api():
        calls.append(1)
        raise RuntimeError("Invalid kube-config file. No configuration found.")

    store = Store.open(str(tmp_path / "s.db"))
    cfg = Config(remediation=RemediationConfig(enabled=True, dry_run=True))
    rem = Remediator.from_config(store, cfg, "n1", KubeDelivery(no_api, "n1"), HostActuator(),
                                 timing=Timing(tick_s=0.02))
    caplog.set_level(logging.WARNING, logger="gpu_monitor.remediate.remediator")
    rem.start()
    try:
        deadline = _time.monotonic() + 1.0
        while _time.monotonic() < deadline:
            rem._wake.set()  # results keep arriving: wake-ups must not defeat the backoff
            _time.sleep(0.01)
    finally:
        rem.stop()
    # 0.02 * (2 + 4 + 8 + 16 + 32) s > 1 s: at most a handful of attempts, one traceback.
    assert 1 <= len(calls) <= 7
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1
    assert "No configuration found" in (rem.last_error or "")
