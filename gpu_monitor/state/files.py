"""Judging a state file before the store uses it: is it ours, sound, and of a version we know?

Why it exists: the store must refuse a damaged, foreign or newer file with an error an operator
can act on, and leave it exactly as it was (WAL included) so that recovery can move it aside
intact. The judgement runs through a read-only connection first (``judge_read_only``), which
never checkpoints; ``Database.open`` and ``check_file`` (``gpu-monitor state check``) both use
it, and ``examine`` is the one sequence of checks either connection runs.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import urllib.parse
from collections.abc import Sequence

from gpu_monitor.state.errors import (
    RECOVER_COMMAND,
    StoreCorruptError,
    StoreError,
    StoreVersionError,
    is_damage,
)
from gpu_monitor.state.schema import APPLICATION_ID, MIGRATIONS, Migration

__all__ = [
    "INTEGRITY_MODES",
    "check_file",
    "check_identity",
    "examine",
    "integrity_problems",
    "judge_read_only",
    "precheck_file",
]

# ``quick``: PRAGMA quick_check (linear in the file size, catches damaged pages); ``full``:
# integrity_check (also cross-checks indexes; slower); ``off``: no page scan.
INTEGRITY_MODES = ("quick", "full", "off")


def check_integrity_mode(integrity: str) -> None:
    if integrity not in INTEGRITY_MODES:
        raise ValueError(f"integrity must be quick, full or off, got {integrity!r}")


def precheck_file(path: str) -> None:
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


def examine(conn: sqlite3.Connection, path: str, *, busy_timeout_s: float, integrity: str,
            supported: int) -> int:
    """The header, the identity, the pages (unless ``integrity`` is ``off``) and the schema
    version of an opened file, in that order; returns the version.

    Raises ``StoreCorruptError`` / ``StoreVersionError`` before anything writes to the file
    (the journal mode included); SQLite's own errors pass through to the caller.
    """
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    # Reading the schema cookie forces SQLite to read and validate the header.
    conn.execute("PRAGMA schema_version").fetchone()
    check_identity(conn, path)
    if integrity != "off":
        problems = integrity_problems(conn, full=integrity == "full")
        if problems:
            raise StoreCorruptError(path, "integrity check failed: " + "; ".join(problems))
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > supported:
        raise StoreVersionError(path, version, supported)
    return int(version)


def judge_read_only(path: str, busy_timeout_s: float, integrity: str,
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
        return examine(conn, path, busy_timeout_s=busy_timeout_s, integrity=integrity,
                       supported=supported)
    except sqlite3.Error as exc:
        if is_damage(exc):
            raise StoreCorruptError(path, str(exc)) from exc
        return None
    finally:
        conn.close()


def check_file(path: str | os.PathLike[str], *, integrity: str = "full",
               busy_timeout_s: float = 5.0,
               migrations: Sequence[Migration] = MIGRATIONS) -> int | None:
    """Judge the file at ``path`` as ``Store.open`` would, without creating, migrating or
    writing it: its schema version (0: empty), or None when there is no file.

    Raises what ``open`` raises (``StoreCorruptError``, ``StoreVersionError``), and
    ``StoreError`` when only a writer could judge it (an interrupted transaction).
    """
    check_integrity_mode(integrity)
    path = os.fspath(path)
    if path == ":memory:":
        raise StoreError("an in-memory store has no file to check")
    if not os.path.lexists(path):
        return None
    precheck_file(path)
    supported = migrations[-1].version if migrations else 0
    version = judge_read_only(path, busy_timeout_s, integrity, supported)
    if version is None:
        raise StoreError(
            f"state file {path} cannot be judged without writing to it: an interrupted "
            f"transaction or its WAL waits for a writer to roll it back; the daemon's next "
            f"start (or `{RECOVER_COMMAND}`) opens it read-write and finishes that")
    return version


def check_identity(conn: sqlite3.Connection, path: str) -> None:
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


def integrity_problems(conn: sqlite3.Connection, full: bool) -> list[str]:
    """What ``integrity_check`` (``full``) or ``quick_check`` finds; empty when sound."""
    pragma = "integrity_check" if full else "quick_check"
    factory = conn.text_factory
    # The report quotes damaged pages, which need not be UTF-8: read it as text, whatever it
    # holds (a decode error here would escape as a non-store error).
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    try:
        rows = [str(r[0]) for r in conn.execute(f"PRAGMA {pragma}(5)")]
    except sqlite3.DatabaseError as exc:
        # Some damage stops the check itself ("database disk image is malformed").
        if is_damage(exc):
            return [str(exc)]
        raise
    except UnicodeDecodeError as exc:
        # SQLite's own error message quoted damaged bytes: the file is damaged all the same.
        return [f"{pragma} failed on bytes that are not text ({exc.reason})"]
    finally:
        conn.text_factory = factory
    if rows == ["ok"]:
        return []
    return [line.strip() for row in rows for line in row.splitlines()
            if line.strip() and not line.startswith("***")][:5]
