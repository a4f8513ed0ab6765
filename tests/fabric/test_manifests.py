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
from gpu_monitor.fabric.scheduler import RBAC_CLUSTER, RBAC_JOBS, rbac_namespaced
from gpu_monitor.fabric.scheduler_settings import (
    DEFAULT_TEMPLATE,
    SchedulerSettings,
    settings_from_mapping,
)

DIR = Path(__file__).resolve().parents[2] / "daemonset" / "fabric"
NOT_OBJECTS = ("kustomization.yaml", "settings.yaml")  # settings.yaml: a ConfigMap's content


def docs():
    out = []
    for f in sorted(DIR.glob("*.yaml")):
        if f.name in NOT_OBJECTS:
            continue
        out += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def one(kind, name=None, namespace=None):
    found = [d for d in docs() if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)
             and (namespace is None or d["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def rules_of(role):
    out = set()
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                out.add((g, res, tuple(sorted(r["verbs"])), tuple(r.get("resourceNames") or ())))
    return out


def declared(rules):
    return {(g, r, tuple(sorted(v)), tuple(n)) for g, r, v, n in rules}


SETTINGS = settings_from_mapping(yaml.safe_load((DIR / "settings.yaml").read_text()))
SCHEDULER_ARGS = one("Deployment", "gpu-monitor-fabric-scheduler")["spec"]["template"]["spec"][
    "containers"][0]["args"]


def flag(name):
    return next(a.split("=", 1)[1] for a in SCHEDULER_ARGS if a.startswith(f"--{name}="))


def test_rbac_grants_exactly_what_the_scheduler_declares():
    ns, jobs_ns = flag("namespace"), flag("job-namespace")
    assert rules_of(one("ClusterRole", "gpu-monitor-fabric-scheduler")) == declared(RBAC_CLUSTER)
    assert rules_of(one("Role", "gpu-monitor-fabric-scheduler", ns)) == \
        declared(rbac_namespaced(SchedulerSettings()))
    assert rules_of(one("Role", "gpu-monitor-fabric-scheduler", jobs_ns)) == declared(RBAC_JOBS)
    assert one("ClusterRoleBinding", "gpu-monitor-fabric-scheduler")["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-monitor-fabric-scheduler", "namespace": ns}]
    for where in (ns, jobs_ns):
        assert one("RoleBinding", "gpu-monitor-fabric-scheduler", where)["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpu-monitor-fabric-scheduler", "namespace": ns}]


def test_the_scheduler_updates_only_its_own_lease_and_record_by_name():
    role = one("Role", "gpu-monitor-fabric-scheduler", flag("namespace"))
    for rule in role["rules"]:
        if set(rule["verbs"]) - {"create"} and rule["resources"] != ["gpuhealthreports"]:
            assert rule.get("resourceNames"), f"{rule} may touch every object of its kind"
    names = {n for r in role["rules"] for n in r.get("resourceNames") or ()}
    assert names == {SchedulerSettings().lease_name, SchedulerSettings().state_configmap}


def test_the_jobs_run_in_their_own_namespace_with_their_own_service_accounts():
    jobs_ns = flag("job-namespace")
    assert jobs_ns != flag("namespace") == "gpu-monitor"  # not where the daemon's SA lives
    assert SchedulerSettings().job_namespace == jobs_ns
    one("Namespace", jobs_ns)
    pod = one("Job")["spec"]["template"]["spec"]
    accounts = {d["metadata"]["name"] for d in docs() if d["kind"] == "ServiceAccount"
                and d["metadata"]["namespace"] == jobs_ns}
    assert accounts == {pod["serviceAccountName"], "gpu-monitor-idle-check"}
    for name in accounts:
        assert one("ServiceAccount", name, jobs_ns)["automountServiceAccountToken"] is False
    # Nothing in the Job namespace is bound to any right but the idle-check's report filing.
    bindings = [d for d in docs() if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    for b in bindings:
        for subject in b["subjects"]:
            if subject.get("namespace") == jobs_ns:
                assert b["roleRef"]["name"] == "gpu-monitor-idle-check", b["metadata"]
    assert rules_of(one("Role", "gpu-monitor-idle-check")) == {
        ("gpu-monitor.io", "gpuhealthreports", ("create",), ())}
    assert one("Service", pod["subdomain"])["metadata"]["namespace"] == jobs_ns


def test_the_shipped_settings_file_spells_out_the_code_defaults():
    defaults = SchedulerSettings()
    keys = yaml.safe_load((DIR / "settings.yaml").read_text())
    assert keys, "settings.yaml is empty"
    for key in keys:
        assert getattr(SETTINGS, key) == getattr(defaults, key), key
    assert SETTINGS.probe_resources["requests"].keys() >= {"cpu", "memory"}
    assert SETTINGS.active_check_resources["requests"].keys() >= {"cpu", "memory"}


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
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4", "rdma/ib": "4",
                                        **SchedulerSettings().probe_resources["limits"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NNODES"] == "2" and env["GPU_MONITOR_FABRIC_GROUP"] == "rack=r1.0"
    assert any(e["name"] == "NODE_NAME" and "valueFrom" in e for e in c["env"])
    assert len(f"{job['metadata']['name']}-1") <= 63  # the pod hostname
    assert job["metadata"]["namespace"] == "gpu-monitor-jobs"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/dev/shm"}
    labels = job["spec"]["template"]["metadata"]["labels"]
    for key in ("name", "instance", "version", "component", "part-of", "managed-by"):
        assert labels[f"app.kubernetes.io/{key}"], key


def test_ipc_lock_is_only_added_where_it_takes_effect():
    """A capability added for a non-root user is never effective: the probe runs as root
    with IPC_LOCK alone, or not with IPC_LOCK at all."""
    sc = one("Job")["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    if "IPC_LOCK" in (sc.get("capabilities") or {}).get("add", []):
        assert sc["runAsUser"] == 0 and sc["capabilities"]["drop"] == ["ALL"]
        assert sc["allowPrivilegeEscalation"] is False


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
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v["configMap"]["name"] for v in pod["volumes"]}
    assert volumes["settings"] == "gpu-monitor-fabric-settings"
    assert flag("settings") == f"{mounts['settings']}/settings.yaml"


def test_the_scheduler_is_probed_on_the_port_it_serves_and_logs_json():
    c = one("Deployment", "gpu-monitor-fabric-scheduler")["spec"]["template"]["spec"][
        "containers"][0]
    (port,) = c["ports"]
    assert flag("listen").rsplit(":", 1)[1] == str(port["containerPort"])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert flag("log-format") == "json"
    svc = one("Service", "gpu-monitor-fabric-scheduler")
    assert svc["spec"]["ports"][0]["targetPort"] == port["name"]
    monitor = one("ServiceMonitor", "gpu-monitor-fabric-scheduler")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]


def test_the_scheduler_never_outranks_the_daemon_and_uses_no_system_class():
    pod = one("Deployment", "gpu-monitor-fabric-scheduler")["spec"]["template"]["spec"]
    assert not pod["priorityClassName"].startswith("system-")
    ours = one("PriorityClass", pod["priorityClassName"])
    base = Path(__file__).resolve().parents[2] / "daemonset" / "priorityclass.yaml"
    daemon = yaml.safe_load(base.read_text())
    assert 0 < ours["value"] < daemon["value"]
    assert ours["preemptionPolicy"] == "Never"


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
    assert kinds.count("ConfigMap") == 2 and "Deployment" in kinds and "PriorityClass" in kinds
    cm = next(d for d in built if d["kind"] == "ConfigMap" and "job-template.yaml" in d["data"])
    dep = next(d for d in built if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == \
        cm["metadata"]["name"]
    assert yaml.safe_load(cm["data"]["job-template.yaml"])["kind"] == "Job"
