"""Read process and kernel identity facts from procfs, below ``HostPaths.procfs``.

Why it exists: the daemon needs the boot id (to notice reboots between runs and reset
baselines), uptime (the post-boot grace period), the hostname, and which processes hold the
NVIDIA device nodes open (active checks refuse to load GPUs that someone else is using, and
NVML does not list every holder, e.g. a process that opened ``/dev/nvidia0`` but has no context).

Contract:

1. Single-value reads return ``None`` when the file is missing, unreadable or unparseable; they
   never raise. procfs is a moving target: a process can exit between any two reads.
2. The fd scan tolerates races (a process or fd vanishing mid-scan is simply skipped) and does
   not hide what it could not see: ``scan_open`` reports the pids whose fd table it was denied
   (an unprivileged container cannot read other users' ``fd/``), so a caller can tell "no
   holders" from "no holders that I could see".
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from gpu_monitor.hw.paths import DEFAULT_DEV, HostPaths

_MAX_READ = 64 * 1024


class DeviceHolder(NamedTuple):
    """A process with a matching device node open. ``comm`` is None if it could not be read."""

    pid: int
    comm: str | None


@dataclass(frozen=True)
class FdScan:
    """The outcome of one scan of every process's open files."""

    holders: tuple[DeviceHolder, ...] = ()
    denied_pids: tuple[int, ...] = ()  # fd/ not readable: they might hold the device too
    available: bool = True  # False when the proc root itself could not be listed

    @property
    def complete(self) -> bool:
        """True when every process was examined."""
        return self.available and not self.denied_pids


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_READ)
    except OSError:  # missing, permission, ESRCH from an exiting process
        return None


def _read_text(path: str) -> str | None:
    data = _read_bytes(path)
    if data is None:
        return None
    return data.decode("utf-8", "replace")


class ProcfsReader:
    """The host's procfs mounted at ``paths.procfs``."""

    def __init__(self, paths: HostPaths) -> None:
        self._paths = paths

    # --- kernel identity -------------------------------------------------------------------

    def boot_id(self) -> str | None:
        """A random UUID the kernel picks at each boot: a changed value means a reboot."""
        text = _read_text(self._paths.proc("sys", "kernel", "random", "boot_id"))
        value = text.strip() if text else ""
        return value or None

    def uptime_s(self) -> float | None:
        """Seconds since boot (first field of ``uptime``); ``None`` unless a finite, non-negative
        number (a NaN or a negative uptime would hold every boot grace open, or skip it)."""
        text = _read_text(self._paths.proc("uptime"))
        if not text or not text.split():
            return None
        try:
            value = float(text.split()[0])
        except ValueError:
            return None
        return value if math.isfinite(value) and value >= 0 else None

    def hostname(self) -> str | None:
        text = _read_text(self._paths.proc("sys", "kernel", "hostname"))
        value = text.strip() if text else ""
        return value or None

    # --- processes -------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """Process ids present now (numeric entries of the proc root), ascending."""
        try:
            names = os.listdir(self._paths.procfs)
        except OSError:
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def comm(self, pid: int) -> str | None:
        """The process name (at most 15 characters, as the kernel truncates it)."""
        text = _read_text(self._paths.proc(str(pid), "comm"))
        if text is None:
            return None
        return text.rstrip("\n")

    def cmdline(self, pid: int) -> list[str] | None:
        """The argument vector; ``[]`` for kernel threads, ``None`` when the process is gone."""
        data = _read_bytes(self._paths.proc(str(pid), "cmdline"))
        if data is None:
            return None
        return [a.decode("utf-8", "replace") for a in data.split(b"\0") if a]

    def scan_open(self, device_prefix: str = "nvidia",
                  exclude_pids: Iterable[int] = ()) -> FdScan:
        """Processes that hold a file whose path starts with ``device_prefix`` open.

        A bare name (``nvidia``) matches below the device directory as the processes see it
        (``/dev/nvidia0``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``) and below ``HostPaths.dev``
        (a simulated tree); an absolute prefix is matched as given. The fd links are resolved
        by the kernel in each process's own mount namespace, so the host's ``/dev`` spelling is
        what they show even when we run in a container with the host's /dev elsewhere.
        """
        prefixes = self._prefixes(device_prefix)
        skip = set(exclude_pids)
        try:
            names = os.listdir(self._paths.procfs)
        except OSError:
            return FdScan(available=False)
        holders: list[DeviceHolder] = []
        denied: list[int] = []
        for name in sorted(names, key=lambda n: int(n) if n.isdigit() else -1):
            if not name.isdigit() or int(name) in skip:
                continue
            pid = int(name)
            match = self._holds(pid, prefixes)
            if match is None:
                denied.append(pid)
            elif match:
                comm = self.comm(pid)
                if comm is None and not os.path.isdir(self._paths.proc(name)):
                    continue  # exited after we saw its fd: it holds nothing now
                holders.append(DeviceHolder(pid, comm))
        return FdScan(holders=tuple(holders), denied_pids=tuple(denied))

    def processes_with_open(self, device_prefix: str = "nvidia",
                            exclude_pids: Iterable[int] = ()) -> list[DeviceHolder]:
        """``(pid, comm)`` of the holders ``scan_open`` found (see it for the caveats)."""
        return list(self.scan_open(device_prefix, exclude_pids).holders)

    def _prefixes(self, device_prefix: str) -> tuple[str, ...]:
        if os.path.isabs(device_prefix):
            return (device_prefix,)
        return tuple(
            dict.fromkeys(
                (os.path.join(DEFAULT_DEV, device_prefix), self._paths.device(device_prefix))
            )
        )

    def _holds(self, pid: int, prefixes: tuple[str, ...]) -> bool | None:
        """True/False, or None when the process's fd table could not be read."""
        fd_dir = self._paths.proc(str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except (FileNotFoundError, NotADirectoryError):
            return False  # exited, or a zombie with no fd table
        except PermissionError:
            return None
        except OSError:
            return False  # ESRCH and friends: the process is going away
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue  # fd closed or process exited since listing
            if target.startswith(prefixes):
                return True
        return False
