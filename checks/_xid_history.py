"""What the xid check's repeat rules need of a GPU's history of one code, kept in memory and
updated per event instead of read back from the store for every event.

Why it exists: an Xid 13 storm is thousands of events a second, and reading the GPU's window
back for each of them (an ``XidEvent`` rebuilt per stored row) made the follower quadratic in
the window (issue 18: half of its time). The two rules need little of that history:

- the application rule (checks/xid.py) counts *bursts* in the window: repeats closer than
  ``app_xid_dedup_s`` to the one before are one burst (``rules.xid.burst_count``). Kept per
  key: the last time of each burst in the window (:class:`_Bursts`), pruned from the left;
- the hardware ladder counts the earlier *fatal* occurrences and the recoveries between
  consecutive ones (``rules.xid.count_recoveries``). Kept per key: how many, the last one,
  the recoveries so far and the GPU resets they were counted against (:class:`_Ladder`).

A key is (code, the GPU): ``("uuid", uuid)`` when NVML mapped the address, else ``("pci",
address)``, matching the events the store query of checks/xid.py selects for it.

Guarantees (the check calls every method under its own lock; this class takes none):

1. **The same answer as a recount from the store.** An answer is given only when the store holds
   exactly what this copy was built from: the store's :class:`XidHistoryMark` moved only by
   the events added through :meth:`XidRecall.added`. A prune, a rolled-back transaction,
   another connection's write or another store object drop every key.
2. **Seeded once per key**, from the store, at the key's first use (after a restart: the first
   event after it), then O(1) amortized per event.
3. **None where the quick answer could differ**, and the caller recounts from the store: the
   event's record is already stored (a replay of it), or its time is older than the newest
   event the key holds (or than the time the key was seeded at). A key an out-of-order event
   was added to is dropped and seeded again at its next use; a changed window or dedup
   setting, or a changed set of recorded resets, seeds the key again.
4. **Bounded.** Per key: one entry per burst in the window (at most window / dedup + 1; with
   ``app_xid_dedup_s`` 0, one per distinct event time in the window); the ladder is O(1).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from gpu_monitor.state.kernel_log import XidEvent, XidHistoryMark

log = logging.getLogger(__name__)

#: What an Xid 45 "caused by previous Xid N" says: it follows another Xid and never counts.
SYMPATHETIC_TEXT = "caused by previous Xid"

GpuKey = tuple[str, str | None]


def counts_as_repeat(message: str) -> bool:
    """Whether a stored application Xid counts toward the repeat rule (not sympathetic)."""
    return SYMPATHETIC_TEXT not in message


def gpu_key(uuid: str | None, pci: str | None) -> GpuKey:
    """Which of a code's events are this GPU's: those of its UUID, else of its address."""
    return ("uuid", uuid) if uuid else ("pci", pci)


def event_keys(event: XidEvent) -> list[GpuKey]:
    """Every key whose history holds ``event``."""
    keys = [("pci", event.pci_bus_id)]
    if event.gpu_uuid:
        keys.append(("uuid", event.gpu_uuid))
    return keys


class _Bursts:
    """The bursts of one key's counted events: ``runs`` holds ``[last time, weight]`` per burst,
    oldest first (weight: events it counts as, 1 but where dedup 0 makes every event at one time
    count); ``total`` is the sum of the weights. Complete for windows ending at or after
    ``upto``."""

    __slots__ = ("window_s", "dedup_s", "runs", "total", "upto")

    def __init__(self, window_s: float, dedup_s: float, upto: datetime):
        self.window_s = window_s
        self.dedup_s = dedup_s
        self.runs: deque[list[Any]] = deque()
        self.total = 0
        self.upto = upto

    def add(self, t: datetime) -> None:
        """One more event at ``t`` (no earlier than ``upto``)."""
        self.upto = max(self.upto, t)
        if self.runs:
            last = self.runs[-1]
            if (t - last[0]).total_seconds() < self.dedup_s:
                last[0] = t  # the same burst goes on
                return
            if t == last[0]:
                last[1] += 1
                self.total += 1
                return
        self.runs.append([t, 1])
        self.total += 1

    def count_with(self, at: datetime) -> int:
        """``burst_count`` of the events in the window ending at ``at``, plus one at ``at``."""
        start = at - timedelta(seconds=self.window_s)
        runs = self.runs
        while runs and runs[0][0] < start:
            self.total -= runs.popleft()[1]
        if not runs:
            return 1
        return self.total + (0 if (at - runs[-1][0]).total_seconds() < self.dedup_s else 1)


class _Ladder:
    """One key's fatal occurrences: how many, the last (time, boot id) in sorted order, and the
    recoveries between consecutive ones counted against ``resets``."""

    __slots__ = ("resets", "fatal", "last", "recoveries")

    def __init__(self, resets: Sequence[datetime]):
        self.resets = sorted(resets)
        self.fatal = 0
        self.last: tuple[datetime, str] | None = None
        self.recoveries = 0

    def _step(self, to: tuple[datetime, str]) -> int:
        """1 when a recovery lies between the last occurrence and ``to``: a reboot (another
        boot id) or a GPU reset recorded after the one and at or before the other."""
        t0, b0 = self.last  # type: ignore[misc]
        t1, b1 = to
        return int(b0 != b1 or any(t0 < r <= t1 for r in self.resets))

    def add(self, occurrence: tuple[datetime, str]) -> bool:
        """One more fatal occurrence; False when it does not sort last (nothing changed)."""
        if self.last is not None:
            if occurrence < self.last:
                return False
            self.recoveries += self._step(occurrence)
        self.fatal += 1
        self.last = occurrence
        return True

    def answer(self, occurrence: tuple[datetime, str]) -> tuple[int, int] | None:
        """(earlier fatal occurrences, recoveries with ``occurrence`` added), or None when it
        does not sort last."""
        if self.last is None:
            return 0, 0
        if occurrence < self.last:
            return None
        return self.fatal, self.recoveries + self._step(occurrence)


class XidRecall:
    """The xid check's repeat-rule history in memory, per code and GPU (module docstring)."""

    def __init__(self) -> None:
        self._store: Any = None
        self._mark: XidHistoryMark | None = None
        self._bursts: dict[tuple[int, GpuKey], _Bursts] = {}
        self._ladders: dict[tuple[int, GpuKey], _Ladder] = {}

    def forget(self) -> None:
        self._bursts.clear()
        self._ladders.clear()

    def usable(self, store: Any, boot: str, seq: int, code: int) -> bool:
        """Whether quick answers may be given for this event: the store's events are what this
        copy holds (else it is emptied, to be seeded again) and the event's record is not
        stored already (a replayed record is judged by a recount, which leaves it out)."""
        try:
            mark = store.xid_history_mark("xid")
            held = store.xid_event_held(boot, seq, code)
        except Exception as exc:  # noqa: BLE001 - the caller's recount reports the store
            log.debug("xid: history state unavailable: %s", exc)
            self._store = None
            self.forget()
            return False
        if store is not self._store or mark != self._mark:
            self._store, self._mark = store, mark
            self.forget()
        return not held

    def bursts(self, store: Any, code: int, uuid: str | None, pci: str | None, at: datetime,
               window_s: float, dedup_s: float) -> int | None:
        """``burst_count`` of the key's counted events in the window ending at ``at`` with one
        at ``at`` added; None when a recount must say (guarantee 3)."""
        key = (code, gpu_key(uuid, pci))
        state = self._bursts.get(key)
        if state is None or (state.window_s, state.dedup_s) != (window_s, dedup_s):
            events = self._read(store, code, key[1], at - timedelta(seconds=window_s))
            if events is None:
                self._bursts.pop(key, None)
                return None
            state = _Bursts(window_s, dedup_s, at)
            for e in events:
                if counts_as_repeat(e.message):
                    state.add(e.observed_at)
            self._bursts[key] = state
        if at < state.upto:
            return None
        return state.count_with(at)

    def ladder(self, store: Any, code: int, uuid: str | None, pci: str | None, at: datetime,
               boot: str, resets: Sequence[datetime]) -> tuple[int, int] | None:
        """(earlier fatal occurrences, recoveries counting this one at (``at``, ``boot``)) of
        the key; None when a recount must say (guarantee 3)."""
        key = (code, gpu_key(uuid, pci))
        state = self._ladders.get(key)
        if state is None or state.resets != sorted(resets):
            events = self._read(store, code, key[1], None)
            if events is None:
                self._ladders.pop(key, None)
                return None
            state = _Ladder(resets)
            for occurrence in sorted((e.observed_at, e.boot_id) for e in events if e.fatal):
                state.add(occurrence)
            self._ladders[key] = state
        return state.answer((at, boot))

    def added(self, store: Any, event: XidEvent) -> None:
        """``event`` was stored (it was not held): add it to the keys that hold its history."""
        if store is not self._store or self._mark is None:
            return
        try:
            mark = store.xid_history_mark("xid")
        except Exception:  # noqa: BLE001
            mark = None
        if mark != self._mark.plus(1):
            self._mark = mark  # something else changed the events too: seed again
            self.forget()
            return
        self._mark = mark
        for gpu in event_keys(event):
            key = (event.code, gpu)
            bursts = self._bursts.get(key)
            if bursts is not None and counts_as_repeat(event.message):
                if event.observed_at < bursts.upto:
                    del self._bursts[key]  # out of order: seed again at its next use
                else:
                    bursts.add(event.observed_at)
            ladder = self._ladders.get(key)
            if ladder is not None and event.fatal and not ladder.add(
                    (event.observed_at, event.boot_id)):
                del self._ladders[key]

    @staticmethod
    def _read(store: Any, code: int, gpu: GpuKey, since: datetime | None
              ) -> list[XidEvent] | None:
        """The key's stored events (at or after ``since``), oldest first; None on failure."""
        by, value = gpu
        try:
            events = store.xid_events(since=since, uuid=value if by == "uuid" else None,
                                      code=code, kind="xid")
        except Exception as exc:  # noqa: BLE001 - the caller's recount reports the store
            log.debug("xid: cannot seed the history state: %s", exc)
            return None
        if by == "uuid":
            return [e for e in events if e.gpu_uuid == value]
        return [e for e in events if e.pci_bus_id == value]
