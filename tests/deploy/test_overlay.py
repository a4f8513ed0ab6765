"""The overlay docs/install.md tells operators to write renders, with every image mapped.

Why from the docs: the overlay an operator copies is the one that must work. The test takes
the YAML block of docs/install.md, turns on the components it names in comments, renders it
with ``kubectl kustomize`` and asserts that no container keeps an image the overlay's
``images:`` did not map (a bare ``gpu-monitor`` would be pulled as
docker.io/library/gpu-monitor:latest).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from tests.deploy.deploy_helpers import DEPLOY, DOCS, find, render

OVERLAY_MARK = "# my-cluster/kustomization.yaml"


def documented_overlay() -> str:
    text = (DOCS / "install.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    found = [b for b in blocks if b.startswith(OVERLAY_MARK)]
    assert len(found) == 1, "docs/install.md has no (or more than one) overlay example"
    return found[0]


def write_overlay(tmp_path: Path, enable: tuple[str, ...]) -> Path:
    """The documented overlay in ``tmp_path/my-cluster``, with the commented-out components
    whose path ends in one of ``enable`` turned on."""
    shutil.copytree(DEPLOY, tmp_path / "daemonset")
    lines = []
    for line in documented_overlay().splitlines():
        m = re.match(r"(\s*)# (- \.\./daemonset/\S+)", line)
        if m and m.group(2).rstrip("/").endswith(enable):
            line = m.group(1) + m.group(2)
        lines.append(line)
    overlay = tmp_path / "my-cluster"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    shutil.copy(DEPLOY / "config.yaml", overlay / "config.yaml")
    return overlay


def mapped_registry() -> str:
    kust = yaml.safe_load(documented_overlay())
    (entry,) = kust["images"]
    return entry["newName"]


def images(objects: list[dict]) -> dict[str, str]:
    """``Kind/name/container`` -> image of every container and init container."""
    out = {}
    for doc in objects:
        pod = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            out[f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"] = c["image"]
    return out


def test_the_documented_overlay_with_the_fabric_component_maps_every_image(tmp_path):
    rendered = render(write_overlay(tmp_path, ("fabric",)))
    found = images(rendered)
    assert "Deployment/gpu-monitor-fabric-scheduler/scheduler" in found, "fabric is not on"
    registry = mapped_registry()
    for where, image in found.items():
        assert image.startswith(registry + ":"), f"{where} keeps the unmapped image {image}"
    daemon = find(rendered, "DaemonSet", "gpu-monitor")
    assert found["Deployment/gpu-monitor-fabric-scheduler/scheduler"] == \
        daemon["spec"]["template"]["spec"]["containers"][0]["image"], (
        "the scheduler (and so its probe pods) must run the daemon's release")


def test_with_the_passive_image_the_scheduler_keeps_the_full_image_its_probes_need(tmp_path):
    """Probe pods run the scheduler's own image and need torch: the passive retag (listed
    before fabric in the docs) must reach the daemon only."""
    found = images(render(write_overlay(tmp_path, ("fabric", "passive-image"))))
    scheduler = found["Deployment/gpu-monitor-fabric-scheduler/scheduler"]
    assert found["DaemonSet/gpu-monitor/gpu-monitor"].endswith("-passive")
    assert scheduler.startswith(mapped_registry() + ":") and not scheduler.endswith("-passive")


def test_the_fabric_component_maps_the_image_as_the_base_does():
    base = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["images"]
    fabric = yaml.safe_load((DEPLOY / "fabric" / "kustomization.yaml").read_text())["images"]
    assert fabric == base
