"""Shared by the fail-fast tests: a real rdma_ports crossing on the simulated node, and a
notifier over a real store with the attribution, pairing and clock the test chooses."""

from __future__ import annotations

from dataclasses import replace

from checks.rdma_ports import RdmaPorts
from gpu_monitor.config import DEFAULT_CONFIG
from gpu_monitor.failfast.notifier import FailFast, Wiring
from gpu_monitor.model import Result, Status
from gpu_monitor.state import Store
from gpu_monitor.workloads.attribution import GpuIdentity, Holder, Snapshot, resolve
from gpu_monitor.workloads.kubelet import DeviceAssignment
from tests.checks.rig import CheckRig

PORT = "ib:mlx5_0:1"
NODE = "gpu-node-1"


def crossing_result(rig: CheckRig) -> Result:
    """The result of the poll at the instant mlx5_0:1's outage crosses NCCL's tolerance
    (down from t=10 s for 20 s), as the daemon would poll it (``wake_at``)."""
    rig.run_to(10)
    rig.run_to(17)
    rig.advance(rig.check.wake_at() - rig.clock.now().timestamp())
    rig.sync()
    res = rig.poll()[PORT]
    assert (res.status, res.reason) == (Status.FAILED, "PortDownExceededNcclTimeout")
    return res


def new_rig() -> CheckRig:
    return CheckRig(RdmaPorts, "port-down@ib:mlx5_0:1,after=10,for=20", watch=PORT)


def pods_snapshot(pods: dict[int, tuple[str, str]]) -> Snapshot:
    """The kubelet's answer: GPU index -> (namespace, pod), container "main"."""
    gpus = [GpuIdentity(i, f"GPU-{i:08d}") for i in range(8)]
    rows = [DeviceAssignment(ns, pod, "main", "nvidia.com/gpu", f"GPU-{i:08d}")
            for i, (ns, pod) in pods.items()]
    return resolve(rows, gpus, {}, ("nvidia.com/gpu",), ())


def processes_snapshot(pids: dict[int, int]) -> Snapshot:
    """NVML's answer off Kubernetes: GPU index -> pid."""
    return Snapshot(state="ok", source="nvml",
                    gpus={f"GPU-{i:08d}": (Holder(pid=pid, process="python"),)
                          for i, pid in pids.items()},
                    gpu_index={f"GPU-{i:08d}": i for i in range(8)})


class Rig:
    """A notifier whose inputs the test holds: ``snap``, ``pair``, ``clock``."""

    def __init__(self, tmp_path, clock, snap: Snapshot, *, store=None, dry_run=False,
                 pair=None, kube=None, kill=None, gpu_pids=None, pod_pids=None,
                 pid_alive=None, **settings):
        self.store = store or Store.open(":memory:", clock)
        self.snap = snap
        self.pair = {f"mlx5_{i}": [i] for i in range(8)} if pair is None else pair
        self.notice_dir = str(tmp_path / "notices")
        ff = replace(DEFAULT_CONFIG.failfast, notice_dir=self.notice_dir, **settings)
        self.wiring = Wiring(node=NODE, store=self.store, snapshot=lambda: self.snap,
                             pairing=self._pairing, now=lambda: clock.now().timestamp(),
                             kube=kube, kill=kill,
                             gpu_pids=gpu_pids or (lambda gpus: []),
                             pod_pids=pod_pids or (lambda uid: []),
                             pid_alive=pid_alive or (lambda pid: True))
        self.ff = FailFast(ff, dry_run, self.wiring)

    def _pairing(self):
        if isinstance(self.pair, Exception):
            raise self.pair
        return self.pair

    def restarted(self, tmp_path, clock, **kw) -> Rig:
        return Rig(tmp_path, clock, self.snap, store=self.store, pair=self.pair, **kw)
