"""Remediation under API faults: a cordon race, an Events-API outage, a full Event queue.

Each test makes the fake apiserver misbehave at the wire (a hook between two requests, 503s
for as long as the injected clock says, refusals) and drives the real Remediator / NodeClient
through the real `kubernetes` client.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from gpu_monitor.clock import FakeClock
from gpu_monitor.model import parse_iso
from gpu_monitor.remediate.k8s.node import ANNOTATIONS, NodeClient
from tests.kube.client_helpers import kube_for
from tests.remediate.remediate_helpers import (
    NODE,
    config,
    event_reasons,
    events_for,
    ok,
    our_taints,
    patch_as_human,
    remediator,
    writes_to,
    xid,
)

NODE_PATH = f"/api/v1/nodes/{NODE}"
EVENTS_PATH = "/api/v1/namespaces/default/events"
SMP = "application/strategic-merge-patch+json"
T0 = datetime(2026, 4, 1, tzinfo=timezone.utc)


def ann(fake):
    return fake.node(NODE)["metadata"].get("annotations") or {}


def cordon_only():
    return replace(config(hysteresis_s=60.0),
                   checks={"xid": {"remediation": {"Xid79": "cordon"}}})


def drain_only():
    return replace(config(), checks={"xid": {"remediation": {"Xid79": "drain"}}})


def operator_cordons_before_our_cordon(fake):
    """`kubectl cordon` by an operator, landing after our ownership write (a JSON patch) and
    before our cordon (the first strategic-merge PATCH of the node)."""

    def cordon(_request):
        patch_as_human(fake, NODE, {"spec": {"unschedulable": True}})

    return fake.on_request("PATCH", NODE_PATH, cordon, content_type=SMP)


# --- the cordon race ---------------------------------------------------------------------------


def test_an_operators_cordon_between_our_record_and_our_cordon_stays_theirs(fake, tmp_path):
    hook = operator_cordons_before_our_cordon(fake)
    clock = FakeClock(T0)
    r = remediator(fake, tmp_path, cfg=cordon_only(), clock=clock, node_sync_s=0.0)
    r.on_results([xid(79)])
    r.tick()
    assert hook.hits == 1, "the race window was never reached"
    node = fake.node(NODE)
    assert node["spec"]["unschedulable"] is True and len(our_taints(node)) == 1
    a = ann(fake)
    assert ANNOTATIONS.CORDONED not in a  # not recorded as our cordon ...
    assert a[ANNOTATIONS.PRE_EXISTING] == "true"  # ... but as someone else's
    ours = [q for q in writes_to(fake, NODE_PATH)
            if q.content_type == SMP and ANNOTATIONS.CORDONED in q.body]
    assert [q.status for q in ours] == [409]  # conditional on what it read: refused
    assert ours[0].json["metadata"]["resourceVersion"]
    assert r.store.action_counts().get(("cordon", "ok"), 0) == 0
    assert "it was already cordoned" in next(
        e["message"] for e in events_for(fake, NODE) if e["reason"] == "Quarantined")

    # The problem clears: gpu-monitor takes back only what is its own (the taint).
    r.on_results([ok()])
    r.tick()
    clock.advance(61)
    r.tick()
    node = fake.node(NODE)
    assert r.store.node_state().state == "healthy" and our_taints(node) == []
    assert node["spec"]["unschedulable"] is True  # the operator's cordon stays
    assert not any('"unschedulable": null' in q.body for q in writes_to(fake, NODE_PATH))
    assert any("not uncordoned" in e["message"] for e in events_for(fake, NODE)
               if e["reason"] == "ReturnedToService")


def test_our_cordon_carries_the_resource_version_it_was_decided_on(fake):
    node = NodeClient(kube_for(fake, FakeClock(T0)), NODE)
    out = node.ensure_quarantined("Xid79", "quarantined", T0)
    assert out.cordoned and not out.cordon_pre_existing
    record, cordon = [q for q in fake.requests if q.method == "PATCH"]
    assert cordon.content_type == SMP and cordon.status == 200
    assert cordon.json["spec"] == {"unschedulable": True}
    after_record = record.json[0]["value"]
    assert int(cordon.json["metadata"]["resourceVersion"]) > int(after_record)
    assert node.view.cordoned_by_us and ann(fake)[ANNOTATIONS.PRE_EXISTING] == "false"


def test_an_unmarked_cordon_found_after_a_restart_is_someone_elses(fake):
    """A daemon killed between its record and its cordon; an operator cordoned meanwhile."""
    fake.add_node(NODE, gpus=8, unschedulable=True, annotations={
        ANNOTATIONS.SINCE: "2026-04-01T00:00:00Z", ANNOTATIONS.PRE_EXISTING: "false",
        ANNOTATIONS.REASON: "Xid79", ANNOTATIONS.DRAIN: "pending"})
    node = NodeClient(kube_for(fake, FakeClock(T0)), NODE)
    out = node.ensure_quarantined("Xid79", "quarantined", T0)
    assert not out.cordoned and out.cordon_pre_existing
    assert ann(fake)[ANNOTATIONS.PRE_EXISTING] == "true"
    view, uncordoned = node.release()
    assert not uncordoned and view.unschedulable


def test_a_write_between_our_read_and_our_uncordon_makes_us_decide_again(fake):
    node = NodeClient(kube_for(fake, FakeClock(T0)), NODE)
    node.ensure_quarantined("Xid79", "quarantined", T0)

    def someone_labels(_request):
        patch_as_human(fake, NODE, {"metadata": {"labels": {"rack": "r7"}}})

    hook = fake.on_request("PATCH", NODE_PATH, someone_labels, content_type=SMP)
    view, uncordoned = node.release()
    assert hook.hits == 1
    assert uncordoned and not view.unschedulable and not fake.node(NODE)["spec"].get(
        "unschedulable")
    uncordons = [q for q in writes_to(fake, NODE_PATH)
                 if q.content_type == SMP and '"unschedulable": null' in q.body]
    # Refused on the stale read, then redone on a fresh one. Under load the client may also
    # resend the stale request after its own timeout while the hook's write is still landing:
    # that copy is refused too, never applied.
    statuses = [q.status for q in uncordons]
    assert statuses[-1] == 200 and len(statuses) >= 2 and set(statuses[:-1]) == {409}, statuses
    assert fake.node(NODE)["metadata"]["labels"]["rack"] == "r7"


# --- Events --------------------------------------------------------------------------------------


def events_down_until(fake, clock, seconds: float):
    end = clock.monotonic() + seconds
    fault = fake.inject("POST", EVENTS_PATH, 503, times=None,
                        active=lambda: clock.monotonic() < end)
    return fault, end


def test_after_a_50_s_events_outage_the_quarantined_event_is_delivered(fake, tmp_path, caplog):
    fake.add_pod("train", "job-0", node=NODE, owner=("ReplicaSet", "job"), gpus=8,
                 grace_period=0)
    clock = FakeClock(T0)
    r = remediator(fake, tmp_path, cfg=drain_only(), clock=clock)
    r.tick()  # running, nothing to do
    outage, end = events_down_until(fake, clock, 50.0)
    caplog.set_level(logging.INFO, logger="gpu_monitor.remediate")
    r.on_results([xid(79)])
    r.tick()
    assert outage.hits >= 1 and "Quarantined" not in event_reasons(fake, NODE)
    for _ in range(200):  # the daemon ticks every few seconds; the clock is the test's
        if "Quarantined" in event_reasons(fake, NODE):
            break
        clock.advance(5)
        r.tick()
    reasons = event_reasons(fake, NODE)
    assert clock.monotonic() >= end  # delivered after the outage ...
    assert reasons.count("Quarantined") == 1  # ... once
    delivered = [q.json["reason"] for q in fake.requests
                 if q.method == "POST" and q.path == EVENTS_PATH and q.status == 201]
    assert delivered.index("Quarantined") < delivered.index("DrainSucceeded")  # in order
    assert "Xid79" in reasons
    assert r.delivery.node.events.pending == 0 and r.delivery.node.events.dropped == 0
    assert outage.hits <= 10  # backed off: no hammering of a failing server
    warned = [x for x in caplog.records if "cannot send Event" in x.getMessage()]
    assert len(warned) == 1 and "503" in warned[0].getMessage()
    assert any("Events API answers again" in x.getMessage() for x in caplog.records)


def test_a_failing_events_api_does_not_hold_up_cordon_taint_and_drain(fake, tmp_path):
    fake.add_pod("train", "job-0", node=NODE, owner=("ReplicaSet", "job"), gpus=8,
                 grace_period=0)
    clock = FakeClock(T0)
    r = remediator(fake, tmp_path, cfg=drain_only(), clock=clock)
    r.tick()
    fake.inject("POST", EVENTS_PATH, 503, times=None)  # down for the whole test
    fake.clear_requests()
    start = clock.monotonic()
    r.on_results([xid(79)])
    r.tick()
    node = fake.node(NODE)
    assert node["spec"]["unschedulable"] is True and len(our_taints(node)) == 1
    assert ann(fake)[ANNOTATIONS.DRAIN] == "succeeded" and fake.pod("train", "job-0") is None
    seq = [(q.method, q.path, q.status) for q in fake.requests]
    drained = next(i for i, (m, p, _) in enumerate(seq)
                   if m == "PATCH" and p == NODE_PATH and "succeeded" in fake.requests[i].body)
    evicted = next(i for i, (m, p, _) in enumerate(seq) if p.endswith("/eviction"))
    tries = [i for i, (m, p, _) in enumerate(seq) if m == "POST" and p == EVENTS_PATH]
    assert len([i for i in tries if i < drained]) == 1  # one attempt, then only queued
    assert tries[0] < evicted  # the Quarantined Event was tried before the drain began
    # The steps waited for no Event: the clock moved only by the drain's own polls.
    assert clock.monotonic() - start < 5
    assert r.delivery.node.events.pending >= 3  # Quarantined, DrainSucceeded, the Xid79 finding


def test_the_event_queue_is_bounded_and_drops_the_oldest(fake, caplog):
    clock = FakeClock(T0)
    dropped = []
    node = NodeClient(kube_for(fake, clock), NODE, event_capacity=8,
                      on_event_dropped=lambda body, why: dropped.append((body["reason"], why)))
    node.read()
    outage, end = events_down_until(fake, clock, 10.0)
    caplog.set_level(logging.INFO, logger="gpu_monitor.remediate")
    for i in range(12):
        assert node.event(f"Finding{i}", f"finding {i}")
    assert node.events.pending == 8 and node.events.dropped == 4
    assert dropped == [(f"Finding{i}", "dropped") for i in range(4)]  # the oldest four
    assert len([x for x in caplog.records if "queue full" in x.getMessage()]) == 1
    clock.advance(end - clock.monotonic() + 40)
    assert node.flush_events() == 8
    delivered = [q.json["reason"] for q in fake.requests
                 if q.method == "POST" and q.path == EVENTS_PATH and q.status == 201]
    assert delivered == [f"Finding{i}" for i in range(4, 12)]  # oldest first
    assert any("4 dropped meanwhile" in x.getMessage() for x in caplog.records)


def test_an_identical_event_while_waiting_merges_and_counts(fake):
    clock = FakeClock(T0)
    node = NodeClient(kube_for(fake, clock), NODE)
    node.read()
    _, end = events_down_until(fake, clock, 5.0)
    assert node.event("Xid79", "gpu:3", type="Warning")
    clock.advance(1)
    assert not node.event("Xid79", "gpu:3", type="Warning")  # merged into the waiting one
    clock.advance(end - clock.monotonic() + 30)
    assert node.flush_events() == 1
    (ev,) = events_for(fake, NODE)
    assert ev["count"] == 2 and parse_iso(ev["firstTimestamp"]) == T0
    assert parse_iso(ev["lastTimestamp"]) == T0 + timedelta(seconds=1)
    assert not node.event("Xid79", "gpu:3", type="Warning")  # sent: now the repeat window


def test_an_event_answered_already_exists_was_delivered(fake):
    node = NodeClient(kube_for(fake, FakeClock(T0)), NODE)
    node.read()
    fake.inject("POST", EVENTS_PATH, 409, reason="AlreadyExists", times=1)
    assert node.event("Xid79", "gpu:3")
    assert node.events.pending == 0 and node.events.sent == 1


def test_an_event_refused_for_good_is_dropped_not_retried(fake, caplog):
    dropped = []
    clock = FakeClock(T0)
    node = NodeClient(kube_for(fake, clock), NODE,
                      on_event_dropped=lambda body, why: dropped.append(why))
    node.read()
    refusal = fake.inject("POST", EVENTS_PATH, 403, times=None)
    for i in range(3):
        node.event("Xid79", f"gpu:{i}")
    clock.advance(600)
    node.flush_events()
    assert refusal.hits == 3 and node.events.pending == 0 and node.events.refused == 3
    assert dropped == ["refused"] * 3
    assert len([x for x in caplog.records if "refused Event" in x.getMessage()]) == 1


def test_a_dropped_event_is_counted_as_an_action(fake, tmp_path):
    r = remediator(fake, tmp_path, clock=FakeClock(T0))
    r.tick()
    fake.inject("POST", EVENTS_PATH, 403, times=None)
    r.on_results([xid(79)])
    r.tick()
    assert r.store.action_counts()[("event", "refused")] >= 2  # Quarantined, Xid79, ...
    assert r.store.node_state().state == "reboot-required"  # the steps went on
