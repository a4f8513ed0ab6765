"""The base of the checks the kernel log feeds (xid, nvswitch): what the two share.

Not a check: :class:`KernelLogCheck`. The event plumbing it and they use (record identity,
open problems, the one-shot read of the whole log) is checks/_kmsg_events.py.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from checks._builtin import BuiltinCheck
from checks._kmsg_events import KernelLogScan, OpenProblems, UnreadLog
from gpu_monitor.check import ClearTracker, Context
from gpu_monitor.hw.kmsg.record import KmsgRecord
from gpu_monitor.locks import WaitedLock
from gpu_monitor.model import NODE, Kind, Result


class KernelLogCheck(BuiltinCheck):
    """A check fed by the kernel log (xid, nvswitch): what the two share.

    - ``on_kmsg`` hands a record (never a ``KmsgGap``, which carries no text) to
      ``_on_record`` under the check's lock, which the follower lets go between batches so
      that a poll is not kept waiting behind a replay; ``poll`` reports ``_state``, the
      standing state, through the check's ``ClearTracker`` under the same lock.
    - ``run`` scans the whole log (``_scan``, over :meth:`log_scan`) under the lock; a log
      *file* given with ``--kmsg`` may come from another host or boot: it is analysed without
      the state store and with a throw-away set of open problems, so neither this node's event
      history nor its standing results change. The live ``/dev/kmsg`` scan keeps both.
    - ``parse_errors`` and ``parse_error_kinds`` count the lines that could not be used
      (``_count``); the daemon's metrics read them from the instance.

    Both are passive and run in a bootstrap (``kinds``); a one-shot scan of a whole saved log
    may take ``timeout``.
    """

    kinds = frozenset({Kind.BOOTSTRAP, Kind.PASSIVE})
    timeout = 600.0

    def __init__(self) -> None:
        self.parse_errors = 0
        self.parse_error_kinds: Counter[str] = Counter()
        self._lock = WaitedLock()  # the follower lets go between batches when polled
        self._open = OpenProblems(self.name)
        self._clear = ClearTracker(self.name)

    def _count(self, kind: str) -> None:
        self.parse_errors += 1
        self.parse_error_kinds[kind] += 1

    def on_kmsg(self, record: Any, ctx: Context) -> Sequence[Result]:
        if not isinstance(record, KmsgRecord):
            return ()  # a KmsgGap (ring-buffer overrun) carries no text
        with self._lock:
            return self._on_record(record, ctx)

    def _on_record(self, record: KmsgRecord, ctx: Context) -> list[Result]:
        raise NotImplementedError

    def poll(self, ctx: Context) -> Sequence[Result]:
        with self._lock:
            return self._clear.track(ctx, self._state(ctx))

    def _state(self, ctx: Context) -> list[Result]:
        raise NotImplementedError

    def run(self, ctx: Context) -> Sequence[Result]:
        with self._lock:
            saved_open = self._open
            if not ctx.host.paths.kmsg_is_device:
                ctx = dataclasses.replace(ctx, store=None)
                self._open = OpenProblems(self.name)
            try:
                return self._scan(ctx)
            finally:
                self._open = saved_open

    def _scan(self, ctx: Context) -> list[Result]:
        raise NotImplementedError

    def log_scan(self, ctx: Context) -> KernelLogScan:
        """The whole kernel log, as far as it holds one of the check's ``kmsg_literals``."""
        return KernelLogScan(ctx, tuple(w.encode() for w in self.kmsg_literals))

    def quiet(self, ctx: Context, target: str, unread: UnreadLog | None, message: str,
              details: Mapping[str, Any]) -> Result:
        """A target with no event and no open problem: ``ok`` with ``message``, or ``unknown``
        when the log was not read (``unread``)."""
        return (unread.result(self, ctx, target, details) if unread is not None
                else self.ok(ctx, target, message, details))

    def unread_at_node(self, ctx: Context, unread: UnreadLog | None, results: list[Result],
                       details: Mapping[str, Any] | None = None) -> None:
        """Add the node's ``unknown`` to ``results`` when the log was not read and no target
        already carries it."""
        if unread is not None and not any(r.reason == unread.reason for r in results):
            results.append(unread.result(self, ctx, NODE, details))
