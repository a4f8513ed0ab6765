"""The scheduler's list-watch cache of nodes and active pods, against the wire-level fake API
server through the real kubernetes client: one list, then changes by watch; 410 Gone lists
again; an outage makes the cache say nothing rather than something stale."""

from __future__ import annotations

import pytest

from gpu_monitor.fabric.cache import ListWatchCache
from gpu_monitor.fabric.scheduler import FabricScheduler
from gpu_monitor.fabric.scheduler_settings import SchedulerSettings
from tests.waiting import eventually

RACK = "topology.kubernetes.io/rack"


def names(items):
    return sorted(o["metadata"]["name"] for o in items or [])


def pod_lists(fake_api):
    return [r for r in fake_api.requests
            if r.method == "GET" and r.path == "/api/v1/pods" and "watch=" not in (r.query or "")]


@pytest.fixture
def pods_cache(fabric_api):
    cache = ListWatchCache("pods", fabric_api.list_active_pods_rv, fabric_api.watch_active_pods,
                           timeout_s=2, backoff_s=(0.05, 0.2))
    yield cache
    cache.stop()


def test_one_list_then_every_change_by_watch(fake_api, fabric_api, pods_cache):
    from kubernetes import client

    fake_api.add_pod("ml", "a", node="n0", gpus=8)
    fake_api.add_pod("ml", "done", node="n1", phase="Succeeded")
    assert pods_cache.items() is None  # not listed yet: the caller must list for itself
    pods_cache.start()
    eventually(lambda: names(pods_cache.items()) == ["a"])
    fake_api.add_pod("ml", "b", node="n1", gpus=8)
    eventually(lambda: names(pods_cache.items()) == ["a", "b"])
    core = client.CoreV1Api(fabric_api.kube.api_client)
    core.patch_namespaced_pod_status("a", "ml", {"status": {"phase": "Succeeded"}})
    eventually(lambda: names(pods_cache.items()) == ["b"])  # finished: out of the field selector
    core.delete_namespaced_pod("b", "ml", grace_period_seconds=0)
    eventually(lambda: names(pods_cache.items()) == [])
    assert pods_cache.lists == 1 and len(pod_lists(fake_api)) == 1
    assert pods_cache.events >= 3


def test_compacted_history_lists_again(fake_api, fabric_api, pods_cache):
    pods_cache.start()
    eventually(lambda: pods_cache.items() == [])
    fake_api.inject(None, "/api/v1/pods", status=503, times=None)
    eventually(lambda: pods_cache.errors >= 1, timeout=15)  # the stream ended, cannot resume
    fake_api.add_pod("ml", "c", node="n0")  # missed while away ...
    fake_api.compact()  # ... and no longer in the history a watch could resume from
    fake_api.clear_faults()
    eventually(lambda: pods_cache.lists >= 2 and names(pods_cache.items()) == ["c"])


def test_an_outage_makes_the_cache_answer_none_not_stale_data(fake_api, fabric_api):
    now = [0.0]
    cache = ListWatchCache("pods", fabric_api.list_active_pods_rv, fabric_api.watch_active_pods,
                           timeout_s=1, stale_after_s=30.0, backoff_s=(0.05, 0.1),
                           clock=lambda: now[0])
    try:
        fake_api.add_pod("ml", "a", node="n0")
        cache.start()
        eventually(lambda: names(cache.items()) == ["a"])
        fake_api.inject(None, "/api/v1/pods", status=503, times=None)
        eventually(lambda: cache.errors >= 1)  # the watch cannot resume
        assert names(cache.items()) == ["a"]  # recent contact: still trusted
        now[0] += 31.0
        assert cache.items() is None  # out of contact too long: the caller lists (and fails)
        fake_api.clear_faults()
        fake_api.add_pod("ml", "b", node="n0")
        eventually(lambda: names(cache.items()) == ["a", "b"])  # resumed from its resourceVersion
    finally:
        cache.stop()


def test_the_running_scheduler_lists_once_and_still_sees_a_workload_arrive(
        fake_api, fabric_api, template, controller):
    controller.verdict = lambda nodes: None  # keep probes running
    for n in ("n0", "n1", "n2"):
        fake_api.add_node(n, gpus=8, labels={RACK: "r1"})
    fake_api.add_pod("ml", "trainer", node="n0", gpus=8)
    settings = SchedulerSettings(identity="t", idle_for_s=0.0, interval_s=0.05,
                                 topology_labels=(RACK,), rdma_resources={"rdma/ib": "1"},
                                 group_size=3, min_group_size=3)
    sched = FabricScheduler(fabric_api, settings, template=template, always_lead=True)
    sched.start_caches()
    try:
        eventually(lambda: all(c.synced for c in sched.caches.values()))
        fake_api.clear_requests()
        for _ in range(10):
            sched.tick()
        assert not pod_lists(fake_api)  # ten rounds, no pod list
        assert not fake_api.list("batch", "jobs", "gpu-monitor-jobs")  # n0 busy: only 2 idle
        from kubernetes import client

        client.CoreV1Api(fabric_api.kube.api_client).delete_namespaced_pod(
            "trainer", "ml", grace_period_seconds=0)
        eventually(lambda: not sched.caches["pods"].items())
        sched.tick()
        assert len(fake_api.list("batch", "jobs", "gpu-monitor-jobs")) == 1  # all three idle now
    finally:
        sched.stop_caches()


def test_the_cache_keeps_only_what_the_idle_decision_reads(fake_api, fabric_api):
    from gpu_monitor.fabric.idle import node_facts, slim_node, slim_pod

    fake_api.add_node("n0", gpus=8, labels={RACK: "r1"},
                      taints=[{"key": "x", "value": "y", "effect": "NoSchedule"}])
    fake_api.add_pod("ml", "a", node="n0", gpus=8)
    fake_api.add_pod("ml", "b", node="n0")
    node = fabric_api.list_nodes(None)[0]
    pods = fabric_api.list_active_pods()
    full = node_facts(node, pods)
    slim = node_facts(slim_node(node), [slim_pod(p) for p in pods])
    assert slim == full and full.gpu_pods == ("ml/a",) and full.untolerated
    assert len(repr(slim_pod(pods[0]))) < len(repr(pods[0])) / 2
