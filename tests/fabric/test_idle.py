"""Idle nodes: eligibility, idle time, due checks, the active-check Job, and the runner that
feeds a failure back to the node's daemon."""

from __future__ import annotations

import json
import os
import stat
import sys
from datetime import datetime, timedelta, timezone

import pytest

from gpu_monitor.fabric.idle import (
    DEFAULT_CHECKS,
    ActiveCheckSpec,
    IdleTracker,
    build_active_check_job,
    decide,
    failure_report,
    ineligible_reason,
    node_facts,
    parse_active_summary,
    run_active_checks,
    short_name,
    tolerates,
)
from gpu_monitor.fabric.pods import pod_gpu_request, pod_holds_gpus

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


def node(name="n1", gpus=8, labels=None, taints=None, unschedulable=False, ready=True):
    spec = {"taints": taints} if taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec,
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)} if gpus else {},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(name, gpus=0, phase="Running", ours=False, init_gpus=0, node_name="n1"):
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec = {"nodeName": node_name, "containers": [{"name": "c", "resources": res}]}
    if init_gpus:
        spec["initContainers"] = [{"name": "i", "resources": {
            "requests": {"nvidia.com/gpu": str(init_gpus)}}}]
    labels = {"app.kubernetes.io/managed-by": "gpu-monitor-fabric-scheduler"} if ours else {}
    return {"metadata": {"name": name, "namespace": "ml", "labels": labels}, "spec": spec,
            "status": {"phase": phase}}


GPU_TOL = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@pytest.mark.parametrize("n, pods, why", [
    (node(), [], None),
    (node(), [pod("web")], None),  # a pod without GPUs does not make the node busy
    (node(), [pod("done", gpus=8, phase="Succeeded")], None),
    (node(), [pod("train", gpus=1)], "GPUs in use by 1 pod(s) (ml/train)"),
    (node(), [pod("pending-init", init_gpus=2)], "GPUs in use"),
    (node(), [pod("probe", gpus=8, ours=True)], "already being checked"),
    (node(gpus=0), [], "no allocatable GPUs"),
    (node(ready=False), [], "not Ready"),
    (node(labels={"gpu-monitor.io/state": "quarantined"}), [], "gpu-monitor state quarantined"),
    (node(labels={"gpu-monitor.io/state": "suspect"}), [], "gpu-monitor state suspect"),
    (node(labels={"gpu-monitor.io/state": "healthy"}), [], None),
    (node(labels={"gpu-monitor.io/exclude": "true"}), [], "labelled gpu-monitor.io/exclude"),
    (node(taints=[{"key": "gpu-monitor.io/unhealthy", "value": "Xid79",
                   "effect": "NoSchedule"}]), [], "tainted by gpu-monitor"),
    (node(unschedulable=True), [], "cordoned"),
    (node(taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]), [], None),  # tolerated
    (node(taints=[{"key": "dedicated", "value": "team-a", "effect": "NoSchedule"}]), [],
     "taint dedicated:NoSchedule not tolerated"),
    (node(taints=[{"key": "soft", "effect": "PreferNoSchedule"}]), [], None),
])
def test_eligibility(n, pods, why):
    got = ineligible_reason(node_facts(n, pods, tolerations=GPU_TOL))
    if why is None:
        assert got is None
    else:
        assert got is not None and got.startswith(why)


def test_gpu_requests_follow_the_schedulers_arithmetic():
    assert pod_gpu_request(pod("a", gpus=4)) == 4
    assert pod_gpu_request(pod("b", gpus=2, init_gpus=8)) == 8
    assert not pod_holds_gpus(pod("c", gpus=4, node_name=None))  # not bound yet
    assert not pod_holds_gpus(pod("d", gpus=4, phase="Failed"))


@pytest.mark.parametrize("tol, taint, ok", [
    ({"operator": "Exists"}, {"key": "x", "effect": "NoExecute"}, True),
    ({"key": "x", "operator": "Equal", "value": "1"}, {"key": "x", "value": "1",
                                                     "effect": "NoSchedule"}, True),
    ({"key": "x", "value": "1"}, {"key": "x", "value": "2", "effect": "NoSchedule"}, False),
    ({"key": "x", "operator": "Exists", "effect": "NoExecute"}, {"key": "x",
                                                                 "effect": "NoSchedule"}, False),
])
def test_toleration_matching(tol, taint, ok):
    assert tolerates([tol], taint) is ok


def test_idle_time_restarts_whenever_a_workload_appears():
    t = IdleTracker()
    t.observe("a", False, 100.0)
    assert t.idle_for("a", 160.0) == 60.0
    t.observe("a", False, 170.0)  # still idle: the start stays
    assert t.idle_for("a", 200.0) == 100.0
    t.observe("a", True, 210.0)
    assert t.idle_for("a", 220.0) is None
    t.observe("a", False, 230.0)
    assert t.idle_for("a", 240.0) == 10.0
    t.forget(["b"])
    assert t.idle_for("a", 250.0) is None


@pytest.mark.parametrize("idle, last, run", [
    (None, None, False),
    (599.0, None, False),
    (600.0, None, True),
    (3600.0, T0 - timedelta(hours=23), False),
    (3600.0, T0 - timedelta(hours=24), True),
])
def test_decide_needs_idle_long_enough_and_not_checked_recently(idle, last, run):
    d = decide(node_facts(node(), []), idle, last, T0, idle_for_s=600, interval_s=86400)
    assert d.run is run and d.why


def test_decide_never_borrows_an_ineligible_node():
    d = decide(node_facts(node(), [pod("t", gpus=8)]), 1e9, None, T0, idle_for_s=0,
               interval_s=0)
    assert not d.run and "GPUs in use" in d.why


def test_the_active_check_job_reserves_the_node_through_the_scheduler():
    spec = ActiveCheckSpec(image="img:1", namespace="gm")
    job = build_active_check_job("gpu-node-17.example", 8, spec, probe_id="abcdef0123")
    assert job["metadata"]["namespace"] == "gm"
    assert len(job["metadata"]["name"]) <= 63
    assert job["spec"]["backoffLimit"] == 0
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "FailJob"
    assert rules[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["priorityClassName"] == "gpu-monitor-idle-check"
    assert "nodeName" not in pod_spec  # through the scheduler: taints, capacity, preemption
    expr = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]
    assert expr == {"key": "kubernetes.io/hostname", "operator": "In",
                    "values": ["gpu-node-17.example"]}
    c = pod_spec["containers"][0]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert c["command"][:4] == ["gpu-monitor", "idle-check", "--checks", ",".join(DEFAULT_CHECKS)]
    assert "--drop-dir" in c["command"]
    assert pod_spec["volumes"][0]["hostPath"]["path"] == "/var/lib/gpu-monitor/reports"
    assert c["volumeMounts"][0]["mountPath"] == "/var/lib/gpu-monitor/reports"
    crd = build_active_check_job("n", 4, ActiveCheckSpec(deliver="crd"), probe_id="x" * 10)
    assert [v["name"] for v in crd["spec"]["template"]["spec"]["volumes"]] == ["dshm"]


def test_the_active_check_job_is_not_best_effort_and_has_a_memory_backed_shm():
    spec = ActiveCheckSpec(resources={"requests": {"cpu": "2", "memory": "8Gi"},
                                      "limits": {"memory": "20Gi"}}, shm_size="4Gi")
    pod = build_active_check_job("n", 8, spec, probe_id="abcdef0123")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["requests"] == {"nvidia.com/gpu": "8", "cpu": "2", "memory": "8Gi"}
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "memory": "20Gi"}
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    default = build_active_check_job("n", 8, ActiveCheckSpec(), probe_id="abcdef0123")
    requests = default["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests.keys() >= {"cpu", "memory"}


@pytest.mark.parametrize("deliver,root,token", [("drop-dir", True, False), ("crd", False, True),
                                                ("none", False, False)])
def test_the_active_check_job_adds_no_capability_and_a_token_only_for_crd(deliver, root, token):
    job = build_active_check_job("n", 8, ActiveCheckSpec(deliver=deliver), probe_id="a" * 10)
    pod = job["spec"]["template"]["spec"]
    sc = pod["containers"][0]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert (sc.get("runAsUser") == 0) is root  # only to write the root-owned drop directory
    assert pod["automountServiceAccountToken"] is token


def test_the_active_check_job_carries_the_standard_labels_and_files_reports_elsewhere():
    spec = ActiveCheckSpec(namespace="gm-jobs", report_namespace="gm", deliver="crd",
                           instance="prod")
    job = build_active_check_job("n", 8, spec, probe_id="abcdef0123")
    assert job["metadata"]["namespace"] == "gm-jobs"
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--namespace") + 1] == "gm"
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["app.kubernetes.io/instance"] == "prod"
        assert labels["app.kubernetes.io/managed-by"] == "gpu-monitor-fabric-scheduler"
        assert labels["app.kubernetes.io/part-of"] == "gpu-monitor"
        assert labels["app.kubernetes.io/component"] == "idle-check"
        assert labels["app.kubernetes.io/version"] and labels["app.kubernetes.io/name"]


def test_short_names_are_dns_safe_and_distinct():
    a, b = short_name("GPU_Node.1"), short_name("gpu-node-1")
    assert a != b
    assert all(c.isalnum() or c == "-" for c in a + b)


REPORT = {
    "schema": 1, "node": "n1", "profile": "h100-sxm-8", "verdict": "unhealthy",
    "started_at": "2026-03-01T00:00:00Z", "finished_at": "2026-03-01T00:10:00Z",
    "results": [
        {"check": "burn_in", "status": "ok", "target": "gpu:0", "reason": "Ok"},
        {"check": "burn_in", "status": "failed", "target": "gpu:3", "reason": "BurnInWrongResult",
         "action": "replace", "message": "gpu:3 differs"},
        {"check": "nccl_allreduce", "status": "failed", "target": "node",
         "reason": "NcclBusBwLow", "action": "watch", "message": "low"},
    ],
}


def test_a_failed_report_becomes_a_health_report_the_daemon_reads(tmp_path):
    from gpu_monitor.remediate.reports import parse_report_file

    body = failure_report(REPORT, "n1", T0, "gpu-monitor")
    assert body["spec"]["reason"] == "BurnInWrongResult"  # the worst action's reason
    assert body["spec"]["evidence"]["action"] == "replace"
    got = parse_report_file(json.dumps(body), "n1", "f.json", T0)
    assert [r.reason for r in got] == ["BurnInWrongResult"]
    assert failure_report({**REPORT, "verdict": "healthy"}, "n1", T0, "gm") is None
    assert failure_report({**REPORT, "verdict": "unknown"}, "n1", T0, "gm") is None


def _fake_python(tmp_path, report, rc):
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\nimport sys, json\n"
                      f"sys.stderr.write('args: ' + ' '.join(sys.argv[1:]) + '\\n')\n"
                      f"print(json.dumps({report!r}))\nsys.exit({rc})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_the_runner_drops_a_failure_where_the_daemon_looks(tmp_path, capsys):
    from gpu_monitor.clock import Clock
    from gpu_monitor.remediate.reports import ReportSource

    drop = tmp_path / "reports"
    term = tmp_path / "term"
    rc, report = run_active_checks(["burn_in", "nccl_allreduce"], "n1", drop_dir=str(drop),
                                   termination_log=str(term),
                                   python=_fake_python(tmp_path, REPORT, 1))
    assert rc == 1 and report["verdict"] == "unhealthy"
    assert "bootstrap --checks burn_in,nccl_allreduce --output json --node-name n1" in \
        capsys.readouterr().err
    files = [f for f in os.listdir(drop) if not f.startswith(".")]
    assert len(files) == 1 and files[0].endswith(".json")
    summary = parse_active_summary(term.read_text())
    assert summary["verdict"] == "unhealthy" and summary["delivered"].endswith(files[0])
    assert {(x["check"], x["reason"]) for x in summary["not_ok"]} == {
        ("burn_in", "BurnInWrongResult"), ("nccl_allreduce", "NcclBusBwLow")}

    class _Store:  # what ReportSource needs of the state store
        def __init__(self):
            self.seen = set()

        def add_health_report(self, uid, *a):
            if uid in self.seen:
                return False
            self.seen.add(uid)
            return True

    src = ReportSource("n1", _Store(), Clock(), drop_dir=str(drop), max_age_s=1e12)
    results = src.poll(crd=False)
    assert [(r.reason, r.status.value) for r in results] == [("BurnInWrongResult", "failed")]


def test_the_runner_delivers_nothing_for_a_healthy_node(tmp_path):
    drop = tmp_path / "reports"
    rc, _ = run_active_checks(["burn_in"], "n1", drop_dir=str(drop),
                              python=_fake_python(tmp_path, {**REPORT, "verdict": "healthy"}, 0))
    assert rc == 0 and not drop.exists()


def test_the_runner_files_a_gpuhealthreport_through_the_api(tmp_path, kube, fake_api):
    rc, _ = run_active_checks(["burn_in"], "n1", deliver="crd", namespace="gpu-monitor",
                              python=_fake_python(tmp_path, REPORT, 1), kube=kube)
    (rep,) = fake_api.list("gpu-monitor.io", "gpuhealthreports", "gpu-monitor")
    assert rep["spec"]["node"] == "n1" and rep["metadata"]["labels"]["gpu-monitor.io/node"] == "n1"


def test_the_runner_reports_unknown_when_bootstrap_printed_nothing(tmp_path):
    term = tmp_path / "term"
    script = tmp_path / "broken"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('boom\\n')\nsys.exit(2)\n")
    script.chmod(0o755)
    rc, report = run_active_checks(["burn_in"], "n1", termination_log=str(term),
                                   python=str(script), drop_dir=str(tmp_path / "r"))
    assert rc == 2 and report is None
    s = parse_active_summary(term.read_text())
    assert s["verdict"] == "unknown" and s["error"] == "boom"
