"""What the daemon follows: the :class:`KmsgSource` interface and :func:`open_kmsg`, which
picks the record device or a ``--kmsg`` file from :class:`HostPaths`.

Why it exists on its own: the live follower (how often and how much is read, what is handed
to the checks, when the position is saved) is the seam that changes for throughput; the
sources behind it and the parsing under them do not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gpu_monitor.hw.kmsg.device import (
    KmsgDeviceSource,
    KmsgReader,
)
from gpu_monitor.hw.kmsg.files import (
    KmsgFileSource,
)
from gpu_monitor.hw.kmsg.record import (
    KmsgGap,
    KmsgRecord,
)
from gpu_monitor.hw.paths import HostPaths


class KmsgSource(Protocol):
    path: str

    @property
    def parse_errors(self) -> int: ...

    def read_available(self, max_records: int | None = None) -> list[KmsgRecord | KmsgGap]: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...



def open_kmsg(
    paths: HostPaths,
    replay: bool = True,
    *,
    device_reader: Callable[[str], KmsgReader] | None = None,
) -> KmsgDeviceSource | KmsgFileSource:
    """The kernel-log source ``paths`` names: the record device, or a file/FIFO given by
    ``--kmsg``. ``replay`` means "from the oldest record" (device) / "from the start" (file).
    """
    path = paths.kmsg_path
    if paths.kmsg_is_device:
        reader = device_reader(path) if device_reader is not None else None
        return KmsgDeviceSource(path, replay=replay, reader=reader)
    return KmsgFileSource(path, from_start=replay)
