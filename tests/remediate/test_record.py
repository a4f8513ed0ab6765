"""The quarantine record (record.py): typed, and stored in the shape earlier daemons wrote, so an
upgraded daemon resumes a quarantine in progress."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from gpu_monitor.model import Result, Status, iso
from gpu_monitor.remediate.policy import Op
from gpu_monitor.remediate.record import (
    KV_NAMESPACE,
    KV_RECORD,
    QuarantineRecord,
    Retest,
    load_record,
    save_record,
)
from gpu_monitor.state import Store
from tests.remediate.remediate_helpers import (
    event_reasons,
    fake_cluster,
    our_taints,
    remediator,
    seed_breaker,
    set_boot_id,
)

NODE = "gpu-node-1"
T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
SINCE = "2026-03-01T00:00:00.123456Z"

#: Records as the daemon wrote them before the record had a type (one per lifecycle stage).
WRITTEN_BEFORE = {
    "just-claimed": {"op": "cordon", "reason": "Xid79", "since": SINCE, "slot": True,
                     "applied": False, "drain": "none", "gpus": [3]},
    "draining": {"op": "reboot", "reason": "Xid79", "since": SINCE, "slot": True,
                 "applied": True, "announced": True, "drain": "pending", "gpus": [3],
                 "drain_started": "2026-03-01T00:00:01Z", "drain_attempts": 1},
    "drain-failed": {"op": "drain", "reason": "Xid79", "since": SINCE, "slot": True,
                     "applied": True, "announced": True, "drain": "failed", "gpus": None,
                     "drain_started": "2026-03-01T00:00:01Z", "drain_attempts": 2,
                     "drain_detail": "1 timeout; train/job-0: global timeout reached",
                     "drain_next": "2026-03-01T00:15:01Z"},
    "retesting": {"op": "reset_gpu", "reason": "Xid48", "since": SINCE, "slot": True,
                  "applied": True, "announced": True, "drain": "succeeded", "gpus": [0, 3],
                  "retest": {"phase": "suite", "needs_reset": True,
                             "started": "2026-03-01T00:20:00Z",
                             "retry_at": "2026-03-01T00:30:00Z"}},
    "reboot-required": {"op": "reboot", "reason": "Xid79", "since": SINCE, "slot": True,
                        "applied": True, "announced": True, "drain": "succeeded", "gpus": [3],
                        "boot_id": "boot-1", "sentinel": "/host/var/run/reboot-required"},
    "replace": {"op": "replace", "reason": "Xid64", "since": SINCE, "slot": False,
                "applied": True, "announced": True, "drain": "succeeded", "gpus": None,
                "replace_reason": "retest failed 2 times", "replaced": True},
    "releasing": {"op": "cordon", "reason": "Xid79", "since": SINCE, "slot": True,
                  "applied": True, "announced": True, "drain": "none", "gpus": [3],
                  "releasing": True, "release_reason": "retest passed"},
}


@pytest.mark.parametrize("stage", sorted(WRITTEN_BEFORE))
def test_a_record_written_before_reads_back_and_is_written_in_the_same_shape(stage):
    raw = WRITTEN_BEFORE[stage]
    rec = QuarantineRecord.from_dict(raw, T0)
    assert rec.to_dict() == raw
    assert QuarantineRecord.from_dict(rec.to_dict(), T0) == rec


def test_the_fields_are_typed():
    rec = QuarantineRecord.from_dict(WRITTEN_BEFORE["retesting"], T0)
    assert rec.op is Op.RESET_GPU and rec.gpus == (0, 3) and rec.since.microsecond == 123456
    assert rec.retest == Retest(started=datetime(2026, 3, 1, 0, 20, tzinfo=timezone.utc),
                                phase="suite", needs_reset=True,
                                retry_at=datetime(2026, 3, 1, 0, 30, tzinfo=timezone.utc))


def test_missing_keys_mean_their_defaults_and_no_record_is_none():
    store = Store.open(":memory:")
    assert load_record(store, T0) is None
    store.set_kv(KV_NAMESPACE, KV_RECORD, {})
    assert load_record(store, T0) is None
    store.set_kv(KV_NAMESPACE, KV_RECORD, {"op": "reboot", "reason": "Xid79"})
    rec = load_record(store, T0)
    assert rec == QuarantineRecord(op=Op.REBOOT, reason="Xid79", since=T0)
    assert rec.retest is None and rec.drain == "none" and not rec.slot
    save_record(store, rec.but(slot=True))
    assert store.get_kv(KV_NAMESPACE, KV_RECORD)["slot"] is True


@pytest.fixture
def fake():
    with fake_cluster(NODE, breaker=False) as server:
        yield server


def test_a_daemon_upgraded_mid_reboot_resumes_the_quarantine_it_finds(fake, tmp_path):
    """The old daemon asked for a reboot (boot-1) and held a slot; the upgraded one finds its
    record after the reboot, retests, and returns the node - without announcing the
    quarantine again or asking for another slot."""
    seed_breaker(fake, slots=json.dumps({NODE: {"since": SINCE, "renewed": iso(T0),
                                                "reason": "Xid79"}}))
    store = Store.open(":memory:")
    store.set_node_state("reboot-required", "Xid79", T0)
    sentinel = tmp_path / "root" / "var" / "run" / "reboot-required"
    store.set_kv(KV_NAMESPACE, KV_RECORD,
                 {**WRITTEN_BEFORE["reboot-required"], "sentinel": str(sentinel)})

    def passing():
        return [Result(check="dcgm_diag", status=Status.OK, target="gpu:0")]

    r = remediator(fake, tmp_path, store=store, retest=passing)
    set_boot_id(r.actuator.paths, "boot-2")  # Kured rebooted the node meanwhile
    r.tick()
    assert r.store.node_state().state == "healthy"
    reasons = event_reasons(fake, NODE)
    assert "Rebooted" in reasons and "ReturnedToService" in reasons
    assert "Quarantined" not in reasons  # announced by the old daemon
    counts = r.store.action_counts()
    assert counts.get(("quarantine", "ok"), 0) == 0 and counts[("reboot", "ok")] == 1
    assert our_taints(fake.node(NODE)) == [] and not fake.node(NODE)["spec"].get(
        "unschedulable")
    assert load_record(r.store, T0) is None
    assert json.loads(fake.get("", "configmaps", "gpu-monitor-breaker",
                               "gpu-monitor")["data"]["slots"]) == {}
