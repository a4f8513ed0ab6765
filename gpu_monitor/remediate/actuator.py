"""What the remediator asks of its own host: reset GPUs, tell a reboot, ask for one.

Why an interface: the remediator decides, the host acts. Reading procfs for the processes that
hold the GPUs, running ``nvidia-smi -r``, detecting NVSwitch systems, reading the boot id and
writing the reboot sentinel are the host's business (gpu_monitor/host_actuator.py, built by the
daemon and injected), so remediation imports nothing from ``hw/`` and its tests hand in a fake.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Actuator", "ResetOutcome"]


@dataclass(frozen=True)
class ResetOutcome:
    ok: bool
    detail: str = ""
    gpus: tuple[int, ...] = ()  # the GPUs that were reset
    blocked_by: tuple[str, ...] = ()


class Actuator(Protocol):
    """The host-side steps of a quarantine."""

    #: the configured reboot sentinel as the operator wrote it (None: none configured)
    reboot_sentinel: str | None

    def reset_gpus(self, gpus: Sequence[int] | None) -> ResetOutcome:
        """Reset ``gpus`` (None: every GPU) unless a process holds them (then ``blocked_by``
        names it); on NVSwitch systems every GPU is reset at once, whatever was asked."""
        ...

    def boot_id(self) -> str | None:
        """The kernel's boot id (a reboot changes it); None when unreadable."""
        ...

    def sentinel_path(self) -> str | None:
        """Where a reboot request is written on the host (None: no sentinel configured)."""
        ...

    def write_sentinel(self, path: str, why: str) -> None:
        """Ask for a reboot (Kured watches the file); a sentinel already there is kept."""
        ...

    def sentinel_present(self, path: str) -> bool:
        """Whether the reboot request is still there (a reboot removes it)."""
        ...
