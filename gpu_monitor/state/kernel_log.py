"""Kernel-log bookkeeping: which records were handled, and the XID/SXid events found in them.

Why it exists: the daemon replays the kernel ring buffer at every start, and neither a record
nor an event may count twice. ``mark_kmsg`` keeps each boot's high-water mark (a replay skips
records at or below it); ``add_xid_event`` ignores an event it already holds, so a daemon that
died between the two adds nothing twice. The per-GPU, per-code counters only go up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_monitor.model import canonical_pci
from gpu_monitor.state.connection import Database
from gpu_monitor.state.encoding import from_us, to_us

__all__ = ["KernelLogTables", "XidEvent", "XidHistoryMark"]


@dataclass(frozen=True)
class XidEvent:
    """One XID (GPU) or SXid (NVSwitch) kernel-log event.

    ``(boot_id, seq, code, pci_bus_id)`` identifies it: replaying the kernel ring buffer after a
    restart adds nothing twice. ``pci_bus_id`` is canonicalised (``0000:3b:00.0``); ``None``
    when the line carried no address.
    """

    boot_id: str
    seq: int
    observed_at: datetime
    code: int
    pci_bus_id: str | None = None
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    kind: str = "xid"
    message: str = ""
    fatal: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("xid", "sxid"):
            raise ValueError(f"kind must be 'xid' or 'sxid', got {self.kind!r}")
        if self.observed_at.tzinfo is None:
            raise ValueError("observed_at must be timezone-aware (UTC)")
        if self.pci_bus_id is not None:
            object.__setattr__(self, "pci_bus_id", canonical_pci(self.pci_bus_id))



@dataclass(frozen=True)
class XidHistoryMark:
    """Where the stored events of one kind stand, for a reader that keeps what it read in
    memory and adds its own events to it (the xid check's per-GPU history).

    ``others`` changes whenever something other than this connection's ``add_xid_event``
    may have changed the events: a prune that deleted some, a write transaction rolled back
    (it may have held an add), a commit by another connection (SQLite's ``data_version``).
    ``added`` counts the events of the kind this connection added. A reader whose copy was
    right at one mark is right at a later one when ``others`` is the same and ``added`` grew
    only by the events it added itself."""

    others: tuple[int, int, int]
    added: int

    def plus(self, added: int) -> XidHistoryMark:
        return XidHistoryMark(self.others, self.added + added)


class KernelLogTables(Database):
    """``kmsg_boots``/``kmsg_seen`` (records handled) and ``xid_events``/``xid_counters``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._xid_added: Counter[str] = Counter()  # events added, per kind (XidHistoryMark)
        self._xid_prunes = 0

    def mark_kmsg(self, boot_id: str, seq: int) -> None:
        """Remember that record ``seq`` of boot ``boot_id`` was handled."""
        self.mark_kmsg_many(boot_id, (seq,))

    def mark_kmsg_many(self, boot_id: str, seqs: Sequence[int]) -> None:
        """``mark_kmsg`` for a batch of records, in one statement pair (the follower's)."""
        if not seqs:
            return
        now = to_us(self._clock.now())
        with self._write() as c:
            c.execute(
                "INSERT INTO kmsg_boots (boot_id, high_water, first_seen_us) VALUES (?, ?, ?)"
                " ON CONFLICT (boot_id) DO UPDATE SET"
                " high_water = MAX(high_water, excluded.high_water)",
                (boot_id, max(int(s) for s in seqs), now))
            c.executemany("INSERT INTO kmsg_seen (boot_id, seq, seen_us) VALUES (?, ?, ?)"
                          " ON CONFLICT (boot_id, seq) DO NOTHING",
                          [(boot_id, int(s), now) for s in seqs])

    def kmsg_seen(self, boot_id: str, seq: int) -> bool:
        with self._read() as c:
            if c.execute("SELECT 1 FROM kmsg_seen WHERE boot_id = ? AND seq = ?",
                         (boot_id, int(seq))).fetchone():
                return True
            row = c.execute("SELECT pruned_through FROM kmsg_boots WHERE boot_id = ?",
                            (boot_id,)).fetchone()
        return row is not None and int(seq) <= row[0]

    def kmsg_high_water(self, boot_id: str) -> int | None:
        """The highest ``seq`` marked for this boot; a replay skips records at or below it."""
        with self._read() as c:
            row = c.execute("SELECT high_water FROM kmsg_boots WHERE boot_id = ?",
                            (boot_id,)).fetchone()
        return None if row is None else int(row[0])

    # --- XID / SXid history ------------------------------------------------------------------

    def add_xid_event(self, event: XidEvent) -> bool:
        """Record an event; False (and no count) when the same record was already stored."""
        with self._write() as c:
            inserted = c.execute(
                "INSERT INTO xid_events (boot_id, seq, observed_us, code, pci_bus_id, gpu_uuid,"
                " gpu_index, kind, message, fatal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (boot_id, seq, code, pci_bus_id) DO NOTHING",
                (event.boot_id, int(event.seq), to_us(event.observed_at), int(event.code),
                 event.pci_bus_id or "", event.gpu_uuid, event.gpu_index, event.kind,
                 event.message, int(event.fatal))).rowcount
            if not inserted:
                return False
            self._xid_added[event.kind] += 1
            # NULLs never collide in a primary key: -1 / '' stand for "not mapped to a GPU".
            c.execute(
                "INSERT INTO xid_counters (kind, gpu_index, gpu_uuid, code, count)"
                " VALUES (?, ?, ?, ?, 1) ON CONFLICT (kind, gpu_index, gpu_uuid, code)"
                " DO UPDATE SET count = count + 1",
                (event.kind, -1 if event.gpu_index is None else int(event.gpu_index),
                 event.gpu_uuid or "", int(event.code)))
        return True

    def xid_event_held(self, boot_id: str, seq: int, code: int) -> bool:
        """Whether an event of record ``seq`` of boot ``boot_id`` with ``code`` is stored
        (for any address: a record read again after a restart)."""
        with self._read() as c:
            return c.execute("SELECT 1 FROM xid_events WHERE boot_id = ? AND seq = ? AND"
                             " code = ? LIMIT 1", (boot_id, int(seq), int(code))
                             ).fetchone() is not None

    def xid_history_mark(self, kind: str) -> XidHistoryMark:
        """The stored events of ``kind`` now, as an :class:`XidHistoryMark`."""
        with self._read() as c:
            data_version = self._data_version(c)
        return XidHistoryMark((data_version, self._rolled_back, self._xid_prunes),
                              self._xid_added[kind])

    def _xid_events_pruned(self) -> None:
        self._xid_prunes += 1

    def xid_events(self, since: datetime | None = None, uuid: str | None = None,
                   code: int | None = None, kind: str | None = None) -> list[XidEvent]:
        """Stored events, oldest first, filtered by time, GPU UUID, code and kind."""
        rows = self._select(
            "SELECT boot_id, seq, observed_us, code, pci_bus_id, gpu_uuid, gpu_index, kind,"
            " message, fatal FROM xid_events", "observed_us, id", "observed_us", since,
            (("gpu_uuid", uuid), ("code", code), ("kind", kind)))
        return [XidEvent(boot_id=r[0], seq=r[1], observed_at=from_us(r[2]), code=r[3],
                         pci_bus_id=r[4] or None, gpu_uuid=r[5], gpu_index=r[6], kind=r[7],
                         message=r[8], fatal=bool(r[9])) for r in rows]

    def xid_counts(self, kind: str | None = None) -> dict[tuple[int | None, str | None, int], int]:
        """Events ever recorded per (gpu_index, uuid, code); None where not mapped. Monotonic."""
        sql = "SELECT gpu_index, gpu_uuid, code, SUM(count) FROM xid_counters"
        args: list[Any] = []
        if kind is not None:
            sql += " WHERE kind = ?"
            args.append(kind)
        with self._read() as c:
            rows = c.execute(sql + " GROUP BY gpu_index, gpu_uuid, code", args).fetchall()
        return {(None if idx == -1 else idx, uuid or None, code): int(n)
                for idx, uuid, code, n in rows}

