"""Which workloads a trigger affects: every pod (off Kubernetes, every process) holding one of
the affected GPUs, from the attribution snapshot (gpu_monitor/workloads)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_monitor.workloads.attribution import Holder, Snapshot


@dataclass(frozen=True)
class PodRef:
    namespace: str
    pod: str
    containers: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True)
class Affected:
    pods: tuple[PodRef, ...] = ()
    pids: tuple[int, ...] = ()  # processes off Kubernetes (NVML's process lists)

    def __bool__(self) -> bool:
        return bool(self.pods or self.pids)

    def names(self) -> list[str]:
        return [p.name for p in self.pods] + [f"pid {pid}" for pid in self.pids]


def affected(snapshot: Snapshot, gpus: Iterable[int],
             rdma_devices: Iterable[str] = ()) -> Affected:
    """The holders of ``gpus`` (NVML indices) and of ``rdma_devices``, pods grouped with their
    containers, in the snapshot's order."""
    holders: dict[Holder, None] = {}
    for index in gpus:
        for h in snapshot.holders_of_target(f"gpu:{index}"):
            holders[h] = None
    for h in snapshot.holders_of_rdma(rdma_devices):
        holders[h] = None
    pods: dict[tuple[str, str], list[str]] = {}
    pids: dict[int, None] = {}
    for h in holders:
        if h.pod:
            containers = pods.setdefault((h.namespace, h.pod), [])
            if h.container and h.container not in containers:
                containers.append(h.container)
        elif h.pid is not None:
            pids[h.pid] = None
    return Affected(tuple(PodRef(ns, pod, tuple(c)) for (ns, pod), c in pods.items()),
                    tuple(pids))
