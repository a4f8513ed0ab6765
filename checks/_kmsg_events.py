"""Kernel-log event plumbing shared by the xid and nvswitch checks.

Not a check: identity of a record (boot id, sequence), when it happened, the standing
"open problems" a passive check keeps between events, recorded GPU resets, and reading the
whole kernel log for a one-shot scan (:class:`KernelLogScan`, which says when the log could
not be read or held nothing, so that no check claims "no XID" about a log nobody read). The
checks' base, which uses it, is checks/_kernel_log.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpu_monitor.check import Context
from gpu_monitor.hw.kmsg.files import FIFO_IDLE_S
from gpu_monitor.hw.kmsg.record import KmsgGap, KmsgRecord, text_event_key
from gpu_monitor.hw.kmsg_scan import ScanStats, iter_matching
from gpu_monitor.model import (
    ACTION_SEVERITY,
    STATUS_SEVERITY,
    Action,
    Result,
    Status,
    gpu_target,
    parse_iso,
)

log = logging.getLogger(__name__)

# Results of recorded GPU resets that count as "the GPU was reset" (not "dry-run", "failed").
RESET_OK_RESULTS = frozenset({"ok", "success", "succeeded", "done"})


#: The boot id of an event whose boot could not be read (the one value for it: the follower's
#: high-water mark and the checks' stored events agree on it).
UNKNOWN_BOOT = "unknown"


def read_boot_id(ctx: Context) -> str:
    """This boot's id from /proc, else :data:`UNKNOWN_BOOT` (identity is best effort)."""
    try:
        return ctx.host.procfs.boot_id() or UNKNOWN_BOOT
    except Exception:  # noqa: BLE001 - identity is best effort
        return UNKNOWN_BOOT


def boot_id(ctx: Context) -> str:
    """The boot id events are keyed by: the one the daemon's follower read when it opened the
    log (not re-read per record), else read now."""
    if ctx.kmsg_boot_id is not None:
        return ctx.kmsg_boot_id
    return read_boot_id(ctx)


def record_seq(record: KmsgRecord) -> int:
    """The de-duplication key within a boot: the kernel's sequence number; for a line of a
    followed text file, a key of its file, offset and text (it survives a restart that resumes
    mid-file, where line numbers start again); else the line number (one-shot reads)."""
    if record.seq is not None:
        return record.seq
    if record.position is not None:
        return text_event_key(record.position, record.raw.partition("\n")[0])
    return record.line_no


def uptime_s(ctx: Context) -> float | None:
    """Seconds since boot, or None when /proc/uptime cannot be read (best effort, like the
    boot id: an event then keeps the clock's time, a grace period is not assumed)."""
    try:
        return ctx.host.procfs.uptime_s()
    except Exception:  # noqa: BLE001
        return None


def event_time(record: KmsgRecord, ctx: Context) -> tuple[datetime, bool]:
    """(when it happened, True when the time came from the record rather than the clock)."""
    if record.wallclock is not None:
        return record.wallclock, True
    now = ctx.clock.now()
    if (record.monotonic_s is not None and record.source_format == "kmsg"
            and ctx.host.paths.kmsg_is_device):
        up = uptime_s(ctx)
        if up is not None and 0 <= record.monotonic_s <= up:
            return now - timedelta(seconds=up - record.monotonic_s), True
    return now, False


def worse_than(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    ka = (STATUS_SEVERITY[Status(a["status"])], ACTION_SEVERITY[Action(a["action"])])
    kb = (STATUS_SEVERITY[Status(b["status"])], ACTION_SEVERITY[Action(b["action"])])
    return ka > kb


class OpenProblems:
    """Unresolved problems per target and reason: the store's kv ``(<check>, "open")``, else
    memory. ``current`` keeps those its predicate still calls open and returns the worst one per
    target, so a later, milder problem is not hidden by an older one that has been resolved."""

    def __init__(self, check: str):
        self.check = check
        self.memory: dict[str, dict[str, dict[str, Any]]] = {}

    def load(self, ctx: Context) -> dict[str, dict[str, dict[str, Any]]]:
        if ctx.store is None:
            return {t: dict(v) for t, v in self.memory.items()}
        try:
            data = ctx.store.get_kv(self.check, "open", {}) or {}
            return {t: dict(v) for t, v in data.items()}
        except Exception as exc:  # noqa: BLE001 - history is best effort
            log.warning("%s: cannot read open problems: %s", self.check, exc)
            return {t: dict(v) for t, v in self.memory.items()}

    def save(self, ctx: Context, data: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
        self.memory = {t: {r: dict(p) for r, p in v.items()} for t, v in data.items() if v}
        if ctx.store is not None:
            try:
                ctx.store.set_kv(self.check, "open", self.memory)
            except Exception as exc:  # noqa: BLE001
                log.warning("%s: cannot store open problems: %s", self.check, exc)

    def note(self, ctx: Context, target: str, problem: Mapping[str, Any]) -> None:
        data = self.load(ctx)
        data.setdefault(target, {})[problem["reason"]] = dict(problem)
        self.save(ctx, data)

    def current(self, ctx: Context, is_open: Callable[[Mapping[str, Any]], bool]
                ) -> dict[str, dict[str, Any]]:
        data = self.load(ctx)
        kept = {t: {r: p for r, p in v.items() if is_open(p)} for t, v in data.items()}
        kept = {t: v for t, v in kept.items() if v}
        if kept != data:
            self.save(ctx, kept)
        worst: dict[str, dict[str, Any]] = {}
        for target, by_reason in kept.items():
            for prob in by_reason.values():
                best = worst.get(target)
                if best is None or worse_than(prob, best) or (
                        not worse_than(best, prob)
                        and parse_iso(prob["at"]) > parse_iso(best["at"])):
                    worst[target] = prob
        return worst


def reset_times(ctx: Context, index: int | None, uuid: str | None) -> list[datetime]:
    """When a GPU reset of this GPU was recorded (remediation's ``record_action``)."""
    if ctx.store is None:
        return []
    try:
        records = ctx.store.actions(action="reset_gpu")
    except Exception:  # noqa: BLE001
        return []
    out = []
    for a in records:
        if a.result not in RESET_OK_RESULTS:
            continue
        d = a.details
        if (uuid and uuid in (d.get("gpu_uuid"), d.get("uuid"))) or (
                index is not None and (index in (d.get("gpu_index"), d.get("gpu"))
                                       or d.get("target") == gpu_target(index))):
            out.append(a.at)
    return out


def kernel_log(ctx: Context, needles: tuple[bytes, ...], stats: ScanStats
               ) -> Iterator[KmsgRecord | KmsgGap]:
    """The kernel log from its start: the device's ring, or the records of a saved file that
    mention one of ``needles`` (found at memchr speed, gpu_monitor/hw/kmsg_scan.py)."""
    paths = ctx.host.paths
    if not paths.kmsg_is_device:
        yield from iter_matching(paths.kmsg_path, needles, stats)
        return
    source = ctx.host.open_kmsg(replay=True)
    stats.source = "device"
    try:
        while True:
            batch = source.read_available(4096)
            if not batch:
                return
            stats.text = True
            stats.lines += sum(isinstance(item, KmsgRecord) for item in batch)
            yield from batch
    finally:
        source.close()


READ_ERROR = "KmsgReadError"


@dataclass(frozen=True)
class UnreadLog:
    """Why a one-shot scan has nothing to say about the targets it found no event for: the log
    could not be opened or read to its end (``error`` is the OS's error, naming the path where
    it did), or it was read and held no line (``empty``). Both are reason ``KmsgReadError``."""

    path: str
    error: str
    empty: bool = False

    @property
    def reason(self) -> str:
        return READ_ERROR

    def result(self, check: Any, ctx: Context, target: str,
               details: Mapping[str, Any] | None = None) -> Result:
        """``unknown`` for ``target``: it is neither healthy nor not, its log was not read."""
        said = (f"the kernel log {self.path} gave no line ({self.error})" if self.empty
                else f"cannot read the kernel log {self.path}: {self.error}")
        return check.result(ctx, Status.UNKNOWN, target, self.reason,
                            f"{said}; no claim about {target}",
                            {**(details or {}), "path": self.path, "error": self.error})


def follower_unread(ctx: Context) -> UnreadLog | None:
    """In the daemon: the follower's reason for not reading the log now, as an ``UnreadLog``
    (None while it reads, and in one-shot runs, whose scan says so itself)."""
    if ctx.kmsg_error is None:
        return None
    return UnreadLog(ctx.host.paths.kmsg_path, ctx.kmsg_error)


class KernelLogScan:
    """The kernel log for a one-shot scan, read through :func:`kernel_log`.

    Guarantees:

    1. Iterating never raises on account of the log: an ``OSError`` (missing, a directory,
       no permission, a dangling symlink, an I/O error part-way) or any other exception out of
       a reader ends the iteration, and ``unread`` says why. Records read before it stand.
    2. A log that was opened and read to its end but held no line (an empty file; a FIFO
       nobody wrote to within ``FIFO_IDLE_S``) sets ``unread`` too: zero lines prove nothing.
    3. Exceptions raised by the caller's loop body are not caught here.
    """

    def __init__(self, ctx: Context, needles: tuple[bytes, ...]):
        self._ctx = ctx
        self._needles = needles
        self.path = ctx.host.paths.kmsg_path
        self.stats = ScanStats()
        self.unread: UnreadLog | None = None

    def __iter__(self) -> Iterator[KmsgRecord | KmsgGap]:
        try:
            yield from kernel_log(self._ctx, self._needles, self.stats)
        except OSError as exc:
            self.unread = UnreadLog(self.path, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - guarantee 1: a reader bug is not a crash
            log.warning("reading the kernel log %s failed: %r", self.path, exc)
            self.unread = UnreadLog(self.path, f"the reader failed: {type(exc).__name__}: {exc}")
            return
        if not self.stats.text:
            self.unread = UnreadLog(self.path, self._nothing(), empty=True)

    def _nothing(self) -> str:
        if self.stats.source == "fifo":
            return (f"nothing was written to the FIFO within {FIFO_IDLE_S:g} s"
                    if self.stats.fifo_idle else "the FIFO's writer closed it without a line")
        if self.stats.source == "device":
            return "the record device returned no record"
        return "the file is empty" if not self.stats.bytes else "the file holds only blank lines"
