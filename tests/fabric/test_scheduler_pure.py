"""The scheduler's pure parts: grouping by topology, and what a Job and its pods say."""

from __future__ import annotations

import json

import pytest

from gpu_monitor.fabric.idle import NodeFacts
from gpu_monitor.fabric.lease import micro_time
from gpu_monitor.fabric.plan import Group, plan_groups, probe_state
from tests.fabric.fake_cluster import probe_summary

RACK, RAIL = "topology.kubernetes.io/rack", "nvidia.com/rail"


def f(name, labels):
    return NodeFacts(name=name, gpus=8, labels=labels)


def test_groups_follow_the_first_topology_label_present():
    nodes = [f("a1", {RACK: "r1"}), f("a2", {RACK: "r1", RAIL: "0"}), f("b1", {RAIL: "0"}),
             f("b2", {RAIL: "0"}), f("c1", {}), f("c2", {})]
    got = plan_groups(nodes, (RACK, RAIL), group_size=8)
    assert sorted(got, key=str) == sorted([Group("all.0", ("c1", "c2"), ""),
                                  Group("rack=r1.0", ("a1", "a2"), f"{RACK}=r1"),
                                  Group("rail=0.0", ("b1", "b2"), f"{RAIL}=0")], key=str)


def test_big_domains_are_split_evenly_and_lone_nodes_pooled():
    nodes = [f(f"n{i:02d}", {RACK: "r1"}) for i in range(11)]
    nodes += [f("x", {RACK: "r2"}), f("y", {RACK: "r3"}), f("z", {RACK: "r4"})]
    got = plan_groups(nodes, (RACK,), group_size=8)
    assert [len(g.nodes) for g in got] == [6, 5, 3]
    assert got[2] == Group("mixed.0", ("x", "y", "z"), "mixed")
    assert sorted(n for g in got for n in g.nodes) == sorted(x.name for x in nodes)


def test_a_single_candidate_makes_no_group():
    assert plan_groups([f("only", {})], (RACK,), group_size=8) == []


def pod(i, phase="Running", message=None, disrupted=False, deleting=False):
    p = {"metadata": {"name": f"p{i}", "labels": {"batch.kubernetes.io/job-completion-index":
                                                 str(i)}},
         "status": {"phase": phase}}
    if message is not None:
        p["status"]["containerStatuses"] = [{"state": {"terminated": {"message": message}}}]
    if disrupted:
        p["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                      "reason": "PreemptionByScheduler"}]
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return p


JOB = {"metadata": {"name": "j"}, "status": {}}


def job(cond=None, reason=None):
    if cond is None:
        return JOB
    return {"metadata": {"name": "j"}, "status": {"conditions": [
        {"type": cond, "status": "True", "reason": reason}]}}


OK = json.dumps(probe_summary(["a", "b"], True))
BAD = json.dumps(probe_summary(["a", "b"], False))
ERR = json.dumps({"schema": 1, "kind": "FabricProbeSummary", "verdict": "unknown",
                  "reasons": ["FabricProbeError"], "error": "NCCL error: remote process exited"})
KW = dict(schedule_timeout_s=300, probe_timeout_s=1800)


@pytest.mark.parametrize("j, pods, age, seen, outcome, why", [
    (JOB, [pod(0), pod(1)], 10, 2, None, "running"),
    (JOB, [pod(0, "Pending")], 10, 0, None, "running"),
    (job("Complete"), [pod(0, "Succeeded", OK), pod(1, "Succeeded", OK)], 60, 2, "pass", "verdict"),
    (job("Complete"), [pod(0, "Succeeded", BAD), pod(1, "Succeeded", BAD)], 60, 2, "fail", "verdict"),
    # A verdict decides even when a pod was preempted after rank 0 finished.
    (job("Failed", "PodFailurePolicy"), [pod(0, "Succeeded", OK), pod(1, disrupted=True)], 60, 2,
     "pass", "verdict"),
    (job("Failed", "PodFailurePolicy"), [pod(0)], 60, 2, "abandoned", "pod was disrupted"),
    (JOB, [pod(0), pod(1, disrupted=True)], 60, 2, "abandoned", "preempted or deleted: p1"),
    (JOB, [pod(0), pod(1, deleting=True)], 60, 2, "abandoned", "preempted or deleted: p1"),
    (JOB, [pod(0)], 60, 2, "abandoned", "1 pod(s) disappeared"),
    (None, [pod(0), pod(1)], 60, 2, "abandoned", "the Job was deleted"),
    (JOB, [pod(0), pod(1, "Pending")], 301, 2, "abandoned", "only 1 of 2 pods started"),
    (JOB, [pod(0), pod(1)], 1801, 2, "unknown", "no verdict within"),
    (job("Failed", "BackoffLimitExceeded"), [pod(0, "Failed", ERR), pod(1, "Failed")], 60, 2,
     "unknown", "NCCL error"),
    (job("Failed", "DeadlineExceeded"), [pod(0), pod(1)], 60, 2, "unknown", "deadline"),
    (job("Complete"), [pod(0, "Succeeded"), pod(1, "Succeeded")], 60, 2, "unknown",
     "without a verdict"),
])
def test_probe_state(j, pods, age, seen, outcome, why):
    st = probe_state(j, pods, 2, age, max_pods_seen=seen, **KW)
    assert st.outcome == outcome
    assert why in st.why


def test_partial_summaries_of_an_abandoned_probe_are_kept():
    st = probe_state(job("Failed", "PodFailurePolicy"), [pod(0, "Failed", ERR)], 2, 60,
                     max_pods_seen=2, **KW)
    assert st.outcome == "abandoned" and st.partial[0]["error"].startswith("NCCL")


def test_active_check_summaries():
    msg = json.dumps({"kind": "ActiveCheckSummary", "verdict": "unhealthy", "node": "n"})
    st = probe_state(job("Complete"), [pod(0, "Succeeded", msg)], 1, 5, kind="active-check",
                     max_pods_seen=1, **KW)
    assert st.outcome == "fail"


def test_lease_times_have_microseconds():
    from datetime import datetime, timezone

    assert micro_time(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc)) == \
        "2026-01-02T03:04:05.000006Z"
