"""The client's token bucket (gpu_monitor/kube/ratelimit.py), on a fake clock."""

from __future__ import annotations

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.kube.ratelimit import RateLimiter


def test_rate_limiter_spaces_writes_after_the_burst():
    clock = FakeClock()
    rl = RateLimiter(qps=2.0, burst=2, clock=clock)
    waits = [rl.acquire() for _ in range(4)]
    assert waits[:2] == [0.0, 0.0] and waits[2] == pytest.approx(0.5)
    assert waits[3] == pytest.approx(0.5)


def test_try_acquire_never_sleeps_and_keeps_tokens_for_writes_that_wait():
    clock = FakeClock()
    rl = RateLimiter(qps=1.0, burst=4, clock=clock)
    assert [rl.try_acquire(keep=2) for _ in range(3)] == [True, True, False]
    assert clock.monotonic() == 1000.0  # never slept
    assert rl.acquire() == 0.0 and rl.acquire() == 0.0  # the kept tokens
    clock.advance(3)
    assert rl.try_acquire(keep=2)
