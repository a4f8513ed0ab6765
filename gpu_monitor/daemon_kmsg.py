"""The daemon's kernel-log follower: bounded batches, a literal pre-search, inline dispatch, and
one store transaction per batch.

Why it exists apart from daemon.py: a log storm (a flapping NIC, an Xid 13 storm, a driver
spewing warnings) is tens of thousands of lines a second, and the follower is the one path
whose cost is per line. Starting a thread per record and check and committing SQLite per record
held it to ~2,700 lines/s (issue 18); this module is what keeps that cost per *candidate* and
per *batch* instead, and it is small enough to read whole.

Guarantees, in order:

1. **Nothing counted twice, nothing lost that the log still holds.** A batch's writes -- what
   the checks store (events, open problems, results), the boot's high-water mark and a text
   log's position -- commit in one transaction (``Store.batch``); the remediator is handed the
   results only after the commit. A crash before it leaves mark and position where the batch
   before put them, so the restart reads the batch again and stores each event once (events
   are keyed; a held or skipped record is before the saved position: ``KmsgFileSource``).
2. **Bounded memory.** One batch is at most :data:`BATCH_RECORDS` records, and a text source
   reads at most ``READ_BUDGET_BYTES`` (4 MiB) per batch: the follower holds at most
   ``BATCH_RECORDS`` records (each at most ``MAX_LINE_BYTES``; real kernel lines are under
   8 KiB) plus one read buffer, whatever the backlog. What is not read yet stays where it is:
   in the file, or in the kernel's ring buffer, whose overrun is reported as ``KmsgOverrun``.
3. **Only candidates reach the checks.** A record none of a check's ``kmsg_literals`` occurs
   in is not handed to it (a check that declares none gets every record); a text source skips
   lines no check wants without decoding them, the batch scan's cut.
4. **Crash isolation without a thread per record.** Each call runs inline under
   ``runner.run_on_kmsg``: an exception is that check's ``CheckCrashed`` result, and the other
   check, the next record and the daemon go on. A call that *hangs* stops the follower: the
   heartbeat (``stats.last_kmsg_loop_monotonic``, set per batch) goes stale and the daemon's
   health reports the follower stalled, so the liveness probe restarts the pod. A check that
   declares requirements keeps the runner's gated, timed path.
5. **Progress, not a stall.** :meth:`KmsgFollower.pump` does one batch; the follower thread
   loops over batches (replay at start included) beside the scheduler, saving the position
   with each batch, and ``replay_done`` is set when it first catches up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Sequence

from checks._kmsg_events import UNKNOWN_BOOT, read_boot_id
from gpu_monitor.check import Check, Context
from gpu_monitor.hw.inotify import FileWatch
from gpu_monitor.hw.kmsg.record import KmsgGap
from gpu_monitor.model import NODE, Result, RunOutcome, Status
from gpu_monitor.runner import run_check, run_on_kmsg

log = logging.getLogger("gpu_monitor.daemon")

#: Records read per batch (guarantee 2); also the most candidates one transaction holds the
#: store for (a scrape waits for at most one batch). A commit costs about as much as a few
#: dozen Xid events, so 32 spent a third of a storm's time committing; 256 holds at most
#: 16 MiB of records (2 MiB of real kernel lines) and the store for tens of milliseconds.
BATCH_RECORDS = 256
#: The pause between two batches of a backlog while another thread waits (see ``pump_all``).
YIELD_S = 0.001
#: The store key of a followed text log's saved position (device, inode, offset), per path.
KV_FILE_POS = "kmsg_file_position"


def merge_outcomes(outcomes: Sequence[RunOutcome]
                   ) -> list[tuple[RunOutcome, list[RunOutcome]]]:
    """One outcome per check and run of consecutive outcomes with the same ``success`` and
    ``error``, with their results in order, and the parts it was made of. What a store of the
    merged outcome records is what storing the parts one by one does: every result, each
    reason's count, and as the check's latest run the last part's time, duration and
    success."""
    groups: dict[str, list[list[RunOutcome]]] = {}
    for outcome in outcomes:
        runs = groups.setdefault(outcome.check, [])
        if runs and (runs[-1][-1].success, runs[-1][-1].error) == (outcome.success,
                                                                    outcome.error):
            runs[-1].append(outcome)
        else:
            runs.append([outcome])
    merged = []
    for runs in groups.values():
        for parts in runs:
            last = parts[-1]
            whole = last if len(parts) == 1 else RunOutcome(
                last.check, tuple(r for p in parts for r in p.results), last.started_at,
                last.duration_s, last.success, last.error)
            merged.append((whole, parts))
    return merged


class KmsgFollower:
    """Follows one kernel-log source for the daemon's kernel-log checks."""

    def __init__(self, checks: Sequence[Check], ctx: Context, stats,
                 record: Callable[[RunOutcome], bool], consume: Callable[[RunOutcome], None]):
        self.checks = list(checks)
        self.ctx = ctx
        self.stats = stats
        self._record = record  # store one outcome (inside the batch's transaction)
        self._consume = consume  # hand a stored outcome on (after the commit)
        self.source = None
        self.boot_id = UNKNOWN_BOOT
        self.replay_done = threading.Event()
        self._saved_pos = None
        # Per check: its literals (None: every record). The union goes to a text source.
        self._wants = [tuple(c.kmsg_literals) or None for c in self.checks]
        self._literals = (None if any(w is None for w in self._wants)
                          else sorted({w for ws in self._wants for w in ws}))

    @property
    def _boot_known(self) -> bool:
        """Whether the high-water mark can be used: under an unread boot id, sequence numbers
        of different boots would be confused."""
        return self.boot_id != UNKNOWN_BOOT

    # --- opening ---------------------------------------------------------------------------

    def open(self) -> None:
        """Open the source and resume a text log where the store says it stopped; on failure
        the checks report the log ``unknown`` and the replay counts as done."""
        # Read once per follower (not per record); the checks key their events by the same.
        self.boot_id = read_boot_id(self.ctx)
        self.ctx.kmsg_boot_id = self.boot_id
        if not self.checks:
            self.replay_done.set()
            return
        try:
            self.source = self.ctx.host.open_kmsg(replay=True)
        except OSError as exc:
            log.error("cannot open the kernel log %s: %s; XID detection is unknown",
                      self.ctx.host.paths.kmsg_path, exc)
            self.ctx.kmsg_error = str(exc)
            self.report_problem("KmsgUnavailable", f"cannot read the kernel log: {exc}")
            self.replay_done.set()
            return
        if self._literals is not None and hasattr(self.source, "select"):
            self.source.select(self._literals)
        self._resume_file_position()

    def _resume_file_position(self) -> None:
        src, store = self.source, self.ctx.store
        if store is None or not hasattr(src, "resume"):
            return
        try:
            saved = store.get_kv(KV_FILE_POS, src.path)
            if saved and src.resume(tuple(saved)):
                log.info("resuming the kernel log %s at byte %d", src.path, saved[2])
        except Exception as exc:  # noqa: BLE001 - worst case: replay from the start
            log.warning("cannot resume the kernel log position: %s", exc)

    def report_problem(self, reason: str, message: str) -> None:
        now = self.ctx.clock.now()
        for check in self.checks:
            res = Result(check=check.name, status=Status.UNKNOWN, target=NODE, reason=reason,
                         message=message, observed_at=now)
            outcome = RunOutcome(check.name, (res,), now, 0.0, False, reason)
            if self._record(outcome):
                self._consume(outcome)

    # --- one batch ---------------------------------------------------------------------------

    def _read_count(self) -> int:
        return int(getattr(self.source, "lines_skipped", 0) or 0)

    def pump(self) -> tuple[int, int]:
        """Read and handle one batch: (records handed to a check, lines/records read)."""
        src = self.source
        if src is None:
            return 0, 0
        skipped0 = self._read_count()
        try:
            items = src.read_available(max_records=BATCH_RECORDS)
        except OSError as exc:
            log.error("kernel log read failed: %s", exc)
            self.ctx.kmsg_error = f"read failed: {exc}"
            self.report_problem("KmsgUnavailable", f"kernel log read failed: {exc}")
            return 0, 0
        self.ctx.kmsg_error = None
        read = len(items) + self._read_count() - skipped0
        if not read:
            return 0, 0
        store = self.ctx.store
        outcomes: list[RunOutcome] = []
        if store is None:
            n = self._handle(items, None, outcomes)
        else:
            try:
                with self._checks_locked(), store.batch():
                    n = self._handle(items, store, outcomes)
            except Exception as exc:  # noqa: BLE001 - nothing of the batch was committed
                log.error("cannot store a kernel-log batch: %s", exc)
                outcomes, n = [], 0
        for outcome in outcomes:
            self._consume(outcome)
        with self.stats.lock:
            self.stats.kmsg_records += n
            self.stats.kmsg_read += read
        return n, read

    def _checks_locked(self) -> contextlib.ExitStack:
        """Every kernel-log check's own lock (``_lock``: the xid and nvswitch checks guard the
        state ``on_kmsg`` and ``poll`` share with one), taken in check order *before* the
        batch's transaction. Their ``poll`` takes its lock and then the store's; a batch that
        held the store and then waited for a check's lock would deadlock with it."""
        stack = contextlib.ExitStack()
        for check in self.checks:
            lock = getattr(check, "_lock", None)
            if lock is not None:
                stack.enter_context(lock)
        return stack

    def _handle(self, items, store, outcomes: list[RunOutcome]) -> int:
        """Dispatch a batch and mark it (inside the transaction when there is a store)."""
        high = None
        if store is not None and self._boot_known:
            try:
                high = store.kmsg_high_water(self.boot_id)
            except Exception:  # noqa: BLE001
                high = None
        seqs: list[int] = []
        pending: list[RunOutcome] = []
        n = 0
        for item in items:
            if isinstance(item, KmsgGap):
                self._gap(item, pending)
                continue
            if item.malformed:
                with self.stats.lock:
                    self.stats.kmsg_parse_errors += 1
            seq = item.seq
            if seq is not None and high is not None and seq <= high:
                with self.stats.lock:
                    self.stats.kmsg_skipped_replay += 1
                continue
            n += self._dispatch(item, pending)
            if seq is not None:
                seqs.append(seq)
        self._record_batch(pending, outcomes)
        if store is not None and self._boot_known and seqs:
            store.mark_kmsg_many(self.boot_id, seqs)
        self._save_file_position(store)
        return n

    def _gap(self, gap: KmsgGap, pending: list[RunOutcome]) -> None:
        with self.stats.lock:
            self.stats.kmsg_gaps += 1
        log.warning("kernel ring buffer overrun: %s records lost (%s)",
                    gap.missed if gap.missed is not None else "some", gap.reason)
        message = (f"kernel ring buffer overrun: {gap.missed or 'some'} records lost before "
                   "they were read; events in them may be missed")
        now = self.ctx.clock.now()
        for check in self.checks:
            res = Result(check=check.name, status=Status.UNKNOWN, target=NODE,
                         reason="KmsgOverrun", message=message, observed_at=now)
            pending.append(RunOutcome(check.name, (res,), now, 0.0, False, "KmsgOverrun"))

    def _dispatch(self, record, pending: list[RunOutcome]) -> int:
        """Hand ``record`` to each check that wants it; 1 when any did."""
        raw = record.raw
        handed = 0
        for check, wants in zip(self.checks, self._wants, strict=True):
            if wants is not None and not any(w in raw for w in wants):
                continue
            handed = 1
            if check.requires:
                outcome = run_check(check, self.ctx, method="on_kmsg", record=record)
                outcome = outcome if outcome.results else None
            else:
                outcome = run_on_kmsg(check, self.ctx, record)
            if outcome is not None:
                pending.append(outcome)
        return handed

    def _record_batch(self, pending: list[RunOutcome], outcomes: list[RunOutcome]) -> None:
        """Store the batch's outcomes with one ``record_run`` per check and run of like
        outcomes (:func:`merge_outcomes`), not one per record; a merged outcome that cannot be
        stored is tried part by part, so one bad result does not lose the others."""
        for merged, parts in merge_outcomes(pending):
            if self._record(merged):
                outcomes.append(merged)
                continue
            for part in parts if len(parts) > 1 else ():
                if self._record(part):
                    outcomes.append(part)

    def _save_file_position(self, store) -> None:
        src = self.source
        if store is None or not hasattr(src, "position"):
            return
        pos = src.position()
        if pos is None or pos == self._saved_pos:
            return
        store.set_kv(KV_FILE_POS, src.path, list(pos))
        self._saved_pos = pos

    def pump_all(self, stop: threading.Event | None = None) -> int:
        """Batches until the source has nothing more now (or ``stop``): records handed on."""
        total = 0
        while stop is None or not stop.is_set():
            self.stats.last_kmsg_loop_monotonic = time.monotonic()
            n, read = self.pump()
            total += n
            if not read:
                break
            if read >= BATCH_RECORDS and self._waited():
                # A backlog. Fair share: a thread waiting for the store or a check (a scrape,
                # a poll) gets it between two batches; a lock released and at once retaken by
                # this thread would starve it. Only then: a pause per batch with nobody
                # waiting only slows the catch-up (and after a small read it would be an
                # event's latency).
                time.sleep(YIELD_S)
        return total

    def _waited(self) -> bool:
        """Whether another thread waits for the store or a kernel-log check's lock now."""
        locks = [self.ctx.store, *(getattr(c, "_lock", None) for c in self.checks)]
        return any(getattr(lock, "waited", False) for lock in locks)

    # --- the follower thread -------------------------------------------------------------

    def loop(self, stop: threading.Event, poll_s: float) -> None:
        """Follow until ``stop``: replay first (batch by batch), then wait for more."""
        src = self.source
        try:
            selectable = not stat.S_ISREG(os.fstat(src.fileno()).st_mode)
        except (OSError, AttributeError, ValueError):
            selectable = False
        # A regular file never blocks select(): wake on inotify, poll only as a fallback.
        watch = None if selectable else FileWatch.open(
            getattr(src, "path", self.ctx.host.paths.kmsg_path))
        try:
            while not stop.is_set():
                try:
                    self.pump_all(stop)
                except Exception as exc:  # noqa: BLE001 - the follower must survive anything
                    log.error("kernel-log follower error: %s", exc, exc_info=True)
                self.replay_done.set()
                self.stats.last_kmsg_loop_monotonic = time.monotonic()
                self._wait(stop, poll_s, selectable, watch)
        finally:
            if watch is not None:
                watch.close()

    def _wait(self, stop: threading.Event, poll_s: float, selectable: bool, watch) -> None:
        if selectable:
            try:
                select.select([self.source.fileno()], [], [], 0.5)
                return
            except (OSError, ValueError):
                pass
        elif watch is not None:
            watch.wait(0.5)
            return
        stop.wait(poll_s)
