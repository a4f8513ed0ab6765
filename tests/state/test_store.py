"""The state store's API: results, runs, counters, kernel-log marks, XID history, key/value
state, quarantine state, actions, health reports, restart persistence and thread safety.

Downtime windows: test_ports.py. Migrations: test_schema.py. Corrupt files: test_recovery.py.
Crashes: test_store_crash.py.
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
from datetime import timedelta

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.model import Action, Result, RunOutcome, Status, iso
from gpu_monitor.state import Store
from gpu_monitor.state.errors import StoreError
from gpu_monitor.state.kernel_log import XidEvent
from gpu_monitor.state.node import ActionRecord, NodeStateChange
from gpu_monitor.state.results import RunInfo
from gpu_monitor.state.schema import LATEST_VERSION


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "state" / "state.db")


@pytest.fixture
def store(db_path, clock):
    with Store.open(db_path, clock) as s:
        yield s


def _result(clock, check="ecc_memory", target="gpu:0", status=Status.OK, reason="Ok",
            **kw) -> Result:
    return Result(check=check, status=status, target=target, reason=reason,
                  observed_at=clock.now(), **kw)


def _outcome(clock, *results: Result, check: str | None = None, success=True, error="",
             duration_s=0.25) -> RunOutcome:
    name = check or results[0].check
    return RunOutcome(name, tuple(results), clock.now(), duration_s, success, error)


# --- opening -----------------------------------------------------------------------------------


def test_open_creates_parent_directories_and_a_wal_file(db_path):
    with Store.open(db_path) as s:
        assert s.path == db_path
        assert s.schema_version == LATEST_VERSION
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


def test_connection_uses_normal_sync_foreign_keys_and_a_busy_timeout(store):
    conn = store._conn  # the pragmas are per connection: only the store's own can tell
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000


def test_memory_store_works_without_a_file(clock):
    with Store.open(":memory:", clock) as s:
        s.record_run(_outcome(clock, _result(clock)))
        assert [r.target for r in s.latest_results()] == ["gpu:0"]
        assert s.schema_version == LATEST_VERSION


def test_closed_store_raises_store_error_and_close_is_idempotent(db_path, clock):
    s = Store.open(db_path, clock)
    with s:
        pass
    assert s.closed
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.latest_results()
    with pytest.raises(StoreError, match="closed"):
        s.set_kv("ns", "k", 1)


def test_a_write_nested_in_a_read_snapshot_is_refused(store):
    with store._read(), pytest.raises(RuntimeError, match="nest"):
        store.set_kv("ns", "k", 1)
    store.set_kv("ns", "k", 2)  # the store is usable afterwards
    assert store.get_kv("ns", "k") == 2


def test_naive_datetimes_are_refused(store, clock):
    with pytest.raises(ValueError, match="naive"):
        store.port_down_start("mlx5_0", 1, clock.now().replace(tzinfo=None))


def test_unknown_integrity_mode_is_a_usage_error(db_path):
    with pytest.raises(ValueError, match="integrity"):
        Store.open(db_path, integrity="sometimes")


# --- results, runs, reason counters ------------------------------------------------------------


def test_latest_results_keeps_the_newest_per_check_and_target(store, clock):
    first = _result(clock, target="gpu:0")
    remap = _result(clock, target="gpu:1", status=Status.FAILED, reason="RowRemapPending",
                    message="row remap pending", details={"pending_rows": 1},
                    action=Action.RESET_GPU)
    store.record_run(_outcome(clock, first, remap))
    clock.advance(30)
    newer = _result(clock, target="gpu:0", status=Status.DEGRADED, reason="RemapHeadroomLow",
                    details={"banks_low": 3, "threshold_banks_low": 2})
    store.record_run(_outcome(clock, newer))
    assert store.latest_results() == [newer, remap]


def test_latest_follows_observation_time_not_arrival_order(store, clock):
    late_arrival = _result(clock, target="gpu:2", reason="Ok")
    clock.advance(10)
    current = _result(clock, target="gpu:2", status=Status.FAILED, reason="RowRemapFailure")
    store.record_run(_outcome(clock, current))
    store.record_run(_outcome(clock, late_arrival))
    assert store.latest_results() == [current]


@pytest.mark.parametrize("seed", range(20))
def test_one_run_of_many_results_stores_what_the_results_one_by_one_do(tmp_path, clock, seed):
    """record_run updates each target's latest result once: the last of the run's results
    with its greatest time, which is what applying them one by one leaves (ties go to the
    later, an older one never replaces a newer, an earlier stored one may stay newest)."""
    import random

    rng = random.Random(seed)
    t0 = clock.now()
    earlier = [_result(clock, target=f"gpu:{g}", message="stored before") for g in range(3)]
    results = [Result(check="xid", status=Status.OK, target=f"gpu:{rng.randrange(3)}",
                      message=str(i), observed_at=t0 + timedelta(seconds=rng.randrange(-2, 3)))
               for i in range(rng.randrange(1, 12))]
    with Store.open(str(tmp_path / "whole.db"), clock) as whole, \
            Store.open(str(tmp_path / "parts.db"), clock) as parts:
        for s in (whole, parts):
            s.record_run(_outcome(clock, *[replace_check(r) for r in earlier], check="xid"))
        whole.record_run(_outcome(clock, *results))
        for r in results:
            parts.record_run(_outcome(clock, r))
        assert whole.latest_results() == parts.latest_results()
        assert whole.result_rows() == parts.result_rows()


def replace_check(r: Result) -> Result:
    return Result(check="xid", status=r.status, target=r.target, message=r.message,
                  observed_at=r.observed_at)


def test_result_fields_round_trip_exactly(store, clock):
    r = _result(clock, check="nccl_allreduce", target="node", status=Status.FAILED,
                reason="BusBandwidthLow", message="busbw 201 GB/s < floor 460 GB/s",
                details={"busbw_gb_per_s": 201.5, "floor_gb_per_s": 460,
                         "sizes": [8, 1 << 31], "per_size": {"8": {"p95_us": 31.5}}},
                action=Action.WATCH)
    store.record_run(_outcome(clock, r))
    (back,) = store.results_for("nccl_allreduce")
    assert back == r
    assert back.to_dict() == r.to_dict()


def test_nan_in_details_is_stored_as_null(store, clock):
    r = _result(clock, details={"ratio": math.nan})
    store.record_run(_outcome(clock, r))
    (back,) = store.results_for("ecc_memory")
    assert back.details["ratio"] is None


def test_results_for_filters_by_time_and_target_oldest_first(store, clock):
    t0 = clock.now()
    for i in range(4):
        store.record_run(_outcome(clock, _result(clock, target="gpu:0", message=str(i)),
                                  _result(clock, target="gpu:1", message=str(i))))
        clock.advance(60)
    assert [r.message for r in store.results_for("ecc_memory", target="gpu:1")] == \
        ["0", "1", "2", "3"]
    since = store.results_for("ecc_memory", since=t0 + timedelta(seconds=120))
    assert [(r.target, r.message) for r in since] == \
        [("gpu:0", "2"), ("gpu:1", "2"), ("gpu:0", "3"), ("gpu:1", "3")]
    newest_two = store.results_for("ecc_memory", target="gpu:0", limit=2)
    assert [r.message for r in newest_two] == ["2", "3"]
    assert store.results_for("no_such_check") == []


def test_last_run_and_runs_report_duration_success_and_error(store, clock):
    assert store.last_run("burn_in") is None
    started = clock.now()
    store.record_run(_outcome(clock, _result(clock, check="burn_in", reason="Timeout",
                                             status=Status.UNKNOWN),
                              success=False, error="timeout", duration_s=61.5))
    store.record_run(_outcome(clock, _result(clock, check="pcie")))
    assert store.last_run("burn_in") == RunInfo("burn_in", started, 61.5, False, "timeout")
    assert set(store.runs()) == {"burn_in", "pcie"}
    assert store.runs()["pcie"].success is True


def test_an_older_run_recorded_late_does_not_replace_the_last_run(store, clock):
    old = _outcome(clock, _result(clock, check="pcie"), duration_s=1.0)
    clock.advance(5)
    new = _outcome(clock, _result(clock, check="pcie"), duration_s=2.0)
    store.record_run(new)
    store.record_run(old)
    assert store.last_run("pcie").duration_s == 2.0


def test_a_run_with_no_results_still_records_the_run(store, clock):
    store.record_run(RunOutcome("xid", (), clock.now(), 0.01, True))
    assert store.last_run("xid").success
    assert store.latest_results() == []


def test_reason_counts_total_every_result_recorded(store, clock):
    store.record_run(_outcome(clock, _result(clock, target="gpu:0"),
                              _result(clock, target="gpu:1", status=Status.FAILED,
                                      reason="RowRemapPending")))
    store.record_run(_outcome(clock, _result(clock, target="gpu:0")))
    assert store.reason_counts() == {("ecc_memory", "Ok"): 2,
                                     ("ecc_memory", "RowRemapPending"): 1}


def test_prune_drops_old_history_but_keeps_latest_per_key_and_counters(store, clock):
    for i in range(5):
        store.record_run(_outcome(clock, _result(clock, target="gpu:0", message=str(i))))
        clock.advance(60)
    store.record_run(_outcome(clock, _result(clock, target="gpu:7", message="only")))
    clock.advance(3600)
    counts_before = store.reason_counts()
    deleted = store.prune(timedelta(minutes=30))
    assert deleted["results"] == 4
    assert [r.message for r in store.results_for("ecc_memory")] == ["4", "only"]
    assert [r.message for r in store.latest_results()] == ["4", "only"]
    assert store.reason_counts() == counts_before


def test_prune_accepts_an_absolute_cutoff(store, clock):
    store.record_run(_outcome(clock, _result(clock, target="gpu:0", message="old")))
    clock.advance(10)
    cutoff = clock.now()
    store.record_run(_outcome(clock, _result(clock, target="gpu:0", message="new")))
    assert store.prune(cutoff)["results"] == 1
    assert [r.message for r in store.results_for("ecc_memory")] == ["new"]


# --- kernel-log de-duplication -------------------------------------------------------------------


BOOT_A = "0f5d8a52-65b4-4a2f-9a55-9a2d6d3cbd10"
BOOT_B = "9a1c4e2e-1f0b-4d0b-8c5c-3cf4b0a3e7aa"


def test_kmsg_marks_are_exact_per_boot_and_track_the_high_water(store):
    assert store.kmsg_high_water(BOOT_A) is None
    assert not store.kmsg_seen(BOOT_A, 3964)
    store.mark_kmsg(BOOT_A, 3964)
    store.mark_kmsg(BOOT_A, 3970)
    store.mark_kmsg(BOOT_A, 3966)  # out of order: the high water stays
    store.mark_kmsg(BOOT_A, 3970)  # idempotent
    assert store.kmsg_seen(BOOT_A, 3964) and store.kmsg_seen(BOOT_A, 3966)
    assert not store.kmsg_seen(BOOT_A, 3965)
    assert store.kmsg_high_water(BOOT_A) == 3970
    assert store.kmsg_high_water(BOOT_B) is None
    assert not store.kmsg_seen(BOOT_B, 3964)


def test_pruned_kmsg_marks_still_read_as_seen(store, clock):
    for seq in (10, 11, 12):
        store.mark_kmsg(BOOT_A, seq)
    clock.advance(7200)
    store.mark_kmsg(BOOT_A, 40)
    assert store.prune(timedelta(hours=1))["kmsg_seen"] == 3
    assert store.kmsg_seen(BOOT_A, 11)
    assert store.kmsg_seen(BOOT_A, 40)
    assert not store.kmsg_seen(BOOT_A, 39)
    assert store.kmsg_high_water(BOOT_A) == 40


# --- XID / SXid history -------------------------------------------------------------------------

_XID_RE = re.compile(r"NVRM: Xid \((PCI:[0-9a-fA-F:.]+)\): (\d+),")
_SXID_RE = re.compile(r"SXid \((PCI:[0-9a-fA-F:.]+)\): (\d+), (Fatal|Non-fatal)")
UUID_91 = "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"  # the GPU at 0000:91:00 in the same log


def _events_from_fixture(fixtures_dir, clock) -> list[XidEvent]:
    """Events from a real dmesg capture (XID 79 then an NVSwitch SXid 20034 storm)."""
    lines = (fixtures_dir / "xid_kmsg" / "gpud_sxid-readme_dmesg_xid79_sxid20034.log"
             ).read_text().splitlines()
    events = []
    for seq, line in enumerate(lines, start=5000):
        if m := _XID_RE.search(line):
            events.append(XidEvent(BOOT_A, seq, clock.now(), int(m[2]), m[1], UUID_91, 4,
                                   "xid", line.split("] ", 1)[1], True))
        elif m := _SXID_RE.search(line):
            events.append(XidEvent(BOOT_A, seq, clock.now(), int(m[2]), m[1], None, None,
                                   "sxid", line.split("] ", 1)[1], m[3] == "Fatal"))
        clock.advance(0.001)
    return events


def test_xid_events_are_idempotent_and_counted_once(store, clock, fixtures_dir):
    events = _events_from_fixture(fixtures_dir, clock)
    assert [e.code for e in events][:2] == [79, 20034]
    assert all(store.add_xid_event(e) for e in events)
    assert not any(store.add_xid_event(e) for e in events)  # a replay after restart
    counts = store.xid_counts()
    assert counts[(4, UUID_91, 79)] == 1
    assert counts[(None, None, 20034)] == sum(e.code == 20034 for e in events)
    assert store.xid_events() == events


def test_the_history_mark_reads_data_version_once_per_write_transaction(store, db_path,
                                                                          clock):
    """Inside a batch no other connection can commit, so the mark's data_version is read once
    per transaction; between transactions another writer's commit still changes the mark."""
    pragmas: list[str] = []
    store._conn.set_trace_callback(
        lambda sql: pragmas.append(sql) if "data_version" in sql else None)
    with store.batch():
        first = store.xid_history_mark("xid")
        assert store.add_xid_event(XidEvent(BOOT_A, 1, clock.now(), 13, "0000:19:00.0"))
        assert store.xid_history_mark("xid") == first.plus(1)
    assert len(pragmas) == 1
    before = store.xid_history_mark("xid")
    with Store.open(db_path, clock) as other:
        other.add_xid_event(XidEvent(BOOT_A, 2, clock.now(), 13, "0000:19:00.0"))
    with store.batch():
        after = store.xid_history_mark("xid")
    assert after.others != before.others and after.added == before.added
    assert len(pragmas) == 3


def test_xid_event_canonicalises_the_pci_address_from_the_log():
    e = XidEvent(BOOT_A, 1, FakeClock().now(), 79, "PCI:0000:91:00")
    assert e.pci_bus_id == "0000:91:00.0"
    with pytest.raises(ValueError):
        XidEvent(BOOT_A, 1, FakeClock().now(), 79, None, kind="nvlink")


def test_same_record_on_two_gpus_is_two_events(store, clock):
    a = XidEvent(BOOT_A, 77, clock.now(), 74, "0000:19:00.0", "GPU-a", 0)
    b = XidEvent(BOOT_A, 77, clock.now(), 74, "0000:3b:00.0", "GPU-b", 1)
    assert store.add_xid_event(a) and store.add_xid_event(b)
    assert store.xid_counts() == {(0, "GPU-a", 74): 1, (1, "GPU-b", 74): 1}


def test_xid_events_filter_by_time_uuid_code_and_kind(store, clock):
    t0 = clock.now()
    store.add_xid_event(XidEvent(BOOT_A, 1, clock.now(), 48, "0000:19:00.0", "GPU-a", 0))
    clock.advance(60)
    store.add_xid_event(XidEvent(BOOT_A, 2, clock.now(), 63, "0000:19:00.0", "GPU-a", 0))
    store.add_xid_event(XidEvent(BOOT_A, 3, clock.now(), 94, "0000:3b:00.0", "GPU-b", 1))
    store.add_xid_event(XidEvent(BOOT_A, 4, clock.now(), 12028, "0000:05:00.0", kind="sxid"))
    assert [e.seq for e in store.xid_events(since=t0 + timedelta(seconds=30))] == [2, 3, 4]
    assert [e.code for e in store.xid_events(uuid="GPU-a")] == [48, 63]
    assert [e.seq for e in store.xid_events(code=94)] == [3]
    assert [e.code for e in store.xid_events(kind="sxid")] == [12028]
    assert set(store.xid_counts(kind="xid")) == {(0, "GPU-a", 48), (0, "GPU-a", 63),
                                                  (1, "GPU-b", 94)}


def test_xid_counts_survive_pruning_the_events(store, clock):
    store.add_xid_event(XidEvent(BOOT_A, 1, clock.now(), 79, "0000:91:00.0", UUID_91, 4))
    clock.advance(86400)
    assert store.prune(timedelta(hours=1))["xid_events"] == 1
    assert store.xid_events() == []
    assert store.xid_counts() == {(4, UUID_91, 79): 1}


# --- key/value state ---------------------------------------------------------------------------


def test_kv_round_trips_json_values_per_namespace(store):
    baseline = {"mlx5_0:1": {"link_downed": 3, "symbol_error": 0}, "rates": [1.5, 2.0]}
    store.set_kv("rdma_ports", "baseline", baseline)
    store.set_kv("pcie", "baseline", [1, 2])
    assert store.get_kv("rdma_ports", "baseline") == baseline
    assert store.get_kv("pcie", "baseline") == [1, 2]
    store.set_kv("rdma_ports", "baseline", {"mlx5_0:1": {"link_downed": 4}})
    assert store.get_kv("rdma_ports", "baseline") == {"mlx5_0:1": {"link_downed": 4}}
    assert store.kv_items("rdma_ports") == {"baseline": {"mlx5_0:1": {"link_downed": 4}}}


def test_kv_missing_key_gives_the_default_and_delete_removes(store):
    assert store.get_kv("ns", "absent") is None
    assert store.get_kv("ns", "absent", default=0) == 0
    store.set_kv("ns", "k", None)
    assert store.get_kv("ns", "k", default="missing") is None
    assert store.delete_kv("ns", "k")
    assert not store.delete_kv("ns", "k")
    assert store.get_kv("ns", "k", default="missing") == "missing"


def test_kv_converts_mappings_sets_enums_and_datetimes(store, clock):
    r = _result(clock, details={"a": {"b": 1}})
    store.set_kv("ns", "k", {"details": r.details, "set": {3, 1}, "status": Status.FAILED,
                             "at": clock.now()})
    back = store.get_kv("ns", "k")
    assert back["details"] == {"a": {"b": 1}}
    assert back["set"] == [1, 3]
    assert back["status"] == "failed"
    assert back["at"] == iso(clock.now())


def test_kv_refuses_values_json_cannot_hold(store):
    with pytest.raises(TypeError, match="JSON"):
        store.set_kv("ns", "k", object())
    assert store.get_kv("ns", "k") is None


# --- node (quarantine) state ------------------------------------------------------------------


def test_node_state_defaults_to_healthy_never_recorded(store):
    state = store.node_state()
    assert (state.state, state.since, state.retest_failures, state.history) == \
        ("healthy", None, 0, ())


def test_node_state_transitions_append_history(store, clock):
    t1 = clock.now()
    assert store.set_node_state("suspect", "Xid79", t1)
    clock.advance(120)
    t2 = clock.now()
    assert store.set_node_state("quarantined", "Xid79", t2)
    assert not store.set_node_state("quarantined", "Xid79 again", t2 + timedelta(seconds=5))
    state = store.node_state()
    assert (state.state, state.since, state.reason) == ("quarantined", t2, "Xid79")
    assert state.history == (NodeStateChange(t1, "healthy", "suspect", "Xid79"),
                             NodeStateChange(t2, "suspect", "quarantined", "Xid79"))


def test_failed_retests_count_up_and_reset_when_healthy(store, clock):
    for state in ("quarantined", "retesting", "quarantined", "retesting", "quarantined"):
        store.set_node_state(state, "RowRemapPending", clock.now())
        clock.advance(60)
    assert store.node_state().retest_failures == 2
    store.set_node_state("retesting", "retry", clock.now())
    store.set_node_state("healthy", "RetestPassed", clock.now())
    assert store.node_state().retest_failures == 0
    store.set_node_state("quarantined", "manual", clock.now(), retest_failures=5)
    assert store.node_state().retest_failures == 5


def test_node_state_rejects_unknown_states_and_limits_history(store, clock):
    with pytest.raises(ValueError, match="unknown node state"):
        store.set_node_state("drained", "typo", clock.now())
    for i in range(6):
        store.set_node_state("suspect" if i % 2 == 0 else "healthy", f"r{i}", clock.now())
        clock.advance(1)
    assert [h.reason for h in store.node_state(history_limit=2).history] == ["r4", "r5"]


# --- actions -----------------------------------------------------------------------------------


def test_actions_are_listed_and_counted(store, clock):
    t0 = clock.now()
    store.record_action("cordon", "ok", t0, {"reason": "Xid79", "dry_run": False})
    clock.advance(10)
    store.record_action("drain", "failed", clock.now(), {"pods_left": 2})
    store.record_action("drain", "failed", clock.now())
    assert store.actions(since=t0 + timedelta(seconds=1), action="drain")[0] == \
        ActionRecord("drain", "failed", clock.now(), {"pods_left": 2})
    assert store.actions()[0].details == {"reason": "Xid79", "dry_run": False}
    assert store.action_counts() == {("cordon", "ok"): 1, ("drain", "failed"): 2}
    clock.advance(86400)
    store.prune(timedelta(hours=1))
    assert store.actions() == []
    assert store.action_counts()[("drain", "failed")] == 2


# --- health reports ------------------------------------------------------------------------------


def test_health_reports_are_accepted_once_per_uid(store, clock):
    payload = {"check": "sdc_ring", "rank": 3, "gpu_uuid": "GPU-b"}
    assert store.add_health_report("5c0e-uid-1", "node-a", "SdcSuspected", "cr",
                                   clock.now(), payload)
    assert not store.add_health_report("5c0e-uid-1", "node-a", "SdcSuspected", "cr",
                                       clock.now(), payload)
    assert store.add_health_report("drop-17", "node-a", "FabricSlow", "dropdir", clock.now())
    assert store.health_report_counts() == {"SdcSuspected": 1, "FabricSlow": 1}
    (first, second) = store.health_reports()
    assert (first.uid, first.payload) == ("5c0e-uid-1", payload)
    assert second.source == "dropdir"


def test_health_report_uids_outlive_prune(store, clock):
    store.add_health_report("uid-1", "node-a", "SdcSuspected", "cr", clock.now())
    clock.advance(30 * 86400)
    store.prune(timedelta(days=1))
    assert not store.add_health_report("uid-1", "node-a", "SdcSuspected", "cr", clock.now())
    assert store.health_report_counts() == {"SdcSuspected": 1}


# --- persistence across restarts -------------------------------------------------------------------


def test_everything_survives_close_and_reopen(db_path, clock):
    r = _result(clock, target="gpu:3", status=Status.FAILED, reason="RowRemapPending")
    ev = XidEvent(BOOT_A, 9, clock.now(), 79, "0000:91:00.0", UUID_91, 4, message="fell off")
    with Store.open(db_path, clock) as s:
        s.record_run(_outcome(clock, r, success=False, error="CheckCrashed"))
        s.mark_kmsg(BOOT_A, 9)
        s.add_xid_event(ev)
        s.port_down_start("mlx5_0", 1, clock.now())
        s.set_kv("rdma_ports", "baseline", {"link_downed": 2})
        s.set_node_state("quarantined", "RowRemapPending", clock.now())
        s.record_action("cordon", "ok", clock.now(), {"reason": "RowRemapPending"})
        s.add_health_report("uid-1", "node-a", "SdcSuspected", "cr", clock.now())
        before = (s.latest_results(), s.runs(), s.reason_counts(), s.xid_events(),
                  s.xid_counts(), s.node_state(), s.actions(), s.action_counts(),
                  s.health_report_counts())
    clock.advance(5)
    with Store.open(db_path, clock) as s:
        after = (s.latest_results(), s.runs(), s.reason_counts(), s.xid_events(),
                 s.xid_counts(), s.node_state(), s.actions(), s.action_counts(),
                 s.health_report_counts())
        assert after == before
        assert s.kmsg_high_water(BOOT_A) == 9
        assert s.get_kv("rdma_ports", "baseline") == {"link_downed": 2}
        assert s.open_port_outage("mlx5_0", 1) == clock.now() - timedelta(seconds=5)
        assert not s.add_xid_event(ev)
        assert not s.add_health_report("uid-1", "node-a", "SdcSuspected", "cr", clock.now())


# --- threads ---------------------------------------------------------------------------------------


def test_concurrent_writers_and_readers_lose_nothing(db_path, clock):
    writers, per_writer = 8, 40
    errors: list[BaseException] = []
    done = threading.Event()
    barrier = threading.Barrier(writers + 2)

    with Store.open(db_path, clock) as s:

        def write(w: int) -> None:
            try:
                barrier.wait()
                for i in range(per_writer):
                    s.record_run(_outcome(clock, _result(clock, check=f"c{w}", target="gpu:0"),
                                          _result(clock, check=f"c{w}", target="gpu:1")))
                    s.add_xid_event(XidEvent(BOOT_A, w * 1000 + i, clock.now(), 13,
                                             "0000:19:00.0", "GPU-a", 0))
                    s.mark_kmsg(BOOT_A, w * 1000 + i)
                    s.set_kv(f"w{w}", str(i), i)
                    s.record_action("cordon", "dry_run", clock.now())
                    s.port_down_start(f"mlx5_{w}", 1, clock.now())
                    s.port_down_end(f"mlx5_{w}", 1, clock.now())
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        def read() -> None:
            try:
                barrier.wait()
                while not done.is_set():
                    s.latest_results()
                    s.reason_counts()
                    s.xid_counts()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in threads + readers:
            t.start()
        for t in threads:
            t.join(60)
        done.set()
        for t in readers:
            t.join(60)

        assert errors == []
        total = writers * per_writer
        assert sum(s.reason_counts().values()) == 2 * total
        assert s.xid_counts() == {(0, "GPU-a", 13): total}
        assert s.action_counts() == {("cordon", "dry_run"): total}
        assert len(s.latest_results()) == 2 * writers
        assert sum(len(s.kv_items(f"w{w}")) for w in range(writers)) == total
        assert s.kmsg_high_water(BOOT_A) == (writers - 1) * 1000 + per_writer - 1
        assert sum(s.port_outages_total(f"mlx5_{w}", 1) for w in range(writers)) == total
