"""Render and lint charts/gpu-monitor with the real Helm engine, and put Helm's output and
kustomize's side by side.

Why a helper module: the chart tests (test_helm_chart.py) and the equivalence tests
(test_helm_equivalence.py) render the same chart with the same engine and must normalise the
two renderings the same way. Helm is helm-python-sdk (Helm v4's engine as a library, in the
test extra); without it the tests are skipped with what goes unchecked. Nothing here asserts.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_helpers import DEPLOY, NAMESPACE, REPO, component_dir, render

CHART = REPO / "charts" / "gpu-monitor"
RELEASE = "gpu-monitor"


def _component_values() -> dict[str, dict[str, Any]]:
    """The chart's values for each kustomize component: charts/gpu-monitor/ci/<name>-values.yaml
    (chart-testing's value sets) for daemonset/components/<name> or daemonset/<name>. A
    component with no file fails test_every_kustomize_component_has_a_chart_value."""
    out = {}
    for path in sorted((CHART / "ci").glob("*-values.yaml")):
        name = path.name.removesuffix("-values.yaml")
        key = f"components/{name}" if (DEPLOY / "components" / name).is_dir() else name
        out[key] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return out


COMPONENT_VALUES: dict[str, dict[str, Any]] = _component_values()

#: The label only a Helm chart has (the comparison drops it). The other standard labels are
#: compared: instance and version are equal (the release is named gpu-monitor, as the base's
#: instance), managed-by differs by design (test_helm_equivalence says so).
HELM_ONLY_LABELS = frozenset({"helm.sh/chart"})
#: Annotations only a Helm release has: the config checksum that rolls the pods (kustomize
#: rolls them by the ConfigMap's name hash instead) and the CRD's keep policy.
HELM_ONLY_ANNOTATIONS = re.compile(r"^(checksum/.*|helm\.sh/resource-policy)$")
#: kustomize's configMapGenerator appends a content hash to these names; the chart does not.
HASHED_CONFIGMAPS = ("gpu-monitor-config", "gpu-monitor-fabric-job-template",
                     "gpu-monitor-fabric-settings")
#: ConfigMaps whose YAML file the chart writes through toYaml (values applied): compared as data.
PARSED_CONFIGMAPS = ("gpu-monitor-config", "gpu-monitor-fabric-settings")
_HASH_SUFFIX = re.compile(r"^(?P<name>.+)-[a-z0-9]{10}$")


def helm():
    """The helm_python module, or a skip saying what is not checked."""
    # (The engine prints an INFO line to stderr for the followed link files/daemonset.)
    return pytest.importorskip(
        "helm_python",
        reason="helm-python-sdk is not installed (pip install helm-python-sdk; it is in the "
               "test extra): the Helm chart is not rendered or linted")


def merged(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge of values layers (later wins; maps merge key by key)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = merged(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def _freeze(values: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(values), sort_keys=True)


@cache
def _helm_render(frozen: str, namespace: str, chart: str) -> tuple[dict[str, Any], ...]:
    h = helm()
    with h.Chart.load(chart) as loaded:
        manifests = loaded.render(yaml.safe_load(frozen), name=RELEASE, namespace=namespace,
                                  is_install=True)
    docs = []
    for path in sorted(manifests):
        if path.endswith(".txt"):  # NOTES.txt
            continue
        docs += [d for d in yaml.safe_load_all(manifests[path]) if d]
    return tuple(docs)


def helm_render(values: Mapping[str, Any] | None = None, *, namespace: str = NAMESPACE,
                chart: Path = CHART) -> list[dict[str, Any]]:
    """The objects ``helm template`` makes of the chart (copies, safe to change)."""
    return copy.deepcopy(list(_helm_render(_freeze(values or {}), namespace, str(chart))))


def helm_lint(values: Mapping[str, Any] | None = None, *,
              namespace: str = NAMESPACE) -> dict[str, Any]:
    """``helm lint --strict`` of the chart: {"messages": [{"severity", "path", "error"}], ...}.
    (helm-python-sdk 0.2.2's kube_version option changes nothing seen: not used.)"""
    return helm().lint(CHART, dict(values or {}), strict=True, namespace=namespace)


def kustomize_render(tmp_path: Path, components: Iterable[str]) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of an overlay using the base and ``components``, with the base's
    `images:` mapping repeated in the overlay, as docs/install.md's overlay does (a component's
    objects are not renamed by the base's mapping)."""
    components = list(components)
    if not components:
        return render(DEPLOY)
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "daemonset").symlink_to(DEPLOY, target_is_directory=True)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["daemonset"],
        "components": [f"daemonset/{component_dir(c).relative_to(DEPLOY)}" for c in components],
        "images": [{"name": i["name"], "newName": i["newName"], "newTag": i["newTag"]}
                   for i in base.get("images", [])],
    }), encoding="utf-8")
    return render(tmp_path)


# --- the comparison ---------------------------------------------------------------------------


def _strip_metadata(meta: dict[str, Any]) -> None:
    labels = {k: v for k, v in (meta.get("labels") or {}).items()
              if k not in HELM_ONLY_LABELS}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if not HELM_ONLY_ANNOTATIONS.match(k)}
    for key, value in (("labels", labels), ("annotations", annotations)):
        if value:
            meta[key] = value
        else:
            meta.pop(key, None)


def _unhash(name: str) -> str:
    m = _HASH_SUFFIX.match(name)
    if m and m["name"] in HASHED_CONFIGMAPS:
        return m["name"]
    return name


def _normalise(node: Any, parent_key: str = "") -> Any:
    """Helm's own label and annotations dropped, kustomize's ConfigMap name hashes removed, the
    daemon's config.yaml and the scheduler's settings.yaml parsed (the chart writes them through
    toYaml), lists of named items
    ordered by name (volumes, mounts, env, containers: merge keys, order-free)."""
    if isinstance(node, dict):
        out = {k: _normalise(v, k) for k, v in node.items()}
        if isinstance(out.get("metadata"), dict):
            _strip_metadata(out["metadata"])
        if parent_key == "configMap" and isinstance(out.get("name"), str):
            out["name"] = _unhash(out["name"])
        return out
    if isinstance(node, list):
        items = [_normalise(v, parent_key) for v in node]
        if items and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
            names = [i["name"] for i in items]
            if len(set(names)) == len(names):
                items.sort(key=lambda i: i["name"])
        return items
    return node


def normalised(docs: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Objects by (kind, namespace, name) ("" for cluster-scoped ones), normalised for comparing
    a Helm and a kustomize rendering."""
    out = {}
    for doc in docs:
        doc = _normalise(copy.deepcopy(doc))
        meta = doc["metadata"]
        if doc["kind"] == "ConfigMap":
            meta["name"] = _unhash(meta["name"])
            if meta["name"] in PARSED_CONFIGMAPS:
                doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
        key = (doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, f"two objects {key}"
        out[key] = doc
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every path where ``a`` (kustomize) and ``b`` (Helm) differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}"
            if key not in b:
                out.append(f"{where}: only kustomize has it: {a[key]!r:.200}")
            elif key not in a:
                out.append(f"{where}: only Helm has it: {b[key]!r:.200}")
            else:
                out += differences(a[key], b[key], where)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    if a != b:
        return [f"{path or '.'}: kustomize {a!r:.200} != Helm {b!r:.200}"]
    return []
