"""The SQLite state store: what gpu-monitor remembers across restarts.

Checks are mostly stateless functions of the host, but several decisions need history: RDMA
port downtime in a sliding window, XID repeats after a reset, which kernel-log records were
already handled, the node's quarantine state, what remediation already did. The store keeps that
history in one SQLite file (a hostPath in the DaemonSet, so it survives pod restarts), and it is
the snapshot the metrics collector reads at scrape time.

Guarantees (tests hold the store to each):
1. Every write is committed before the method returns. A decision taken on the strength of a
   write (cordon after an XID, skip a replayed kmsg record) never outlives the write.
2. Committed data survives a crash of the process (SIGKILL included); a torn transaction is
   rolled back on the next open, never half applied.
3. Counters (``reason_counts``, ``xid_counts``, ``action_counts``, ``health_report_counts``,
   ``port_down_total_s``) only go up: they live in their own tables, are incremented in the same
   transaction as the row they count, and pruning history never touches them.
4. A file that is not a readable gpu-monitor database raises ``StoreCorruptError`` naming the
   file and the recovery command (``RECOVER_COMMAND``); a file written by a newer gpu-monitor
   raises ``StoreVersionError``. Either is left exactly as it was, WAL included: an existing
   file is judged through a read-only connection first, which never checkpoints (the
   recovery itself is state_recovery.py). Callers see ``StoreError`` subclasses, never
   ``sqlite3`` exceptions.
5. Safe to share between threads: one connection, every use under one re-entrant lock.

Times are stored as integer microseconds since the Unix epoch (UTC): exact, and ordered
numerically, which ISO text with optional fractions is not. The schema version is
``PRAGMA user_version``; ``MIGRATIONS`` is the ordered list that brings any older file to
``LATEST_VERSION``, one transaction per step. docs/state.md describes tables and recovery.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpu_monitor.clock import Clock
from gpu_monitor.model import Action, Result, Status, canonical_pci, iso

if TYPE_CHECKING:  # pragma: no cover
    from gpu_monitor.model import RunOutcome

__all__ = [
    "APPLICATION_ID",
    "CORRUPT_CAUSES",
    "LATEST_VERSION",
    "MIGRATIONS",
    "NODE_STATES",
    "ActionRecord",
    "HealthReport",
    "Migration",
    "NodeState",
    "NodeStateChange",
    "RECOVER_COMMAND",
    "RunInfo",
    "Store",
    "StoreCorruptError",
    "StoreError",
    "StoreVersionError",
    "XidEvent",
    "clip_downtime_s",
]

log = logging.getLogger("gpu_monitor.state")

# Written to ``PRAGMA application_id`` ("GPMS"): tells our files from other SQLite databases.
APPLICATION_ID = 0x47504D53

# The quarantine lifecycle of DESIGN.md §7; the store refuses anything else (a typo persisted
# would be read back as an unknown state after every restart).
NODE_STATES = ("healthy", "suspect", "quarantined", "retesting", "reboot-required", "replace")

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


# --- errors ----------------------------------------------------------------------------------


class StoreError(Exception):
    """The state store cannot do what was asked; the message is meant for an operator."""


# The one command that moves a damaged file aside (gpu_monitor/state_cli.py); every message and
# docs/state.md name it exactly, and a test parses it with the real argument parser.
RECOVER_COMMAND = "gpu-monitor state recover"


class StoreVersionError(StoreError):
    """The file was written by a newer gpu-monitor (a higher schema version)."""

    def __init__(self, path: str, found: int, supported: int):
        self.path = path
        self.found = found
        self.supported = supported
        super().__init__(
            f"state file {path} has schema version {found}, newer than the {supported} this "
            f"gpu-monitor understands: it was written by a newer release. Run that release "
            f"again; `{RECOVER_COMMAND}` refuses to move it aside, because starting empty "
            f"here would be a downgrade that drops the newer release's history. The file is "
            f"never downgraded in place; to start empty anyway, stop the daemon and move "
            f"{path} (with its -wal and -shm) aside by hand."
        )


# What kind of trouble a StoreCorruptError is; recovery moves only the first two aside.
CORRUPT_CAUSES = ("damaged", "not-a-file", "access")


class StoreCorruptError(StoreError):
    """The file is damaged, unreadable, or not a gpu-monitor database at all.

    ``cause``: ``damaged`` (its bytes are not a sound gpu-monitor database), ``not-a-file``
    (a directory or special file at the path) or ``access`` (gpu-monitor may not read and
    write it: the file itself may be intact, so recovery leaves it alone).
    """

    def __init__(self, path: str, detail: str, cause: str = "damaged"):
        if cause not in CORRUPT_CAUSES:
            raise ValueError(f"cause must be one of {CORRUPT_CAUSES}, got {cause!r}")
        self.path = path
        self.detail = detail
        self.cause = cause
        if cause == "access":
            advice = (
                f"The file may be intact: give gpu-monitor read and write access to it and to "
                f"its directory (ownership, mode, a read-only mount) and no history is lost; "
                f"`{RECOVER_COMMAND}` does not move a file it cannot read."
            )
        else:
            advice = (
                f"Recovery: stop the daemon and run `{RECOVER_COMMAND} --state {path}`: it "
                f"moves {path} (with its -wal and -shm) aside to {path}.corrupt-<timestamp>, "
                f"deleting nothing, and creates an empty store; gpu-monitor then starts with "
                f"an empty history, and quarantine state is re-read from the node's labels. "
                f"The long-running daemon does this itself at start while "
                f"daemon.recover_corrupt_state is true (the default)."
            )
        super().__init__(f"state file {path} is corrupt or unreadable: {detail}. {advice}")


# SQLite primary result codes (sqlite3.h); ``sqlite_errorcode`` exists from Python 3.11.
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 10, 11, 13, 14, 26

# Python 3.10 has no error codes on exceptions: fall back to SQLite's fixed English messages.
_MESSAGE_CODES = (
    ("file is not a database", _SQLITE_NOTADB),
    ("malformed", _SQLITE_CORRUPT),
    ("unable to open", _SQLITE_CANTOPEN),
    ("readonly database", _SQLITE_READONLY),
    ("disk i/o error", _SQLITE_IOERR),
    ("database or disk is full", _SQLITE_FULL),
    ("database is locked", _SQLITE_BUSY),
    ("database table is locked", _SQLITE_LOCKED),
)


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc).lower()
    for needle, value in _MESSAGE_CODES:
        if needle in text:
            return value
    return None


def _classify(exc: sqlite3.Error, path: str, opening: bool) -> StoreError:
    """Turn a sqlite3 exception into the StoreError an operator can act on."""
    code = _primary_code(exc)
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreCorruptError(path, str(exc))
    if opening and code in (_SQLITE_CANTOPEN, _SQLITE_PERM, _SQLITE_IOERR, _SQLITE_READONLY):
        return StoreCorruptError(path, f"cannot be opened for reading and writing ({exc})",
                                 cause="access")
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreError(
            f"state file {path} stayed locked by another process ({exc}); is a second "
            f"gpu-monitor using the same file?"
        )
    if code == _SQLITE_FULL:
        return StoreError(f"cannot write state file {path}: the disk is full ({exc})")
    if code == _SQLITE_READONLY:
        return StoreError(f"state file {path} became read-only ({exc})")
    if code == _SQLITE_IOERR:
        return StoreError(f"I/O error on state file {path} ({exc}); check the disk")
    return StoreError(f"state store {path}: {exc}")


# --- values ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunInfo:
    """The latest run of one check: when, how long, and whether it ran to completion."""

    check: str
    started_at: datetime
    duration_s: float
    success: bool
    error: str = ""


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
class NodeStateChange:
    at: datetime
    from_state: str
    to_state: str
    reason: str


@dataclass(frozen=True)
class NodeState:
    """Where the node is in the quarantine lifecycle; ``since`` is None if never recorded."""

    state: str = "healthy"
    since: datetime | None = None
    reason: str = ""
    retest_failures: int = 0
    history: tuple[NodeStateChange, ...] = ()  # oldest first


@dataclass(frozen=True)
class ActionRecord:
    """One remediation step taken (or, in dry-run, decided) and how it ended."""

    action: str
    result: str
    at: datetime
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthReport:
    """A report about this node from another detector (GPUHealthReport CR or the drop dir)."""

    uid: str
    node: str
    reason: str
    source: str
    observed_at: datetime
    payload: Mapping[str, Any] = field(default_factory=dict)


# --- time and JSON ---------------------------------------------------------------------------


def _us(ts: datetime) -> int:
    if ts.tzinfo is None:
        raise ValueError("naive datetime: gpu-monitor timestamps are always UTC-aware")
    delta = ts - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _dt(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"cannot store a {type(value).__name__} as JSON: {value!r:.80}")


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, sort_keys=True, separators=(",", ":"))


def _loads_mapping(text: str) -> Mapping[str, Any]:
    value = json.loads(text) if text else {}
    return MappingProxyType(value if isinstance(value, dict) else {"value": value})


def clip_downtime_s(intervals: Iterable[tuple[datetime, datetime | None]],
                    window_start: datetime, now: datetime) -> float:
    """Seconds of ``intervals`` inside ``[window_start, now]``; an open interval runs to ``now``.

    Pure, so the window arithmetic is tested apart from SQLite. Overlapping input intervals are
    not merged: the store never has two open at once for one port.
    """
    lo, hi = _us(window_start), _us(now)
    total = 0
    for start, end in intervals:
        s = max(_us(start), lo)
        e = min(hi if end is None else _us(end), hi)
        if e > s:
            total += e - s
    return total / 1e6


# --- schema and migrations -------------------------------------------------------------------


@dataclass(frozen=True)
class Migration:
    """One schema step: ``apply`` is an SQL script or a function of the connection.

    A shipped migration is never edited: files in the field were built by it. Each runs in its
    own transaction together with the ``user_version`` bump, so a crash leaves the previous
    version intact.
    """

    version: int
    summary: str
    apply: str | Callable[[sqlite3.Connection], None]


_V1 = """
CREATE TABLE results (
    id INTEGER PRIMARY KEY,
    check_name TEXT NOT NULL,
    target TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    details TEXT NOT NULL DEFAULT '{}',
    action TEXT NOT NULL DEFAULT 'none',
    observed_us INTEGER NOT NULL
);
CREATE TABLE runs (
    check_name TEXT PRIMARY KEY,
    started_us INTEGER NOT NULL,
    duration_s REAL NOT NULL,
    success INTEGER NOT NULL
);
CREATE TABLE reason_counters (
    check_name TEXT NOT NULL,
    reason TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (check_name, reason)
) WITHOUT ROWID;
CREATE TABLE kmsg_boots (
    boot_id TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL,
    pruned_through INTEGER NOT NULL DEFAULT -1,
    first_seen_us INTEGER NOT NULL
);
CREATE TABLE kmsg_seen (
    boot_id TEXT NOT NULL REFERENCES kmsg_boots(boot_id),
    seq INTEGER NOT NULL,
    seen_us INTEGER NOT NULL,
    PRIMARY KEY (boot_id, seq)
) WITHOUT ROWID;
CREATE TABLE xid_events (
    id INTEGER PRIMARY KEY,
    boot_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    observed_us INTEGER NOT NULL,
    code INTEGER NOT NULL,
    pci_bus_id TEXT NOT NULL DEFAULT '',
    gpu_uuid TEXT,
    gpu_index INTEGER,
    kind TEXT NOT NULL CHECK (kind IN ('xid', 'sxid')),
    message TEXT NOT NULL DEFAULT '',
    fatal INTEGER NOT NULL DEFAULT 0,
    UNIQUE (boot_id, seq, code, pci_bus_id)
);
CREATE TABLE xid_counters (
    kind TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    code INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (kind, gpu_index, gpu_uuid, code)
) WITHOUT ROWID;
CREATE TABLE ports (
    device TEXT NOT NULL,
    port INTEGER NOT NULL,
    closed_down_us INTEGER NOT NULL DEFAULT 0,
    outages INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (device, port)
) WITHOUT ROWID;
CREATE TABLE port_down (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL,
    port INTEGER NOT NULL,
    start_us INTEGER NOT NULL,
    end_us INTEGER,
    FOREIGN KEY (device, port) REFERENCES ports(device, port)
);
CREATE UNIQUE INDEX port_down_one_open ON port_down(device, port) WHERE end_us IS NULL;
CREATE TABLE kv (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_us INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
CREATE TABLE node_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL,
    since_us INTEGER NOT NULL,
    reason TEXT NOT NULL,
    retest_failures INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE node_state_history (
    id INTEGER PRIMARY KEY,
    at_us INTEGER NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE actions (
    id INTEGER PRIMARY KEY,
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    at_us INTEGER NOT NULL,
    details TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE action_counters (
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (action, result)
) WITHOUT ROWID;
"""

# v2: the metrics collector asks for the latest result per check/target on every scrape, and
# rdma_ports alone writes one result per port per second. Scanning the history for the maximum
# grew with the history; a pointer table keeps the read proportional to the number of targets,
# and its foreign key stops pruning from deleting a latest result (the index on result_id keeps
# that check cheap while prune deletes). The backfill picks, per key, the newest observation
# (highest id on a tie). The time indexes serve ``since=`` queries and prune.
_V2 = """
CREATE INDEX results_by_key_time ON results(check_name, target, observed_us);
CREATE INDEX results_by_time ON results(observed_us);
CREATE TABLE latest_results (
    check_name TEXT NOT NULL,
    target TEXT NOT NULL,
    result_id INTEGER NOT NULL REFERENCES results(id),
    observed_us INTEGER NOT NULL,
    PRIMARY KEY (check_name, target)
) WITHOUT ROWID;
INSERT INTO latest_results (check_name, target, result_id, observed_us)
    SELECT check_name, target, id, observed_us FROM (
        SELECT id, check_name, target, observed_us, ROW_NUMBER() OVER (
            PARTITION BY check_name, target ORDER BY observed_us DESC, id DESC) AS rn
        FROM results)
    WHERE rn = 1;
CREATE INDEX latest_results_by_result ON latest_results(result_id);
CREATE INDEX xid_events_by_time ON xid_events(observed_us);
CREATE INDEX port_down_by_port_start ON port_down(device, port, start_us);
CREATE INDEX actions_by_time ON actions(at_us);
CREATE INDEX kmsg_seen_by_time ON kmsg_seen(seen_us);
"""

# v3: the runner started telling a timeout from a crash (RunOutcome.error), and reports about
# this node from other detectors (GPUHealthReport CRs, the host drop dir) must be acted on once
# only, even after a restart, so their uids are remembered.
_V3 = """
ALTER TABLE runs ADD COLUMN error TEXT NOT NULL DEFAULT '';
CREATE TABLE health_reports (
    uid TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    reason TEXT NOT NULL,
    source TEXT NOT NULL,
    observed_us INTEGER NOT NULL,
    received_us INTEGER NOT NULL,
    payload TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX health_reports_by_time ON health_reports(observed_us);
CREATE TABLE health_report_counters (
    reason TEXT PRIMARY KEY,
    count INTEGER NOT NULL
) WITHOUT ROWID;
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _V1),
    Migration(2, "latest-result pointers and time indexes", _V2),
    Migration(3, "run error text; health reports from other detectors", _V3),
)
LATEST_VERSION = MIGRATIONS[-1].version


def _statements(script: str) -> Iterator[str]:
    """Split a script into statements (``executescript`` would commit our transaction)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                yield buf.strip()
            buf = ""
    if buf.strip():
        raise ValueError(f"incomplete SQL statement in migration: {buf.strip()[:80]!r}")


def _apply_migrations(conn: sqlite3.Connection, path: str,
                      migrations: Sequence[Migration]) -> None:
    supported = migrations[-1].version if migrations else 0
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise ValueError(f"migrations must be numbered 1, 2, ...: found {m.version} at {i}")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > supported:
        raise StoreVersionError(path, version, supported)
    for m in migrations[version:]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the write lock.
            if conn.execute("PRAGMA user_version").fetchone()[0] >= m.version:
                conn.execute("COMMIT")
                continue
            if isinstance(m.apply, str):
                for stmt in _statements(m.apply):
                    conn.execute(stmt)
            else:
                m.apply(conn)
            conn.execute(f"PRAGMA user_version = {int(m.version)}")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        # Creating a new store is routine; upgrading an existing one is worth a log line.
        log.log(logging.DEBUG if version == 0 else logging.INFO,
                "state %s: migrated to schema version %d (%s)", path, m.version, m.summary)


# --- the store -------------------------------------------------------------------------------


def _precheck_file(path: str) -> None:
    """Explain the failures SQLite reports only as "unable to open database file"."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the state directory {parent}: {exc.strerror}") from exc
    if os.path.isdir(path):
        raise StoreCorruptError(path, "it is a directory, not a database file", "not-a-file")
    if os.path.exists(path):
        if not os.path.isfile(path):
            raise StoreCorruptError(path, "it is not a regular file", "not-a-file")
        # Try it rather than os.access: that answers for the real uid, and knows nothing of
        # read-only mounts.
        try:
            os.close(os.open(path, os.O_RDWR))
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                detail = "permission denied: gpu-monitor cannot read and write it"
            else:
                detail = f"cannot be opened for reading and writing: {exc.strerror}"
            raise StoreCorruptError(path, detail, "access") from exc
    effective = os.access in os.supports_effective_ids
    if not os.access(parent, os.W_OK | os.X_OK, effective_ids=effective):
        raise StoreError(
            f"cannot write in the state directory {parent} (the journal files live beside "
            f"{os.path.basename(path)}): permission denied"
        )


class Store:
    """The state store. Create with ``Store.open(path)``; close with ``close()`` or ``with``."""

    def __init__(self, conn: sqlite3.Connection, path: str, clock: Clock):
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._clock = clock
        self._lock = threading.RLock()
        self._tx: str | None = None  # "read" or "write" while this thread holds a transaction

    # --- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], clock: Clock | None = None, *,
             busy_timeout_s: float = 5.0, integrity: str = "quick",
             migrations: Sequence[Migration] = MIGRATIONS) -> Store:
        """Open (creating if needed) and migrate the store at ``path`` (``":memory:"`` works).

        ``integrity``: ``"quick"`` runs ``PRAGMA quick_check`` at open (linear in the file
        size, catches damaged pages), ``"full"`` runs ``integrity_check`` (also cross-checks
        indexes; slower), ``"off"`` skips it. ``migrations`` is for tests of the mechanism.
        """
        if integrity not in ("quick", "full", "off"):
            raise ValueError(f"integrity must be quick, full or off, got {integrity!r}")
        path = os.fspath(path)
        memory = path == ":memory:"
        supported = migrations[-1].version if migrations else 0
        if not memory:
            _precheck_file(path)
            if os.path.isfile(path) and cls._judge_read_only(
                    path, busy_timeout_s, integrity, supported) is not None:
                integrity = "off"  # judged already; the writer need not scan it again
        try:
            conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise _classify(exc, path, opening=True) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            # Reading the schema cookie forces SQLite to read and validate the header.
            conn.execute("PRAGMA schema_version").fetchone()
            cls._check_identity(conn, path)
            if integrity != "off":
                problems = cls._integrity(conn, full=integrity == "full")
                if problems:
                    raise StoreCorruptError(path, "integrity check failed: " + "; ".join(problems))
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > supported:
                # Before anything writes to the file (journal mode included).
                raise StoreVersionError(path, version, supported)
            if not memory:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("state %s: WAL unavailable (journal mode %s); writes are "
                                "slower but still durable", path, mode)
            # WAL + synchronous=NORMAL: a commit appends to the WAL without fsync; the WAL is
            # fsynced at checkpoints. A process crash (even SIGKILL) loses nothing committed,
            # because the WAL is already in the OS page cache. A power loss or kernel panic may
            # lose the last few transactions, but never corrupts the file. FULL would fsync on
            # every commit, and rdma_ports alone commits once a second per port.
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            _apply_migrations(conn, path, migrations)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise _classify(exc, path, opening=True) from exc
            raise
        return cls(conn, path, clock or Clock())

    @classmethod
    def _judge_read_only(cls, path: str, busy_timeout_s: float, integrity: str,
                         supported: int) -> int | None:
        """Judge an existing file through a read-only connection first (guarantee 4).

        A read-write connection that is the last to close checkpoints the WAL into the main
        file and deletes the WAL. Closing one after it found damage would write into the
        damaged file and remove the companion holding its newest committed data, before
        anyone could move the two aside. A read-only connection reads the WAL but never
        checkpoints, so the damage is found while both files are as they were.

        Raises ``StoreCorruptError`` / ``StoreVersionError``; returns the schema version when
        the file is sound, None when a read-only connection cannot judge it (a hot rollback
        journal, a WAL that needs a writer to recover): the read-write open then decides.
        """
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error:
            return None
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA schema_version").fetchone()
            cls._check_identity(conn, path)
            if integrity != "off":
                problems = cls._integrity(conn, full=integrity == "full")
                if problems:
                    raise StoreCorruptError(path, "integrity check failed: " + "; ".join(problems))
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > supported:
                raise StoreVersionError(path, version, supported)
            return int(version)
        except sqlite3.Error as exc:
            if _primary_code(exc) in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
                raise StoreCorruptError(path, str(exc)) from exc
            return None
        finally:
            conn.close()

    @classmethod
    def check_file(cls, path: str | os.PathLike[str], *, integrity: str = "full",
                   busy_timeout_s: float = 5.0,
                   migrations: Sequence[Migration] = MIGRATIONS) -> int | None:
        """Judge the file at ``path`` as ``open`` would, without creating, migrating or
        writing it: its schema version (0: empty), or None when there is no file.

        Raises what ``open`` raises (``StoreCorruptError``, ``StoreVersionError``), and
        ``StoreError`` when only a writer could judge it (an interrupted transaction).
        """
        if integrity not in ("quick", "full", "off"):
            raise ValueError(f"integrity must be quick, full or off, got {integrity!r}")
        path = os.fspath(path)
        if path == ":memory:":
            raise StoreError("an in-memory store has no file to check")
        if not os.path.lexists(path):
            return None
        _precheck_file(path)
        supported = migrations[-1].version if migrations else 0
        version = cls._judge_read_only(path, busy_timeout_s, integrity, supported)
        if version is None:
            raise StoreError(
                f"state file {path} cannot be judged without writing to it: an interrupted "
                f"transaction or its WAL waits for a writer to roll it back; the daemon's next "
                f"start (or `{RECOVER_COMMAND}`) opens it read-write and finishes that")
        return version

    @staticmethod
    def _check_identity(conn: sqlite3.Connection, path: str) -> None:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if app_id not in (0, APPLICATION_ID):
            raise StoreCorruptError(
                path, f"it is the SQLite database of another application "
                      f"(application_id {app_id:#x})")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version < 0:
            raise StoreCorruptError(path, f"negative schema version {version}")
        if version == 0:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' LIMIT 3")]
            if tables:
                raise StoreCorruptError(
                    path, f"it holds tables ({', '.join(tables)}) but no gpu-monitor schema "
                          f"version: not a gpu-monitor state file")

    @staticmethod
    def _integrity(conn: sqlite3.Connection, full: bool) -> list[str]:
        pragma = "integrity_check" if full else "quick_check"
        try:
            rows = [str(r[0]) for r in conn.execute(f"PRAGMA {pragma}(5)")]
        except sqlite3.DatabaseError as exc:
            # Some damage stops the check itself ("database disk image is malformed").
            if _primary_code(exc) in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
                return [str(exc)]
            raise
        if rows == ["ok"]:
            return []
        return [line.strip() for row in rows for line in row.splitlines()
                if line.strip() and not line.startswith("***")][:5]

    def check_integrity(self, full: bool = True) -> list[str]:
        """Problems ``integrity_check`` (or ``quick_check``) finds now; empty when sound."""
        with self._read() as c:
            return self._integrity(c, full)

    def close(self) -> None:
        """Close the connection (idempotent). SQLite checkpoints the WAL into the file."""
        with self._lock:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> str:
        return self._path

    @property
    def closed(self) -> bool:
        return self._conn is None

    @property
    def schema_version(self) -> int:
        with self._read() as c:
            return int(c.execute("PRAGMA user_version").fetchone()[0])

    @staticmethod
    def quarantine_corrupt(path: str | os.PathLike[str], clock: Clock | None = None) -> str:
        """Rename a damaged state file aside (with its -wal/-shm/-journal) and return the name.

        The next ``Store.open(path)`` starts empty. The WAL moves too, under a name SQLite
        pairs with the moved file, so the copy stays inspectable with ``sqlite3``. Nothing is
        deleted. Run it only while no daemon has the file open.
        """
        path = os.fspath(path)
        if path == ":memory:":
            raise StoreError("an in-memory store has no file to move aside")
        if not os.path.lexists(path):
            raise StoreError(f"state file {path} does not exist: nothing to move aside")
        stamp = (clock or Clock()).now().astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = f"{path}.corrupt-{stamp}"
        n = 1
        while any(os.path.lexists(target + s) for s in ("", "-wal", "-shm", "-journal")):
            target = f"{path}.corrupt-{stamp}.{n}"
            n += 1
        try:
            os.rename(path, target)
            for suffix in ("-wal", "-shm", "-journal"):
                if os.path.lexists(path + suffix):
                    os.rename(path + suffix, target + suffix)
        except OSError as exc:
            raise StoreError(f"cannot move {path} aside to {target}: {exc.strerror}") from exc
        log.info("state %s moved aside to %s", path, target)
        return target

    # --- transactions ------------------------------------------------------------------------

    def _ensure_open(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"state store {self._path} is closed")
        return self._conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for several SELECTs (other processes may write meanwhile)."""
        with self._lock:
            conn = self._ensure_open()
            if self._tx is not None:
                yield conn
                return
            try:
                self._end_stale_transaction(conn)
                conn.execute("BEGIN")
                self._tx = "read"
                try:
                    yield conn
                finally:
                    self._tx = None
                    # Nothing was written: ending the snapshot cannot lose anything, and after
                    # a read hit a damaged page SQLite may refuse even this.
                    self._end_stale_transaction(conn)
            except sqlite3.Error as exc:
                raise _classify(exc, self._path, opening=False) from exc

    def _end_stale_transaction(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log.debug("state %s: ending a transaction failed: %s", self._path, exc)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction, committed before the caller's method returns (guarantee 1)."""
        with self._lock:
            conn = self._ensure_open()
            if self._tx == "write":
                yield conn
                return
            if self._tx == "read":
                # It would join the read snapshot and be rolled back with it.
                raise RuntimeError("state store: a write cannot nest inside a read snapshot")
            try:
                self._end_stale_transaction(conn)
                conn.execute("BEGIN IMMEDIATE")
                self._tx = "write"
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    self._end_stale_transaction(conn)
                    raise
                finally:
                    self._tx = None
            except sqlite3.Error as exc:
                raise _classify(exc, self._path, opening=False) from exc

    def _since_clause(self, column: str, since: datetime | None,
                      where: list[str], args: list[Any]) -> None:
        if since is not None:
            where.append(f"{column} >= ?")
            args.append(_us(since))

    # --- results and runs --------------------------------------------------------------------

    def record_run(self, outcome: RunOutcome) -> None:
        """Store a run's results, count their reasons and remember the run, atomically."""
        rows = []
        for r in outcome.results:
            rows.append((r.check, r.target, r.status.value, r.reason, r.message,
                         _dumps(r.to_dict()["details"]), r.action.value, _us(r.observed_at)))
        started = _us(outcome.started_at)
        with self._write() as c:
            for row in rows:
                rid = c.execute(
                    "INSERT INTO results (check_name, target, status, reason, message, details,"
                    " action, observed_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row).lastrowid
                c.execute(
                    "INSERT INTO latest_results (check_name, target, result_id, observed_us)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (check_name, target) DO UPDATE SET"
                    " result_id = excluded.result_id, observed_us = excluded.observed_us"
                    " WHERE excluded.observed_us >= latest_results.observed_us",
                    (row[0], row[1], rid, row[7]))
            counts = Counter((r.check, r.reason) for r in outcome.results)
            c.executemany(
                "INSERT INTO reason_counters (check_name, reason, count) VALUES (?, ?, ?)"
                " ON CONFLICT (check_name, reason) DO UPDATE SET count = count + excluded.count",
                [(check, reason, n) for (check, reason), n in counts.items()])
            c.execute(
                "INSERT INTO runs (check_name, started_us, duration_s, success, error)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (check_name) DO UPDATE SET"
                " started_us = excluded.started_us, duration_s = excluded.duration_s,"
                " success = excluded.success, error = excluded.error"
                " WHERE excluded.started_us >= runs.started_us",
                (outcome.check, started, float(outcome.duration_s), int(outcome.success),
                 outcome.error or ""))

    _RESULT_COLUMNS = "check_name, target, status, reason, message, details, action, observed_us"

    @staticmethod
    def _result(row: Sequence[Any]) -> Result:
        check, target, status, reason, message, details, action, observed = row
        return Result(check=check, status=Status(status), target=target, reason=reason,
                      message=message, details=json.loads(details or "{}"),
                      action=Action(action), observed_at=_dt(observed))

    def latest_results(self) -> list[Result]:
        """The newest result per (check, target), ordered by check then target."""
        cols = ", ".join(f"r.{c.strip()}" for c in self._RESULT_COLUMNS.split(","))
        with self._read() as c:
            rows = c.execute(
                f"SELECT {cols} FROM latest_results l JOIN results r ON r.id = l.result_id"
                " ORDER BY l.check_name, l.target").fetchall()
        return [self._result(row) for row in rows]

    def latest_rows(self) -> list[tuple[str, str, str, str, dict[str, Any]]]:
        """``(check, target, status, reason, details)`` of the newest result per (check,
        target): what a scrape needs, without building a frozen ``Result`` per row."""
        with self._read() as c:
            rows = c.execute(
                "SELECT r.check_name, r.target, r.status, r.reason, r.details"
                " FROM latest_results l JOIN results r ON r.id = l.result_id"
                " ORDER BY l.check_name, l.target").fetchall()
        return [(check, target, status, reason, json.loads(details or "{}"))
                for check, target, status, reason, details in rows]

    def results_for(self, check: str, since: datetime | None = None,
                    target: str | None = None, limit: int | None = None) -> list[Result]:
        """A check's results, oldest first; ``limit`` keeps the newest ``limit`` of them."""
        where, args = ["check_name = ?"], [check]
        if target is not None:
            where.append("target = ?")
            args.append(target)
        self._since_clause("observed_us", since, where, args)
        sql = (f"SELECT {self._RESULT_COLUMNS} FROM results WHERE {' AND '.join(where)}"
               " ORDER BY observed_us DESC, id DESC")
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._read() as c:
            rows = c.execute(sql, args).fetchall()
        return [self._result(row) for row in reversed(rows)]

    def last_run(self, check: str) -> RunInfo | None:
        with self._read() as c:
            row = c.execute("SELECT check_name, started_us, duration_s, success, error"
                            " FROM runs WHERE check_name = ?", (check,)).fetchone()
        return None if row is None else self._run_info(row)

    def runs(self) -> dict[str, RunInfo]:
        with self._read() as c:
            rows = c.execute("SELECT check_name, started_us, duration_s, success, error"
                             " FROM runs ORDER BY check_name").fetchall()
        return {row[0]: self._run_info(row) for row in rows}

    @staticmethod
    def _run_info(row: Sequence[Any]) -> RunInfo:
        return RunInfo(check=row[0], started_at=_dt(row[1]), duration_s=float(row[2]),
                       success=bool(row[3]), error=row[4] or "")

    def reason_counts(self) -> dict[tuple[str, str], int]:
        """Results ever recorded per (check, reason): monotonic, untouched by ``prune``."""
        with self._read() as c:
            rows = c.execute("SELECT check_name, reason, count FROM reason_counters").fetchall()
        return {(check, reason): int(n) for check, reason, n in rows}

    def prune(self, older_than: datetime | timedelta) -> dict[str, int]:
        """Drop history older than a cutoff (a time, or an age before the clock's now).

        Kept whatever their age: the latest result per check/target, open port outages, the
        counters, kernel-log high-water marks, node-state history, key/value state and health
        report uids (their de-duplication depends on them). Returns rows deleted per table.
        """
        if isinstance(older_than, timedelta):
            older_than = self._clock.now() - older_than
        cutoff = _us(older_than)
        deleted: dict[str, int] = {}
        with self._write() as c:
            deleted["results"] = c.execute(
                "DELETE FROM results WHERE observed_us < ? AND id NOT IN"
                " (SELECT result_id FROM latest_results)", (cutoff,)).rowcount
            deleted["xid_events"] = c.execute(
                "DELETE FROM xid_events WHERE observed_us < ?", (cutoff,)).rowcount
            deleted["port_down"] = c.execute(
                "DELETE FROM port_down WHERE end_us IS NOT NULL AND end_us < ?",
                (cutoff,)).rowcount
            deleted["actions"] = c.execute(
                "DELETE FROM actions WHERE at_us < ?", (cutoff,)).rowcount
            # Remember how far each boot's marks were pruned, so kmsg_seen stays true for them.
            c.execute(
                "UPDATE kmsg_boots SET pruned_through = MAX(pruned_through, (SELECT MAX(seq)"
                " FROM kmsg_seen s WHERE s.boot_id = kmsg_boots.boot_id AND s.seen_us < ?))"
                " WHERE EXISTS (SELECT 1 FROM kmsg_seen s WHERE s.boot_id = kmsg_boots.boot_id"
                " AND s.seen_us < ?)", (cutoff, cutoff))
            deleted["kmsg_seen"] = c.execute(
                "DELETE FROM kmsg_seen WHERE seen_us < ?", (cutoff,)).rowcount
        return deleted

    # --- kernel-log de-duplication -----------------------------------------------------------

    def mark_kmsg(self, boot_id: str, seq: int) -> None:
        """Remember that record ``seq`` of boot ``boot_id`` was handled."""
        now = _us(self._clock.now())
        with self._write() as c:
            c.execute(
                "INSERT INTO kmsg_boots (boot_id, high_water, first_seen_us) VALUES (?, ?, ?)"
                " ON CONFLICT (boot_id) DO UPDATE SET"
                " high_water = MAX(high_water, excluded.high_water)",
                (boot_id, int(seq), now))
            c.execute("INSERT INTO kmsg_seen (boot_id, seq, seen_us) VALUES (?, ?, ?)"
                      " ON CONFLICT (boot_id, seq) DO NOTHING", (boot_id, int(seq), now))

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
                (event.boot_id, int(event.seq), _us(event.observed_at), int(event.code),
                 event.pci_bus_id or "", event.gpu_uuid, event.gpu_index, event.kind,
                 event.message, int(event.fatal))).rowcount
            if not inserted:
                return False
            # NULLs never collide in a primary key: -1 / '' stand for "not mapped to a GPU".
            c.execute(
                "INSERT INTO xid_counters (kind, gpu_index, gpu_uuid, code, count)"
                " VALUES (?, ?, ?, ?, 1) ON CONFLICT (kind, gpu_index, gpu_uuid, code)"
                " DO UPDATE SET count = count + 1",
                (event.kind, -1 if event.gpu_index is None else int(event.gpu_index),
                 event.gpu_uuid or "", int(event.code)))
        return True

    def xid_events(self, since: datetime | None = None, uuid: str | None = None,
                   code: int | None = None, kind: str | None = None) -> list[XidEvent]:
        """Stored events, oldest first, filtered by time, GPU UUID, code and kind."""
        where: list[str] = []
        args: list[Any] = []
        self._since_clause("observed_us", since, where, args)
        for column, value in (("gpu_uuid", uuid), ("code", code), ("kind", kind)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = ("SELECT boot_id, seq, observed_us, code, pci_bus_id, gpu_uuid, gpu_index, kind,"
               " message, fatal FROM xid_events")
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._read() as c:
            rows = c.execute(sql + " ORDER BY observed_us, id", args).fetchall()
        return [XidEvent(boot_id=r[0], seq=r[1], observed_at=_dt(r[2]), code=r[3],
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

    # --- RDMA port downtime ------------------------------------------------------------------

    def port_down_start(self, device: str, port: int, at: datetime) -> bool:
        """Open an outage; False when one is already open (the earliest start is kept)."""
        start = _us(at)
        with self._write() as c:
            c.execute("INSERT INTO ports (device, port) VALUES (?, ?)"
                      " ON CONFLICT (device, port) DO NOTHING", (device, int(port)))
            if c.execute("SELECT 1 FROM port_down WHERE device = ? AND port = ?"
                         " AND end_us IS NULL", (device, int(port))).fetchone():
                return False
            c.execute("INSERT INTO port_down (device, port, start_us) VALUES (?, ?, ?)",
                      (device, int(port), start))
            c.execute("UPDATE ports SET outages = outages + 1 WHERE device = ? AND port = ?",
                      (device, int(port)))
        return True

    def port_down_end(self, device: str, port: int, at: datetime) -> float | None:
        """Close the open outage; returns its length in seconds, None when none was open.

        An end before the start (the clock stepped back) closes it with zero length.
        """
        with self._write() as c:
            row = c.execute("SELECT id, start_us FROM port_down WHERE device = ? AND port = ?"
                            " AND end_us IS NULL", (device, int(port))).fetchone()
            if row is None:
                return None
            outage_id, start = row
            end = max(_us(at), start)
            c.execute("UPDATE port_down SET end_us = ? WHERE id = ?", (end, outage_id))
            c.execute("UPDATE ports SET closed_down_us = closed_down_us + ?"
                      " WHERE device = ? AND port = ?", (end - start, device, int(port)))
        return (end - start) / 1e6

    def open_port_outage(self, device: str, port: int) -> datetime | None:
        with self._read() as c:
            row = c.execute("SELECT start_us FROM port_down WHERE device = ? AND port = ?"
                            " AND end_us IS NULL", (device, int(port))).fetchone()
        return None if row is None else _dt(row[0])

    def port_intervals(self, device: str, port: int, since: datetime | None = None
                       ) -> list[tuple[datetime, datetime | None]]:
        """Outages still running or ending at/after ``since``, by start; open ones end None."""
        where, args = ["device = ?", "port = ?"], [device, int(port)]
        if since is not None:
            where.append("(end_us IS NULL OR end_us >= ?)")
            args.append(_us(since))
        with self._read() as c:
            rows = c.execute(f"SELECT start_us, end_us FROM port_down WHERE {' AND '.join(where)}"
                             " ORDER BY start_us, id", args).fetchall()
        return [(_dt(s), None if e is None else _dt(e)) for s, e in rows]

    def port_downtime_s(self, device: str, port: int, window_start: datetime,
                        now: datetime) -> float:
        """Seconds the port was down inside ``[window_start, now]`` (the sliding window)."""
        with self._read() as c:
            rows = c.execute(
                "SELECT start_us, end_us FROM port_down WHERE device = ? AND port = ?"
                " AND start_us < ? AND (end_us IS NULL OR end_us > ?)",
                (device, int(port), _us(now), _us(window_start))).fetchall()
        return clip_downtime_s(((_dt(s), None if e is None else _dt(e)) for s, e in rows),
                               window_start, now)

    def port_down_total_s(self, device: str, port: int, now: datetime | None = None) -> float:
        """All downtime ever recorded for the port, the open outage counted up to ``now``.

        Backs a Prometheus counter: closed outages are summed into ``ports`` when they end, so
        pruning intervals never lowers it.
        """
        now_us = _us(now or self._clock.now())
        with self._read() as c:
            row = c.execute("SELECT closed_down_us FROM ports WHERE device = ? AND port = ?",
                            (device, int(port))).fetchone()
            if row is None:
                return 0.0
            open_row = c.execute("SELECT start_us FROM port_down WHERE device = ? AND port = ?"
                                 " AND end_us IS NULL", (device, int(port))).fetchone()
        total = int(row[0])
        if open_row is not None:
            total += max(0, now_us - open_row[0])
        return total / 1e6

    def port_outages_total(self, device: str, port: int) -> int:
        """Outages ever opened on the port (monotonic)."""
        with self._read() as c:
            row = c.execute("SELECT outages FROM ports WHERE device = ? AND port = ?",
                            (device, int(port))).fetchone()
        return 0 if row is None else int(row[0])

    def known_ports(self) -> list[tuple[str, int]]:
        """Every port that ever had an outage recorded, for the metrics collector."""
        with self._read() as c:
            rows = c.execute("SELECT device, port FROM ports ORDER BY device, port").fetchall()
        return [(d, int(p)) for d, p in rows]

    # --- key/value state for checks ----------------------------------------------------------

    def get_kv(self, namespace: str, key: str, default: Any = None) -> Any:
        """A JSON value stored by ``set_kv`` (datetimes come back as ISO strings)."""
        with self._read() as c:
            row = c.execute("SELECT value FROM kv WHERE namespace = ? AND key = ?",
                            (namespace, key)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_kv(self, namespace: str, key: str, value: Any) -> None:
        text = _dumps(value)
        with self._write() as c:
            c.execute("INSERT INTO kv (namespace, key, value, updated_us) VALUES (?, ?, ?, ?)"
                      " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
                      " updated_us = excluded.updated_us",
                      (namespace, key, text, _us(self._clock.now())))

    def delete_kv(self, namespace: str, key: str) -> bool:
        with self._write() as c:
            return c.execute("DELETE FROM kv WHERE namespace = ? AND key = ?",
                             (namespace, key)).rowcount > 0

    def kv_items(self, namespace: str) -> dict[str, Any]:
        with self._read() as c:
            rows = c.execute("SELECT key, value FROM kv WHERE namespace = ? ORDER BY key",
                             (namespace,)).fetchall()
        return {k: json.loads(v) for k, v in rows}

    # --- node (quarantine) state -------------------------------------------------------------

    def node_state(self, history_limit: int = 50) -> NodeState:
        """The current lifecycle state; ``healthy`` with ``since=None`` if never recorded."""
        with self._read() as c:
            row = c.execute("SELECT state, since_us, reason, retest_failures FROM node_state"
                            " WHERE id = 1").fetchone()
            hist = c.execute("SELECT at_us, from_state, to_state, reason FROM node_state_history"
                             " ORDER BY id DESC LIMIT ?", (int(history_limit),)).fetchall()
        history = tuple(NodeStateChange(_dt(a), f, t, r) for a, f, t, r in reversed(hist))
        if row is None:
            return NodeState(history=history)
        return NodeState(state=row[0], since=_dt(row[1]), reason=row[2],
                         retest_failures=int(row[3]), history=history)

    def set_node_state(self, state: str, reason: str, at: datetime, *,
                       retest_failures: int | None = None) -> bool:
        """Move to ``state``; True when it changed (and a history row was appended).

        ``retest_failures`` counts failed retests in the current quarantine: leaving
        ``retesting`` for anything but ``healthy`` adds one, reaching ``healthy`` resets it;
        pass a value to set it explicitly.
        """
        if state not in NODE_STATES:
            raise ValueError(f"unknown node state {state!r}; expected one of {NODE_STATES}")
        at_us = _us(at)
        with self._write() as c:
            row = c.execute("SELECT state, retest_failures FROM node_state WHERE id = 1"
                            ).fetchone()
            current, failures = (row[0], int(row[1])) if row else ("healthy", 0)
            changed = state != current
            if changed:
                if state == "healthy":
                    failures = 0
                elif current == "retesting":
                    failures += 1
            if retest_failures is not None:
                failures = int(retest_failures)
            if not changed and row is not None:
                c.execute("UPDATE node_state SET retest_failures = ? WHERE id = 1", (failures,))
                return False
            if changed or row is None:
                c.execute(
                    "INSERT INTO node_state (id, state, since_us, reason, retest_failures)"
                    " VALUES (1, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
                    " since_us = excluded.since_us, reason = excluded.reason,"
                    " retest_failures = excluded.retest_failures",
                    (state, at_us, reason, failures))
            if changed:
                c.execute("INSERT INTO node_state_history (at_us, from_state, to_state, reason)"
                          " VALUES (?, ?, ?, ?)", (at_us, current, state, reason))
        return changed

    # --- remediation actions -----------------------------------------------------------------

    def record_action(self, action: str, result: str, at: datetime,
                      details: Mapping[str, Any] | None = None) -> None:
        """Remember a remediation step and count it per (action, result)."""
        text = _dumps(dict(details or {}))
        with self._write() as c:
            c.execute("INSERT INTO actions (action, result, at_us, details) VALUES (?, ?, ?, ?)",
                      (action, result, _us(at), text))
            c.execute("INSERT INTO action_counters (action, result, count) VALUES (?, ?, 1)"
                      " ON CONFLICT (action, result) DO UPDATE SET count = count + 1",
                      (action, result))

    def actions(self, since: datetime | None = None,
                action: str | None = None) -> list[ActionRecord]:
        where: list[str] = []
        args: list[Any] = []
        self._since_clause("at_us", since, where, args)
        if action is not None:
            where.append("action = ?")
            args.append(action)
        sql = "SELECT action, result, at_us, details FROM actions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._read() as c:
            rows = c.execute(sql + " ORDER BY at_us, id", args).fetchall()
        return [ActionRecord(a, r, _dt(t), _loads_mapping(d)) for a, r, t, d in rows]

    def action_counts(self) -> dict[tuple[str, str], int]:
        with self._read() as c:
            rows = c.execute("SELECT action, result, count FROM action_counters").fetchall()
        return {(a, r): int(n) for a, r, n in rows}

    # --- health reports from other detectors -------------------------------------------------

    def add_health_report(self, uid: str, node: str, reason: str, source: str,
                          observed_at: datetime, payload: Mapping[str, Any] | None = None
                          ) -> bool:
        """Remember a report by uid; False when that uid was already seen (act once only)."""
        text = _dumps(dict(payload or {}))
        with self._write() as c:
            inserted = c.execute(
                "INSERT INTO health_reports (uid, node, reason, source, observed_us,"
                " received_us, payload) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (uid) DO NOTHING",
                (uid, node, reason, source, _us(observed_at), _us(self._clock.now()),
                 text)).rowcount
            if inserted:
                c.execute("INSERT INTO health_report_counters (reason, count) VALUES (?, 1)"
                          " ON CONFLICT (reason) DO UPDATE SET count = count + 1", (reason,))
        return bool(inserted)

    def health_reports(self, since: datetime | None = None) -> list[HealthReport]:
        where: list[str] = []
        args: list[Any] = []
        self._since_clause("observed_us", since, where, args)
        sql = "SELECT uid, node, reason, source, observed_us, payload FROM health_reports"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._read() as c:
            rows = c.execute(sql + " ORDER BY observed_us, uid", args).fetchall()
        return [HealthReport(u, n, r, s, _dt(t), _loads_mapping(p)) for u, n, r, s, t, p in rows]

    def health_report_counts(self) -> dict[str, int]:
        with self._read() as c:
            rows = c.execute("SELECT reason, count FROM health_report_counters").fetchall()
        return {r: int(n) for r, n in rows}

