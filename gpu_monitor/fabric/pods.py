"""Pods and Nodes as the API server returns them (plain dicts), read without a client: the GPUs a
pod requests, whether it holds them, a node's allocatable GPUs, and the labels and annotations
gpu-monitor puts on what it launches.

Why its own module: the fabric scheduler, its idle check and the cleaner (gpu_monitor/cleaning/)
all read pods this way; the idle check's module also runs a command through the Kubernetes
client, which the daemon's Slurm path must never import (tests/slurm). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
PREFIX = "gpu-monitor.io/"
LABEL_STATE = PREFIX + "state"  # remediate.k8s.node.LABEL_STATE (not imported: no kubernetes)
LABEL_EXCLUDE = PREFIX + "exclude"
DEFAULT_TAINT_KEY = PREFIX + "unhealthy"
HEALTHY_STATES = frozenset({"", "healthy"})
HOSTNAME_LABEL = "kubernetes.io/hostname"

# Labels and annotations on the Jobs and pods gpu-monitor launches.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PROBE_ID = PREFIX + "probe-id"
LABEL_PROBE_KIND = PREFIX + "probe-kind"
ANNOTATION_NODES = PREFIX + "probe-nodes"
ANNOTATION_GROUP = PREFIX + "probe-group"
ANNOTATION_CHECKS = PREFIX + "checks"
COMPONENT_PROBE = "fabric-probe"
COMPONENT_IDLE_CHECK = "idle-check"
MANAGER = "gpu-monitor-fabric-scheduler"

_DONE_PHASES = frozenset({"Succeeded", "Failed"})


def quantity(value: Any) -> int:
    """An integer resource quantity (``"8"``, ``8``, ``"8k"`` is not a GPU count: 0)."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def pod_gpu_request(pod: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    """GPUs the pod holds: the largest of its app containers' total and any init
    container's (the scheduler's effective request)."""
    spec = pod.get("spec") or {}

    def want(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        return max(quantity((res.get("requests") or {}).get(resource)),
                   quantity((res.get("limits") or {}).get(resource)))

    apps = sum(want(c) for c in spec.get("containers") or [])
    inits = max((want(c) for c in spec.get("initContainers") or []), default=0)
    return max(apps, inits)


def pod_holds_gpus(pod: Mapping[str, Any], resource: str = GPU_RESOURCE) -> bool:
    """Bound, not finished, and requesting GPUs (a terminating pod still holds them)."""
    if (pod.get("status") or {}).get("phase") in _DONE_PHASES:
        return False
    return bool((pod.get("spec") or {}).get("nodeName")) and pod_gpu_request(pod, resource) > 0


def is_ours(pod_or_job: Mapping[str, Any]) -> bool:
    labels = (pod_or_job.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_MANAGED_BY) == MANAGER


def node_gpus(node: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    status = node.get("status") or {}
    return quantity((status.get("allocatable") or status.get("capacity") or {}).get(resource))
