"""Every manifest in daemonset/ is a valid Kubernetes object, and the kustomization holds together.

Core objects are validated against the Kubernetes OpenAPI schemas (``kubernetes-validate``,
strict: an unknown field is an error) for the oldest supported version and the newest one the
package knows; the admission component from 1.30 on. Prometheus Operator objects have no
schema there: tests/deploy/test_monitoring.py checks them structurally.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.deploy_helpers import (
    CLUSTER_SCOPED,
    COMPONENTS,
    DEPLOY,
    KUSTOMIZATION_NAMES,
    MIN_KUBERNETES,
    MIN_KUBERNETES_ADMISSION,
    NAMESPACE,
    base_objects,
    component_dirs,
    find,
    is_core,
    kubernetes_validate,
    load_yaml_documents,
    manifest_files,
    objects,
    overlay,
    render,
    validate_object,
)

COMPONENT_NAMES = sorted(component_dirs())
#: The order an overlay lists them in: no-prometheus-operator last, so that it also drops the
#: ServiceMonitor of the fabric component (a component sees only what came before it).
COMPONENT_ORDER = sorted(COMPONENT_NAMES, key=lambda c: c.endswith("no-prometheus-operator"))
JOB_NAMESPACE = "gpu-monitor-jobs"  # daemonset/fabric/namespace.yaml


def _label(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


BASE_FILES = manifest_files()
COMPONENT_FILES = [p for d in component_dirs().values() for p in manifest_files(d)]


@pytest.mark.parametrize("path", BASE_FILES + COMPONENT_FILES, ids=_label)
def test_every_manifest_file_parses_into_named_objects(path):
    docs = load_yaml_documents(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), f"{path}: object without apiVersion/kind"
        assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} without a name"


@pytest.mark.parametrize("path", BASE_FILES, ids=_label)
def test_core_manifests_validate_against_the_kubernetes_schemas(path):
    kv = kubernetes_validate()
    for doc in load_yaml_documents(path):
        if is_core(doc):
            validate_object(kv, doc, MIN_KUBERNETES, _label(path))


@pytest.mark.parametrize("path", COMPONENT_FILES, ids=_label)
def test_component_manifests_validate_against_the_kubernetes_schemas(path):
    kv = kubernetes_validate()
    admission = "own-node-admission" in path.parts  # needs ValidatingAdmissionPolicy v1
    for doc in load_yaml_documents(path):
        if is_core(doc):
            validate_object(kv, doc, MIN_KUBERNETES_ADMISSION if admission else MIN_KUBERNETES,
                      _label(path))


def test_the_schema_validation_rejects_a_broken_daemonset():
    kv = kubernetes_validate()
    ds = find(base_objects(), "DaemonSet", "gpu-monitor")
    ds["spec"]["template"]["spec"]["hostPid"] = True  # misspelt: hostPID
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, MIN_KUBERNETES, strict=True)


def test_namespaced_objects_live_in_the_gpu_monitor_namespace():
    """All but the fabric scheduler's Job namespace and what its Jobs use there."""
    for doc in objects(BASE_FILES + COMPONENT_FILES):
        ns = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert ns is None, f"{doc['kind']}/{doc['metadata']['name']} is cluster-scoped"
        else:
            assert ns in (NAMESPACE, JOB_NAMESPACE), (
                f"{doc['kind']}/{doc['metadata']['name']} namespace {ns!r}")
    in_jobs = {(d["kind"], d["metadata"]["name"]) for d in objects(COMPONENT_FILES)
               if d["metadata"].get("namespace") == JOB_NAMESPACE}
    assert in_jobs == {("ServiceAccount", "gpu-monitor-fabric-probe"),
                       ("ServiceAccount", "gpu-monitor-idle-check"),
                       ("Service", "gpu-monitor-fabric"),
                       ("Role", "gpu-monitor-fabric-scheduler"),
                       ("RoleBinding", "gpu-monitor-fabric-scheduler")}


def test_the_kustomization_lists_every_manifest_and_only_existing_files():
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    listed = {DEPLOY / r for r in kust["resources"]}
    for r in listed:
        assert r.is_file(), f"kustomization.yaml lists {r.name}, which does not exist"
    assert set(manifest_files()) == listed, (
        "objects in daemonset/ and kustomization.yaml resources differ: "
        f"{sorted(p.name for p in set(manifest_files()) ^ listed)}")
    for gen in kust.get("configMapGenerator", []):
        for f in gen.get("files", []):
            assert (DEPLOY / f.split("=", 1)[-1]).is_file(), f"configMapGenerator file {f}"


def test_every_directory_of_components_is_a_kustomize_component():
    for path in sorted(COMPONENTS.iterdir()):
        if path.is_dir():
            assert str(path.relative_to(DEPLOY)) in component_dirs(), (
                f"{path.relative_to(DEPLOY)} has no kustomization.yaml of kind Component")


@pytest.mark.parametrize("component", COMPONENT_NAMES)
def test_every_component_lists_exactly_its_manifests(component):
    root = component_dirs()[component]
    kust_path = next(root / n for n in KUSTOMIZATION_NAMES if (root / n).exists())
    kust = yaml.safe_load(kust_path.read_text())
    listed = {root / r for r in kust.get("resources", [])}
    for r in listed:
        assert r.is_file(), f"{component}: {r.name} does not exist"
    assert listed == set(manifest_files(root)), f"{component}: unlisted or missing manifests"
    for p in kust.get("patches", []):
        if "path" in p:
            assert (root / p["path"]).is_file(), f"{component}: {p['path']}"
    for gen in kust.get("configMapGenerator", []):
        for f in gen.get("files", []):
            assert (root / f.split("=", 1)[-1]).is_file(), f"{component}: {f}"


def test_kustomize_renders_the_base_into_valid_objects():
    rendered = render(DEPLOY)
    kinds = sorted({d["kind"] for d in rendered})
    for kind in ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                 "RoleBinding", "ConfigMap", "CustomResourceDefinition", "DaemonSet",
                 "PriorityClass", "Service", "ServiceMonitor", "PrometheusRule"):
        assert kind in kinds, f"the rendered base has no {kind}"
    ds = find(rendered, "DaemonSet", "gpu-monitor")
    config_volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"]
                         if v["name"] == "config")
    generated = config_volume["configMap"]["name"]
    assert generated.startswith("gpu-monitor-config-"), "the config ConfigMap name has no hash"
    config_map = find(rendered, "ConfigMap", generated)
    assert config_map["data"]["config.yaml"] == (DEPLOY / "config.yaml").read_text(), (
        "the DaemonSet reads /etc/gpu-monitor/config.yaml: the key must be config.yaml")
    kv = kubernetes_validate()
    for doc in rendered:
        if is_core(doc):
            validate_object(kv, doc, MIN_KUBERNETES, "kubectl kustomize daemonset/")


def test_kustomize_renders_every_component_together(tmp_path):
    rendered = render(overlay(tmp_path, COMPONENT_ORDER))
    kinds = {d["kind"] for d in rendered}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    assert not {"ServiceMonitor", "PrometheusRule"} & kinds, "no-prometheus-operator kept them"
    kv = kubernetes_validate()
    for doc in rendered:
        if is_core(doc):
            validate_object(kv, doc, MIN_KUBERNETES_ADMISSION, "base + every component")
