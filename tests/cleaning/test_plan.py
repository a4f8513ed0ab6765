"""The cleaner's decisions (gpu_monitor/cleaning/plan.py), table by table."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpu_monitor.cleaning import plan
from gpu_monitor.cleaning.plan import (
    CreateHold,
    DeleteHold,
    Hold,
    Memory,
    NodeView,
    RunSuite,
    Workload,
    after_suite,
    step,
)
from gpu_monitor.model import Verdict

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
JOB = Workload("team", "train-0", 8, T0 - timedelta(hours=1))
PENDING = Hold("gpu-monitor-hold-n1", bound=False, running=False, deleting=False)
BOUND = Hold("gpu-monitor-hold-n1", bound=True, running=True, deleting=False)
GOING = Hold("gpu-monitor-hold-n1", bound=True, running=True, deleting=True)


def view(*workloads: Workload, hold: Hold | None = None, quarantined: bool = False) -> NodeView:
    return NodeView(tuple(workloads), hold, quarantined)


@pytest.mark.parametrize(("node", "mem", "state", "actions"), [
    # a workload holds the GPUs: the hold is created behind it, and only once
    (view(JOB), Memory(), plan.STATE_IN_USE, (CreateHold(),)),
    (view(JOB, hold=PENDING), Memory(), plan.STATE_IN_USE, ()),
    # the last GPU pod left; the scheduler has not bound the hold yet
    (view(hold=PENDING), Memory(), plan.STATE_WAITING, ()),
    # a node idle and dirty with no hold (a restart, a workload shorter than a poll)
    (view(), Memory(), plan.STATE_WAITING, (CreateHold(),)),
    # bound and admitted: the suite runs
    (view(hold=BOUND), Memory(), plan.STATE_CLEANING, (RunSuite(1),)),
    # bound but not yet Running (the kubelet has not admitted it): no suite yet
    (view(hold=Hold("h", bound=True, running=False, deleting=False)), Memory(),
     plan.STATE_WAITING, ()),
    # passed since the last workload: nothing held, nothing created
    (view(), Memory(dirty=False), plan.STATE_CLEAN, ()),
    # ... and a hold a killed daemon left after recording the pass is given back
    (view(hold=BOUND), Memory(dirty=False), plan.STATE_CLEAN, (DeleteHold(plan.RELEASED),)),
    # the bootstrap gate has not passed: its taint holds the node, its suite runs; no second
    (NodeView((), None, False, provisioning=True), Memory(), plan.STATE_PROVISIONING, ()),
    # the gate passed after the node was seen idle: that was the clean, no suite again
    (NodeView((), None, False, provisioned_at=T0), Memory(idle_since=T0 - timedelta(seconds=5)),
     plan.STATE_CLEAN, ()),
    # a gate pass from before the node was last in use is no clean of this idle spell
    (NodeView((), None, False, provisioned_at=T0 - timedelta(seconds=9)),
     Memory(idle_since=T0 - timedelta(seconds=5)), plan.STATE_WAITING, (CreateHold(),)),
    # a failed run keeps the node held for remediation's answer; none by then: given back
    (view(hold=BOUND), Memory(held_failed=True, next_try=T0 + timedelta(seconds=1)),
     plan.STATE_FAILED, ()),
    (view(hold=BOUND), Memory(held_failed=True, next_try=T0), plan.STATE_UNCLEAN,
     (DeleteHold(plan.GIVEN_BACK),)),
    # given back uncleaned: not held again (no hold created) until a workload has run
    (view(), Memory(given_up=True), plan.STATE_UNCLEAN, ()),
    (view(JOB), Memory(given_up=True), plan.STATE_IN_USE, (CreateHold(),)),
    # an unknown run is tried again, not before its time
    (view(hold=BOUND), Memory(attempts=1, next_try=T0 + timedelta(seconds=1)),
     plan.STATE_RETRYING, ()),
    (view(hold=BOUND), Memory(attempts=1, next_try=T0), plan.STATE_CLEANING, (RunSuite(2),)),
    # quarantined: skipped, and a hold we hold is given back
    (view(hold=BOUND, quarantined=True), Memory(), plan.STATE_QUARANTINED,
     (DeleteHold(plan.QUARANTINED),)),
    (view(JOB, quarantined=True), Memory(), plan.STATE_QUARANTINED, ()),
    # a hold being deleted is left to finish: never counted as held, never doubled
    (view(hold=GOING), Memory(), plan.STATE_WAITING, ()),
    (view(JOB, hold=GOING), Memory(), plan.STATE_IN_USE, ()),
    (view(hold=GOING, quarantined=True), Memory(), plan.STATE_QUARANTINED, ()),
    # refused by the kubelet (a workload was admitted first): deleted, made anew next step
    (view(JOB, hold=Hold("h", bound=True, running=False, deleting=False, refused=True)),
     Memory(), plan.STATE_IN_USE, (DeleteHold(plan.REFUSED),)),
])
def test_step(node: NodeView, mem: Memory, state: str, actions: tuple) -> None:
    got = step(node, mem, T0)
    assert (got.state, got.actions) == (state, actions)


def test_the_suite_never_runs_beside_a_workload() -> None:
    # Capacity should make this impossible (the hold asks for every GPU); if the API shows
    # both, the workload wins and the suite waits.
    got = step(view(JOB, hold=BOUND), Memory(), T0)
    assert not any(isinstance(a, RunSuite) for a in got.actions)


def test_a_pass_releases_and_the_node_stays_clean_until_the_next_workload() -> None:
    mem = step(view(hold=BOUND), Memory(), T0).memory
    done = after_suite(mem, Verdict.HEALTHY, T0, retry_after_s=60)
    assert done.actions == (DeleteHold(plan.RELEASED),)
    assert (done.memory.dirty, done.memory.last_clean) == (False, T0)
    # released and idle: no new hold (it would bind at once and clean again, forever)
    assert step(view(), done.memory, T0 + timedelta(hours=5)).actions == ()
    # the next workload makes it dirty and puts the hold behind it again
    later = Workload("team", "train-1", 8, T0 + timedelta(hours=6))
    got = step(view(later), done.memory, T0 + timedelta(hours=6))
    assert (got.actions, got.memory.dirty) == ((CreateHold(),), True)


def test_an_unknown_is_no_pass_and_is_retried_after_the_wait() -> None:
    mem = after_suite(Memory(), Verdict.UNKNOWN, T0, retry_after_s=600).memory
    assert (mem.dirty, mem.attempts, mem.next_try) == (True, 1, T0 + timedelta(seconds=600))
    assert step(view(hold=BOUND), mem, T0 + timedelta(seconds=599)).actions == ()
    assert step(view(hold=BOUND), mem, T0 + timedelta(seconds=600)).actions == (RunSuite(2),)


def test_max_attempts_unknown_runs_give_the_node_back_uncleaned() -> None:
    # A fault on every node (a tool missing fleet-wide) must not hold the whole fleet.
    mem = Memory()
    for attempt in (1, 2):
        done = after_suite(mem, Verdict.UNKNOWN, T0, retry_after_s=60, max_attempts=3)
        assert (done.state, done.memory.attempts) == (plan.STATE_RETRYING, attempt)
        mem = done.memory
    done = after_suite(mem, Verdict.UNKNOWN, T0, retry_after_s=60, max_attempts=3)
    assert (done.state, done.actions) == (plan.STATE_UNCLEAN, (DeleteHold(plan.GIVEN_BACK),))
    assert (done.memory.given_back, done.memory.attempts, done.memory.dirty) == (1, 0, True)


def test_a_fail_holds_until_quarantine_then_the_retest_is_the_cleaning() -> None:
    mem = after_suite(Memory(), Verdict.UNHEALTHY, T0, retry_after_s=60).memory
    assert step(view(hold=BOUND), mem, T0).state == plan.STATE_FAILED
    # not quarantined within retry_after_s (remediation off, in dry-run, the breaker): taking
    # the node out of service is remediation's call, so the node is given back, uncleaned
    back = step(view(hold=BOUND), mem, T0 + timedelta(seconds=60))
    assert (back.state, back.actions) == (plan.STATE_UNCLEAN, (DeleteHold(plan.GIVEN_BACK),))
    assert (back.memory.dirty, back.memory.given_up, back.memory.given_back) == (True, True, 1)
    assert step(view(), back.memory, T0 + timedelta(seconds=61)).actions == ()
    q = step(view(hold=BOUND, quarantined=True), mem, T0)
    assert q.actions == (DeleteHold(plan.QUARANTINED),)
    # returned to service (after a passed retest): clean, not held again, not failed
    back = step(view(), q.memory, T0 + timedelta(hours=1))
    assert (back.state, back.actions) == (plan.STATE_CLEAN, ())


def test_a_workload_that_started_on_an_uncleaned_node_is_counted_as_missed() -> None:
    idle = step(view(hold=PENDING), Memory(), T0)  # seen idle at T0, still dirty
    slipped = Workload("team", "train-2", 8, T0 + timedelta(seconds=2))
    got = step(view(slipped, hold=PENDING), idle.memory, T0 + timedelta(seconds=3))
    assert (got.missed_now, got.memory.missed) == (1, 1)
    # the same workload seen again is not counted twice (idle_since is cleared)
    again = step(view(slipped, hold=PENDING), got.memory, T0 + timedelta(seconds=9))
    assert (again.missed_now, again.memory.missed) == (0, 1)
    # a workload that started before the idle moment (seen late) is no miss
    old = step(view(JOB, hold=PENDING), idle.memory, T0 + timedelta(seconds=3))
    assert old.missed_now == 0
    # nor one that starts on a node cleaned since
    clean = after_suite(idle.memory, Verdict.HEALTHY, T0 + timedelta(seconds=1),
                        retry_after_s=60).memory
    assert step(view(slipped), clean, T0 + timedelta(seconds=3)).missed_now == 0


def test_memory_round_trips_through_json() -> None:
    mem = Memory(dirty=False, idle_since=T0, attempts=2, next_try=T0 + timedelta(seconds=5),
                 held_failed=True, last_clean=T0 - timedelta(days=1), missed=3, given_up=True,
                 given_back=2)
    assert Memory.from_json(mem.to_json()) == mem
    assert Memory.from_json({}) == Memory()


def test_an_unreadable_stored_memory_starts_dirty_instead_of_crashing(tmp_path) -> None:
    from gpu_monitor.cleaning.loop import KV_KEY, KV_NAMESPACE, Cleaner
    from gpu_monitor.state import Store

    store = Store.open(str(tmp_path / "state.db"))
    try:
        store.set_kv(KV_NAMESPACE, KV_KEY, {"dirty": False, "idle_since": "not a time"})
        c = Cleaner(lambda: None, "n1", store, run_suite=lambda *_: Verdict.HEALTHY,
                    quarantined=lambda: False)
        assert c.memory() == Memory()
        store.set_kv(KV_NAMESPACE, KV_KEY, {"dirty": False, "attempts": "many"})
        assert c.memory() == Memory()
    finally:
        store.close()


def test_a_cleaner_without_an_api_server_counts_each_pass_and_logs_once(tmp_path,
                                                                          caplog) -> None:
    from gpu_monitor.cleaning.loop import Cleaner
    from gpu_monitor.state import Store

    def no_cluster():
        raise RuntimeError("Invalid kube-config file. No configuration found.")

    store = Store.open(str(tmp_path / "state.db"))
    try:
        c = Cleaner(no_cluster, "n1", store, run_suite=lambda *_: Verdict.HEALTHY,
                    quarantined=lambda: False)
        with caplog.at_level("WARNING", logger="gpu_monitor.cleaning.loop"):
            assert [c.tick() for _ in range(3)] == [None, None, None]
        assert c.counts.errors == 3 and "No configuration found" in c.counts.last_error
        assert len([r for r in caplog.records if "passes on n1 fail" in r.message]) == 1
    finally:
        store.close()


def test_gpu_monitors_own_pods_are_no_workload() -> None:
    from gpu_monitor.cleaning.hold import HoldSpec, build_hold_pod, node_view
    from gpu_monitor.fabric.pods import COMPONENT_IDLE_CHECK, LABEL_COMPONENT, LABEL_MANAGED_BY
    from gpu_monitor.fabric.pods import MANAGER as FABRIC

    def pod(name: str, labels: dict) -> dict:
        return {"metadata": {"name": name, "namespace": "gpu-monitor", "labels": labels},
                "spec": {"nodeName": "n1", "containers": [
                    {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
                "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}}

    idle_check = pod("idle-1", {LABEL_MANAGED_BY: FABRIC, LABEL_COMPONENT: COMPONENT_IDLE_CHECK})
    hold = build_hold_pod("n1", 8, HoldSpec())
    customer = pod("train-0", {})
    customer["metadata"]["namespace"] = "team"
    v = node_view("n1", [idle_check, hold, customer], hold, quarantined=False)
    assert [w.name for w in v.workloads] == ["train-0"]
    assert node_view("n1", [idle_check], None, quarantined=False).workloads == ()
