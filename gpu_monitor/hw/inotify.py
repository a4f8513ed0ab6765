"""Wake-ups for a followed regular file (Linux inotify through libc, no dependency).

``select()`` on a regular file always reports it readable, so following a journal or dmesg
file would otherwise mean polling. An inotify descriptor becomes readable when the file is
written, moved or deleted; the follower selects on it and reads the file only then. Where
inotify is unavailable (not Linux, no libc symbol, the watch limit reached) ``FileWatch.open``
returns None and the caller falls back to polling.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVE_SELF = 0x00000800
IN_DELETE_SELF = 0x00000400
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

_libc = None


def _load():
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c") or "libc.so.6"
        lib = ctypes.CDLL(name, use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        _libc = lib
    return _libc


class FileWatch:
    def __init__(self, fd: int, path: str):
        self.fd = fd
        self.path = path
        self._wd: int | None = None
        self._rewatch()

    @classmethod
    def open(cls, path: str) -> FileWatch | None:
        try:
            lib = _load()
            fd = lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        watch = cls(fd, path)
        if watch._wd is None:
            watch.close()
            return None
        return watch

    def _rewatch(self) -> None:
        lib = _load()
        wd = lib.inotify_add_watch(self.fd, os.fsencode(self.path),
                                   IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVE_SELF
                                   | IN_DELETE_SELF)
        self._wd = wd if wd >= 0 else None

    def wait(self, timeout_s: float) -> bool:
        """Block until the file changes or ``timeout_s`` passes; True when it changed."""
        try:
            ready, _, _ = select.select([self.fd], [], [], timeout_s)
        except (OSError, ValueError):
            return False
        if not ready:
            return False
        try:
            while os.read(self.fd, 65536):
                pass
        except BlockingIOError:
            pass
        except OSError:
            return True
        # A rotated (moved/deleted) file: watch the path again for its successor.
        self._rewatch()
        return True

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
