"""The Helm chart and the kustomize base make the same objects.

For the base alone, each component alone and every component together, ``helm template`` of
charts/gpu-monitor (with the component's value) and ``kubectl kustomize`` of an overlay (with
the component) are compared object by object: the same (kind, namespace, name) set, and equal
objects once Helm's own label (helm.sh/chart) and annotations (checksums, the CRD's keep policy)
are dropped, kustomize's ConfigMap name hashes removed and the YAML files the chart writes
through toYaml (the daemon's config.yaml, the scheduler's settings.yaml) compared as data. The
only other differences are listed in ``_as_the_chart_renders_it``, each with its reason;
anything else (a field changed on either side) fails with the paths that differ.
"""

from __future__ import annotations

import re

import pytest

from tests.deploy.deploy_helpers import NAMESPACE, component_dirs
from tests.deploy.helm_chart import (
    COMPONENT_VALUES,
    differences,
    helm_render,
    kustomize_render,
    merged,
    normalised,
)
from tests.deploy.test_overlay import documented_overlay


def _documented_order() -> list[str]:
    """The components in the order docs/install.md's overlay lists them: a kustomize component
    acts on what came before it (passive-image before fabric retags the daemon only, so probe
    pods keep torch; no-prometheus-operator last drops the fabric ServiceMonitor too)."""
    listed = re.findall(r"^\s*(?:# )?- \.\./daemonset/(\S+?)/?(?:\s|$)", documented_overlay(),
                        flags=re.M)
    return [c for c in listed if c in COMPONENT_VALUES]


ORDER = _documented_order()
#: The base alone, each component alone, and every component together.
CASES = {"base": [], **{c: [c] for c in ORDER}, "all": ORDER}
#: The chart makes the Namespace only when asked (Helm's --create-namespace makes its own).
WITH_NAMESPACE = {"namespace": {"create": True}}


def _chart_values(components: list[str]) -> dict:
    return merged(WITH_NAMESPACE, *(COMPONENT_VALUES[c] for c in components))


def _as_the_chart_renders_it(objects: dict, components: list[str]) -> dict:
    """The kustomize rendering with the chart's deliberate differences applied:

    1. app.kubernetes.io/managed-by names the tool that applied the object: kustomize's
       rendering says kustomize, the chart's says Helm (both set it on objects only, not on pod
       templates);
    2. forceDelete.enabled also sets remediation.drain.force_delete in the config, which the
       force-delete component asks the operator to do by hand; cleaning.enabled likewise sets
       cleaning.enabled.
    """
    for obj in objects.values():
        labels = obj["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") == "kustomize":
            labels["app.kubernetes.io/managed-by"] = "Helm"
    if "components/force-delete" in components:
        config = objects[("ConfigMap", NAMESPACE, "gpu-monitor-config")]["data"]["config.yaml"]
        config["remediation"]["drain"]["force_delete"] = True
    if "components/cleaning" in components:
        config = objects[("ConfigMap", NAMESPACE, "gpu-monitor-config")]["data"]["config.yaml"]
        config.setdefault("cleaning", {})["enabled"] = True
    return objects


def test_every_kustomize_component_has_a_chart_value():
    assert set(component_dirs()) == set(COMPONENT_VALUES), (
        "a kustomize component without a chart value (or a value for a component that is "
        "gone): add the value to charts/gpu-monitor and charts/gpu-monitor/ci/<name>-values.yaml")
    assert sorted(ORDER) == sorted(COMPONENT_VALUES), (
        "docs/install.md's overlay must list every component (its order is the one compared)")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_renders_what_kustomize_renders(case, tmp_path):
    components = CASES[case]
    expected = _as_the_chart_renders_it(normalised(kustomize_render(tmp_path, components)),
                                        components)
    rendered = normalised(helm_render(_chart_values(components)))
    assert sorted(rendered) == sorted(expected), (
        f"{case}: only kustomize makes {sorted(set(expected) - set(rendered))}, "
        f"only Helm makes {sorted(set(rendered) - set(expected))}")
    drift = {key: differences(expected[key], rendered[key]) for key in sorted(expected)}
    drift = {key: d for key, d in drift.items() if d}
    assert not drift, f"{case}: the chart and the kustomize base differ:\n" + "\n".join(
        f"  {kind}/{namespace}/{name}:\n" + "\n".join(f"    {line}" for line in lines)
        for (kind, namespace, name), lines in drift.items())


def test_the_comparison_sees_a_changed_field(tmp_path):
    expected = _as_the_chart_renders_it(normalised(kustomize_render(tmp_path / "base", [])), [])
    rendered = normalised(helm_render({"tolerations": [], **WITH_NAMESPACE}))
    ds = ("DaemonSet", NAMESPACE, "gpu-monitor")
    assert any("tolerations" in d for d in differences(expected[ds], rendered[ds]))
    rendered = normalised(helm_render({"remediation": {"dryRun": False}, **WITH_NAMESPACE}))
    cm = ("ConfigMap", NAMESPACE, "gpu-monitor-config")
    assert differences(expected[cm], rendered[cm]) == [
        ".data.config.yaml.remediation.dry_run: kustomize True != Helm False"]
    fabric = _as_the_chart_renders_it(
        normalised(kustomize_render(tmp_path / "fabric", ["fabric"])), ["fabric"])
    rendered = normalised(helm_render(merged(_chart_values(["fabric"]),
                                             {"fabric": {"activeCheckShmSize": "8Gi"}})))
    settings = ("ConfigMap", NAMESPACE, "gpu-monitor-fabric-settings")
    assert differences(fabric[settings], rendered[settings]) == [
        ".data.settings.yaml.active_check_shm_size: kustomize '16Gi' != Helm '8Gi'"]
