"""The fabric scheduler against the fake apiserver: idle nodes, the Indexed Job, bisection to
the bad node, a probe abandoned when a workload preempts it, active checks, metrics."""

from __future__ import annotations

import json
import time

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.fabric.bisect import probe_bound
from gpu_monitor.fabric.metrics import FabricCollector
from gpu_monitor.fabric.scheduler import FabricScheduler
from gpu_monitor.fabric.scheduler_settings import SchedulerSettings
from tests.fabric.fake_cluster import FLOOR

RACK = "topology.kubernetes.io/rack"


def make(fabric_api, template, clock=None, **kw) -> FabricScheduler:
    base = dict(identity="test", idle_for_s=0.0, interval_s=0.05, topology_labels=(RACK,),
                rdma_resources={"rdma/ib": "1"})
    base.update(kw)
    return FabricScheduler(fabric_api, SchedulerSettings(**base), template=template,
                           clock=clock or FakeClock(), always_lead=True)


def tick_until(sched, cond, timeout=30.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sched.tick()
        if cond():
            return
        time.sleep(step)
    raise AssertionError(f"condition not met in {timeout} s")


def reports(fake_api):
    return fake_api.list("gpu-monitor.io", "gpuhealthreports", "gpu-monitor")


def jobs(fake_api, kind=None):
    out = fake_api.list("batch", "jobs", "gpu-monitor-jobs")
    return [j for j in out if kind is None
            or j["metadata"]["labels"].get("gpu-monitor.io/probe-kind") == kind]


def test_finds_idle_nodes_and_launches_an_indexed_job(fake_api, fabric_api, template,
                                                      controller):
    controller.verdict = lambda nodes: None  # keep the probe running
    for n in ("n0", "n1", "n2", "n3"):
        fake_api.add_node(n, gpus=8, labels={RACK: "r1"})
    fake_api.add_node("n4", gpus=8, labels={RACK: "r2"})
    fake_api.add_node("n5", gpus=8, labels={RACK: "r1"},
                      taints=[{"key": "gpu-monitor.io/unhealthy", "value": "Xid79",
                               "effect": "NoSchedule"}])
    fake_api.add_node("n6", gpus=8, labels={RACK: "r1", "gpu-monitor.io/state": "quarantined"})
    fake_api.add_node("cpu0")  # no GPUs, not selected
    fake_api.add_pod("ml", "trainer", node="n2", gpus=8)  # busy
    fake_api.add_pod("ml", "sidecar", node="n3")  # no GPUs: n3 is still idle
    sched = make(fabric_api, template)
    sched.tick()
    made = jobs(fake_api)
    assert len(made) == 1
    job = made[0]
    nodes = json.loads(job["metadata"]["annotations"]["gpu-monitor.io/probe-nodes"])
    assert nodes == ["n0", "n1", "n3"]  # r1's idle, healthy nodes; n4 alone in r2 waits
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == "gpu-monitor-idle-check"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == nodes
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    c = pod["containers"][0]
    probe = SchedulerSettings().probe_resources
    assert c["resources"]["requests"] == {"nvidia.com/gpu": "8", "rdma/ib": "1",
                                          **probe["requests"]}
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "1", **probe["limits"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NNODES"] == "3" and env["GPUS_PER_NODE"] == "8"
    assert env["MASTER_ADDR"] == (f"{job['metadata']['name']}-0.gpu-monitor-fabric."
                                  "gpu-monitor-jobs.svc")
    assert "fabric-probe" in c["args"]
    # The running probe holds its nodes: no second Job for them.
    tick_until(sched, lambda: len(controller.jobs) == 1)
    sched.tick()
    assert len(jobs(fake_api)) == 1


def test_waits_until_nodes_were_idle_long_enough_and_not_probed_recently(
        fake_api, fabric_api, template, controller):
    for n in ("a", "b"):
        fake_api.add_node(n, gpus=4)
    clock = FakeClock()
    sched = make(fabric_api, template, clock=clock, idle_for_s=600, probe_interval_s=3600)
    sched.tick()
    assert jobs(fake_api) == []
    clock.advance(601)
    sched.tick()
    assert len(jobs(fake_api)) == 1
    tick_until(sched, lambda: sched.counts[("group", "pass")] == 1)
    rec = sched.records["a"]
    assert rec["probe_outcome"] == "pass" and rec["last_probe"]
    clock.advance(1800)  # probed half an hour ago: not due
    sched.tick()
    assert len(jobs(fake_api)) == 1
    clock.advance(1801)
    sched.tick()
    assert len(jobs(fake_api)) == 2
    # The record survives in the ConfigMap for the next leader.
    cm = fake_api.get("", "configmaps", "gpu-monitor-fabric-state", "gpu-monitor")
    assert json.loads(cm["data"]["nodes.json"])["b"]["probe_outcome"] == "pass"


def test_bisection_names_the_injected_bad_node_among_eight(fake_api, fabric_api, template,
                                                          controller):
    nodes = [f"gpu{i}" for i in range(8)]
    for n in nodes:
        fake_api.add_node(n, gpus=8, labels={RACK: "r7"})
    bad = "gpu5"
    controller.verdict = lambda group: bad not in group
    sched = make(fabric_api, template)
    tick_until(sched, lambda: reports(fake_api) and not sched.bisections)
    got = reports(fake_api)
    assert len(got) == 1
    rep = got[0]
    assert rep["spec"]["node"] == bad
    assert rep["spec"]["reason"] == "FabricProbeFailed"
    assert rep["metadata"]["labels"]["gpu-monitor.io/node"] == bad
    ev = rep["spec"]["evidence"]
    assert ev["group_nodes"] == nodes
    assert ev["group_probe"]["ops"]["all_reduce"]["busbw_gb_per_s"] < FLOOR
    pair = ev["pair_probe"]
    assert pair["partner"] in nodes and pair["partner"] != bad
    assert pair["ops"]["all_reduce"]["busbw_gb_per_s"] < FLOOR
    assert pair["limits"]["busbw_floor_gb_per_s"] == FLOOR
    # Bounded: the group probe plus at most 2 x log2(8) re-tests, every one crossing nodes.
    bisects = jobs(fake_api, "bisect")
    assert 1 <= len(bisects) <= probe_bound(8)
    assert len(jobs(fake_api, "group")) == 1
    for j in bisects:
        assert j["spec"]["completions"] >= 2
    # Only the bad node is blamed; the others are cleared.
    assert sched.records[bad]["probe_outcome"] == "fail"
    assert all(sched.records[n]["probe_outcome"] == "pass" for n in nodes if n != bad)
    # The pair numbers are exported; a later round reports nothing twice.
    a, b = sorted((bad, pair["partner"]))
    assert sched.pair_metrics[(a, b)]["all_reduce"]["busbw_gb_per_s"] < FLOOR
    for _ in range(3):
        sched.tick()
    assert len(reports(fake_api)) == 1


def test_the_probes_own_suspect_is_pair_tested_first(fake_api, fabric_api, template,
                                                     controller):
    nodes = [f"h{i}" for i in range(8)]
    for n in nodes:
        fake_api.add_node(n, gpus=8)
    controller.verdict = lambda group: "h2" not in group
    controller.suspects = lambda group: ["h2"] if "h2" in group else []
    sched = make(fabric_api, template)
    tick_until(sched, lambda: reports(fake_api) and not sched.bisections)
    assert [r["spec"]["node"] for r in reports(fake_api)] == ["h2"]
    # The rest re-tested as a whole (it passes and gives a partner), then one pair.
    assert len(jobs(fake_api, "bisect")) == 2


def test_a_probe_preempted_by_a_workload_is_abandoned_not_failed(fake_api, fabric_api,
                                                                 template, controller):
    for n in ("p0", "p1", "p2", "p3"):
        fake_api.add_node(n, gpus=8)
    controller.verdict = lambda nodes: None  # the probe is still running when preempted
    sched = make(fabric_api, template)
    sched.tick()
    (job,) = jobs(fake_api)
    name = job["metadata"]["name"]
    tick_until(sched, lambda: len([p for p in fake_api.list("", "pods", "gpu-monitor-jobs")
                                   if p["metadata"]["labels"].get("job-name") == name]) == 4)
    fake_api.add_pod("ml", "urgent-training", node="p1", gpus=8)
    tick_until(sched, lambda: sched.counts[("group", "abandoned")] == 1)
    assert sched.counts[("group", "fail")] == 0 and sched.counts[("group", "pass")] == 0
    assert not sched.bisections and reports(fake_api) == []
    for n in ("p0", "p1", "p2", "p3"):
        rec = sched.records[n]
        assert rec["abandoned_outcome"] == "abandoned"
        assert "last_probe" not in rec  # not a pass, not a fail: still due
    # The Job is deleted so the other nodes' GPUs are free at once.
    tick_until(sched, lambda: fake_api.get("batch", "jobs", name, "gpu-monitor-jobs") is None)
    # Once the old pods are gone (the garbage collector), the next round leaves the busy node
    # out and probes the others again.
    deadline = time.monotonic() + 10
    while any(p["metadata"]["labels"].get("job-name") == name
              for p in fake_api.list("", "pods", "gpu-monitor-jobs")):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    controller.verdict = lambda nodes: True
    tick_until(sched, lambda: len(jobs(fake_api, "group")) == 1
               and jobs(fake_api, "group")[0]["metadata"]["name"] != name)
    again = json.loads(jobs(fake_api, "group")[0]["metadata"]["annotations"]
                       ["gpu-monitor.io/probe-nodes"])
    # The busy node is left out. (Under load the next round may start while one old probe pod
    # is still terminating, and that node then waits for the round after: either is right.)
    assert "p1" not in again and set(again) <= {"p0", "p2", "p3"} and len(again) >= 2


def test_active_checks_run_on_idle_nodes_and_record_the_outcome(fake_api, fabric_api,
                                                                template, controller):
    fake_api.add_node("solo", gpus=4)  # alone: no fabric group, but due for active checks
    sched = make(fabric_api, template, active_checks=True,
                 active_check_list=("burn_in", "nccl_allreduce"))
    sched.tick()
    (job,) = jobs(fake_api, "active-check")
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4",
                                        **SchedulerSettings().active_check_resources["limits"]}
    assert c["command"][:4] == ["gpu-monitor", "idle-check", "--checks", "burn_in,nccl_allreduce"]
    assert pod["priorityClassName"] == "gpu-monitor-idle-check"
    tick_until(sched, lambda: sched.counts[("active-check", "pass")] == 1)
    assert sched.records["solo"]["check_outcome"] == "pass"
    sched.tick()
    assert len(jobs(fake_api, "active-check")) == 1  # not due again


def test_metrics_expose_groups_pairs_and_outcomes(fake_api, fabric_api, template, controller):
    from prometheus_client import CollectorRegistry, generate_latest

    for n in ("m0", "m1"):
        fake_api.add_node(n, gpus=8)
    sched = make(fabric_api, template)
    tick_until(sched, lambda: sched.counts[("group", "pass")] == 1)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FabricCollector(sched))
    text = generate_latest(reg).decode()
    assert 'gpu_monitor_fabric_group_busbw_gb_per_s{group="all.0",op="all_reduce"} 310.0' in text
    assert 'gpu_monitor_fabric_pair_busbw_gb_per_s{node_a="m0",node_b="m1",op="all_gather"} 310.0' \
        in text
    assert 'gpu_monitor_fabric_probes_total{kind="group",outcome="pass"} 1.0' in text
    assert 'gpu_monitor_fabric_probes_total{kind="bisect",outcome="abandoned"} 0.0' in text
    assert 'gpu_monitor_fabric_last_probe_timestamp_seconds{node="m0"}' in text
    assert "gpu_monitor_fabric_leader 1.0" in text


@pytest.mark.parametrize("bad", [
    {"group_size": 1},
    {"min_group_size": 1},
    {"lease_duration_s": 5, "renew_deadline_s": 5},
])
def test_settings_refuse_nonsense(bad):
    with pytest.raises(ValueError):
        SchedulerSettings(**bad).validate()


def test_a_known_good_node_from_another_rack_partners_the_bisection(fake_api, fabric_api,
                                                                     template, controller):
    good = [f"r1n{i}" for i in range(4)]
    suspect = [f"r2n{i}" for i in range(4)]
    for n in good:
        fake_api.add_node(n, gpus=8, labels={RACK: "r1"})
    for n in suspect:
        fake_api.add_node(n, gpus=8, labels={RACK: "r2"})
    controller.verdict = lambda group: "r2n3" not in group
    sched = make(fabric_api, template, max_concurrent_probes=1)
    tick_until(sched, lambda: reports(fake_api) and not sched.bisections)
    assert [r["spec"]["node"] for r in reports(fake_api)] == ["r2n3"]
    bisects = jobs(fake_api, "bisect")
    assert len(bisects) == probe_bound(4)  # halves, then pairs: 2 + 2
    for j in bisects:  # every re-test includes a node rack r1 cleared
        members = json.loads(j["metadata"]["annotations"]["gpu-monitor.io/probe-nodes"])
        assert set(members) & set(good)


def test_a_new_leader_adopts_a_probe_the_old_one_left_running(fake_api, fabric_api, template,
                                                               controller):
    from gpu_monitor.fabric.plan import render_probe_job

    for n in ("o0", "o1"):
        fake_api.add_node(n, gpus=8)
    controller.verdict = lambda nodes: None
    old = render_probe_job(template, probe_id="0ld0000000", kind="group", nodes=["o0", "o1"],
                           group="all.0", gpus_per_node=8, settings=SchedulerSettings())
    fake_api.add_object(old)
    sched = make(fabric_api, template)
    sched.tick()
    assert list(sched.in_flight) == ["0ld0000000"] and sched.in_flight["0ld0000000"].adopted
    assert len(jobs(fake_api)) == 1  # its nodes are busy: no second probe
    controller.verdict = lambda nodes: True
    tick_until(sched, lambda: sched.counts[("group", "pass")] == 1)
    assert sched.records["o0"]["probe_outcome"] == "pass"


def test_idle_time_counts_only_while_the_node_could_be_borrowed(fake_api, fabric_api, template,
                                                                controller):
    fake_api.add_node("q0", gpus=8)
    fake_api.add_node("q1", gpus=8, labels={"gpu-monitor.io/state": "quarantined"})
    clock = FakeClock()
    sched = make(fabric_api, template, clock=clock, idle_for_s=600)
    sched.tick()
    clock.advance(700)
    sched.tick()
    assert jobs(fake_api) == []  # q1 is quarantined: no pair yet
    node = fake_api.node("q1")
    node["metadata"]["labels"]["gpu-monitor.io/state"] = "healthy"  # released
    fake_api.add_object(node)
    sched.tick()
    assert jobs(fake_api) == []  # q1 has been borrowable for 0 s, not 700
    clock.advance(600)
    sched.tick()
    assert len(jobs(fake_api)) == 1
