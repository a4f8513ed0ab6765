"""The parts every Job gpu-monitor builds shares: the standard labels, the cpu/memory
requests, the memory-backed ``/dev/shm``.

Why a module of its own: two builders make Jobs (plan.py renders the fabric probe from the
template, idle.py builds the single-node active check) and an operator must find the same
things on both: the ``app.kubernetes.io/*`` labels the manifests carry (so a selector such as
``app.kubernetes.io/part-of=gpu-monitor`` sees the Jobs too), requests that keep the pods out
of the BestEffort class (the first evicted under node memory pressure, and scheduled with no
regard for memory), and a tmpfs ``/dev/shm`` for NCCL (a container's own is 64 MiB, and NCCL
falls over or hangs when its shared-memory segments do not fit). Pure functions over dicts;
no imports from the rest of the package, so both builders can use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_monitor import __version__

NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
VERSION = "app.kubernetes.io/version"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"

SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"

#: What a probe pod asks for besides its GPUs: torchrun and one rank per GPU, each a CUDA
#: context and NCCL's proxy thread (about 1 GiB resident per rank on H100 nodes). No cpu
#: limit: throttling a rank shows as fabric latency.
PROBE_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "32Gi"}}
#: The active checks (bootstrap in a subprocess, a torch worker per GPU for burn_in,
#: nccl_allreduce and sdc_probe, the dcgmi client): more host memory than a probe rank.
ACTIVE_CHECK_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "64Gi"}}
#: The idle-check's /dev/shm; tmpfs pages count against the memory limit above.
ACTIVE_CHECK_SHM = "16Gi"


def standard_labels(component: str, manager: str, instance: str = "gpu-monitor"
                    ) -> dict[str, str]:
    """The six ``app.kubernetes.io`` labels of a Job (and its pods) that ``manager`` creates."""
    return {NAME: "gpu-monitor", INSTANCE: instance, VERSION: __version__,
            COMPONENT: component, PART_OF: "gpu-monitor", MANAGED_BY: manager}


def with_cpu_memory(resources: Mapping[str, Any] | None,
                    defaults: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """``resources`` (a container's) with every cpu/memory request and limit of ``defaults``
    it does not set itself: what the container (the template) says wins."""
    out: dict[str, Any] = {k: dict(v) for k, v in (resources or {}).items()}
    for section, values in defaults.items():
        have = out.setdefault(section, {})
        for name, quantity in values.items():
            have.setdefault(name, str(quantity))
    return out


def ensure_shm(pod_spec: dict[str, Any], container: dict[str, Any],
               size: str | None = None) -> None:
    """A memory-backed emptyDir at ``/dev/shm`` in ``container``, unless it has one."""
    mounts = container.setdefault("volumeMounts", [])
    if any(m.get("mountPath") == SHM_PATH for m in mounts):
        return
    volumes = pod_spec.setdefault("volumes", [])
    if not any(v.get("name") == SHM_VOLUME for v in volumes):
        empty: dict[str, Any] = {"medium": "Memory"}
        if size:
            empty["sizeLimit"] = size
        volumes.append({"name": SHM_VOLUME, "emptyDir": empty})
    mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
