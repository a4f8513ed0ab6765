"""daemonset/fabric: the component builds, grants exactly what the scheduler uses, and the
template and PriorityClass say what the scheduler assumes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_monitor.fabric.idle import PRIORITY_CLASS
from gpu_monitor.fabric.plan import render_probe_job
from gpu_monitor.fabric.scheduler import RBAC_CLUSTER, RBAC_NAMESPACED
from gpu_monitor.fabric.scheduler_settings import DEFAULT_TEMPLATE, SchedulerSettings

DIR = Path(__file__).resolve().parents[2] / "daemonset" / "fabric"


def docs():
    out = []
    for f in sorted(DIR.glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        out += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def one(kind, name=None):
    found = [d for d in docs() if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def rules_of(role):
    out = set()
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                out.add((g, res, tuple(sorted(r["verbs"]))))
    return out


def declared(rules):
    return {(g, r, tuple(sorted(v))) for g, r, v in rules}


def test_rbac_grants_exactly_what_the_scheduler_declares():
    assert rules_of(one("ClusterRole", "gpu-monitor-fabric-scheduler")) == declared(RBAC_CLUSTER)
    assert rules_of(one("Role", "gpu-monitor-fabric-scheduler")) == declared(RBAC_NAMESPACED)
    for binding in ("ClusterRoleBinding", "RoleBinding"):
        b = one(binding, "gpu-monitor-fabric-scheduler")
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-monitor-fabric-scheduler",
                                  "namespace": "gpu-monitor"}]


def test_the_priority_class_is_low_and_never_preempts():
    pc = one("PriorityClass", PRIORITY_CLASS)
    assert pc["preemptionPolicy"] == "Never"
    assert pc["value"] < 0 and pc["globalDefault"] is False


def test_the_job_template_is_an_indexed_low_priority_probe():
    job = one("Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["backoffLimit"] == 0
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == PRIORITY_CLASS and pod["restartPolicy"] == "Never"
    svc = one("Service", pod["subdomain"])
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    c = pod["containers"][0]
    assert c["command"] == ["torchrun"]
    args = c["args"]
    assert "--node-rank=$(JOB_COMPLETION_INDEX)" in args
    assert "--master-addr=$(MASTER_ADDR)" in args
    assert args[args.index("-m") + 1:args.index("-m") + 3] == ["gpu_monitor", "fabric-probe"]
    assert "--zero-exit" in args and "--termination-log=/dev/termination-log" in args
    env = {e["name"] for e in c["env"]}
    assert {"NNODES", "GPUS_PER_NODE", "MASTER_ADDR", "GPU_MONITOR_FABRIC_GROUP", "NODE_NAME",
            "POD_NAME"} <= env
    assert one("ServiceAccount", pod["serviceAccountName"])["automountServiceAccountToken"] is False


def test_the_rendered_job_keeps_the_templates_fixed_parts():
    job = render_probe_job(one("Job"), probe_id="0123456789", kind="group", nodes=["a", "b"],
                           group="rack=r1.0", gpus_per_node=4,
                           settings=SchedulerSettings(rdma_resources={"rdma/ib": "4"}))
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == "gpu-monitor-fabric" and pod["tolerations"]
    c = pod["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4", "rdma/ib": "4"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NNODES"] == "2" and env["GPU_MONITOR_FABRIC_GROUP"] == "rack=r1.0"
    assert any(e["name"] == "NODE_NAME" and "valueFrom" in e for e in c["env"])
    assert len(f"{job['metadata']['name']}-1") <= 63  # the pod hostname


def test_the_deployment_mounts_the_template_where_the_scheduler_reads_it():
    d = one("Deployment", "gpu-monitor-fabric-scheduler")
    pod = d["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-monitor-fabric-scheduler"
    c = pod["containers"][0]
    assert c["args"][0] == "fabric-scheduler"
    mount = c["volumeMounts"][0]["mountPath"]
    assert f"--job-template={DEFAULT_TEMPLATE}" in c["args"]
    assert DEFAULT_TEMPLATE.startswith(mount + "/")
    assert pod["volumes"][0]["configMap"]["name"] == "gpu-monitor-fabric-job-template"
    assert d["spec"]["replicas"] >= 2  # a standby to take over the lease


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_the_component_builds_with_kustomize(tmp_path):
    shutil.copytree(DIR, tmp_path / "fabric")
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "components:\n  - fabric\n")
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in built)
    assert kinds.count("ConfigMap") == 1 and "Deployment" in kinds and "PriorityClass" in kinds
    cm = next(d for d in built if d["kind"] == "ConfigMap")
    dep = next(d for d in built if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == \
        cm["metadata"]["name"]
    assert yaml.safe_load(cm["data"]["job-template.yaml"])["kind"] == "Job"
