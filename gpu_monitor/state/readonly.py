"""Opening the state file for reading only: what ``gpu-monitor status|history`` look through.

Why it exists: an operator reads the node's store while its daemon is writing it (``kubectl
exec`` into the DaemonSet pod), or reads a copy taken off a node. ``Store.open`` is the
daemon's door: it creates a missing file, sets the journal mode and migrates an older schema,
all of which write. This door writes nothing.

Guarantees (tests/state/test_readonly.py holds each):
1. The file is opened through a SQLite ``mode=ro`` URI and judged as the daemon judges it
   (identity, ``quick_check``, schema version), then ``PRAGMA query_only`` is set:
   no migration, no journal-mode change, no checkpoint, never a write lock. In WAL mode a
   reader and the daemon's writer do not block each other; each read is one snapshot.
2. A missing file, a directory, a damaged file, another application's database, a file the
   daemon has not given a schema yet, or one whose schema is older or newer than this release
   reads is a ``StoreError`` whose message names the file; never a ``sqlite3`` exception.
3. A copied file without its ``-wal`` in a directory the reader may not write in (a read-only
   mount) is still read: SQLite is then told the file cannot change (``immutable=1``).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse

from gpu_monitor.clock import Clock
from gpu_monitor.state import Store
from gpu_monitor.state.errors import StoreCorruptError, StoreError, classify
from gpu_monitor.state.files import examine
from gpu_monitor.state.schema import MIGRATIONS

__all__ = ["StoreAbsentError", "open_read_only"]


class StoreAbsentError(StoreError):
    """There is no state file at the path: the daemon has not run there (or another path)."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(
            f"state file {path} does not exist: no daemon has written a store there. In the "
            f"DaemonSet pod the daemon's file is the default; elsewhere pass --state PATH "
            f"(a copy of the daemon's file, taken with its -wal)")


def _connect(path: str, busy_timeout_s: float, immutable: bool) -> sqlite3.Connection:
    query = "immutable=1" if immutable else "mode=ro"
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?" + query
    return sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, isolation_level=None,
                           check_same_thread=False)


def _examined(path: str, busy_timeout_s: float, immutable: bool) -> sqlite3.Connection:
    conn = _connect(path, busy_timeout_s, immutable)
    try:
        version = examine(conn, path, busy_timeout_s=busy_timeout_s, integrity="quick",
                          supported=MIGRATIONS[-1].version)
        conn.execute("PRAGMA query_only = 1")
    except BaseException:
        conn.close()
        raise
    if version == 0:
        conn.close()
        raise StoreError(f"state file {path} holds no gpu-monitor store yet (schema version "
                         f"0): the daemon creates it at its first start")
    if version < MIGRATIONS[-1].version:
        conn.close()
        raise StoreError(
            f"state file {path} has schema version {version}, older than the "
            f"{MIGRATIONS[-1].version} this gpu-monitor reads: a daemon of this release "
            f"migrates it at its next start; this command never writes it")
    return conn


def open_read_only(path: str | os.PathLike[str], clock: Clock | None = None, *,
                   busy_timeout_s: float = 5.0) -> Store:
    """The store at ``path`` for reading only (guarantees 1-3). Close it when done."""
    path = os.fspath(path)
    if path == ":memory:":
        raise StoreError("an in-memory store has no file to read: pass --state PATH")
    if not os.path.lexists(path):
        raise StoreAbsentError(path)
    if os.path.isdir(path):
        raise StoreCorruptError(path, "it is a directory, not a database file", "not-a-file")
    if not os.path.isfile(path):
        raise StoreCorruptError(path, "it is not a regular file", "not-a-file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise StoreError(f"cannot read state file {path}: {exc.strerror}") from None
    try:
        try:
            conn = _examined(path, busy_timeout_s, immutable=False)
        except sqlite3.OperationalError as exc:
            # Guarantee 3: no -shm can be made beside a copy on a read-only mount.
            if os.path.exists(path + "-wal") or "unable to open" not in str(exc).lower():
                raise
            conn = _examined(path, busy_timeout_s, immutable=True)
    except sqlite3.Error as exc:
        raise classify(exc, path, opening=False) from None
    return Store(conn, path, clock or Clock())
