"""Damaged or unreadable state files: each kind is refused with ``StoreCorruptError``, whose
message names the file and the recovery procedure, the file is left as it was, and
``Store.quarantine_corrupt`` moves it aside so the next start begins empty.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import tempfile
from pathlib import Path

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Result, Status
from gpu_monitor.runner import RunOutcome
from gpu_monitor.state import Store, StoreCorruptError, StoreError


def assert_recovery_text(err: StoreCorruptError, path: str) -> None:
    text = str(err)
    assert err.path == path
    assert path in text
    assert "stop the daemon" in text
    assert f"move {path} aside to {path}.corrupt-" in text
    assert "restart" in text and "empty history" in text
    assert "re-read from the node's labels" in text


def _populated(path: str, n: int = 300) -> None:
    """A real store file with several pages of results, checkpointed into the main file."""
    clock = FakeClock()
    with Store.open(path, clock) as s:
        for i in range(n):
            r = Result("ecc_memory", Status.OK, f"gpu:{i % 8}", message="m" * 200,
                       observed_at=clock.now())
            s.record_run(RunOutcome("ecc_memory", (r,), clock.now(), 0.1, True))
            clock.advance(1)


def _damage_a_leaf_page(path: str) -> None:
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
    _populated(path, 20)
    Path(path).write_bytes(Path(path).read_bytes()[:100])


def make_truncated_mid_file(path: str) -> None:
    _populated(path)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2 + 123])


def make_malformed_page(path: str) -> None:
    _populated(path)
    _damage_a_leaf_page(path)


def make_foreign_sqlite(path: str) -> None:
    raw = sqlite3.connect(path)
    raw.executescript("PRAGMA application_id = 1234; CREATE TABLE moz_places (id INTEGER);")
    raw.close()


def make_unversioned_tables(path: str) -> None:
    raw = sqlite3.connect(path)
    raw.executescript("CREATE TABLE results (id INTEGER); INSERT INTO results VALUES (1);")
    raw.close()


FILE_VARIANTS = [
    ("garbage-bytes", make_garbage, "not a database"),
    ("json-file", make_not_sqlite, "not a database"),
    ("truncated-header", make_truncated_header, "malformed"),
    ("truncated-mid-file", make_truncated_mid_file, "malformed"),
    ("malformed-page", make_malformed_page, "integrity check failed"),
    ("another-applications-db", make_foreign_sqlite, "another application"),
    ("tables-without-version", make_unversioned_tables, "not a gpu-monitor state file"),
]


@pytest.mark.parametrize(("make", "detail"), [v[1:] for v in FILE_VARIANTS],
                         ids=[v[0] for v in FILE_VARIANTS])
def test_damaged_file_is_refused_with_the_recovery_procedure(tmp_path, make, detail):
    path = str(tmp_path / "state.db")
    make(path)
    before = Path(path).read_bytes()
    with pytest.raises(StoreCorruptError) as ei:
        Store.open(path)
    assert detail in ei.value.detail
    assert_recovery_text(ei.value, path)
    assert Path(path).read_bytes() == before  # nothing written to a damaged file


def test_full_integrity_check_also_catches_the_damaged_page(tmp_path):
    path = str(tmp_path / "state.db")
    make_malformed_page(path)
    with pytest.raises(StoreCorruptError, match="integrity check failed"):
        Store.open(path, integrity="full")


def test_integrity_off_skips_the_scan_but_queries_still_fail_cleanly(tmp_path):
    path = str(tmp_path / "state.db")
    make_malformed_page(path)
    with Store.open(path, integrity="off") as s:
        assert s.check_integrity(full=False) != []
        with pytest.raises(StoreCorruptError) as ei:
            s.results_for("ecc_memory")
        assert_recovery_text(ei.value, path)
        assert s.check_integrity(full=True) != []  # the store stays usable for diagnosis


def test_a_directory_in_place_of_the_file_is_refused(tmp_path):
    path = str(tmp_path / "state.db")
    os.mkdir(path)
    with pytest.raises(StoreCorruptError) as ei:
        Store.open(path)
    assert "directory" in ei.value.detail
    assert_recovery_text(ei.value, path)


def test_a_file_we_may_not_read_and_write_is_refused(tmp_path):
    # Root opens anything: as root, act as the unprivileged user nobody for the open.
    as_root = os.geteuid() == 0
    work = tempfile.mkdtemp(prefix="gpu-monitor-perm-") if as_root else str(tmp_path)
    try:
        os.chmod(work, 0o777)
        path = os.path.join(work, "state.db")
        _populated(path, 5)
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR if as_root else 0)
        if as_root:
            os.setegid(65534)
            os.seteuid(65534)
        try:
            with pytest.raises(StoreCorruptError) as ei:
                Store.open(path)
        finally:
            if as_root:
                os.seteuid(0)
                os.setegid(0)
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
        assert "permission denied" in ei.value.detail
        assert_recovery_text(ei.value, path)
    finally:
        if as_root:
            shutil.rmtree(work)


def test_an_empty_file_is_a_new_store_not_a_corrupt_one(tmp_path):
    path = str(tmp_path / "state.db")
    Path(path).write_bytes(b"")
    with Store.open(path) as s:
        assert s.latest_results() == []


def test_an_uncreatable_state_directory_is_a_store_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create the state directory") as ei:
        Store.open(str(blocker / "state.db"))
    assert not isinstance(ei.value, StoreCorruptError)


# --- quarantine_corrupt ----------------------------------------------------------------------------


def test_quarantine_moves_the_file_aside_and_the_next_open_starts_empty(tmp_path):
    path = str(tmp_path / "state.db")
    make_garbage(path)
    content = Path(path).read_bytes()
    with pytest.raises(StoreCorruptError) as ei:
        Store.open(path)
    moved = Store.quarantine_corrupt(ei.value.path, FakeClock())
    assert moved.startswith(path + ".corrupt-")
    assert not os.path.exists(path)
    assert Path(moved).read_bytes() == content
    with Store.open(path) as s:
        assert s.latest_results() == [] and s.node_state().since is None


def test_quarantine_takes_the_wal_along_under_a_matching_name(tmp_path):
    path = str(tmp_path / "state.db")
    _populated(path, 3)
    Path(path + "-wal").write_bytes(b"wal bytes")
    Path(path + "-shm").write_bytes(b"shm bytes")
    moved = Store.quarantine_corrupt(path)
    assert Path(moved + "-wal").read_bytes() == b"wal bytes"
    assert Path(moved + "-shm").read_bytes() == b"shm bytes"
    assert not any(os.path.exists(path + s) for s in ("", "-wal", "-shm"))


def test_quarantining_twice_in_the_same_second_keeps_both_copies(tmp_path):
    path = str(tmp_path / "state.db")
    clock = FakeClock()
    make_garbage(path)
    first = Store.quarantine_corrupt(path, clock)
    make_not_sqlite(path)
    second = Store.quarantine_corrupt(path, clock)
    assert first != second
    assert Path(first).read_bytes() == bytes(range(256)) * 16
    assert "quarantined" in Path(second).read_text()


def test_quarantine_of_a_missing_file_says_so(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        Store.quarantine_corrupt(str(tmp_path / "absent.db"))
    with pytest.raises(StoreError, match="in-memory"):
        Store.quarantine_corrupt(":memory:")


def test_quarantine_moves_a_directory_too(tmp_path):
    path = str(tmp_path / "state.db")
    os.mkdir(path)
    moved = Store.quarantine_corrupt(path)
    assert os.path.isdir(moved)
    Store.open(path).close()
