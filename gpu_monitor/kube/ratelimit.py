"""A token bucket for API writes: every daemon in a 10,000-node fleet writes only so fast.

Why apart: the client's writes wait for a token, and the Event queue takes one only when it is
free now (it must never delay the node's own writes); both share one bucket per client.
"""

from __future__ import annotations

import threading

from gpu_monitor.clock import Clock

__all__ = ["RateLimiter"]


class RateLimiter:
    """A token bucket (client-go's default for controllers is qps 5, burst 10)."""

    def __init__(self, qps: float, burst: int, clock: Clock):
        self.qps = float(qps)
        self.burst = max(1, int(burst))
        self.clock = clock
        self._tokens = float(self.burst)
        self._last = clock.monotonic()
        self._lock = threading.Lock()

    def try_acquire(self, keep: int = 0) -> bool:
        """Take one token only if one is free now and ``keep`` more stay for writes that wait;
        never sleeps (Events use it: they must not delay the node's own writes)."""
        if self.qps <= 0:
            return True
        with self._lock:
            now = self.clock.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            if self._tokens < 1.0 + keep:
                return False
            self._tokens -= 1.0
            return True

    def acquire(self) -> float:
        """Take one token, sleeping until one is available; returns the seconds waited."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            now = self.clock.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
        if wait:
            self.clock.sleep(wait)
        return wait

