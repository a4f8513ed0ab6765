"""Time, injected: the daemon and every windowed check read time from a ``Clock`` so tests of
ten-minute windows run in milliseconds and golden files hold fixed timestamps."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone


class Clock:
    """Wall time (UTC) and a monotonic counter."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait for ``event`` at most ``seconds``; True when it was set."""
        return event.wait(max(0.0, seconds))


class FakeClock(Clock):
    """A clock that only moves when told to (``advance``) or when something sleeps on it."""

    def __init__(self, start: datetime | None = None):
        self._now = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
        self._mono = 1000.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            self._mono += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        self.advance(max(0.0, seconds))
        # Yield so other threads make progress without real waiting.
        time.sleep(0)
        return event.is_set()
