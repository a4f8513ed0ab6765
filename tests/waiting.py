"""Waiting for a condition, the one way tests wait (never a sleep standing in for one).

The deadline is only an upper bound for a condition that must come true; it is generous so
that the suite holds on a loaded machine, and reaching it fails the test with what was seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.02,
               what: str = "condition") -> T:
    """Poll ``predicate()`` until it returns something truthy and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g} s (last: {value!r})")
        time.sleep(interval)
