"""NodeClient (remediate/k8s/node.py) on the wire against the fake apiserver: conditions, the
quarantine's guarded patch, taints, cordon and events."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.kube.ratelimit import RateLimiter
from gpu_monitor.remediate.k8s.node import NodeClient
from tests.kube.client_helpers import kube_for
from tests.remediate.remediate_helpers import (
    NODE,
    TAINT_KEY,
    our_conditions,
    our_taints,
    patch_as_human,
)
from tests.waiting import eventually

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Want:
    type: str
    status: str
    reason: str
    message: str


@pytest.fixture
def fake(cluster):
    return cluster(NODE, breaker=False)


@pytest.fixture
def node(fake):
    kube = kube_for(fake, FakeClock(T0))
    try:
        yield NodeClient(kube, NODE, taint_key=TAINT_KEY)
    finally:
        kube.close()


def test_conditions_merge_by_type_and_keep_kubelets(fake, node):
    node.sync_conditions([Want("GPUXidError", "True", "Xid79", "gpu:3")], T0)
    conds = {c["type"]: c for c in fake.node(NODE)["status"]["conditions"]}
    assert conds["Ready"]["status"] == "True" and "MemoryPressure" in conds
    assert (conds["GPUXidError"]["status"], conds["GPUXidError"]["reason"]) == ("True", "Xid79")
    patch = [q for q in fake.requests if q.path.endswith("/status")][-1]
    assert patch.content_type == "application/strategic-merge-patch+json"


def test_transition_time_moves_only_on_a_status_or_reason_change(fake, node):
    clock = node.clock
    node.sync_conditions([Want("GPUXidError", "True", "Xid79", "a")], T0)
    t1 = T0 + timedelta(seconds=10)
    clock.advance(10)
    assert node.sync_conditions([Want("GPUXidError", "True", "Xid79", "b")], t1)  # message only
    c = our_conditions(fake.node(NODE))["GPUXidError"]
    assert c["lastTransitionTime"] == "2026-03-01T00:00:00Z" and c["message"] == "b"
    assert c["lastHeartbeatTime"] == "2026-03-01T00:00:10Z"
    t2 = T0 + timedelta(seconds=20)
    assert node.sync_conditions([Want("GPUXidError", "False", "NoProblem", "ok")], t2)
    assert our_conditions(fake.node(NODE))["GPUXidError"]["lastTransitionTime"] == \
        "2026-03-01T00:00:20Z"


def test_no_write_without_a_change_until_the_heartbeat_is_due(fake, node):
    want = [Want("GPUXidError", "False", "NoProblem", "ok")]
    assert node.sync_conditions(want, T0)
    node.clock.advance(60)
    assert not node.sync_conditions(want, T0 + timedelta(seconds=60))
    node.clock.advance(node.heartbeat_s)
    assert node.sync_conditions(want, T0 + timedelta(seconds=400))
    assert len([q for q in fake.requests if q.path.endswith("/status")]) == 2


def test_existing_conditions_are_read_back_not_reset(fake):
    old = {"type": "GPUXidError", "status": "True", "reason": "Xid79", "message": "m",
           "lastHeartbeatTime": "2025-01-01T00:00:00Z",
           "lastTransitionTime": "2025-01-01T00:00:00Z"}
    fake.add_node(NODE, gpus=8, conditions=[old])
    kube = kube_for(fake, FakeClock(T0))
    fresh = NodeClient(kube, NODE)  # a restarted daemon
    fresh.load_conditions(["GPUXidError"])
    fresh.sync_conditions([Want("GPUXidError", "True", "Xid79", "m")], T0)
    c = our_conditions(fake.node(NODE))["GPUXidError"]
    assert c["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    assert c["lastHeartbeatTime"] == "2026-03-01T00:00:00Z"


def test_quarantine_writes_record_and_taint_in_one_guarded_json_patch(fake, node):
    out = node.ensure_quarantined("Xid79", "quarantined", T0)
    assert out.cordoned and out.tainted and not out.cordon_pre_existing
    patches = [q for q in fake.requests if q.method == "PATCH"]
    first, cordon = patches
    assert first.content_type == "application/json-patch+json"
    assert first.json[0]["op"] == "test" and first.json[0]["path"] == "/metadata/resourceVersion"
    assert cordon.content_type == "application/strategic-merge-patch+json"
    assert cordon.json["spec"] == {"unschedulable": True}
    again = node.ensure_quarantined("Xid79", "quarantined", T0)
    assert not again.cordoned and not again.tainted
    assert len([q for q in fake.requests if q.method == "PATCH"]) == 2  # nothing to change


def test_a_stale_view_is_caught_by_the_test_op_and_the_other_writers_taint_kept(fake, node):
    stale = node.read()
    other = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
    patch_as_human(fake, NODE, {"spec": {"taints": [other]}})  # kubectl taint: the whole list
    node.ensure_quarantined("Xid79", "quarantined", T0, view=stale)
    taints = fake.node(NODE)["spec"]["taints"]
    assert other in taints and len(our_taints(fake.node(NODE))) == 1
    statuses = [q.status for q in fake.requests if q.method == "PATCH"]
    assert statuses[:3] == [200, 422, 200]  # human, our stale attempt, our retry


def test_taint_value_follows_the_most_severe_reason_and_only_ours_is_removed(fake, node):
    other = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
    fake.add_node(NODE, gpus=8, taints=[other])
    node.ensure_quarantined("Xid48", "quarantined", T0)
    node.ensure_quarantined("Xid79", "quarantined", T0)
    assert our_taints(fake.node(NODE)) == [{"key": TAINT_KEY, "value": "Xid79",
                                            "effect": "NoSchedule"}]
    view, uncordoned = node.release()
    assert uncordoned and not view.unschedulable
    # The node lifecycle controller drops its own unschedulable taint after the uncordon, on
    # its own time (as the real one does): wait for it rather than read at once.
    eventually(lambda: fake.node(NODE)["spec"].get("taints") == [other],
               what="only the operator's taint left")
    assert not any(k.startswith("gpu-monitor.io/") and k != "gpu-monitor.io/state"
                   for k in fake.node(NODE)["metadata"]["annotations"])


def test_a_pre_existing_cordon_is_recorded_and_kept_on_release(fake, node):
    fake.add_node(NODE, gpus=8, unschedulable=True)
    out = node.ensure_quarantined("Xid79", "quarantined", T0)
    assert out.cordon_pre_existing and not out.cordoned
    _, uncordoned = node.release()
    assert not uncordoned and fake.node(NODE)["spec"]["unschedulable"] is True


def test_events_name_the_node_and_repeat_only_after_the_window(fake, node):
    node.read()
    assert node.event("Xid79", "gpu:3", type="Warning")
    assert not node.event("Xid79", "gpu:3", type="Warning")  # deduplicated
    node.clock.advance(node.event_repeat_s + 1)
    assert node.event("Xid79", "gpu:3", type="Warning")
    events = fake.list("", "events")
    assert len(events) == 2
    e = events[0]
    assert e["metadata"]["namespace"] == "default"
    assert e["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE,
                                   "uid": fake.node(NODE)["metadata"]["uid"]}
    assert (e["type"], e["reason"], e["source"]) == ("Warning", "Xid79",
                                                     {"component": "gpu-monitor", "host": NODE})


def test_an_event_with_no_write_token_free_waits_without_delaying_anything(fake):
    clock = FakeClock(T0)
    kube = kube_for(fake, clock, qps=1.0)
    kube.limiter = RateLimiter(1.0, 3, clock)
    node = NodeClient(kube, NODE)
    node.read()
    kube.patch_node(NODE, {"metadata": {"labels": {"a": "1"}}})  # the node's own writes
    assert node.event("Xid79", "gpu:3")
    assert node.events.pending == 1 and clock.monotonic() == 1000.0  # queued, no sleep
    assert not node.events.backing_off  # no token is not a failure
    assert [q for q in fake.requests if q.method == "POST"] == []
    clock.advance(5)
    assert node.flush_events() == 1 and node.events.pending == 0
