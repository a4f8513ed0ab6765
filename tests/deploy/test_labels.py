"""Every object gpu-monitor installs or creates carries the six standard labels.

Why: ``app.kubernetes.io/{name,instance,version,component,part-of,managed-by}`` are what
operators select on (``kubectl get all -l app.kubernetes.io/part-of=gpu-monitor``), what
dashboards group by and what tells a kustomize install from a Helm one. A component's objects
are added after the base's ``labels:`` ran, so each component must carry them too; the Jobs
the fabric scheduler builds at run time get them from gpu_monitor/fabric/job_parts.py.
"""

from __future__ import annotations

import pytest
import yaml

from gpu_monitor import __version__
from tests.deploy.deploy_helpers import DEPLOY, component_dirs, overlay, render
from tests.deploy.test_jobs import BUILT_JOBS

KEYS = tuple(f"app.kubernetes.io/{k}" for k in
             ("name", "instance", "version", "component", "part-of", "managed-by"))
#: Pods are the controllers' objects, not kustomize's: no managed-by on the templates.
TEMPLATE_KEYS = tuple(k for k in KEYS if not k.endswith("managed-by"))
ORDER = sorted(component_dirs(), key=lambda c: c.endswith("no-prometheus-operator"))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return render(overlay(tmp_path_factory.mktemp("labels"), ORDER))


@pytest.mark.parametrize("component", ORDER)
def test_each_component_alone_labels_its_own_objects(component, tmp_path):
    # Together, a later component's `labels:` also reach the objects of those before it, which
    # hid that force-delete and own-node-admission alone left theirs unlabelled.
    for doc in render(overlay(tmp_path, [component])):
        labels = doc["metadata"].get("labels") or {}
        missing = [k for k in KEYS if not labels.get(k)]
        assert not missing, f"{component}: {doc['kind']}/{doc['metadata']['name']} lacks {missing}"


def _template_labels(doc: dict) -> dict | None:
    template = (doc.get("spec") or {}).get("template")
    return (template.get("metadata") or {}).get("labels") if template else None


def test_every_installed_object_carries_the_standard_labels(rendered):
    for doc in rendered:
        labels = doc["metadata"].get("labels") or {}
        missing = [k for k in KEYS if not labels.get(k)]
        assert not missing, f"{doc['kind']}/{doc['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/name"] == "gpu-monitor"
        assert labels["app.kubernetes.io/part-of"] == "gpu-monitor"
        assert labels["app.kubernetes.io/version"] == __version__


def test_every_pod_template_carries_them_but_managed_by(rendered):
    templates = [(d, _template_labels(d)) for d in rendered if _template_labels(d) is not None]
    assert {d["kind"] for d, _ in templates} >= {"DaemonSet", "Deployment"}
    for doc, labels in templates:
        missing = [k for k in TEMPLATE_KEYS if not labels.get(k)]
        assert not missing, f"{doc['kind']}/{doc['metadata']['name']} pods lack {missing}"


def test_the_version_label_is_the_release_the_images_are_tagged_with():
    paths = [DEPLOY / "kustomization.yaml",
             *(d / "kustomization.yaml" for d in component_dirs().values())]
    for path in paths:
        kust = yaml.safe_load(path.read_text())
        if "labels" in kust:
            versions = {e["pairs"].get("app.kubernetes.io/version") for e in kust["labels"]}
            assert versions - {None} == {__version__}, path
        for image in kust.get("images", []):
            if "newName" in image:  # (passive-image retags: its tag is the version + -passive)
                assert image["newTag"] == __version__, path


#: The Jobs the scheduler creates (the template itself is not one: rendering adds the labels).
CREATED = [(i, b) for i, b in BUILT_JOBS if i != "template"]


@pytest.mark.parametrize("build", [b for _, b in CREATED], ids=[i for i, _ in CREATED])
def test_every_job_the_scheduler_builds_carries_them(build):
    job = build()
    for where in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        missing = [k for k in KEYS if not where.get(k)]
        assert not missing, f"{job['metadata']['name']} lacks {missing}"
        assert where["app.kubernetes.io/managed-by"] == "gpu-monitor-fabric-scheduler"
