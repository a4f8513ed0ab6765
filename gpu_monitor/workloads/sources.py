"""Choosing and building the attribution source: the kubelet, NVML's processes, or none."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

from gpu_monitor.hw.nvml_reader import NvmlReader
from gpu_monitor.workloads.attribution import (
    GpuIdentity,
    Refresher,
    Snapshot,
    from_processes,
    kubelet_reader,
)


def choose_source(source: str, socket_path: str,
                  exists: Callable[[str], bool] = os.path.exists) -> str:
    """``auto`` is the kubelet where its socket exists (a Kubernetes node), else NVML."""
    if source == "auto":
        return "kubelet" if exists(socket_path) else "nvml"
    return source


def gpu_identities(nvml: NvmlReader) -> list[GpuIdentity]:
    return [GpuIdentity(gpu.index, gpu.uuid) for gpu in nvml.gpus() if gpu.uuid]


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""  # exited, or in a PID namespace we cannot see


def nvml_reader(nvml: NvmlReader, clock: Callable[[], float] = time.monotonic,
                process_name: Callable[[int], str] = _process_name) -> Callable[[], Snapshot]:
    """A ``Refresher`` read function over NVML's per-GPU process lists."""

    def read() -> Snapshot:
        procs, index = {}, {}
        for gpu in nvml.gpus():
            if gpu.uuid:
                procs[gpu.uuid] = [(p.pid, process_name(p.pid)) for p in nvml.processes(gpu.index)]
                index[gpu.uuid] = gpu.index
        return from_processes(procs, read_at=clock(), gpu_index=index)

    return read


def make_refresher(source: str, socket_path: str, refresh_s: float, timeout_s: float,
                   gpu_resources: Iterable[str], rdma_resources: Iterable[str],
                   nvml: NvmlReader, rdma_devices: Callable[[], Mapping[str, str]] = dict,
                   exists: Callable[[str], bool] = os.path.exists) -> Refresher | None:
    """The refresher for the configured source (None for ``off``); not started."""
    chosen = choose_source(source, socket_path, exists)
    if chosen == "off":
        return None
    if chosen == "kubelet":
        read = kubelet_reader(socket_path, timeout_s, lambda: gpu_identities(nvml), rdma_devices,
                              gpu_resources, rdma_resources)
    else:
        read = nvml_reader(nvml)
    return Refresher(read, refresh_s, source=chosen)
