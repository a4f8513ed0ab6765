"""Remediation under API faults: a cordon race.

Each test makes the fake apiserver misbehave at the wire (a hook between two requests, 503s
for as long as the injected clock says, refusals) and drives the real Remediator / NodeClient
through the real `kubernetes` client.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest
from remediate_helpers import (
    FakeApiServer,
    config,
    events_for,
    kube_for,
    ok,
    our_taints,
    patch_as_human,
    remediator,
    seed_breaker,
    writes_to,
    xid,
)

from gpu_monitor.clock import FakeClock
from gpu_monitor.remediate.kube import ANNOTATIONS, NodeClient

NODE = "gpu-node-1"
NODE_PATH = f"/api/v1/nodes/{NODE}"
EVENTS_PATH = "/api/v1/namespaces/default/events"
SMP = "application/strategic-merge-patch+json"
T0 = datetime(2026, 4, 1, tzinfo=timezone.utc)


@pytest.fixture
def fake():
    server = FakeApiServer().start()
    server.add_node(NODE, gpus=8)
    seed_breaker(server)
    try:
        yield server
    finally:
        server.stop()


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
    view, uncordoned = node.release(T0)
    assert not uncordoned and view.unschedulable


def test_a_write_between_our_read_and_our_uncordon_makes_us_decide_again(fake):
    node = NodeClient(kube_for(fake, FakeClock(T0)), NODE)
    node.ensure_quarantined("Xid79", "quarantined", T0)

    def someone_labels(_request):
        patch_as_human(fake, NODE, {"metadata": {"labels": {"rack": "r7"}}})

    hook = fake.on_request("PATCH", NODE_PATH, someone_labels, content_type=SMP)
    view, uncordoned = node.release(T0)
    assert hook.hits == 1
    assert uncordoned and not view.unschedulable and not fake.node(NODE)["spec"].get(
        "unschedulable")
    uncordons = [q for q in writes_to(fake, NODE_PATH)
                 if q.content_type == SMP and '"unschedulable": null' in q.body]
    assert [q.status for q in uncordons] == [409, 200]  # refused on the stale read, then redone
    assert fake.node(NODE)["metadata"]["labels"]["rack"] == "r7"
