"""Who holds which device: the kubelet's allocations (or NVML's process lists) mapped onto this
node's GPUs and RDMA devices.

A ``Snapshot`` answers "who holds gpu 3" and "who holds the devices paired to port X" (the
caller names the devices). It is built off the hot path by ``Refresher``; readers only take the
current snapshot. A failed read keeps the last good mapping but marks it ``stale`` with the
reason; with nothing read yet the state is ``unknown``. Device ids the kubelet reports that
this node does not have are kept in ``unknown_devices``, never guessed onto a GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpu_monitor.workloads.kubelet import DeviceAssignment, KubeletUnavailable

DEFAULT_GPU_RESOURCES = ("nvidia.com/gpu",)
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


@dataclass(frozen=True)
class Holder:
    """A pod's container (``pid`` None) or, off Kubernetes, a process (``pod`` empty)."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    pid: int | None = None
    process: str = ""

    def label(self) -> str:
        if self.pod:
            return f"{self.namespace}/{self.pod}/{self.container}"
        return f"pid {self.pid} ({self.process or '?'})"


@dataclass(frozen=True)
class GpuIdentity:
    """One of this node's GPUs as the device plugin may name it."""

    index: int
    uuid: str
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    state: str  # "ok" | "stale" | "unknown" | "off"
    source: str  # "kubelet" | "nvml" | "off"
    gpus: Mapping[str, tuple[Holder, ...]] = field(default_factory=dict)  # by GPU UUID
    rdma: Mapping[str, tuple[Holder, ...]] = field(default_factory=dict)  # by RDMA device name
    unknown_devices: tuple[str, ...] = ()  # "resource=id" the node does not have
    gpu_index: Mapping[str, int] = field(default_factory=dict)  # UUID -> NVML index
    reason: str = ""
    read_at: float | None = None  # monotonic time of the mapping's read

    def holders_of_gpu(self, uuid: str) -> tuple[Holder, ...]:
        return self.gpus.get(uuid, ())

    def holders_of_target(self, target: str) -> tuple[Holder, ...]:
        """The holders of a result's ``gpu:<index>`` target (none for other targets)."""
        kind, _, rest = target.partition(":")
        if kind != "gpu" or not rest.isdigit():
            return ()
        for uuid, index in self.gpu_index.items():
            if index == int(rest):
                return self.holders_of_gpu(uuid)
        return ()

    def holders_of_rdma(self, names: Iterable[str]) -> tuple[Holder, ...]:
        seen: dict[Holder, None] = {}
        for name in names:
            for holder in self.rdma.get(name, ()):
                seen[holder] = None
        return tuple(seen)


def holder_note(snapshot: Snapshot, target: str, limit: int = 3) -> str:
    """What an event about ``target`` says about who holds it: `` (pod ml/trainer-0, container
    main)``, with the mapping's staleness when it is stale; empty when nobody is known to."""
    holders = [h for h in snapshot.holders_of_target(target) if h.pod]
    if not holders:
        return ""
    named = ", ".join(f"pod {h.namespace}/{h.pod}, container {h.container}"
                      for h in holders[:limit])
    more = f" and {len(holders) - limit} more" if len(holders) > limit else ""
    stale = "; attribution stale" if snapshot.state == "stale" else ""
    return f" (held by {named}{more}{stale})"


UNKNOWN = Snapshot(state="unknown", source="off", reason="not read yet")


def _gpu_lookup(gpus: Iterable[GpuIdentity]) -> dict[str, str]:
    """Every id form the NVIDIA device plugin uses, mapped to the GPU's UUID: the UUID
    (DEVICE_ID_STRATEGY=uuid), the index (=index), MIG UUIDs and "gpu:mig" indices."""
    lookup: dict[str, str] = {}
    for gpu in gpus:
        lookup[gpu.uuid] = gpu.uuid
        lookup[str(gpu.index)] = gpu.uuid
        for position, mig in enumerate(gpu.mig_uuids):
            lookup[mig] = gpu.uuid
            lookup[f"{gpu.index}:{position}"] = gpu.uuid
    return lookup


def _strip_replica(device_id: str) -> str:
    """Time-sliced and MPS replicas are announced as ``<id>::<n>``."""
    return device_id.split("::", 1)[0]


def resolve(assignments: Iterable[DeviceAssignment], gpus: Iterable[GpuIdentity],
            rdma_devices: Mapping[str, str], gpu_resources: Iterable[str],
            rdma_resources: Iterable[str], read_at: float | None = None) -> Snapshot:
    """Map the kubelet's rows onto this node's devices. ``rdma_devices`` maps the RDMA plugin's
    device ids (e.g. PCI addresses) to device names (``mlx5_0``)."""
    gpus = tuple(gpus)
    lookup = _gpu_lookup(gpus)
    gpu_resources = frozenset(gpu_resources)
    rdma_resources = frozenset(rdma_resources)
    by_gpu: dict[str, dict[Holder, None]] = {}
    by_rdma: dict[str, dict[Holder, None]] = {}
    unknown: dict[str, None] = {}
    for row in assignments:
        holder = Holder(row.namespace, row.pod, row.container)
        is_gpu = row.resource_name in gpu_resources or row.resource_name.startswith(
            MIG_RESOURCE_PREFIX)
        if is_gpu:
            uuid = lookup.get(_strip_replica(row.device_id))
            if uuid is None:
                unknown[f"{row.resource_name}={row.device_id}"] = None
            else:
                by_gpu.setdefault(uuid, {})[holder] = None
        elif row.resource_name in rdma_resources:
            name = rdma_devices.get(row.device_id)
            if name is None:
                unknown[f"{row.resource_name}={row.device_id}"] = None
            else:
                by_rdma.setdefault(name, {})[holder] = None
    return Snapshot(state="ok", source="kubelet",
                    gpus={k: tuple(v) for k, v in by_gpu.items()},
                    rdma={k: tuple(v) for k, v in by_rdma.items()},
                    unknown_devices=tuple(unknown), read_at=read_at,
                    gpu_index={g.uuid: g.index for g in gpus})


def from_processes(processes: Mapping[str, Iterable[tuple[int, str]]],
                   read_at: float | None = None,
                   gpu_index: Mapping[str, int] | None = None) -> Snapshot:
    """The off-Kubernetes fallback: NVML's compute processes per GPU UUID (processes, not
    pods); ``gpu_index`` (UUID -> NVML index) lets ``holders_of_target`` answer for them."""
    return Snapshot(state="ok", source="nvml", read_at=read_at, gpu_index=dict(gpu_index or {}),
                    gpus={uuid: tuple(Holder(pid=pid, process=name) for pid, name in procs)
                          for uuid, procs in processes.items()})


class Refresher:
    """Reads ``read()`` every ``refresh_s`` on its own thread and keeps the current snapshot.

    ``read`` returns a fresh ``Snapshot`` or raises; a ``KubeletUnavailable`` gives its reason,
    anything else ``error``. Reads are counted by outcome (``reads``) for the read-health metric.
    """

    def __init__(self, read: Callable[[], Snapshot], refresh_s: float, source: str,
                 clock: Callable[[], float] = time.monotonic):
        self._read = read
        self._refresh_s = refresh_s
        self._source = source
        self._clock = clock
        self._lock = threading.Lock()
        self._snapshot = Snapshot(state="unknown", source=source, reason="not read yet")
        self.reads: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def refresh_once(self) -> Snapshot:
        try:
            fresh = self._read()
            outcome = "ok"
        except KubeletUnavailable as error:
            fresh, outcome = None, error.reason
            reason = str(error)
        except Exception as error:  # noqa: BLE001 - a reader's crash is reported, never raised
            fresh, outcome = None, "error"
            reason = f"read failed: {type(error).__name__}: {error}"
        with self._lock:
            self.reads[outcome] = self.reads.get(outcome, 0) + 1
            if fresh is not None:
                self._snapshot = fresh
            else:
                last = self._snapshot
                state = "stale" if last.read_at is not None else "unknown"
                self._snapshot = Snapshot(state=state, source=self._source, gpus=last.gpus,
                                          rdma=last.rdma, unknown_devices=last.unknown_devices,
                                          reason=reason, read_at=last.read_at,
                                          gpu_index=last.gpu_index)
            return self._snapshot

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="workload-attribution",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh_once()
            self._stop.wait(self._refresh_s)


def kubelet_reader(socket_path: str, timeout_s: float, gpus: Callable[[], Iterable[GpuIdentity]],
                   rdma_devices: Callable[[], Mapping[str, str]], gpu_resources: Iterable[str],
                   rdma_resources: Iterable[str],
                   clock: Callable[[], float] = time.monotonic) -> Callable[[], Snapshot]:
    """A ``Refresher`` read function over the kubelet's pod-resources socket."""
    from gpu_monitor.workloads.kubelet import list_assignments

    gpu_resources, rdma_resources = tuple(gpu_resources), tuple(rdma_resources)

    def read() -> Snapshot:
        rows = list_assignments(socket_path, timeout_s)
        return resolve(rows, gpus(), rdma_devices(), gpu_resources, rdma_resources,
                       read_at=clock())

    return read
