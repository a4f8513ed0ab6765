"""One SQLite connection, its lock and its transactions: what every table of the store uses.

Why it exists: the store's guarantees about writes (committed before the method returns, never
half applied, safe between threads) are properties of how the connection is opened and how each
method enters a transaction, not of any one table. ``Database`` owns exactly that; the domain
modules (results.py, kernel_log.py, ports.py, node.py, kv.py) subclass it and only say which
rows they read and write, through ``_read()`` and ``_write()``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpu_monitor.clock import Clock
from gpu_monitor.locks import WaitedLock
from gpu_monitor.state.encoding import to_us
from gpu_monitor.state.errors import StoreError, classify
from gpu_monitor.state.files import (
    check_integrity_mode,
    examine,
    integrity_problems,
    judge_read_only,
    precheck_file,
)
from gpu_monitor.state.schema import MIGRATIONS, Migration, apply_migrations

if TYPE_CHECKING:  # pragma: no cover - Python 3.10 has no typing.Self at run time
    from typing import Self

__all__ = ["Database"]

log = logging.getLogger("gpu_monitor.state")


class Database:
    """The connection under the store. Create with ``open(path)``; close with ``close()`` or
    ``with``. Every use of the connection takes one re-entrant lock."""

    def __init__(self, conn: sqlite3.Connection, path: str, clock: Clock):
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._clock = clock
        self._lock = WaitedLock()
        self._tx: str | None = None  # "read" or "write" while this thread holds a transaction
        self._rolled_back = 0  # write transactions undone (what they wrote is not stored)
        self._tx_data_version: int | None = None  # data_version, read once per write transaction

    # --- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], clock: Clock | None = None, *,
             busy_timeout_s: float = 5.0, integrity: str = "quick",
             migrations: Sequence[Migration] = MIGRATIONS) -> Self:
        """Open (creating if needed) and migrate the store at ``path`` (``":memory:"`` works).

        ``integrity``: ``"quick"`` runs ``PRAGMA quick_check`` at open (linear in the file
        size, catches damaged pages), ``"full"`` runs ``integrity_check`` (also cross-checks
        indexes; slower), ``"off"`` skips it. ``migrations`` is for tests of the mechanism.
        """
        check_integrity_mode(integrity)
        path = os.fspath(path)
        memory = path == ":memory:"
        supported = migrations[-1].version if migrations else 0
        if not memory:
            precheck_file(path)
            if os.path.isfile(path) and judge_read_only(
                    path, busy_timeout_s, integrity, supported) is not None:
                integrity = "off"  # judged already; the writer need not scan it again
        try:
            conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise classify(exc, path, opening=True) from exc
        try:
            # Before anything writes to the file (journal mode included).
            examine(conn, path, busy_timeout_s=busy_timeout_s, integrity=integrity,
                    supported=supported)
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
            apply_migrations(conn, path, migrations)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise classify(exc, path, opening=True) from exc
            raise
        return cls(conn, path, clock or Clock())


    def check_integrity(self, full: bool = True) -> list[str]:
        """Problems ``integrity_check`` (or ``quick_check``) finds now; empty when sound."""
        with self._read() as c:
            return integrity_problems(c, full)

    def close(self) -> None:
        """Close the connection (idempotent). SQLite checkpoints the WAL into the file."""
        with self._lock:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> str:
        return self._path

    @property
    def waited(self) -> bool:
        """Whether another thread is waiting for the store now (the kernel-log follower lets
        go between two batches of a backlog only then)."""
        return self._lock.waited

    @property
    def closed(self) -> bool:
        return self._conn is None

    @property
    def schema_version(self) -> int:
        with self._read() as c:
            return int(c.execute("PRAGMA user_version").fetchone()[0])

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
                raise classify(exc, self._path, opening=False) from exc

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
                self._tx_data_version = None
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    self._rolled_back += 1
                    self._end_stale_transaction(conn)
                    raise
                finally:
                    self._tx = None
                    self._tx_data_version = None
            except sqlite3.Error as exc:
                raise classify(exc, self._path, opening=False) from exc

    def _data_version(self, conn: sqlite3.Connection) -> int:
        """SQLite's ``PRAGMA data_version`` (it changes when another connection commits).
        Inside this connection's write transaction it is read once: no other connection can
        commit while this one holds the write lock (``BEGIN IMMEDIATE``), so every reading in
        the transaction would give the same value (the follower asks twice per Xid event)."""
        if self._tx == "write" and self._tx_data_version is not None:
            return self._tx_data_version
        version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        if self._tx == "write":
            self._tx_data_version = version
        return version

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One write transaction around several store calls: what they write commits together
        when the block ends, or (an exception, a crash) none of it does. Other threads wait
        for the store meanwhile, so keep the block short (the kernel-log follower: one
        bounded batch of records)."""
        with self._write():
            yield

    def _since_clause(self, column: str, since: datetime | None,
                      where: list[str], args: list[Any]) -> None:
        if since is not None:
            where.append(f"{column} >= ?")
            args.append(to_us(since))

    def _select(self, sql: str, order: str, since_column: str, since: datetime | None,
                equal: Sequence[tuple[str, Any]] = ()) -> list[Any]:
        """The rows of ``sql`` (a SELECT without WHERE) in one snapshot: those at or after
        ``since`` by ``since_column`` (when given) and with ``column = value`` for each pair of
        ``equal`` whose value is not None, in ``order``."""
        where: list[str] = []
        args: list[Any] = []
        self._since_clause(since_column, since, where, args)
        for column, value in equal:
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._read() as c:
            return c.execute(f"{sql} ORDER BY {order}", args).fetchall()

