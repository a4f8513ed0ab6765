"""The host a check examines: one bundle of readers, each built from its source.

``Host.real(paths)`` reads the machine (NVML through the real ``pynvml`` module, sysfs/procfs
below ``HostPaths``, the kernel log, external tools on PATH). The simulated node builds the same
``Host`` from fakes at the lowest boundary (sim/node.py), so checks cannot tell the two apart.

``requirement_gap()`` is the requirement gate the runner applies before entering a check. It
tells two kinds of unmet requirement apart, because a bootstrap must treat them differently:

- **not applicable here**: the hardware the check tests is not expected on this node (a
  cpu-only profile has no GPU to burn in, a profile with no RDMA ports needs no perftest, no
  NVSwitch on a PCIe SKU). The check is ``skipped`` and that is the truth.
- **missing**: the node is expected to have it, and a tool or runtime the check needs is not
  there (no ``dcgmi``, no torch or a CPU-only torch on a GPU node, no perftest where RDMA ports
  are expected, NVML down on a GPU node). A bootstrap that needs the check cannot pass
  without it (runner.py).

What the node is expected to have comes from the profile (``gpu.count``, ``rdma.ports``,
``nvlink.nvswitch``); with no profile at hand every gap counts as missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_monitor.hw.command import CommandRunner
from gpu_monitor.hw.paths import HostPaths

if TYPE_CHECKING:  # pragma: no cover
    from gpu_monitor.check import Context
    from gpu_monitor.hw.nvml_reader import NvmlReader
    from gpu_monitor.hw.procfs import ProcfsReader
    from gpu_monitor.hw.runtime import TorchRuntime
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
    to each worker's environment. ``device_seam`` names (``"package.module:function"``) the
    function a worker asks for each device's seam: the simulated node names its own
    (sim/worker.py), through which its CPU workers learn which device is slow or computes wrong
    results from ``fault_file``; production names none, and worker code never imports the
    simulator. Check code never looks at either.
    """

    device_type: str = "cuda"
    env: dict[str, str] = field(default_factory=dict)
    device_seam: str | None = None
    fault_file: str | None = None
    # The number of devices when torch cannot tell (CPU workers on the simulated node).
    device_count: int | None = None
    # The interpreter the workers run (None: this one). The requirement gate asks *it* whether
    # torch is there (hw/runtime.py), so a different interpreter -- the passive image's, or the
    # simulated node's ``missing@node,what=torch`` -- is seen as the workers would see it.
    python: str | None = None


@dataclass(frozen=True)
class Unmet:
    """One requirement a check cannot have here, and whether that is a gap or not its business.

    ``missing`` True: a tool or runtime this node is expected to have is absent (a bootstrap
    that requires the check cannot pass); False: the check does not apply to this node.
    """

    requirement: str
    message: str
    missing: bool


@dataclass
class Host:
    """The readers of one host. ``commands`` runs its external tools (``dcgmi``,
    ``ib_write_bw``, ``nvidia-smi``); it is not ``runner.py``, which runs checks."""

    paths: HostPaths
    nvml: NvmlReader
    sysfs: SysfsReader
    procfs: ProcfsReader
    commands: CommandRunner
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    # The identity of what is behind the readers ("host" or "simulated:<profile>"), for logs and
    # report details only; checks must not branch on it.
    description: str = "host"
    closers: list[Callable[[], None]] = field(default_factory=list)
    # Called with the daemon's clock when monitoring starts (the simulated node's ticker).
    starters: list[Callable[[Any], None]] = field(default_factory=list)
    _torch: TorchRuntime | None = field(default=None, init=False, repr=False)

    @classmethod
    def real(cls, paths: HostPaths, nvml_module: Any = None) -> Host:
        from gpu_monitor.hw.nvml_reader import NvmlReader
        from gpu_monitor.hw.procfs import ProcfsReader
        from gpu_monitor.hw.sysfs import SysfsReader

        nvml = NvmlReader(nvml_module) if nvml_module is not None else NvmlReader()
        return cls(
            paths=paths,
            nvml=nvml,
            sysfs=SysfsReader(paths),
            procfs=ProcfsReader(paths),
            commands=CommandRunner(),
        )

    def open_kmsg(self, replay: bool = True):
        from gpu_monitor.hw.kmsg.follow import open_kmsg

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

    def torch_runtime(self) -> TorchRuntime:
        """The workers' torch (asked once per host: an image does not gain torch mid-run)."""
        if self._torch is None:
            from gpu_monitor.hw.runtime import probe_torch

            self._torch = probe_torch(self.worker.python, self.worker.env)
        return self._torch

    def unmet(self, requires: Iterable[str], ctx: Context | None = None) -> str:
        """Why the requirements are not met (empty string when they all are)."""
        gap = self.requirement_gap(requires, ctx)
        return gap.message if gap is not None else ""

    def requirement_gap(self, requires: Iterable[str],
                        ctx: Context | None = None) -> Unmet | None:
        """The requirement that keeps a check from running here, or None.

        Every requirement is examined: one that is not applicable wins over a missing one (a
        check that does not apply to this node is not waiting for a tool). Among several of the
        same kind, the first in name order is reported. A requirement whose probe raises (an
        NVML that cannot list its GPUs) is no gap: the check runs and reports what it cannot
        read as ``unknown``; the gate neither crashes its caller nor hides the error.
        """
        gaps = []
        for req in sorted(set(requires)):
            try:
                gap = self._unmet_one(req, ctx)
            except Exception:  # noqa: BLE001 - see above: the check's own reading reports it
                gap = None
            if gap is not None:
                gaps.append(gap)
        for gap in gaps:
            if not gap.missing:
                return gap
        return gaps[0] if gaps else None

    def _unmet_one(self, req: str, ctx: Context | None = None) -> Unmet | None:
        gpus = _expects(ctx, "gpu.count")
        if req == "nvml":
            if not self.nvml.available():
                return Unmet(req, f"NVML unavailable: {self.nvml.unavailable_reason()}", gpus)
        elif req == "gpu":
            if not self.nvml.available():
                return Unmet(req, "no GPU visible: NVML unavailable "
                                  f"({self.nvml.unavailable_reason()})", gpus)
            if not self.nvml.gpus():
                return Unmet(req, "no NVIDIA GPU on this node", gpus)
        elif req == "nvswitch":
            if not self.sysfs.nvidia_switches():
                return Unmet(req, "no NVSwitch on this node", _expects(ctx, "nvlink.nvswitch"))
        elif req == "torch":
            why = self._torch_gap()
            if why:
                return Unmet(req, why, gpus)
        elif req == "root":
            if hasattr(os, "geteuid") and os.geteuid() != 0:
                return Unmet(req, "needs root", True)
        elif req == "dcgm":
            if self.commands.which("dcgmi") is None:
                return Unmet(req, "DCGM not installed (dcgmi not found on PATH)", gpus)
        elif req == "perftest":
            if self.commands.which("ib_write_bw") is None:
                return Unmet(req, "perftest not installed (ib_write_bw not found on PATH)",
                             _expects(ctx, "rdma.ports"))
        elif req == "infiniband":
            # Cheap (runs before every 1 s poll): a directory listing, not a full port read.
            # A profile that expects ports keeps the check running, so vanished HCAs are
            # reported as missing ports instead of a skipped check.
            if ctx is not None and ctx.profile.get("rdma.ports"):
                return None
            try:
                present = bool(os.listdir(self.paths.sys("class", "infiniband")))
            except OSError:
                present = False
            if not present:
                return Unmet(req, "no RDMA device (nothing under class/infiniband)", False)
        elif req == "kmsg":
            if not os.path.exists(self.paths.kmsg_path):
                return Unmet(req, f"kernel log not readable: {self.paths.kmsg_path} does not "
                                  "exist", True)
        elif req == "idle":
            return None  # enforced by the runner for invasive checks (names the holders)
        else:
            return Unmet(req, f"unknown requirement {req!r}", True)
        return None

    def _torch_gap(self) -> str:
        rt = self.torch_runtime()
        where = "" if rt.interpreter in ("", "this interpreter") else \
            f" for the worker interpreter {rt.interpreter}"
        if not rt.installed:
            extra = f"; {rt.problem}" if rt.problem else ""
            return f"torch is not installed{where} (install gpu-monitor[active]){extra}"
        if rt.cpu_only and self.worker.device_type == "cuda":
            assert rt.build is not None
            return (f"torch {rt.build.version}{where} is a build without CUDA (its version.py "
                    "says cuda=None); the active checks need torch built for CUDA")
        return ""


def _expects(ctx: Context | None, dotted: str) -> bool:
    """Whether the profile expects the hardware at ``dotted`` (a count > 0, a non-empty list,
    True). No profile to ask: expected (a gap is then reported as missing, never hidden)."""
    profile = getattr(ctx, "profile", None) if ctx is not None else None
    if profile is None or not hasattr(profile, "get"):
        return True
    try:
        value = profile.get(dotted)
    except Exception:  # noqa: BLE001 - a stub or broken profile: assume expected
        return True
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value > 0
    try:
        return len(value) > 0
    except TypeError:
        return bool(value)


def env_with(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(extra)
    return env
