"""Real damaged state files, for the store's, the CLI's and the daemon's recovery tests.

Each maker turns ``path`` into one kind of bad file the way it happens in the field: a real
store file (several pages of results, checkpointed) cut short or with a broken page, bytes that
were never a database, another program's SQLite file, a newer release's file. ``DAMAGED`` are
the kinds recovery moves aside (with the detail SQLite gives); ``REFUSED`` are the kinds it must
leave alone.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import tempfile
from pathlib import Path

from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Result, RunOutcome, Status
from gpu_monitor.state import Store
from gpu_monitor.state.schema import LATEST_VERSION


def populated(path: str, n: int = 300) -> None:
    """A real store file with several pages of results, checkpointed into the main file."""
    clock = FakeClock()
    with Store.open(path, clock) as s:
        for i in range(n):
            r = Result("ecc_memory", Status.OK, f"gpu:{i % 8}", message="m" * 200,
                       observed_at=clock.now())
            s.record_run(RunOutcome("ecc_memory", (r,), clock.now(), 0.1, True))
            clock.advance(1)


def damage_a_leaf_page(path: str) -> None:
    """Break one table leaf page that is no table's root, keeping header and schema readable."""
    raw = sqlite3.connect(path)
    try:
        page_size = raw.execute("PRAGMA page_size").fetchone()[0]
        roots = {r[0] for r in raw.execute("SELECT rootpage FROM sqlite_master")}
    finally:
        raw.close()
    data = bytearray(Path(path).read_bytes())
    # From the end: the schema's own leaf pages come first and would fail before the check.
    for page in range(len(data) // page_size, 1, -1):
        offset = (page - 1) * page_size
        if page not in roots and data[offset] == 0x0D:  # 0x0D: b-tree table leaf page
            data[offset] = 0x00
            Path(path).write_bytes(bytes(data))
            return
    raise AssertionError("no non-root leaf page to damage")


def make_garbage(path: str) -> None:
    Path(path).write_bytes(bytes(range(256)) * 16)


def make_not_sqlite(path: str) -> None:
    Path(path).write_text(json.dumps({"state": "quarantined", "since": "yesterday"}) + "\n")


def make_truncated_header(path: str) -> None:
    populated(path, 20)
    Path(path).write_bytes(Path(path).read_bytes()[:100])


def make_truncated_mid_file(path: str) -> None:
    populated(path)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2 + 123])


def make_malformed_page(path: str) -> None:
    populated(path)
    damage_a_leaf_page(path)


def make_malformed_page_with_live_wal(path: str) -> None:
    """A broken page in the main file while its WAL still holds committed transactions (a
    daemon killed before a checkpoint): the WAL must survive the judgement and move along."""
    src = os.path.join(os.path.dirname(path), "writer.db")
    populated(src)
    shutil.copyfile(src, path)
    damage_a_leaf_page(path)
    store = Store.open(src)
    try:
        for i in range(20):
            store.set_kv("baseline", f"gpu:{i}", {"value": i, "pad": "x" * 300})
        assert os.path.getsize(src + "-wal") > 0
        shutil.copyfile(src + "-wal", path + "-wal")
    finally:
        store.close()
    for name in ("", "-wal", "-shm"):
        if os.path.exists(src + name):
            os.unlink(src + name)


def make_foreign_sqlite(path: str) -> None:
    raw = sqlite3.connect(path)
    raw.executescript("PRAGMA application_id = 1234; CREATE TABLE moz_places (id INTEGER);")
    raw.close()


def make_unversioned_tables(path: str) -> None:
    raw = sqlite3.connect(path)
    raw.executescript("CREATE TABLE results (id INTEGER); INSERT INTO results VALUES (1);")
    raw.close()


def make_newer_version(path: str) -> None:
    """A sound file written by a release one schema version ahead of this one."""
    populated(path, 20)
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {LATEST_VERSION + 1}")
    raw.commit()
    raw.close()


def make_directory(path: str) -> None:
    os.mkdir(path)
    Path(path, "stray").write_text("x")


# (id, maker, the detail SQLite or the store gives)
DAMAGED = [
    ("garbage-bytes", make_garbage, "not a database"),
    ("json-file", make_not_sqlite, "not a database"),
    ("truncated-header", make_truncated_header, "malformed"),
    ("truncated-mid-file", make_truncated_mid_file, "malformed"),
    ("malformed-page", make_malformed_page, "integrity check failed"),
    ("malformed-page-live-wal", make_malformed_page_with_live_wal, "integrity check failed"),
    ("another-applications-db", make_foreign_sqlite, "another application"),
    ("tables-without-version", make_unversioned_tables, "not a gpu-monitor state file"),
]

COMPANIONS = ("", "-wal", "-shm", "-journal")


def snapshot(path: str) -> dict[str, bytes]:
    """The bytes of the file and each companion that exists (a directory: its listing)."""
    out = {}
    for suffix in COMPANIONS:
        p = path + suffix
        if os.path.isdir(p):
            out[suffix] = repr(sorted(os.listdir(p))).encode()
        elif os.path.exists(p):
            out[suffix] = Path(p).read_bytes()
    return out


def assert_untouched(path: str, before: dict[str, bytes]) -> None:
    """The file and every companion it had are byte for byte as in ``before``. A read-only look
    at a WAL-mode file may add what any SQLite reader adds: an empty ``-wal`` and a ``-shm``
    (an index of the WAL, no data)."""
    after = snapshot(path)
    assert {k: after.get(k) for k in before} == before
    added = set(after) - set(before)
    assert added <= {"-wal", "-shm"}, added
    if "-wal" in added:
        assert after["-wal"] == b""


class Unreadable:
    """A sound store file that the running user may not read and write.

    Root opens anything, so as root the file is owned by root with mode 0600 and ``denied()``
    acts as the unprivileged user nobody while the code under test runs.
    """

    def __init__(self, tmp_path: Path):
        self.as_root = os.geteuid() == 0
        self.work = tempfile.mkdtemp(prefix="gpu-monitor-perm-") if self.as_root else str(
            tmp_path)
        os.chmod(self.work, 0o777)
        self.path = os.path.join(self.work, "state.db")
        populated(self.path, 5)
        os.chmod(self.path, stat.S_IRUSR | stat.S_IWUSR if self.as_root else 0)

    def __enter__(self):
        if self.as_root:
            os.setegid(65534)
            os.seteuid(65534)
        return self

    def __exit__(self, *exc):
        if self.as_root:
            os.seteuid(0)
            os.setegid(0)

    def cleanup(self) -> None:
        os.chmod(self.path, stat.S_IRUSR | stat.S_IWUSR)
        if self.as_root:
            shutil.rmtree(self.work)


def unreadable_file(tmp_path: Path):
    """A generator for a test module's ``unreadable`` fixture (``yield from`` it)."""
    u = Unreadable(tmp_path)
    try:
        yield u
    finally:
        u.cleanup()
