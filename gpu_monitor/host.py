"""The host a check examines: one bundle of readers, each built from its source.

``Host.real(paths)`` reads the machine (NVML through the real ``pynvml`` module, sysfs/procfs
below ``HostPaths``, the kernel log, external tools on PATH). The simulated node builds the same
``Host`` from fakes at the lowest boundary (sim/node.py), so checks cannot tell the two apart.

``unmet()`` is the requirement gate the runner applies before entering a check.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_monitor.hw.command import CommandRunner
from gpu_monitor.hw.paths import HostPaths

if TYPE_CHECKING:  # pragma: no cover
    from gpu_monitor.check import Context
    from gpu_monitor.hw.nvml import NvmlReader
    from gpu_monitor.hw.procfs import ProcfsReader
    from gpu_monitor.hw.sysfs import SysfsReader


@dataclass(frozen=True)
class GpuHolder:
    """A process holding a GPU (from NVML's process list)."""

    gpu_index: int
    pid: int
    name: str
    used_memory_bytes: int | None = None


@dataclass
class WorkerSettings:
    """How active checks start their per-device torch workers.

    ``device_type`` is ``cuda`` in production and ``cpu`` on the simulated node; ``env`` is added
    to each worker's environment. ``fault_file`` is the documented seam through which the
    simulated node tells its CPU workers which device is slow or computes wrong results (see
    sim/worker.py); the worker code reads it, check code never does.
    """

    device_type: str = "cuda"
    env: dict[str, str] = field(default_factory=dict)
    fault_file: str | None = None
    # The number of devices when torch cannot tell (CPU workers on the simulated node).
    device_count: int | None = None


@dataclass
class Host:
    paths: HostPaths
    nvml: NvmlReader
    sysfs: SysfsReader
    procfs: ProcfsReader
    runner: CommandRunner
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    # The identity of what is behind the readers ("host" or "simulated:<profile>"), for logs and
    # report details only; checks must not branch on it.
    description: str = "host"
    closers: list[Callable[[], None]] = field(default_factory=list)
    # Called with the daemon's clock when monitoring starts (the simulated node's ticker).
    starters: list[Callable[[Any], None]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def real(cls, paths: HostPaths, nvml_module: Any = None) -> Host:
        from gpu_monitor.hw.nvml import NvmlReader
        from gpu_monitor.hw.procfs import ProcfsReader
        from gpu_monitor.hw.sysfs import SysfsReader

        nvml = NvmlReader(nvml_module) if nvml_module is not None else NvmlReader()
        return cls(
            paths=paths,
            nvml=nvml,
            sysfs=SysfsReader(paths),
            procfs=ProcfsReader(paths),
            runner=CommandRunner(),
        )

    def open_kmsg(self, replay: bool = True):
        from gpu_monitor.hw.kmsg import open_kmsg

        return open_kmsg(self.paths, replay=replay)

    def start(self, clock: Any) -> None:
        for fn in self.starters:
            fn(clock)

    def close(self) -> None:
        for fn in reversed(self.closers):
            try:
                fn()
            except Exception:  # noqa: BLE001 - closing must not mask the real outcome
                pass
        self.closers.clear()
        try:
            self.nvml.close()
        except Exception:  # noqa: BLE001
            pass

    # --- requirements ----------------------------------------------------------------------

    def gpu_count(self) -> int:
        if not self.nvml.available():
            return 0
        return len(self.nvml.gpus())

    def gpu_holders(self, own_pids: Iterable[int] = ()) -> list[GpuHolder]:
        """Processes (other than ``own_pids``) that NVML reports on any GPU."""
        own = set(own_pids) | {os.getpid()}
        holders: list[GpuHolder] = []
        if not self.nvml.available():
            return holders
        for gpu in self.nvml.gpus():
            if getattr(gpu, "lost", False):
                continue
            for proc in self.nvml.processes(gpu.index):
                if proc.pid in own:
                    continue
                name = self.procfs.comm(proc.pid) or "?"
                holders.append(GpuHolder(gpu.index, proc.pid, name, proc.used_memory_bytes))
        return holders

    def unmet(self, requires: Iterable[str], ctx: Context | None = None,
              invasive: bool = False) -> str:
        """Why the requirements are not met (empty string when they all are)."""
        for req in sorted(requires):
            why = self._unmet_one(req, ctx)
            if why:
                return why
        return ""

    def _unmet_one(self, req: str, ctx: Context | None = None) -> str:
        if req == "nvml":
            if not self.nvml.available():
                return f"NVML unavailable: {self.nvml.unavailable_reason()}"
        elif req == "gpu":
            if not self.nvml.available():
                return f"no GPU visible: NVML unavailable ({self.nvml.unavailable_reason()})"
            from gpu_monitor.hw.nvml import NvmlError

            try:
                if not self.nvml.gpus():
                    return "no NVIDIA GPU on this node"
            except NvmlError:  # not a missing requirement: the check says unknown, naming it
                return ""
        elif req == "nvswitch":
            if not self.sysfs.nvidia_switches():
                return "no NVSwitch on this node"
        elif req == "torch":
            if importlib.util.find_spec("torch") is None:
                return "torch is not installed (install gpu-monitor[active])"
        elif req == "root":
            if hasattr(os, "geteuid") and os.geteuid() != 0:
                return "needs root"
        elif req == "dcgm":
            if self.runner.which("dcgmi") is None:
                return "DCGM not installed (dcgmi not found on PATH)"
        elif req == "perftest":
            if self.runner.which("ib_write_bw") is None:
                return "perftest not installed (ib_write_bw not found on PATH)"
        elif req == "infiniband":
            # Cheap (runs before every 1 s poll): a directory listing, not a full port read.
            # A profile that expects ports keeps the check running, so vanished HCAs are
            # reported as missing ports instead of a skipped check.
            if ctx is not None and ctx.profile.get("rdma.ports"):
                return ""
            try:
                present = bool(os.listdir(self.paths.sys("class", "infiniband")))
            except OSError:
                present = False
            if not present:
                return "no RDMA device (nothing under class/infiniband)"
        elif req == "kmsg":
            if not os.path.exists(self.paths.kmsg_path):
                return f"kernel log not readable: {self.paths.kmsg_path} does not exist"
        elif req == "idle":
            return ""  # enforced by the runner for invasive checks (names the holders)
        else:
            return f"unknown requirement {req!r}"
        return ""


def env_with(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(extra)
    return env
