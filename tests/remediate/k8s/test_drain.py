"""The drain: kubectl's pod filters as a table, and the eviction outcomes against the fake's
port of eviction.go (201, 404, 429 with and without Retry-After, 403, 500, UID change)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from gpu_monitor.clock import Clock
from gpu_monitor.remediate.k8s.drain import DrainPolicy, drain_node, requests_gpu, select_pods
from tests.kube.client_helpers import kube_for
from tests.remediate.remediate_helpers import FAST_DRAIN, NODE

ALL_PODS = replace(FAST_DRAIN, gpu_pods_only=False)


def pod(name="p", ns="ns", *, owner="ReplicaSet", phase="Running", gpus=0, init_gpus=0,
        mirror=False, empty_dir=False, resource="nvidia.com/gpu"):
    meta = {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "o", "controller": True}]
    if mirror:
        meta["annotations"]["kubernetes.io/config.mirror"] = "x"
    spec = {"containers": [{"name": "c", "resources": {"limits": {resource: str(gpus)}}
                            if gpus else {}}]}
    if init_gpus:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {resource: "1"}}}]
    if empty_dir:
        spec["volumes"] = [{"name": "s", "emptyDir": {}}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


SELECT = [
    # (id, pod, policy overrides, evicted?, why fragment)
    ("gpu pod is evicted", pod(gpus=1), {}, True, ""),
    ("cpu pod skipped when gpu_pods_only", pod(), {}, False, "requests no GPU"),
    ("cpu pod evicted otherwise", pod(), {"gpu_pods_only": False}, True, ""),
    ("gpu in an init container counts", pod(init_gpus=1), {}, True, ""),
    ("a MIG slice counts", pod(gpus=1, resource="nvidia.com/mig-1g.10gb"), {}, True, ""),
    ("daemonset pod never", pod(owner="DaemonSet", gpus=1), {}, False, "DaemonSet"),
    ("terminal daemonset pod may go", pod(owner="DaemonSet", gpus=1, phase="Succeeded"), {},
     True, ""),
    ("mirror pod never", pod(mirror=True, owner=None, gpus=1), {}, False, "mirror"),
    ("emptyDir evicted by default", pod(gpus=1, empty_dir=True), {}, True, ""),
    ("emptyDir skipped when its data must stay", pod(gpus=1, empty_dir=True),
     {"delete_emptydir_data": False}, False, "emptyDir"),
    ("terminal emptyDir pod always goes", pod(gpus=1, empty_dir=True, phase="Failed"),
     {"delete_emptydir_data": False}, True, ""),
    ("unmanaged evicted by default", pod(owner=None, gpus=1), {}, True, ""),
    ("unmanaged skipped when configured", pod(owner=None, gpus=1), {"evict_unmanaged": False},
     False, "no controller"),
    ("skipped namespace", pod(ns="kube-system", gpus=1), {"skip_namespaces": ("kube-system",)},
     False, "namespace kube-system"),
]


@pytest.mark.parametrize("p,overrides,evicted,why", [c[1:] for c in SELECT],
                         ids=[c[0] for c in SELECT])
def test_pod_selection(p, overrides, evicted, why):
    evict, skipped = select_pods([p], replace(DrainPolicy(), **overrides))
    assert bool(evict) is evicted
    if not evicted:
        assert why in skipped[0].detail


def test_requests_gpu_ignores_zero_quantities():
    assert not requests_gpu(pod(gpus=0))
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "0"}}
    assert not requests_gpu(p)


@pytest.fixture
def fake(cluster):
    return cluster(NODE, breaker=False)


def run(fake, policy=ALL_PODS, **kw):
    kube = kube_for(fake)
    counts = []
    report = drain_node(kube, NODE, policy, Clock(), on_outcome=counts.append, **kw)
    return report, counts


def outcome(report, name):
    return next(o for o in report.outcomes if o.name == name)


def test_a_pod_under_two_pdbs_fails_without_retry_and_the_others_are_evicted(fake):
    fake.add_pod("ns", "multi", node=NODE, labels={"app": "a", "tier": "t"},
                 owner=("ReplicaSet", "a"), grace_period=1, stop_after=0.1)
    fake.add_pod("ns", "free", node=NODE, owner=("ReplicaSet", "b"), grace_period=1,
                 stop_after=0.1)
    fake.set_pdb("ns", "pdb-a", match_labels={"app": "a"}, max_unavailable=1)
    fake.set_pdb("ns", "pdb-t", match_labels={"tier": "t"}, max_unavailable=1)
    report, _ = run(fake)
    assert not report.ok
    assert outcome(report, "multi").result == "failed" and "500" in outcome(report, "multi").detail
    assert outcome(report, "free").result == "evicted"
    posts = [q for q in fake.requests if q.path.endswith("/multi/eviction")]
    assert [q.status for q in posts] == [500]


def test_a_pod_gone_before_its_eviction_counts_as_done(fake):
    ghost = {"metadata": {"name": "ghost", "namespace": "ns", "uid": "u1",
                          "ownerReferences": [{"kind": "ReplicaSet", "controller": True}]},
             "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}}
    fake.add_namespace("ns")
    report, counts = run(fake, pods=[ghost])
    assert report.ok and outcome(report, "ghost").result == "gone" and counts == ["gone"]


def test_a_statefulset_pod_recreated_under_the_same_name_counts_as_evicted(fake):
    fake.add_pod("db", "db-0", node=NODE, owner=("StatefulSet", "db"), grace_period=1,
                 stop_after=0.1)
    fake.recreate_pod_on_deletion("db", "db-0")
    report, _ = run(fake)
    assert report.ok and outcome(report, "db-0").result == "evicted"
    assert fake.pod("db", "db-0") is not None  # the new one, with another UID


def test_a_pdb_that_never_allows_ends_at_the_global_deadline(fake):
    fake.add_pod("ns", "web-1", node=NODE, labels={"app": "web"}, owner=("ReplicaSet", "w"))
    fake.set_pdb("ns", "web-pdb", match_labels={"app": "web"}, min_available=1)
    t0 = time.monotonic()
    report, counts = run(fake, replace(ALL_PODS, timeout_s=1.5))
    assert 1.4 < time.monotonic() - t0 < 5
    o = outcome(report, "web-1")
    assert o.result == "timeout" and o.blocked >= 2 and "global timeout" in o.detail
    assert counts.count("blocked") == o.blocked and fake.pod("ns", "web-1") is not None


def test_retry_after_from_a_stale_pdb_is_honoured(fake):
    fake.add_pod("ns", "web-1", node=NODE, labels={"app": "web"}, owner=("ReplicaSet", "w"))
    fake.set_pdb("ns", "web-pdb", match_labels={"app": "web"}, max_unavailable=1, stale=True)
    report, _ = run(fake, replace(ALL_PODS, timeout_s=1.5))
    posts = [q for q in fake.requests if q.path.endswith("/eviction")]
    assert len(posts) == 1  # Retry-After 10 s is longer than the whole deadline
    assert outcome(report, "web-1").result == "timeout"


def test_namespace_terminating_waits_for_a_pod_already_terminating(fake):
    fake.add_pod("ns", "web-1", node=NODE, owner=("ReplicaSet", "w"), grace_period=1,
                 stop_after=0.3)
    kube = kube_for(fake)
    kube.call(kube.core.delete_namespaced_pod, "web-1", "ns")  # starts terminating
    fake.set_namespace_terminating("ns")
    report, _ = run(fake)
    assert report.ok and outcome(report, "web-1").result == "evicted"
    assert [q.status for q in fake.requests if q.path.endswith("/eviction")] == [403]


def test_evictions_run_concurrently(fake):
    for i in range(6):
        fake.add_pod("ns", f"job-{i}", node=NODE, owner=("ReplicaSet", "j"), grace_period=1,
                     stop_after=0.5)
    t0 = time.monotonic()
    report, _ = run(fake, replace(ALL_PODS, parallelism=6))
    assert report.ok and len(report.with_result("evicted")) == 6
    assert time.monotonic() - t0 < 2.5  # serially it would take 6 x 0.5 s and more


def test_cancel_stops_the_drain_without_marking_it_failed(fake):
    import threading

    fake.add_pod("ns", "job", node=NODE, owner=("ReplicaSet", "j"), grace_period=30)
    fake.hang_pod_deletion("ns", "job")
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    report, _ = run(fake, replace(ALL_PODS, timeout_s=30), cancel=cancel)
    assert report.cancelled and not report.ok
