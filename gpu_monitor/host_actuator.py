"""The host-side actuator: the GPU reset, the GPU-holder scan, NVSwitch detection, the boot id
and the reboot sentinel, for the remediator (remediate/actuator.py says what it asks).

Why apart: these are the only host writes and host reads of remediation. The daemon builds one
from its ``HostPaths`` and command runner (``Host.commands``) and injects it; the remediator never touches ``hw/``.
Tests inject the GPU reset, the holder scan and NVSwitch detection instead of a real host.

1. **A held GPU is not reset**: any process (other than ours) holding an NVIDIA device node
   open - or one whose open files cannot be read - blocks the reset, by name.
2. **NVSwitch systems reset every GPU at once** (``nvidia-smi -r`` without ``-i``), as their
   fabric requires; elsewhere one ``-i N`` call per GPU asked for.
3. **A sentinel already there is kept** (its first reason stays), and a write that fails is
   logged, never raised: a reboot request must not fail the quarantine step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.hw.procfs import ProcfsReader
from gpu_monitor.hw.sysfs import SysfsReader
from gpu_monitor.remediate.actuator import ResetOutcome

log = logging.getLogger(__name__)

__all__ = ["KNOWN_HOLDERS", "HostActuator", "gpu_holders", "nvidia_smi_reset"]

#: Processes that commonly hold the GPU device nodes open and block a reset (named in Events).
KNOWN_HOLDERS = {
    "nvidia-device-plugin": "NVIDIA device plugin",
    "nvidia-device-p": "NVIDIA device plugin",
    "dcgm-exporter": "dcgm-exporter",
    "nv-hostengine": "DCGM host engine",
    "nvidia-persistenced": "nvidia-persistenced",
    "nvidia-persiste": "nvidia-persistenced",
    "nvidia-fabricmanager": "Fabric Manager",
    "nv-fabricmanager": "Fabric Manager",
}


def nvidia_smi_reset(commands: Any, gpus: Sequence[int] | None, timeout_s: float = 300.0
                     ) -> ResetOutcome:
    """Reset GPUs with ``nvidia-smi -r`` (``gpus`` None: every GPU at once, as NVSwitch
    systems require; else one ``-i N`` call per GPU)."""
    if gpus is None:
        listing = commands.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             timeout=60.0)
        indices = tuple(int(x) for x in listing.stdout.split() if x.strip().isdigit()) \
            if listing.ok else ()
        res = commands.run(["nvidia-smi", "-r"], timeout=timeout_s)
        if not res.ok:
            return ResetOutcome(False, _why(res))
        return ResetOutcome(True, "all GPUs reset", indices)
    done: list[int] = []
    for i in gpus:
        res = commands.run(["nvidia-smi", "-r", "-i", str(i)], timeout=timeout_s)
        if not res.ok:
            return ResetOutcome(False, f"GPU {i}: {_why(res)}", tuple(done))
        done.append(i)
    return ResetOutcome(True, f"GPU(s) {', '.join(map(str, done))} reset", tuple(done))


def _why(res: Any) -> str:
    text = (res.stderr or res.stdout or res.error or "").strip().splitlines()
    return (text[-1] if text else f"exit status {res.returncode}")[:300]


def gpu_holders(paths: HostPaths, exclude_pids: Iterable[int] = ()) -> list[str]:
    """Processes that hold an NVIDIA device node open, by name ("nvidia-persistenced (pid
    812)"); processes whose open files could not be read count too (they might)."""
    proc = ProcfsReader(paths)
    scan = proc.scan_open("nvidia", exclude_pids=exclude_pids)
    if not scan.available:
        return ["unknown processes (the process table could not be read)"]
    out = []
    for h in scan.holders:
        argv = proc.cmdline(h.pid) or []
        name = os.path.basename(argv[0]) if argv else (h.comm or "?")
        label = KNOWN_HOLDERS.get(name) or KNOWN_HOLDERS.get(h.comm or "")
        out.append(f"{name} (pid {h.pid}{', ' + label if label and label != name else ''})")
    if scan.denied_pids:
        out.append(f"{len(scan.denied_pids)} process(es) whose open files could not be read")
    return out


class HostActuator:
    """The host steps of a quarantine on this node (``remediate.actuator.Actuator``).

    ``commands``: the host's command runner (``Host.commands``) for ``nvidia-smi -r``; ``reboot_sentinel``: the file Kured
    watches, relative to the host's root (None: no sentinel). ``reset``/``holders``/``nvswitch``
    replace the GPU reset, the holder scan and NVSwitch detection (tests inject them)."""

    def __init__(self, paths: HostPaths | None = None, commands: Any = None, *,
                 reboot_sentinel: str | None = None,
                 reset: Callable[[Sequence[int] | None], ResetOutcome] | None = None,
                 holders: Callable[[], list[str]] | None = None,
                 nvswitch: bool | None = None):
        self.paths = paths or HostPaths()
        self.commands = commands
        self.reboot_sentinel = reboot_sentinel
        self._reset = reset
        self._holders = holders
        self._nvswitch = nvswitch

    def reset_gpus(self, gpus: Sequence[int] | None) -> ResetOutcome:
        holders = self._holders() if self._holders is not None else gpu_holders(
            self.paths, exclude_pids={os.getpid()})
        if holders:
            return ResetOutcome(False, "the GPUs are in use by " + ", ".join(holders),
                                blocked_by=tuple(holders))
        gpus = None if self._is_nvswitch() else gpus
        if self._reset is not None:
            return self._reset(gpus)
        if self.commands is None:
            return ResetOutcome(False, "no command runner to run nvidia-smi -r")
        return nvidia_smi_reset(self.commands, gpus)

    def _is_nvswitch(self) -> bool:
        if self._nvswitch is not None:
            return self._nvswitch
        try:
            self._nvswitch = bool(SysfsReader(self.paths).nvidia_switches())
        except Exception:  # noqa: BLE001
            self._nvswitch = False
        return self._nvswitch

    def boot_id(self) -> str | None:
        return ProcfsReader(self.paths).boot_id()

    def sentinel_path(self) -> str | None:
        path = self.reboot_sentinel
        return self.paths.root(path) if path else None

    def write_sentinel(self, path: str, why: str) -> None:
        if not path or os.path.exists(path):
            return
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(f"gpu-monitor: {why}\n")
        except OSError as exc:
            log.error("cannot write the reboot sentinel %s: %s", path, exc)

    def sentinel_present(self, path: str) -> bool:
        return os.path.exists(path)
