"""Events about our Node, delivered from a bounded queue: an Events-API outage neither loses
them nor holds up the node's own steps.

Why: an Event is how an operator reading ``kubectl describe node`` learns what gpu-monitor did;
the condition, taint, cordon and drain are how the cluster is protected from a bad GPU. The two
must not be coupled. Sending each Event inline, with the API client's 30 s retry deadline, made
a failing Events API (a 503 for 50 s) delay the drain by 30 s per Event, and marking an Event
sent before sending it lost the ``Quarantined`` Event for good.

Guarantees:

1. **Sent means accepted.** An Event counts as sent (and starts its ``repeat_s`` window, in
   which an identical one is dropped) only once the API server accepted it: 201, or 409
   AlreadyExists for a retry of one that had landed (each queued Event has its own name, so a
   retry is idempotent). Until then it waits here, and an identical one merges into it
   (``count`` + 1, ``lastTimestamp`` moves), as the API server's own Event series do.
2. **Delivery never waits.** A flush makes one attempt per Event (no retry loop, a short
   request timeout, a write token only if one is free now), stops at the first temporary
   failure (429, 5xx, unreachable: sending the rest would only add load to a failing server)
   and backs off before the next attempt: 1 s doubling to 30 s, +-20 % jitter, at least the
   server's Retry-After. A flush happens when an Event is queued (unless backing off) and after
   every remediation tick.
3. **Bounded.** At most ``capacity`` (128) Events wait; when full the oldest is dropped,
   counted (``dropped``; ``on_drop`` is told, the remediator records it as action ``event``,
   result ``dropped``) and logged: a warning for the first drop of an outage, the total when
   delivery resumes.
4. **Refused for good is dropped, not retried**: any other 4xx (403 without RBAC, 422
   invalid) is logged once per distinct error, counted (``refused``; ``on_drop`` with
   ``refused``) and never retried.
5. **Thread-safe**: the remediator's tick and the bootstrap gate share one queue; one flush
   runs at a time, a second caller returns at once.

This module knows no Kubernetes: ``send(body)`` (kube.py's ``NodeClient``) classifies the
answer into an ``Attempt``.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpu_monitor.clock import Clock

log = logging.getLogger(__name__)

__all__ = ["Attempt", "Delivery", "EventQueue"]

CAPACITY = 128
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 30.0
_SENT_MEMO = 512  # identical-Event windows remembered (oldest half forgotten beyond)


class Delivery(str, Enum):
    SENT = "sent"  # accepted (or already there)
    RETRY = "retry"  # temporary: keep it, back off
    LATER = "later"  # no write token free now: keep it, no backoff
    REFUSED = "refused"  # permanent: drop it


@dataclass(frozen=True)
class Attempt:
    """How one send went."""

    outcome: Delivery
    detail: str = ""
    retry_after: float = 0.0


@dataclass
class _Waiting:
    body: dict[str, Any]
    queued_at: float


class EventQueue:
    """The Events of one Node waiting to be delivered, oldest first."""

    def __init__(self, send: Callable[[Mapping[str, Any]], Attempt], clock: Clock, *,
                 capacity: int = CAPACITY, repeat_s: float = 600.0,
                 backoff_base_s: float = BACKOFF_BASE_S, backoff_max_s: float = BACKOFF_MAX_S,
                 on_drop: Callable[[Mapping[str, Any], str], None] | None = None):
        self.send = send
        self.clock = clock
        self.capacity = max(1, int(capacity))
        self.repeat_s = float(repeat_s)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self.on_drop = on_drop
        self.sent = 0
        self.dropped = 0
        self.refused = 0
        self.failures = 0  # consecutive failed attempts (0: delivering normally)
        self._waiting: OrderedDict[tuple[str, str], _Waiting] = OrderedDict()
        self._sent_at: dict[tuple[str, str], float] = {}
        self._next_attempt = float("-inf")
        self._dropped_in_outage = 0
        self._refusals_logged: set[str] = set()
        self._lock = threading.Lock()
        self._flushing = threading.Lock()

    # --- state ---------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._waiting)

    def waiting(self) -> list[dict[str, Any]]:
        """Copies of the waiting Event bodies, oldest first."""
        with self._lock:
            return [dict(w.body) for w in self._waiting.values()]

    def was_sent(self, key: tuple[str, str]) -> bool:
        """Whether the Event ``key`` was accepted by the API server (in this process, within
        the memo of recent sends): what a caller that must announce something once waits for,
        since ``put`` only queues."""
        with self._lock:
            return key in self._sent_at

    @property
    def backing_off(self) -> bool:
        return self.clock.monotonic() < self._next_attempt

    # --- input ---------------------------------------------------------------------------------

    def put(self, key: tuple[str, str], body: Mapping[str, Any], stamp: str) -> bool:
        """Queue an Event; False when it is a repeat (of one sent within ``repeat_s``, or of
        one still waiting, which it merges into). ``stamp``: when it happened (RFC 3339)."""
        mono = self.clock.monotonic()
        dropped: list[dict[str, Any]] = []
        with self._lock:
            at = self._sent_at.get(key)
            if at is not None and mono - at < self.repeat_s:
                return False
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.body["count"] = int(waiting.body.get("count") or 1) + 1
                waiting.body["lastTimestamp"] = stamp
                return False
            self._waiting[key] = _Waiting(dict(body), mono)
            while len(self._waiting) > self.capacity:
                _, old = self._waiting.popitem(last=False)
                dropped.append(old.body)
            self.dropped += len(dropped)
            first_drop = bool(dropped) and self._dropped_in_outage == 0
            self._dropped_in_outage += len(dropped)
        for old in dropped:
            if first_drop:
                log.warning("Event queue full (%d waiting, the Events API is failing): "
                            "dropping the oldest, %s %r", self.capacity, old.get("reason"),
                            str(old.get("message", ""))[:120])
                first_drop = False
            else:
                log.debug("Event queue full: dropped %s", old.get("reason"))
            self._told(old, "dropped")
        return True

    # --- delivery ------------------------------------------------------------------------------

    def flush(self) -> int:
        """Try the waiting Events, oldest first, once each; the number delivered. Returns at
        once while backing off, or when another thread is flushing."""
        if not self._flushing.acquire(blocking=False):
            return 0
        try:
            delivered = 0
            while True:
                if self.clock.monotonic() < self._next_attempt:
                    return delivered
                with self._lock:
                    if not self._waiting:
                        return delivered
                    key, waiting = next(iter(self._waiting.items()))
                    body = dict(waiting.body)
                try:
                    attempt = self.send(body)
                except Exception as exc:  # noqa: BLE001 - an Event never takes the caller down
                    attempt = Attempt(Delivery.RETRY, f"{type(exc).__name__}: {exc}")
                if attempt.outcome is Delivery.LATER:
                    return delivered
                if attempt.outcome is Delivery.RETRY:
                    self._failed(body, attempt)
                    return delivered
                with self._lock:
                    # (a repeat merged in during the send is counted in neither: rare, harmless)
                    self._waiting.pop(key, None)
                    if attempt.outcome is Delivery.SENT:
                        self._sent(key)
                self._answered()
                if attempt.outcome is Delivery.SENT:
                    delivered += 1
                else:
                    self._refused(body, attempt)
        finally:
            self._flushing.release()

    def _sent(self, key: tuple[str, str]) -> None:
        self.sent += 1
        self._sent_at[key] = self.clock.monotonic()
        if len(self._sent_at) > _SENT_MEMO:
            for k, _ in sorted(self._sent_at.items(), key=lambda kv: kv[1])[:_SENT_MEMO // 2]:
                self._sent_at.pop(k, None)

    def _failed(self, body: Mapping[str, Any], attempt: Attempt) -> None:
        self.failures += 1
        delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (self.failures - 1))
        delay = max(attempt.retry_after, delay * random.uniform(0.8, 1.2))
        self._next_attempt = self.clock.monotonic() + delay
        if self.failures == 1:
            log.warning("cannot send Event %s: %s; %d Event(s) waiting, retrying with backoff "
                        "(the node's own steps go on)", body.get("reason"), attempt.detail,
                        self.pending)
        else:
            log.debug("Event %s still not sent (%d failed attempts): %s; next in %.1f s",
                      body.get("reason"), self.failures, attempt.detail, delay)

    def _answered(self) -> None:
        """The Events API answered (accepted or refused for good): the outage, if any, is over."""
        if not self.failures and not self._dropped_in_outage:
            return
        lost = self._dropped_in_outage
        log.info("the Events API answers again after %d failed attempt(s)%s; %d waiting",
                 self.failures, f", {lost} dropped meanwhile (queue full)" if lost else "",
                 self.pending)
        self.failures = 0
        self._dropped_in_outage = 0
        self._next_attempt = float("-inf")

    def _refused(self, body: Mapping[str, Any], attempt: Attempt) -> None:
        self.refused += 1
        if attempt.detail not in self._refusals_logged:
            if len(self._refusals_logged) >= 64:
                self._refusals_logged.clear()
            self._refusals_logged.add(attempt.detail)
            log.warning("the API server refused Event %s: %s; dropped (not retried)",
                        body.get("reason"), attempt.detail)
        self._told(body, "refused")

    def _told(self, body: Mapping[str, Any], why: str) -> None:
        if self.on_drop is None:
            return
        try:
            self.on_drop(body, why)
        except Exception as exc:  # noqa: BLE001 - bookkeeping only
            log.debug("on_drop failed: %s", exc)
