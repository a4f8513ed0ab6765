"""Lease leadership: one leader among candidates, takeover after expiry, graceful hand-off,
and the record a new leader inherits."""

from __future__ import annotations

import json
import threading
import time

from gpu_monitor.clock import FakeClock
from gpu_monitor.fabric.lease import LeaderElector
from gpu_monitor.fabric.scheduler import FabricScheduler
from gpu_monitor.fabric.scheduler_settings import SchedulerSettings
from tests.waiting import eventually


def lease(fake_api, name="gpu-monitor-fabric-scheduler"):
    return fake_api.get("coordination.k8s.io", "leases", name, "gpu-monitor")


def test_one_leader_and_takeover_only_after_the_lease_expires(fabric_api, fake_api):
    clock = FakeClock()
    a = LeaderElector(fabric_api, "gpu-monitor", "l", "a", lease_duration_s=15,
                      renew_deadline_s=10, clock=clock)
    b = LeaderElector(fabric_api, "gpu-monitor", "l", "b", lease_duration_s=15,
                      renew_deadline_s=10, clock=clock)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    assert a.is_leader and not b.is_leader
    for _ in range(5):  # a renews every 2 s: b never gets it
        clock.advance(2)
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    spec = lease(fake_api, "l")["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0
    # a stops renewing (crashed): b waits a full lease duration from when it last saw a change.
    clock.advance(14)
    assert not b.try_acquire_or_renew()
    assert not a.is_leader  # past its renew deadline, a no longer acts
    clock.advance(1.5)
    assert b.try_acquire_or_renew() and b.is_leader
    spec = lease(fake_api, "l")["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    # a comes back: it sees b renewing and stays a follower.
    assert not a.try_acquire_or_renew()


def test_release_hands_over_without_waiting(fabric_api, fake_api):
    clock = FakeClock()
    a = LeaderElector(fabric_api, "gpu-monitor", "l", "a", clock=clock)
    b = LeaderElector(fabric_api, "gpu-monitor", "l", "b", clock=clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader
    assert lease(fake_api, "l")["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew()


def test_a_stale_write_loses(fabric_api, fake_api):
    """Two candidates that both saw the lease expire: the resourceVersion decides."""
    clock = FakeClock()
    a = LeaderElector(fabric_api, "gpu-monitor", "l", "a", clock=clock)
    assert a.try_acquire_or_renew()
    stale = lease(fake_api, "l")
    clock.advance(1)
    assert a.try_acquire_or_renew()  # renewed: the resourceVersion moved on
    stale["spec"]["holderIdentity"] = "intruder"
    from gpu_monitor.kube.errors import KubeError

    try:
        fabric_api.replace_lease("gpu-monitor", "l", stale)
    except KubeError as err:
        assert err.status == 409
    else:
        raise AssertionError("a write with a stale resourceVersion was accepted")
    assert lease(fake_api, "l")["spec"]["holderIdentity"] == "a"


def test_two_schedulers_one_leads_and_the_other_takes_over_after_expiry(
        fabric_api, fake_api, template, controller):
    for n in ("x0", "x1"):
        fake_api.add_node(n, gpus=8)
    common = dict(lease_duration_s=1.0, renew_deadline_s=0.6, retry_period_s=0.1,
                  interval_s=0.1, idle_for_s=0.0)
    a = FabricScheduler(fabric_api, SchedulerSettings(identity="sched-a", **common),
                        template=template)
    b = FabricScheduler(fabric_api, SchedulerSettings(identity="sched-b", **common),
                        template=template)
    ta = threading.Thread(target=a.run, daemon=True)
    ta.start()
    eventually(lambda: a.is_leader)
    tb = threading.Thread(target=b.run, daemon=True)
    tb.start()
    # a probes the idle pair once and records it; b, following, does nothing.
    eventually(lambda: a.counts[("group", "pass")] == 1)

    def recorded():
        cm = fake_api.get("", "configmaps", "gpu-monitor-fabric-state", "gpu-monitor")
        return cm and set(json.loads(cm["data"]["nodes.json"])) == {"x0", "x1"}

    eventually(recorded)
    time.sleep(0.3)
    assert a.is_leader and not b.is_leader
    assert lease(fake_api)["spec"]["holderIdentity"] == "sched-a"
    # a dies without releasing: b takes over only after the lease duration.
    t0 = time.monotonic()
    a.stop(release=False)
    ta.join(timeout=5)
    eventually(lambda: b.is_leader, timeout=10)
    assert time.monotonic() - t0 >= 0.9
    spec = lease(fake_api)["spec"]
    assert spec["holderIdentity"] == "sched-b" and spec["leaseTransitions"] == 1
    # b inherited the record: the pair was probed recently, no second probe.
    time.sleep(0.5)
    assert len(fake_api.list("batch", "jobs", "gpu-monitor-jobs")) == 1
    assert b.records["x0"]["probe_outcome"] == "pass"
    b.stop()
    tb.join(timeout=5)
    assert lease(fake_api)["spec"]["holderIdentity"] == ""  # b released on a clean stop
