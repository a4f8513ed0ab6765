"""charts/gpu-monitor: `helm lint` is clean, every rendering is valid Kubernetes, and each value
does what values.yaml says.

Rendered and linted by Helm v4's engine (helm-python-sdk). The rendered core objects are held
to the same schema validation as the kustomize output (tests/deploy/test_manifests.py:
kubernetes-validate, strict, the oldest supported and the newest Kubernetes).
"""

from __future__ import annotations

import hashlib

import pytest
import yaml

from gpu_monitor import __version__
from tests.deploy.deploy_helpers import (
    CLUSTER_SCOPED,
    DEPLOY,
    MIN_KUBERNETES,
    MIN_KUBERNETES_ADMISSION,
    daemon_container,
    find,
    find_all,
    is_core,
    kubernetes_validate,
    validate_object,
)
from tests.deploy.helm_chart import CHART, COMPONENT_VALUES, helm, helm_lint, helm_render, merged

#: Value sets every test of the renderings runs: the defaults, each component, all of them.
VALUE_SETS = {"defaults": {}, **COMPONENT_VALUES,
              "all": merged({"namespace": {"create": True}}, *COMPONENT_VALUES.values())}
WARNING = 2  # helm lint severities: 1 info, 2 warning, 3 error


def _config(docs) -> dict:
    return yaml.safe_load(find(docs, "ConfigMap", "gpu-monitor-config")["data"]["config.yaml"])


def _daemon(docs) -> dict:
    return daemon_container(find(docs, "DaemonSet", "gpu-monitor"))


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_is_clean(name):
    report = helm_lint(VALUE_SETS[name])
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert not report["errors"] and not problems, (name, report)


def test_helm_lint_reports_a_broken_template(tmp_path):
    import shutil

    broken = tmp_path / "gpu-monitor"
    shutil.copytree(CHART, broken, symlinks=False)
    (broken / "templates" / "service.yaml").write_text("{{ .Values.nope.deeper }}\n")
    report = helm().lint(broken, {}, strict=True)
    assert report["errors"] or any(m["severity"] >= WARNING for m in report["messages"])


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_objects_validate_against_the_kubernetes_schemas(name):
    kv = kubernetes_validate()
    docs = helm_render(VALUE_SETS[name])
    minimum = MIN_KUBERNETES_ADMISSION if any(
        d["kind"].startswith("ValidatingAdmissionPolicy") for d in docs) else MIN_KUBERNETES
    assert docs
    for doc in docs:
        if is_core(doc):
            validate_object(kv, doc, minimum, f"helm template ({name})")


#: The objects of daemonset/fabric that live where the Jobs run (fabric.jobNamespace).
IN_JOB_NAMESPACE = {("ServiceAccount", "gpu-monitor-fabric-probe"),
                    ("ServiceAccount", "gpu-monitor-idle-check"),
                    ("Service", "gpu-monitor-fabric"),
                    ("Role", "gpu-monitor-fabric-scheduler"),
                    ("RoleBinding", "gpu-monitor-fabric-scheduler")}


def _where(doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_object_carries_the_standard_labels_and_sits_in_its_namespace(name):
    docs = helm_render(VALUE_SETS[name], namespace="gpu-monitor")
    for doc in docs:
        labels = doc["metadata"]["labels"]
        where = f"{doc['kind']}/{doc['metadata'].get('namespace')}/{doc['metadata']['name']}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/instance"] == "gpu-monitor", where
        assert labels["app.kubernetes.io/version"] == __version__, where
        assert labels["helm.sh/chart"] == f"gpu-monitor-{__version__}", where
        assert labels["app.kubernetes.io/part-of"] == "gpu-monitor", where
        template = (doc.get("spec") or {}).get("template")
        if template:  # the base's three; the pods are the controllers' objects, not Helm's
            pod = template["metadata"]["labels"]
            assert {k: pod.get(k) for k in ("app.kubernetes.io/part-of",
                                            "app.kubernetes.io/instance",
                                            "app.kubernetes.io/version")} == {
                "app.kubernetes.io/part-of": "gpu-monitor",
                "app.kubernetes.io/instance": "gpu-monitor",
                "app.kubernetes.io/version": __version__}, where
            assert not {"app.kubernetes.io/managed-by", "helm.sh/chart"} & set(pod), where
        ns = doc["metadata"].get("namespace")
        assert ns in ((None,) if doc["kind"] in CLUSTER_SCOPED else
                      ("gpu-monitor", "gpu-monitor-jobs")), where
    in_jobs = {_where(d) for d in docs if d["metadata"].get("namespace") == "gpu-monitor-jobs"}
    fabric = VALUE_SETS[name].get("fabric", {}).get("enabled")
    assert in_jobs == (IN_JOB_NAMESPACE if fabric else set())


def test_the_chart_version_is_the_package_and_the_kustomize_image_tag():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert chart["appVersion"] == __version__ == base["images"][0]["newTag"]
    assert chart["kubeVersion"] == f">={MIN_KUBERNETES}.0-0"


def test_the_alerts_dashboard_config_and_crd_come_from_the_kustomize_files():
    link = CHART / "files" / "daemonset"
    assert link.is_symlink() and link.resolve() == DEPLOY.resolve(), (
        "charts/gpu-monitor/files/daemonset must be a link to daemonset/ (one source)")
    docs = helm_render()
    rule = yaml.safe_load((DEPLOY / "prometheusrule.yaml").read_text())
    assert find(docs, "PrometheusRule", "gpu-monitor")["spec"] == rule["spec"]
    dashboard = find(docs, "ConfigMap", "gpu-monitor-dashboard")["data"]["gpu-monitor.json"]
    assert dashboard == (DEPLOY / "dashboards" / "gpu-monitor.json").read_text()
    crd = yaml.safe_load((DEPLOY / "crd-gpuhealthreports.yaml").read_text())
    assert find(docs, "CustomResourceDefinition")["spec"] == crd["spec"]
    assert _config(docs) == yaml.safe_load((DEPLOY / "config.yaml").read_text())


def test_the_packaged_chart_holds_the_files_not_the_link(tmp_path):
    h = helm()
    archive = h.package(CHART, destination=tmp_path)
    with h.Chart.load(archive) as packaged:
        names = {f["name"] for f in packaged.files}
        manifests = packaged.render({}, name="gpu-monitor", namespace="gpu-monitor")
    assert "files/daemonset/prometheusrule.yaml" in names
    rendered = [d for path, text in manifests.items() if path.endswith(".yaml")
                for d in yaml.safe_load_all(text) if d]
    assert find(rendered, "PrometheusRule", "gpu-monitor")["spec"]["groups"]


# --- values ------------------------------------------------------------------------------------


def test_dry_run_and_the_breaker_budget_are_set_in_the_config():
    config = _config(helm_render({"remediation": {"dryRun": False, "breaker": {
        "budgetFraction": 0.05, "maxNodes": 3}}}))
    assert config["remediation"]["dry_run"] is False
    assert config["remediation"]["breaker"] == {"budget_fraction": 0.05, "max_nodes": 3}
    assert _config(helm_render())["remediation"]["dry_run"] is True


def test_config_merges_key_by_key_and_false_replaces():
    config = _config(helm_render({"config": {"daemon": {"kmsg_replay": False},
                                             "checks": {"dcgm_diag": {"required": False}}}}))
    assert config["daemon"]["kmsg_replay"] is False
    assert config["daemon"]["listen"] == "0.0.0.0:9425"  # the rest of daemon: kept
    assert config["checks"] == {"dcgm_diag": {"required": False}}


def test_a_config_change_rolls_the_daemonset():
    def checksum(values):
        ds = find(helm_render(values), "DaemonSet", "gpu-monitor")
        return ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    docs = helm_render()
    text = find(docs, "ConfigMap", "gpu-monitor-config")["data"]["config.yaml"]
    assert checksum({}) == hashlib.sha256(text.rstrip("\n").encode()).hexdigest()
    assert checksum({"remediation": {"dryRun": False}}) != checksum({})


@pytest.mark.parametrize(("image", "expected"), [
    ({}, f"registry.example.com/gpu-monitor:{__version__}"),
    ({"repository": "my.registry/gm", "tag": "1.2.3"}, "my.registry/gm:1.2.3"),
    ({"repository": "my.registry/gm", "digest": "sha256:" + "a" * 64},
     "my.registry/gm@sha256:" + "a" * 64),
])
def test_the_image_is_repository_and_tag_or_digest(image, expected):
    docs = helm_render({"image": image, "fabric": {"enabled": True}})
    assert _daemon(docs)["image"] == expected
    scheduler = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert scheduler["image"] == expected


def test_the_passive_image_is_the_daemons_only_and_the_pull_policy_is_a_value():
    docs = helm_render({"passiveImage": {"enabled": True}, "fabric": {"enabled": True},
                        "image": {"pullPolicy": "Always"}})
    assert _daemon(docs)["image"].endswith(f":{__version__}-passive")
    assert _daemon(docs)["imagePullPolicy"] == "Always"
    assert _daemon(docs)["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}
    scheduler = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert scheduler["image"].endswith(f":{__version__}"), "probe pods need torch (full image)"


def test_scheduling_values_reach_the_daemon_pod():
    pod = find(helm_render({
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu",
                         "effect": "NoSchedule"}],
        # Helm merges maps into the defaults; null removes a default key.
        "nodeSelector": {"node-role/gpu": "true", "nvidia.com/gpu.present": None},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "priorityClassName": "system-node-critical", "priorityClass": {"create": False},
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"team": "infra"}, "podLabels": {"cost": "gpu"},
    }), "DaemonSet")["spec"]["template"]
    spec = pod["spec"]
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "gpu",
                                    "effect": "NoSchedule"}]
    assert spec["nodeSelector"] == {"node-role/gpu": "true"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                  "limits": {"cpu": "8", "memory": "16Gi"}}
    assert pod["metadata"]["annotations"]["team"] == "infra"
    assert pod["metadata"]["labels"]["cost"] == "gpu"


def test_fabric_values_reach_the_scheduler():
    docs = helm_render({"fabric": {"enabled": True, "replicas": 3, "groupSize": 4,
                                   "topologyLabels": ["rack"],
                                   "nodeSelector": {"node-role/cpu": "true"},
                                   "tolerations": [{"key": "cpu-only", "operator": "Exists"}]}})
    spec = find(docs, "Deployment")["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role/cpu": "true"}
    assert pod["tolerations"] == [{"key": "cpu-only", "operator": "Exists"}]
    args = pod["containers"][0]["args"]
    assert "--group-size=4" in args
    assert [a for a in args if a.startswith("--topology-label")] == ["--topology-label=rack"]


def test_the_probe_job_template_is_the_shipped_one_or_yours():
    def template_and_checksum(values):
        docs = helm_render(merged({"fabric": {"enabled": True}}, values))
        data = find(docs, "ConfigMap", "gpu-monitor-fabric-job-template")["data"]
        pod = find(docs, "Deployment")["spec"]["template"]
        return data["job-template.yaml"], pod["metadata"]["annotations"]["checksum/job-template"]

    shipped, checksum = template_and_checksum({})
    assert shipped == (DEPLOY / "fabric" / "job-template.yaml").read_text()
    mine = shipped.replace("activeDeadlineSeconds: 1800", "activeDeadlineSeconds: 900")
    assert template_and_checksum({"fabric": {"jobTemplate": mine}})[0] == mine
    assert template_and_checksum({"fabric": {"jobTemplate": mine}})[1] != checksum


def test_priority_class_create_false_makes_none():
    kinds = {d["kind"] for d in helm_render({"priorityClass": {"create": False}})}
    assert "PriorityClass" not in kinds


def test_monitoring_objects_follow_their_values():
    docs = helm_render({"serviceMonitor": {"additionalLabels": {"release": "prom"},
                                           "interval": "15s"},
                        "prometheusRule": {"additionalLabels": {"release": "prom"}},
                        "dashboard": {"annotations": {"grafana_folder": "GPU"}}})
    sm = find(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert find(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "prom"
    dashboard = find(docs, "ConfigMap", "gpu-monitor-dashboard")["metadata"]
    assert dashboard["annotations"] == {"grafana_folder": "GPU"}
    assert dashboard["labels"]["grafana_dashboard"] == "1"
    assert not [d for d in find_all(helm_render({"dashboard": {"enabled": False}}), "ConfigMap")
                if d["metadata"]["name"] == "gpu-monitor-dashboard"]
    off = {d["kind"] for d in helm_render({"serviceMonitor": {"enabled": False},
                                           "prometheusRule": {"enabled": False},
                                           "fabric": {"enabled": True}})}
    assert not {"ServiceMonitor", "PrometheusRule"} & off


def test_the_scheduler_is_scraped_as_the_daemon_is():
    docs = helm_render({"fabric": {"enabled": True},
                        "serviceMonitor": {"additionalLabels": {"release": "prom"},
                                           "interval": "15s"}})
    monitor = find(docs, "ServiceMonitor", "gpu-monitor-fabric-scheduler")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics",
                                             "scheme": "http", "interval": "15s",
                                             "scrapeTimeout": "10s"}]
    service = find(docs, "Service", "gpu-monitor-fabric-scheduler")
    assert service["spec"]["selector"] == monitor["spec"]["selector"]["matchLabels"]
    container = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_common_labels_and_annotations_reach_every_object():
    docs = helm_render({"commonLabels": {"team": "infra"},
                        "commonAnnotations": {"owner": "gpu-oncall"}})
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "infra", doc["kind"]
        assert doc["metadata"]["annotations"]["owner"] == "gpu-oncall", doc["kind"]


def test_another_namespace_reaches_every_reference_to_it():
    docs = helm_render(merged(VALUE_SETS["all"], {"serviceMonitor": {"enabled": True},
                                                  "fabric": {"jobNamespace": {
                                                      "name": "gpu-health-jobs"}}}),
                       namespace="gpu-health")
    assert sorted(d["metadata"]["name"] for d in find_all(docs, "Namespace")) == [
        "gpu-health", "gpu-health-jobs"]
    for doc in docs:
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] in ("gpu-health", "gpu-health-jobs"), _where(doc)
        for subject in doc.get("subjects", []):
            expected = "gpu-health-jobs" if subject["name"] == "gpu-monitor-idle-check" \
                else "gpu-health"
            assert subject["namespace"] == expected, doc["metadata"]["name"]
    assert {(d["kind"], d["metadata"]["name"]) for d in docs
            if d["metadata"].get("namespace") == "gpu-health-jobs"} == IN_JOB_NAMESPACE
    policy = find(docs, "ValidatingAdmissionPolicy", "gpu-monitor-own-node")
    assert "system:serviceaccount:gpu-health:gpu-monitor" in \
        policy["spec"]["matchConditions"][0]["expression"]
    args = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=gpu-health" in args
    assert "--job-namespace=gpu-health-jobs" in args
    for monitor in find_all(docs, "ServiceMonitor"):
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-health"]}
    override = helm_render({"namespaceOverride": "elsewhere"}, namespace="gpu-health")
    assert find(override, "DaemonSet")["metadata"]["namespace"] == "elsewhere"


def test_the_job_namespace_is_never_the_release_namespace():
    h = helm()
    with h.Chart.load(CHART) as chart, pytest.raises(h.HelmError, match="must differ"):
        chart.render({"fabric": {"enabled": True, "jobNamespace": {"name": "gpu-monitor"}}},
                     name="gpu-monitor", namespace="gpu-monitor")


def test_job_namespace_create_false_leaves_the_namespace_to_you():
    docs = helm_render({"fabric": {"enabled": True, "jobNamespace": {"create": False}}})
    assert [d["metadata"]["name"] for d in find_all(docs, "Namespace")] == []
    assert find(docs, "ServiceAccount", "gpu-monitor-fabric-probe")["metadata"][
        "namespace"] == "gpu-monitor-jobs"


def _settings(docs) -> dict:
    return yaml.safe_load(find(docs, "ConfigMap", "gpu-monitor-fabric-settings")["data"][
        "settings.yaml"])


def test_job_resources_shm_and_settings_reach_the_settings_file():
    shipped = yaml.safe_load((DEPLOY / "fabric" / "settings.yaml").read_text())
    docs = helm_render({"fabric": {"enabled": True}})
    assert _settings(docs) == shipped
    docs = helm_render({"fabric": {
        "enabled": True, "probeResources": {"limits": {"memory": "48Gi"}},
        "activeCheckResources": {"requests": {"cpu": "2"}}, "activeCheckShmSize": "8Gi",
        "settings": {"rdma_resources": {"rdma/ib": "8"}, "max_concurrent_probes": 1}}})
    settings = _settings(docs)
    assert settings["probe_resources"] == {"requests": {"cpu": "4", "memory": "16Gi"},
                                           "limits": {"memory": "48Gi"}}
    assert settings["active_check_resources"]["requests"] == {"cpu": "2", "memory": "16Gi"}
    assert settings["active_check_shm_size"] == "8Gi"
    assert settings["rdma_resources"] == {"rdma/ib": "8"}
    assert settings["max_concurrent_probes"] == 1
    assert "instance" not in settings


def test_the_rendered_settings_file_is_one_the_scheduler_accepts():
    from gpu_monitor.fabric.scheduler_settings import settings_from_mapping

    docs = helm_render({"fabric": {"enabled": True, "activeCheckShmSize": "8Gi"}})
    settings = settings_from_mapping(_settings(docs)).validate()
    assert settings.active_check_shm_size == "8Gi"
    assert dict(settings.probe_resources["requests"]) == {"cpu": "4", "memory": "16Gi"}


def test_another_release_name_labels_the_jobs_with_it():
    h = helm()
    with h.Chart.load(CHART) as chart:
        manifests = chart.render({"fabric": {"enabled": True}}, name="gm-prod",
                                 namespace="gpu-monitor", is_install=True)
    docs = [d for path, text in manifests.items() if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]
    assert _settings(docs)["instance"] == "gm-prod"


def test_a_settings_change_rolls_the_scheduler():
    def checksum(values):
        docs = helm_render(merged({"fabric": {"enabled": True}}, values))
        return find(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"][
            "checksum/settings"]

    assert checksum({}) != checksum({"fabric": {"activeCheckShmSize": "8Gi"}})
    assert checksum({}) == checksum({"fabric": {"groupSize": 4}})  # a flag, not the file


def test_the_log_format_reaches_the_daemon_and_the_scheduler():
    for fmt in ("json", "text"):
        docs = helm_render({"logFormat": fmt, "fabric": {"enabled": True}})
        scheduler = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert f"--log-format={fmt}" in _daemon(docs)["args"]
        assert f"--log-format={fmt}" in scheduler["args"]


def test_the_priority_classes_follow_their_values():
    docs = helm_render({"priorityClass": {"value": 900000000}, "fabric": {
        "enabled": True, "priorityClassName": "fabric-low", "priorityClass": {"value": 5000}}})
    assert find(docs, "PriorityClass", "gpu-monitor-node-critical")["value"] == 900000000
    assert find(docs, "PriorityClass", "fabric-low")["value"] == 5000
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "fabric-low"
    mine = helm_render({"fabric": {"enabled": True, "priorityClassName": "mine",
                                   "priorityClass": {"create": False}}})
    assert sorted(d["metadata"]["name"] for d in find_all(mine, "PriorityClass")) == [
        "gpu-monitor-idle-check", "gpu-monitor-node-critical"]
    assert find(mine, "Deployment")["spec"]["template"]["spec"]["priorityClassName"] == "mine"


def test_the_journal_file_is_a_value():
    docs = helm_render({"journalKmsg": {"enabled": True, "file": "/var/log/messages"}})
    daemon = _daemon(docs)
    assert "--kmsg=/host/var/log/messages" in daemon["args"]
    assert {"name": "host-log", "mountPath": "/host/var/log", "readOnly": True} in \
        daemon["volumeMounts"]
    assert daemon["securityContext"]["privileged"] is False


def test_force_delete_grants_the_rbac_and_turns_the_config_on():
    docs = helm_render({"forceDelete": {"enabled": True}})
    role = find(docs, "ClusterRole", "gpu-monitor-force-delete")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    assert _config(docs)["remediation"]["drain"]["force_delete"] is True


def test_failfast_delete_grants_pods_delete_and_adds_the_action():
    assert not find_all([d for d in helm_render() if d["metadata"]["name"]
                         == "gpu-monitor-force-delete"], "ClusterRole")
    docs = helm_render({"failfastDelete": {"enabled": True}})
    role = find(docs, "ClusterRole", "gpu-monitor-force-delete")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    assert _config(docs)["failfast"]["actions"] == ["event", "file", "delete"]
    assert _config(docs)["remediation"]["drain"].get("force_delete") is not True
    mine = helm_render({"failfastDelete": {"enabled": True},
                        "config": {"failfast": {"actions": ["file", "delete"]}}})
    assert _config(mine)["failfast"]["actions"] == ["file", "delete"]


def test_the_crd_is_kept_on_uninstall_unless_asked():
    crd = find(helm_render(), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    crd = find(helm_render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})
    assert not find_all(helm_render({"crds": {"enabled": False}}), "CustomResourceDefinition")


@pytest.mark.parametrize("values", [
    {"fabric": {"enable": True}},                 # misspelt: enabled
    {"image": {"digest": "abc123"}},              # not sha256:<64 hex>
    {"remediation": {"dryRun": "false"}},         # a string, not a boolean
    {"journalKmsg": {"file": "kern.log"}},        # not an absolute host path
    {"serviceMonitor": {"enabled": True, "labels": {"release": "x"}}},  # additionalLabels
    {"logFormat": "yaml"},                        # json or text
    {"fabric": {"jobNamespace": {"name": "GPU_Jobs"}}},  # not a DNS label
    {"fabric": {"activeCheckShmSize": "16 GB"}},  # not a quantity
])
def test_the_values_schema_refuses_a_mistake(values):
    h = helm()
    with h.Chart.load(CHART) as chart, pytest.raises(h.HelmError):
        chart.render(values, name="gpu-monitor", namespace="gpu-monitor")


def test_the_values_schema_describes_exactly_the_values():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def same_keys(schema_node, value_node, path):
        props = schema_node.get("properties")
        if props is None or not isinstance(value_node, dict) or \
                schema_node.get("additionalProperties") is not False:
            return
        assert set(props) - {"global"} == set(value_node), path
        for key, sub in props.items():
            if key in value_node:
                same_keys(sub, value_node[key], f"{path}.{key}")

    same_keys(schema, values, "values")


#: Values whose keys are Kubernetes' or the daemon's own (documented there, not one by one).
PASSTHROUGH = frozenset({"config", "resources", "nodeSelector", "affinity", "podLabels",
                         "podAnnotations", "commonLabels", "commonAnnotations",
                         "updateStrategy"})


def test_the_install_docs_list_every_value():
    from tests.deploy.deploy_helpers import DOCS

    text = (DOCS / "install.md").read_text(encoding="utf-8")
    section = text.split("## Install with Helm", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, value in values.items():
        mine = [r for r in rows if f"`{key}" in r]
        assert mine, f"docs/install.md#install-with-helm: no row for the value {key}"
        if isinstance(value, dict) and key not in PASSTHROUGH:
            for sub in value:
                assert any(sub in r for r in mine), (
                    f"docs/install.md#install-with-helm: the row of {key} does not name {sub}")


def test_a_kustomize_file_keeps_its_own_namespaces_and_helm_owns_the_standard_labels(tmp_path):
    import shutil

    chart = tmp_path / "gpu-monitor"
    shutil.copytree(CHART, chart)  # the link becomes the files it points to
    accounts = chart / "files" / "daemonset" / "fabric" / "serviceaccount.yaml"
    text = accounts.read_text()
    moved = text.replace("  name: gpu-monitor-idle-check\n  namespace: gpu-monitor-jobs\n",
                         "  name: gpu-monitor-idle-check\n  namespace: batch-checks\n")
    assert moved != text
    accounts.write_text(moved.replace("    app.kubernetes.io/component: fabric-scheduler\n",
                                      "    app.kubernetes.io/component: fabric-scheduler\n"
                                      "    app.kubernetes.io/managed-by: kustomize\n", 1))
    docs = helm_render({"fabric": {"enabled": True}}, namespace="gpu-health", chart=chart)
    idle = find(docs, "ServiceAccount", "gpu-monitor-idle-check")
    assert idle["metadata"]["namespace"] == "batch-checks"
    probe = find(docs, "ServiceAccount", "gpu-monitor-fabric-probe")
    assert probe["metadata"]["namespace"] == "gpu-monitor-jobs"
    scheduler = find(docs, "ServiceAccount", "gpu-monitor-fabric-scheduler")
    assert scheduler["metadata"]["namespace"] == "gpu-health"
    assert scheduler["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_the_own_node_admission_policy_is_refused_on_a_cluster_before_1_30(tmp_path):
    # The engine renders for its default Kubernetes (1.36 in Helm 4.2) and helm-python-sdk 0.2.2
    # takes no other version: a copy of the chart with the floor raised above it stands in for
    # an old cluster.
    import shutil

    h = helm()
    template = CHART / "templates" / "admission.yaml"
    assert 'semverCompare "<1.30.0-0"' in template.read_text()
    chart = tmp_path / "gpu-monitor"
    shutil.copytree(CHART, chart)
    raised = chart / "templates" / "admission.yaml"
    raised.write_text(raised.read_text().replace('"<1.30.0-0"', '"<99.0.0-0"'))
    values = COMPONENT_VALUES["components/own-node-admission"]
    with h.Chart.load(chart) as old_cluster, pytest.raises(h.HelmError, match="needs Kubernetes >= 1.30"):
        old_cluster.render(values, name="gpu-monitor", namespace="gpu-monitor")
    assert find(helm_render(values), "ValidatingAdmissionPolicy", "gpu-monitor-own-node")
    pods = find(helm_render(values), "ValidatingAdmissionPolicy", "gpu-monitor-own-node-pods")
    assert "system:serviceaccount:" in pods["spec"]["matchConditions"][0]["expression"]
