"""The notice's actions through the Kubernetes API, on pods of this node only: an Event on the
pod, a pod condition (``GPUMonitorFabricFault``, patched through ``pods/status``), and the
pod's deletion so its Job or JobSet restarts it. The own-node admission policy holds the same
rule on the server (deploy: daemonset/base/admission-policy.yaml)."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

CONDITION_TYPE = "GPUMonitorFabricFault"

#: Every (apiGroup, resource, verbs) the notice uses (as remediation's RBAC_RULES; the
#: manifests grant the union, tests/deploy/test_rbac.py): pods ``delete`` only with the
#: ``delete`` action (daemonset/components/force-delete).
RBAC_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "pods", ("get", "delete")),
    ("", "pods/status", ("patch",)),
    ("", "events", ("create",)),
)
COMPONENT = "gpu-monitor"


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class NotOnThisNode(Exception):
    """The pod is bound to another node (or gone): nothing is written to it."""


class PodWriter:
    """Writes to the pods of ``node`` through a ``gpu_monitor.kube.Kube``."""

    def __init__(self, kube: Any, node: str):
        self.kube = kube
        self.node = node

    def read(self, namespace: str, name: str) -> dict:
        """The pod, if it is on this node; else ``NotOnThisNode``."""
        pod = self.kube.get_pod(namespace, name)
        if pod is None:
            raise NotOnThisNode(f"pod {namespace}/{name} is gone")
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound != self.node:
            raise NotOnThisNode(f"pod {namespace}/{name} is on node {bound!r}, not {self.node!r}")
        return pod

    def event(self, pod: dict, reason: str, message: str, now: float) -> None:
        meta = pod["metadata"]
        stamp = iso(now)
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name'][:236]}.{secrets.token_hex(8)}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid", "")},
            "reason": reason, "message": message[:1024], "type": "Warning",
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT, "reportingInstance": self.node,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        self.kube.create_event(meta["namespace"], body)

    def condition(self, pod: dict, reason: str, message: str, now: float) -> None:
        """Set the pod's ``GPUMonitorFabricFault`` condition True (a strategic-merge patch of
        ``status.conditions``, merged by ``type``: the kubelet's own conditions are kept)."""
        meta = pod["metadata"]
        body = {"status": {"conditions": [{
            "type": CONDITION_TYPE, "status": "True", "reason": reason,
            "message": message[:1024], "lastTransitionTime": iso(now), "lastProbeTime": None,
        }]}}
        self.kube.patch_pod_status(meta["namespace"], meta["name"], body)

    def delete(self, pod: dict, grace_s: int) -> None:
        meta = pod["metadata"]
        self.kube.delete_pod(meta["namespace"], meta["name"], grace_period_s=grace_s,
                             uid=meta.get("uid") or None)
