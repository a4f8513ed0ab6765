"""Schema versions: a database built by the raw SQL of version 1, holding data, migrates to the
latest version without losing any of it; a newer file is refused untouched; a failing step leaves
the previous version intact.
"""

from __future__ import annotations

import hashlib
import sqlite3
from datetime import timedelta

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Result, RunOutcome, Status
from gpu_monitor.state import Store
from gpu_monitor.state.errors import StoreCorruptError, StoreError, StoreVersionError
from gpu_monitor.state.kernel_log import XidEvent
from gpu_monitor.state.schema import APPLICATION_ID, LATEST_VERSION, MIGRATIONS, Migration

# Each shipped migration's SQL as SHA-256 over its statements with white space folded (one
# line a statement). Files in the field were built by exactly this text, so a digest that no
# longer matches means a shipped migration was edited: add a new migration instead. Holding
# the digest, not a second copy of the DDL, keeps one text of each version: the v1 file below
# is built from the very SQL this pins. A new migration adds its line here when it is written.
SHIPPED_SHA256 = {
    1: "4e2251452901b8def3d4543a7a68824dfe6059342d4aad12b42732019ce8c1ac",
    2: "0b0dc7a7bd7e65d8f021daef21105fe410a13edff8d11a0672df93e29f6974ef",
    3: "3699626d7d3788681bfe505e70f2ba56fcd90f93f75172ed524bb02ea9daecfd",
    4: "b66b2376778b8c888a0f5db557a2904179f383518ab6a6edd080447f4031141d",
}


def _normalise(script: str) -> list[str]:
    return [" ".join(stmt.split()) for stmt in script.split(";") if stmt.strip()]


def _us(ts) -> int:
    return int(round(ts.timestamp() * 1_000_000))


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _digest(script: str) -> str:
    return hashlib.sha256("\n".join(_normalise(script)).encode()).hexdigest()


def test_shipped_migrations_are_frozen():
    assert MIGRATIONS[0].version == 1
    assert {m.version for m in MIGRATIONS} == set(SHIPPED_SHA256)
    for m in MIGRATIONS:
        assert isinstance(m.apply, str), f"v{m.version}: pin a function migration another way"
        assert _digest(m.apply) == SHIPPED_SHA256[m.version], f"shipped v{m.version} was edited"


def test_migration_versions_are_consecutive_from_one():
    assert [m.version for m in MIGRATIONS] == list(range(1, LATEST_VERSION + 1))
    assert LATEST_VERSION >= 3


@pytest.fixture
def v1_db(tmp_path):
    """A version-1 file with data in it, written by the shipped v1 SQL alone (pinned by
    test_shipped_migrations_are_frozen), without the store's code."""
    path = str(tmp_path / "state.db")
    t0 = _us(FakeClock().now())
    raw = sqlite3.connect(path)
    raw.executescript(MIGRATIONS[0].apply)
    raw.executescript(f"""
        PRAGMA user_version = 1;
        -- gpu:0 arrived newest first (ids out of time order): the backfill must go by time
        INSERT INTO results (check_name, target, status, reason, message, details, action,
                             observed_us)
        VALUES ('ecc_memory', 'gpu:0', 'failed', 'RowRemapPending', 'newest', '{{"pending_rows":1}}',
                'reset_gpu', {t0 + 20_000_000}),
               ('ecc_memory', 'gpu:0', 'ok', 'Ok', 'oldest', '{{}}', 'none', {t0}),
               ('ecc_memory', 'gpu:0', 'ok', 'Ok', 'middle', '{{}}', 'none', {t0 + 10_000_000}),
               ('pcie', 'pcie:0000:3b:00.0', 'ok', 'Ok', 'pcie', '{{}}', 'none', {t0 + 5_000_000});
        INSERT INTO runs VALUES ('ecc_memory', {t0 + 20_000_000}, 0.5, 1);
        INSERT INTO reason_counters VALUES ('ecc_memory', 'Ok', 41), ('ecc_memory', 'RowRemapPending', 1);
        INSERT INTO kmsg_boots (boot_id, high_water, first_seen_us) VALUES ('boot-a', 3970, {t0});
        INSERT INTO kmsg_seen VALUES ('boot-a', 3970, {t0});
        INSERT INTO xid_events (boot_id, seq, observed_us, code, pci_bus_id, gpu_uuid, gpu_index,
                                kind, message, fatal)
        VALUES ('boot-a', 3970, {t0}, 79, '0000:91:00.0', 'GPU-b6c3', 4, 'xid', 'fell off', 1);
        INSERT INTO xid_counters VALUES ('xid', 4, 'GPU-b6c3', 79, 1);
        INSERT INTO ports VALUES ('mlx5_0', 1, 30000000, 2);
        INSERT INTO port_down (device, port, start_us, end_us) VALUES ('mlx5_0', 1, {t0}, NULL);
        INSERT INTO kv VALUES ('rdma_ports', 'baseline', '{{"link_downed":3}}', {t0});
        INSERT INTO node_state VALUES (1, 'quarantined', {t0}, 'Xid79', 1);
        INSERT INTO node_state_history (at_us, from_state, to_state, reason)
        VALUES ({t0}, 'healthy', 'quarantined', 'Xid79');
        INSERT INTO actions (action, result, at_us, details) VALUES ('cordon', 'ok', {t0}, '{{}}');
        INSERT INTO action_counters VALUES ('cordon', 'ok', 1);
    """)
    raw.close()
    return path


def test_v1_file_migrates_to_latest_keeping_its_data(v1_db):
    clock = FakeClock()
    with Store.open(v1_db, clock) as s:
        assert s.schema_version == LATEST_VERSION
        latest = {r.target: r.message for r in s.latest_results()}
        assert latest == {"gpu:0": "newest", "pcie:0000:3b:00.0": "pcie"}
        assert [r.message for r in s.results_for("ecc_memory", target="gpu:0")] == \
            ["oldest", "middle", "newest"]
        run = s.last_run("ecc_memory")
        assert (run.success, run.error) == (True, "")  # the column v3 added, defaulted
        assert s.reason_counts() == {("ecc_memory", "Ok"): 41,
                                     ("ecc_memory", "RowRemapPending"): 1}
        assert s.kmsg_high_water("boot-a") == 3970
        assert s.xid_counts() == {(4, "GPU-b6c3", 79): 1}
        assert s.port_down_total_s("mlx5_0", 1, now=clock.now() + timedelta(seconds=5)) == \
            pytest.approx(35)
        assert s.get_kv("rdma_ports", "baseline") == {"link_downed": 3}
        state = s.node_state()
        assert (state.state, state.retest_failures, len(state.history)) == ("quarantined", 1, 1)
        assert s.action_counts() == {("cordon", "ok"): 1}
        # What the later versions brought works on the migrated file.
        assert s.add_health_report("uid-1", "node-a", "SdcSuspected", "cr", clock.now())
        clock.advance(60)
        s.record_run(RunOutcome("ecc_memory", (Result("ecc_memory", Status.OK, "gpu:0",
                                                      observed_at=clock.now()),),
                                clock.now(), 0.1, False, "timeout"))
        assert s.last_run("ecc_memory").error == "timeout"
        assert s.reason_counts()[("ecc_memory", "Ok")] == 42
        # The latest-result pointers protect the latest rows from pruning.
        clock.advance(3600)
        assert s.prune(timedelta(minutes=1))["results"] == 3
        assert len(s.latest_results()) == 2
    raw = sqlite3.connect(v1_db)
    try:
        assert raw.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "results_by_key_time" in indexes
    finally:
        raw.close()


def test_each_migration_step_is_recorded_in_user_version(v1_db):
    with Store.open(v1_db, migrations=MIGRATIONS[:2]) as s:
        assert s.schema_version == 2
    with Store.open(v1_db) as s:
        assert s.schema_version == LATEST_VERSION


def test_fresh_file_and_migrated_file_have_the_same_schema(v1_db, tmp_path):
    fresh = str(tmp_path / "fresh.db")
    Store.open(fresh).close()
    Store.open(v1_db).close()

    def schema(path):
        raw = sqlite3.connect(path)
        try:
            return sorted(" ".join((sql or "").split()) for (sql,) in raw.execute(
                "SELECT sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))
        finally:
            raw.close()

    assert schema(fresh) == schema(v1_db)


def test_newer_schema_is_refused_and_the_file_left_untouched(tmp_path):
    path = str(tmp_path / "state.db")
    Store.open(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {LATEST_VERSION + 1}")
    raw.close()
    digest = _sha(path)
    with pytest.raises(StoreVersionError) as ei:
        Store.open(path)
    err = ei.value
    assert isinstance(err, StoreError) and not isinstance(err, StoreCorruptError)
    assert (err.found, err.supported) == (LATEST_VERSION + 1, LATEST_VERSION)
    assert path in str(err) and "newer" in str(err) and "never downgraded" in str(err)
    assert _sha(path) == digest
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION + 1
    finally:
        raw.close()


def test_a_failing_migration_rolls_back_to_the_previous_version(tmp_path):
    path = str(tmp_path / "state.db")
    Store.open(path).close()
    broken = Migration(LATEST_VERSION + 1, "broken on purpose",
                       "CREATE TABLE half_done (a INTEGER);\n"
                       "INSERT INTO no_such_table VALUES (1);\n")
    with pytest.raises(StoreError, match="no such table"):
        Store.open(path, migrations=(*MIGRATIONS, broken))
    with Store.open(path) as s:
        assert s.schema_version == LATEST_VERSION
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'"
                           ).fetchall() == []
    finally:
        raw.close()


def test_a_python_migration_runs_and_then_older_code_refuses_the_file(tmp_path):
    path = str(tmp_path / "state.db")

    def add_table(conn):
        conn.execute("CREATE TABLE future_feature (a INTEGER)")

    future = (*MIGRATIONS, Migration(LATEST_VERSION + 1, "future", add_table))
    with Store.open(path, migrations=future) as s:
        assert s.schema_version == LATEST_VERSION + 1
    with pytest.raises(StoreVersionError):
        Store.open(path)


def test_misnumbered_migrations_are_a_programming_error(tmp_path):
    bad = (MIGRATIONS[0], Migration(3, "skips two", "SELECT 1;"))
    with pytest.raises(ValueError, match="numbered"):
        Store.open(str(tmp_path / "state.db"), migrations=bad)


def test_v3_file_gains_the_xid_indexes_keeping_its_events(tmp_path):
    path = str(tmp_path / "state.db")
    clock = FakeClock()
    with Store.open(path, clock, migrations=MIGRATIONS[:3]) as s:
        for seq in range(5):
            s.add_xid_event(XidEvent(boot_id="boot-a", seq=seq, observed_at=clock.now(),
                                     code=13 if seq % 2 else 79, pci_bus_id="0000:53:00.0",
                                     gpu_uuid="GPU-b6c3", gpu_index=4, kind="xid",
                                     message=f"event {seq}", fatal=seq % 2 == 0))
            clock.advance(1)
        before = s.xid_events()
    with Store.open(path, clock) as s:
        assert s.schema_version == LATEST_VERSION
        assert s.xid_events() == before and len(before) == 5
        assert [e.seq for e in s.xid_events(uuid="GPU-b6c3", code=79, kind="xid")] == [0, 2, 4]
        assert s.xid_counts() == {(4, "GPU-b6c3", 13): 2, (4, "GPU-b6c3", 79): 3}
    raw = sqlite3.connect(path)
    try:
        plan = " ".join(str(r[-1]) for r in raw.execute(
            "EXPLAIN QUERY PLAN SELECT seq FROM xid_events WHERE gpu_uuid = ? AND code = ?"
            " AND kind = ? ORDER BY observed_us, id", ("GPU-b6c3", 79, "xid")))
        assert "xid_events_by_gpu_code_time" in plan  # a history read is not a table scan
    finally:
        raw.close()
