"""Where the host's pseudo-filesystems are mounted.

This is the only file that spells ``/sys``, ``/proc``, ``/dev`` and ``/``. In a container the
DaemonSet mounts the host's under ``/host/...`` and passes ``--path.sysfs=/host/sys`` etc.;
tests and the simulated node pass a tree in a temporary directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

DEFAULT_SYSFS = "/sys"
DEFAULT_PROCFS = "/proc"
DEFAULT_DEV = "/dev"
DEFAULT_ROOTFS = "/"
DEFAULT_STATE_DB = "/var/lib/gpu-monitor/state.db"
# Where the DaemonSet mounts the daemon's configuration (daemonset/daemonset.yaml --config):
# the node-view commands read it by default, so they judge with the daemon's settings.
DEFAULT_CONFIG_FILE = "/etc/gpu-monitor/config.yaml"
DEFAULT_REPORT_DIR = "/var/lib/gpu-monitor/reports"
DEFAULT_REBOOT_SENTINEL = "/var/run/reboot-required"


@dataclass(frozen=True)
class HostPaths:
    sysfs: str = DEFAULT_SYSFS
    procfs: str = DEFAULT_PROCFS
    dev: str = DEFAULT_DEV
    rootfs: str = DEFAULT_ROOTFS
    kmsg: str | None = None  # overrides <dev>/kmsg (a saved log file or a FIFO)

    def sys(self, *parts: str) -> str:
        return os.path.join(self.sysfs, *parts)

    def proc(self, *parts: str) -> str:
        return os.path.join(self.procfs, *parts)

    def device(self, *parts: str) -> str:
        return os.path.join(self.dev, *parts)

    def root(self, *parts: str) -> str:
        """A path on the host's root filesystem (``/etc/...`` of the host)."""
        return os.path.join(self.rootfs, *(p.lstrip("/") for p in parts))

    @property
    def kmsg_path(self) -> str:
        return self.kmsg if self.kmsg else self.device("kmsg")

    @property
    def kmsg_is_device(self) -> bool:
        """True when reading the real ``/dev/kmsg`` record interface, not a text file."""
        return self.kmsg is None

    def under(self, root: str) -> HostPaths:
        """The same layout re-rooted below ``root`` (used by the simulated node)."""
        return replace(
            self,
            sysfs=os.path.join(root, "sys"),
            procfs=os.path.join(root, "proc"),
            dev=os.path.join(root, "dev"),
            rootfs=root,
        )
