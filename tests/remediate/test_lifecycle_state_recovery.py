"""The remediator announces a state recovery with one Event, on the fake apiserver."""

from __future__ import annotations

import pytest

from gpu_monitor.clock import FakeClock
from gpu_monitor.state import Store
from gpu_monitor.state.recovery import recover, recoveries
from tests.remediate.remediate_helpers import (
    NODE,
    JumpClock,
    config,
    events_for,
    remediator,
)
from tests.state.state_damage import make_garbage


def recovered_store(tmp_path):
    path = str(tmp_path / "state.db")
    make_garbage(path)
    store, rec = recover(path, FakeClock(), by="daemon")
    assert rec is not None
    return path, store, rec


def recovery_events(fake):
    return [e for e in events_for(fake, NODE) if e["reason"] == "StateRecovered"]


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "live"])
def test_a_recovery_is_announced_once_naming_the_moved_aside_file(fake, tmp_path, dry_run):
    path, store, rec = recovered_store(tmp_path)
    r = remediator(fake, tmp_path / "host", store=store, cfg=config(dry_run=dry_run))
    r.tick()
    r.tick()
    events = recovery_events(fake)
    assert len(events) == 1
    event = events[0]
    assert event["type"] == "Warning"
    assert rec.moved_to in event["message"] and path in event["message"]
    assert "not a database" in event["message"]
    assert not event["message"].startswith("[dry-run]")  # the recovery really happened
    assert recoveries(store)[0].announced
    store.close()


def test_a_restarted_daemon_does_not_announce_it_again(fake, tmp_path):
    path, store, _ = recovered_store(tmp_path)
    remediator(fake, tmp_path / "host", store=store).tick()
    store.close()
    with Store.open(path) as again:
        remediator(fake, tmp_path / "host", store=again).tick()
    assert len(recovery_events(fake)) == 1


def test_an_event_the_apiserver_could_not_take_is_sent_later_and_marked_only_then(fake, tmp_path):
    _, store, _ = recovered_store(tmp_path)
    clock = JumpClock()
    r = remediator(fake, tmp_path / "host", store=store, clock=clock)
    fake.inject("POST", r"/api/v1/namespaces/default/events", 503, times=1)
    r.tick()
    assert recovery_events(fake) == [] and not recoveries(store)[0].announced  # only queued
    clock.advance(31)  # past the Event queue's backoff
    r.tick()
    r.tick()
    assert len(recovery_events(fake)) == 1 and recoveries(store)[0].announced
    store.close()


def test_an_event_queued_but_not_delivered_before_a_restart_is_sent_by_the_next_daemon(
        fake, tmp_path):
    path, store, _ = recovered_store(tmp_path)
    fake.inject("POST", r"/api/v1/namespaces/default/events", 503, times=100)
    remediator(fake, tmp_path / "host", store=store).tick()
    assert recovery_events(fake) == [] and not recoveries(store)[0].announced
    store.close()
    fake.clear_faults()
    with Store.open(path) as again:
        r = remediator(fake, tmp_path / "host", store=again)
        r.tick()
        r.tick()
        assert len(recovery_events(fake)) == 1 and recoveries(again)[0].announced
