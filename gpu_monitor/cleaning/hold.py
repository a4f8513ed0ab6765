"""The hold pod, and the node as the cleaner sees it, from the API server's objects (pure).

The hold asks for every GPU of the node and does nothing (the pause image): it exists so the
Kubernetes scheduler, not gpu-monitor, keeps new GPU work off the node while the suite runs.
Its PriorityClass (``gpu-monitor-cleaning``, value 1,000,000,000, the highest a user class may
have; ``preemptionPolicy: Never``) puts it ahead of every pending workload of lower priority in
the scheduling queue and keeps those workloads from preempting it, and it never displaces a
running pod. docs/cleaning.md#the-hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_monitor.cleaning.plan import Hold, NodeView, Workload
from gpu_monitor.config import CleaningConfig
from gpu_monitor.fabric.pods import (
    GPU_RESOURCE,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    PREFIX,
    pod_gpu_request,
    pod_holds_gpus,
)
from gpu_monitor.fabric.pods import is_ours as is_fabric_pod
from gpu_monitor.model import parse_iso

LABEL_NODE = PREFIX + "node"
NODE_NAME_FIELD = "metadata.name"
COMPONENT = "cleaning-hold"
MANAGER = "gpu-monitor-cleaner"
PRIORITY_CLASS = CleaningConfig.priority_class  # the defaults of cleaning.*, in one place
PAUSE_IMAGE = CleaningConfig.hold_image


#: What the cleaner asks of the API server beyond the base's reads (pods get/list, nodes get):
#: (apiGroup, resource, verbs), granted in the hold's namespace only by
#: daemonset/components/cleaning (tests/deploy/test_rbac.py holds them equal).
RBAC_RULES = (("", "pods", ("create", "delete")),)


@dataclass(frozen=True)
class HoldSpec:
    namespace: str = "gpu-monitor"
    image: str = PAUSE_IMAGE
    priority_class: str = PRIORITY_CLASS
    resource: str = GPU_RESOURCE


def hold_name(node: str) -> str:
    """One hold per node, one name: a second create is refused by the API server (409)."""
    return f"gpu-monitor-hold-{node}"[:253]


def build_hold_pod(node: str, gpus: int, spec: HoldSpec) -> dict[str, Any]:
    """The hold: through the scheduler (node affinity, not ``nodeName``: a pod with
    ``nodeName`` skips the queue and is refused by the kubelet if a workload was bound first,
    or makes the workload's pod fail admission if ours came first)."""
    gpu = {spec.resource: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": hold_name(node),
            "namespace": spec.namespace,
            "labels": {LABEL_COMPONENT: COMPONENT, LABEL_MANAGED_BY: MANAGER,
                       LABEL_NODE: node[:63]},
        },
        "spec": {
            "priorityClassName": spec.priority_class,
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "enableServiceLinks": False,
            # By the Node's name (matchFields metadata.name, as the DaemonSet controller pins
            # its pods), not its kubernetes.io/hostname label: the two differ on some clouds.
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}]}]}}},
            # The node's GPU taint only: the hold must land wherever GPU work may. Nothing
            # else: a cordoned, quarantined or otherwise tainted node is not ours to hold.
            "tolerations": [{"key": spec.resource, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "hold",
                "image": spec.image,
                "resources": {"requests": {**gpu, "cpu": "1m", "memory": "8Mi"},
                              "limits": {**gpu, "memory": "8Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "runAsNonRoot": True, "runAsUser": 65535,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def is_hold(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return labels.get(LABEL_MANAGED_BY) == MANAGER and labels.get(LABEL_COMPONENT) == COMPONENT


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time from the API server; None when absent or not one (never a crash)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_iso(value)
    except ValueError:
        return None


def node_view(node: str, pods_on_node: Iterable[Mapping[str, Any]],
              hold: Mapping[str, Any] | None, *, quarantined: bool,
              resource: str = GPU_RESOURCE, provisioning: bool = False,
              provisioned_at: datetime | None = None) -> NodeView:
    """What ``plan.step`` reads: the workloads holding the node's GPUs (bound, not finished;
    a terminating pod still holds them), and our hold as the API server has it. gpu-monitor's
    own pods are no workload: the hold, and the fabric scheduler's probes and idle checks (they
    test the node; they leave nothing of a customer's behind, and while they hold the GPUs the
    hold cannot bind, so no suite runs beside them)."""
    workloads = []
    for p in pods_on_node:
        if is_hold(p) or is_fabric_pod(p) or not pod_holds_gpus(p, resource):
            continue
        meta = p.get("metadata") or {}
        workloads.append(Workload(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                                  pod_gpu_request(p, resource),
                                  _time((p.get("status") or {}).get("startTime"))))
    view_hold = None
    if hold is not None:
        meta = hold.get("metadata") or {}
        view_hold = Hold(str(meta.get("name") or ""),
                         bound=bool((hold.get("spec") or {}).get("nodeName")),
                         running=(hold.get("status") or {}).get("phase") == "Running",
                         deleting=bool(meta.get("deletionTimestamp")),
                         refused=(hold.get("status") or {}).get("phase") in ("Failed", "Succeeded"))
    return NodeView(tuple(sorted(workloads, key=lambda w: (w.namespace, w.name))), view_hold,
                    quarantined, provisioning, provisioned_at)
