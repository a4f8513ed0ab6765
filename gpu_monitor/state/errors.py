"""What the state store raises: one ``StoreError`` family, never a bare ``sqlite3`` exception.

Why it exists: an operator reading a crash-looping pod's log must learn which file is wrong, in
what way, and the one command that fixes it. SQLite says "file is not a database" or "disk I/O
error"; ``classify`` turns its result code into the ``StoreError`` subclass that names the file
and the fix, and every other module of the store raises through it.
"""

from __future__ import annotations

import sqlite3

__all__ = [
    "CORRUPT_CAUSES",
    "RECOVER_COMMAND",
    "StoreCorruptError",
    "StoreError",
    "StoreVersionError",
    "classify",
    "is_damage",
]


class StoreError(Exception):
    """The state store cannot do what was asked; the message is meant for an operator."""


# The one command that moves a damaged file aside (state/cli.py); every message and
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


def classify(exc: sqlite3.Error, path: str, opening: bool) -> StoreError:
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



def is_damage(exc: sqlite3.Error) -> bool:
    """Whether SQLite says the bytes themselves are bad: corrupt, or not a database at all."""
    return _primary_code(exc) in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
