"""``/dev/kmsg``, read record by record without blocking (package contract 4).

Why it exists apart from the text readers: the device gives one record per ``read()``, has
sequence numbers, and reports a ring-buffer overrun as ``EPIPE``; those become
:class:`~gpu_monitor.hw.kmsg.record.KmsgGap` values. The device is reached through
:class:`KmsgReader`, so tests and the simulated node replace it without patching.
"""

from __future__ import annotations

import errno
import os
from typing import Protocol

from gpu_monitor.hw.kmsg.record import (
    KmsgGap,
    KmsgParseError,
    KmsgRecord,
    malformed_record,
    parse_kmsg_record,
)

# /dev/kmsg answers EINVAL when the buffer is smaller than the next record (<= 8 KiB).
KMSG_READ_BUFFER = 16 * 1024


class KmsgReader(Protocol):
    """What :class:`KmsgDeviceSource` reads from: one record per ``read``.

    ``read`` raises ``BlockingIOError`` when nothing is available and ``OSError(EPIPE)`` when
    records were overwritten, exactly as ``os.read`` on ``/dev/kmsg`` does.
    """

    def read(self, size: int) -> bytes: ...

    def seek_end(self) -> None: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...


class FdRecordReader:
    """A :class:`KmsgReader` over an open file descriptor (``/dev/kmsg``, or in tests a
    ``SOCK_SEQPACKET`` socket, which keeps the same one-record-per-read boundaries)."""

    def __init__(self, fd: int, *, owns_fd: bool = True):
        self._fd = fd
        self._owns = owns_fd

    @classmethod
    def open(cls, path: str) -> FdRecordReader:
        return cls(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))

    def read(self, size: int) -> bytes:
        return os.read(self._fd, size)

    def seek_end(self) -> None:
        os.lseek(self._fd, 0, os.SEEK_END)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0 and self._owns:
            os.close(self._fd)
        self._fd = -1



_EPIPE_REASON = "kernel ring buffer overrun (EPIPE): records were overwritten before read"
_SEQ_REASON = "kmsg sequence number jumped"
# A device that keeps answering EPIPE is broken; stop the round instead of spinning.
_MAX_EPIPE_IN_A_ROW = 16


class KmsgDeviceSource:
    """``/dev/kmsg``, read record by record without blocking.

    ``replay=True`` starts at the oldest record in the ring (the position a fresh open has,
    which also covers records hidden by ``dmesg -C``); ``replay=False`` seeks to the end and
    delivers only new records. ``reader`` replaces the device (tests, the simulated node);
    without it the path is opened ``O_RDONLY|O_NONBLOCK`` and open errors raise.
    """

    def __init__(self, path: str, replay: bool = True, *, reader: KmsgReader | None = None):
        self.path = path
        self.parse_errors = 0
        self.gaps = 0
        self._reader: KmsgReader = reader if reader is not None else FdRecordReader.open(path)
        self._count = 0
        self._last_seq: int | None = None
        self._gap_pending = False
        self._deferred: OSError | None = None
        if not replay:
            self._reader.seek_end()

    def read_available(self, max_records: int | None = None) -> list[KmsgRecord | KmsgGap]:
        """Everything readable now (at most ``max_records`` records), gaps in place.

        An I/O error other than those above raises; when records were read before it in the
        same call they are returned first and the error is raised by the next call.
        """
        if self._deferred is not None:
            exc, self._deferred = self._deferred, None
            raise exc
        out: list[KmsgRecord | KmsgGap] = []
        drained = False
        epipes = 0
        n = 0
        while max_records is None or n < max_records:
            try:
                data = self._reader.read(KMSG_READ_BUFFER)
            except BlockingIOError:
                drained = True
                break
            except OSError as e:
                if e.errno == errno.EPIPE:
                    self._gap_pending = True
                    epipes += 1
                    if epipes > _MAX_EPIPE_IN_A_ROW:
                        drained = True
                        break
                    continue
                if e.errno == errno.EAGAIN:
                    drained = True
                    break
                if e.errno == errno.EINVAL:  # a record bigger than our buffer: cannot happen
                    self.parse_errors += 1
                    self._gap(out, None, "record larger than the read buffer (EINVAL)")
                    break
                if out:  # keep what was read; the error comes with the next call
                    self._deferred = e
                    break
                raise
            epipes = 0
            if not data:
                drained = True
                break
            self._count += 1
            n += 1
            try:
                rec = parse_kmsg_record(data, line_no=self._count)
            except KmsgParseError as e:
                self.parse_errors += 1
                out.append(malformed_record(bytes(data).decode("utf-8", "replace"), str(e), self._count))
                continue
            self._note_seq(out, rec.seq)
            out.append(rec)
        if drained and self._gap_pending:
            self._gap(out, None, _EPIPE_REASON)
            self._last_seq = (
                None  # the next record's jump belongs to this gap: don't count it twice
            )
        return out

    def _note_seq(self, out: list[KmsgRecord | KmsgGap], seq: int | None) -> None:
        last = self._last_seq
        missed = seq - last - 1 if last is not None and seq is not None and seq > last else None
        if self._gap_pending:
            self._gap(out, missed, _EPIPE_REASON)
        elif missed:
            self._gap(out, missed, _SEQ_REASON)
        self._last_seq = seq

    def _gap(self, out: list[KmsgRecord | KmsgGap], missed: int | None, reason: str) -> None:
        self._gap_pending = False
        self.gaps += 1
        out.append(KmsgGap(missed, reason))

    def fileno(self) -> int:
        return self._reader.fileno()

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> KmsgDeviceSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

