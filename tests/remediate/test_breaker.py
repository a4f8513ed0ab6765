"""The fleet circuit breaker: budget arithmetic, compare-and-swap, tripping, reset and cooldown,
TTL, and 100 daemons failing at once against a 10 % budget."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from gpu_monitor.clock import Clock, FakeClock
from gpu_monitor.model import iso
from gpu_monitor.remediate.breaker import budget_for
from gpu_monitor.remediate.k8s.breaker import BreakerSettings, ConfigMapBreaker
from gpu_monitor.state import Store
from tests.kube.client_helpers import kube_for
from tests.remediate.remediate_helpers import (
    BREAKER,
    NAMESPACE,
    FakeApiServer,
    breaker_data,
    config,
    our_taints,
    remediator,
    seed_breaker,
    xid,
)

BUDGETS = [
    # (id, gpu nodes, fraction, cap, budget)
    ("10% of 100 is 10", 100, 0.10, 20, 10),
    ("10% of 101 rounds up to 11", 101, 0.10, 20, 11),
    ("10% of 5 rounds up to 1", 5, 0.10, 20, 1),
    ("the cap wins over the fraction", 1000, 0.10, 20, 20),
    ("half of 5 is 3", 5, 0.5, 20, 3),
    ("no labelled node still counts the claimer", 0, 0.10, 20, 1),
]


@pytest.mark.parametrize("n,fraction,cap,want", [c[1:] for c in BUDGETS],
                         ids=[c[0] for c in BUDGETS])
def test_budget_is_the_fraction_rounded_up_then_capped(n, fraction, cap, want):
    assert budget_for(n, fraction, cap) == want


@pytest.fixture
def fake(cluster):
    return cluster(*(f"gpu-{i}" for i in range(10)))


@pytest.fixture
def clock():
    return FakeClock()


def breaker(fake, clock, **kw):
    return ConfigMapBreaker(kube_for(fake, clock),
                   BreakerSettings(namespace=NAMESPACE, **{"cooldown_s": 600.0, **kw}), clock)


def slots(fake):
    return json.loads(breaker_data(fake)["slots"])


def test_claim_hold_and_release(fake, clock):
    b = breaker(fake, clock)  # 10 GPU nodes x 10 % = 1 slot
    c = b.claim("gpu-0", "Xid79")
    assert c.granted and c.why == "claimed" and c.status.budget == 1
    assert slots(fake)["gpu-0"]["reason"] == "Xid79"
    assert b.claim("gpu-0").why == "held"  # a restarted daemon keeps its slot
    assert b.release("gpu-0") and slots(fake) == {}
    assert not b.release("gpu-0")


def test_no_free_slot_trips_and_stays_tripped_until_reset_then_cools_down(fake, clock):
    b = breaker(fake, clock)
    assert b.claim("gpu-0").granted
    denied = b.claim("gpu-1", "Xid48")
    assert not denied.granted and denied.why == "tripped" and denied.tripped_now
    data = breaker_data(fake)
    assert data["state"] == "tripped" and data["trippedBy"] == "gpu-1"
    assert "1/1 in use" in data["trippedReason"]
    again = b.claim("gpu-2")
    assert again.why == "tripped" and not again.tripped_now
    b.release("gpu-0")
    assert b.claim("gpu-2").why == "tripped"  # a free slot does not close it
    b.reset()
    assert breaker_data(fake)["state"] == "closed"
    assert b.claim("gpu-2").why == "cooldown"
    clock.advance(601)
    assert b.claim("gpu-2").granted


def test_pause_refuses_without_tripping(fake, clock):
    b = breaker(fake, clock)
    b.pause(True)
    c = b.claim("gpu-0")
    assert c.why == "paused" and breaker_data(fake)["state"] == "closed"
    b.pause(False)
    assert b.claim("gpu-0").granted


def test_a_vanished_holder_expires_after_the_ttl(fake, clock):
    b = breaker(fake, clock, ttl_s=3600.0)
    assert b.claim("gpu-0").granted
    clock.advance(3000)
    assert b.claim("gpu-1").why == "tripped"
    b.reset()
    clock.advance(3600)  # gpu-0 never renewed: expired; the cooldown is over too
    assert b.claim("gpu-1").granted and list(slots(fake)) == ["gpu-1"]


def test_renewal_keeps_a_slot_alive(fake, clock):
    b = breaker(fake, clock, ttl_s=100.0)
    b.claim("gpu-0")
    for _ in range(5):
        clock.advance(60)
        assert b.renew("gpu-0")
    assert b.claim("gpu-1").why == "tripped"


def test_a_replacement_frees_the_slot_and_is_counted(fake, clock):
    b = breaker(fake, clock)
    b.claim("gpu-0")
    b.release("gpu-0", replaced=True)
    assert slots(fake) == {} and breaker_data(fake)["replacements"] == "1"


def test_a_conflicting_write_is_re_read_and_the_gpu_nodes_counted_once(fake, clock):
    b = breaker(fake, clock)
    fake.inject("PUT", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{BREAKER}", 409, times=2)
    assert b.claim("gpu-0").granted
    puts = [q.status for q in fake.requests if q.method == "PUT"]
    assert puts == [409, 409, 200]
    assert len([q for q in fake.requests if q.path == "/api/v1/nodes"]) == 1


def test_a_missing_configmap_fails_closed(clock):
    with FakeApiServer() as server:
        c = breaker(server, clock).claim("gpu-0")
    assert not c.granted and c.why == "missing"


def test_unreadable_slots_count_as_full():
    with FakeApiServer() as server:
        server.add_node("gpu-0", gpus=8)
        seed_breaker(server, slots="{not json")
        c = breaker(server, FakeClock()).claim("gpu-0")
    assert not c.granted


def test_status_shows_expired_slots_as_such(fake, clock):
    b = breaker(fake, clock, ttl_s=10.0)
    b.claim("gpu-0")
    clock.advance(11)
    st = b.status()
    assert list(st.slots) == ["gpu-0"] and st.live_slots(clock.now(), 10.0) == {}
    assert st.cooling_until(600.0) is None and iso(clock.now() - timedelta(seconds=11))


def test_hundred_daemons_failing_at_once_quarantine_at_most_ten(tmp_path):
    """100 GPU nodes, a 10 % budget: every daemon sees an Xid 79 at the same moment."""
    n = 100
    with FakeApiServer() as server:
        for i in range(n):
            server.add_node(f"gpu-{i:03d}", gpus=8)
        seed_breaker(server)
        cfg = config(breaker={"budget_fraction": 0.10, "max_nodes": 20},
                     reboot_sentinel=None)
        clock = Clock()
        go = threading.Barrier(n)
        errors = []

        def daemon(i: int) -> None:
            try:
                r = remediator(server, tmp_path / f"n{i}", f"gpu-{i:03d}", clock=clock, cfg=cfg,
                               store=Store.open(":memory:", clock), report_poll_s=3600)
                go.wait(30)
                r.on_results([xid(79)])
                r.tick()
                if r.last_error:
                    errors.append(r.last_error)
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))

        threads = [threading.Thread(target=daemon, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        nodes = [server.node(f"gpu-{i:03d}") for i in range(n)]
        cordoned = [x["metadata"]["name"] for x in nodes if x["spec"].get("unschedulable")]
        tainted = [x["metadata"]["name"] for x in nodes if our_taints(x)]
        data = breaker_data(server)
        held = json.loads(data["slots"])
        assert len(cordoned) <= 10 and sorted(cordoned) == sorted(tainted) == sorted(held)
        assert len(held) == 10
        assert data["state"] == "tripped" and data["trippedBy"] not in held
        events = server.list("", "events")
        tripped = [e for e in events if e["reason"] == "BreakerTripped"]
        skipped = {e["involvedObject"]["name"] for e in events
                   if e["reason"] in ("BreakerTripped", "RemediationSkipped")}
        assert len(tripped) == 1 and len(skipped) == n - 10


def test_only_the_claim_whose_write_won_reports_tripping_the_breaker(fake, clock):
    a, b = breaker(fake, clock), breaker(fake, clock)
    assert a.claim("gpu-0").granted
    put = b.kube.replace_configmap
    raced = []

    def another_daemon_trips_it_first(ns, name, body):
        if not raced:  # between b's read and b's write, gpu-9 trips the breaker
            raced.append(True)
            assert a.claim("gpu-9").tripped_now
        return put(ns, name, body)

    b.kube.replace_configmap = another_daemon_trips_it_first
    lost = b.claim("gpu-1")
    assert lost.why == "tripped" and not lost.tripped_now
    assert breaker_data(fake)["trippedBy"] == "gpu-9"
    assert 409 in [q.status for q in fake.requests if q.method == "PUT"]
