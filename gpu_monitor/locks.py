"""A re-entrant lock that says whether another thread is waiting for it.

Why it exists: the kernel-log follower holds the store (and the kernel-log checks' locks) for
one batch at a time, batch after batch through a backlog. A lock released and at once taken
again by the same thread starves a thread waiting for it (a scrape, a poll), so the follower
pauses between two batches; but a pause per batch when nobody waits only slows the catch-up.
:class:`WaitedLock` lets the follower pause only when someone waits (``waited``).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["WaitedLock"]


class WaitedLock:
    """``threading.RLock`` with ``waited``: True while another thread blocks in ``acquire``.
    The uncontended path is one non-blocking acquire of the inner lock."""

    __slots__ = ("_lock", "_count_lock", "_waiting")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()
        self._waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        with self._count_lock:
            self._waiting += 1
        try:
            return self._lock.acquire(True, timeout)
        finally:
            with self._count_lock:
                self._waiting -= 1

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> WaitedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    @property
    def waited(self) -> bool:
        """Whether some thread is waiting for the lock now."""
        return self._waiting > 0
