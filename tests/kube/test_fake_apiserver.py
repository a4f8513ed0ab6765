"""The fake apiserver, driven by the real `kubernetes` client: it must answer as kube-apiserver does.

Each test names an apiserver behaviour the remediation code relies on (conflicts, failed `test`
ops, conditions merged by type, atomic taints, PDB-guarded evictions, paging, watches, faults).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client import ApiException

from tests.kube.fake_apiserver import (
    ApiError,
    FakeApiServer,
    parse_field_selector,
    parse_label_selector,
)
from tests.kube.fake_apiserver_patch import (
    PatchError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
    json_equal,
)
from tests.waiting import eventually

GPU_GROUP, GPU_VERSION, GPU_PLURAL = "gpu-monitor.io", "v1alpha1", "gpuhealthreports"


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def eviction(name: str, ns: str, **delete_options) -> client.V1Eviction:
    return client.V1Eviction(
        api_version="policy/v1",
        kind="Eviction",
        metadata=client.V1ObjectMeta(name=name, namespace=ns),
        delete_options=client.V1DeleteOptions(**delete_options) if delete_options else None,
    )


@pytest.fixture
def core(kube_client) -> client.CoreV1Api:
    return client.CoreV1Api(kube_client)


@pytest.fixture
def custom(kube_client) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_client)


def pod_gone(core: client.CoreV1Api, ns: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, ns)
    except ApiException as e:
        return e.status == 404
    return False


# ----------------------------------------------------------------------- patch semantics (pure)

NODE = {
    "metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y"]},
    "spec": {
        "taints": [{"key": "k1", "effect": "NoSchedule"}, {"key": "k2", "effect": "NoExecute"}]
    },
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "GpuHealthy", "status": "True", "reason": "Ok"},
        ]
    },
}


@pytest.mark.parametrize(
    ("patch", "path", "expected"),
    [
        (  # conditions merge by type: Ready survives, ours changes
            {
                "status": {
                    "conditions": [{"type": "GpuHealthy", "status": "False", "reason": "Xid79"}]
                }
            },
            ("status", "conditions"),
            [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "GpuHealthy", "status": "False", "reason": "Xid79"},
            ],
        ),
        (  # a new condition type is appended
            {"status": {"conditions": [{"type": "GpuXid", "status": "True"}]}},
            ("status", "conditions"),
            [*NODE["status"]["conditions"], {"type": "GpuXid", "status": "True"}],
        ),
        (  # $patch: delete removes one element by merge key
            {"status": {"conditions": [{"type": "GpuHealthy", "$patch": "delete"}]}},
            ("status", "conditions"),
            [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        ),
        (  # taints are atomic: the patch's list replaces the stored one
            {"spec": {"taints": [{"key": "ours", "effect": "NoSchedule"}]}},
            ("spec", "taints"),
            [{"key": "ours", "effect": "NoSchedule"}],
        ),
        (  # null deletes a map key, others stay
            {"metadata": {"labels": {"a": None, "c": "3"}}},
            ("metadata", "labels"),
            {"b": "2", "c": "3"},
        ),
        (  # finalizers merge as a set; $deleteFromPrimitiveList removes
            {"metadata": {"finalizers": ["z"], "$deleteFromPrimitiveList/finalizers": ["x"]}},
            ("metadata", "finalizers"),
            ["y", "z"],
        ),
        (  # $setElementOrder reorders a merged list
            {
                "status": {
                    "$setElementOrder/conditions": [{"type": "GpuHealthy"}, {"type": "Ready"}]
                }
            },
            ("status", "conditions"),
            [NODE["status"]["conditions"][1], NODE["status"]["conditions"][0]],
        ),
    ],
)
def test_strategic_merge_patch_follows_the_struct_tags(patch, path, expected):
    out = apply_strategic_merge_patch(NODE, patch)
    got = out
    for p in path:
        got = got[p]
    assert got == expected
    assert NODE["status"]["conditions"][0]["type"] == "Ready"  # input untouched


def test_merge_patch_replaces_lists_which_would_wipe_kubelet_conditions():
    out = apply_merge_patch(
        NODE, {"status": {"conditions": [{"type": "GpuHealthy", "status": "False"}]}}
    )
    assert [c["type"] for c in out["status"]["conditions"]] == ["GpuHealthy"]
    assert apply_merge_patch(NODE, {"metadata": {"labels": {"a": None}}})["metadata"]["labels"] == {
        "b": "2"
    }


@pytest.mark.parametrize(
    ("ops", "error"),
    [
        (
            [{"op": "test", "path": "/metadata/name", "value": "n2"}],
            "testing value /metadata/name failed: test failed",
        ),
        (
            [{"op": "replace", "path": "/spec/nope", "value": 1}],
            "replace operation does not apply: doc is missing key: /spec/nope: missing value",
        ),
        (
            [{"op": "remove", "path": "/spec/taints/5"}],
            "Unable to access invalid index: 5: invalid index referenced",
        ),
        (
            [{"op": "add", "path": "/nope/deeper", "value": 1}],
            'add operation does not apply: doc is missing path: "/nope/deeper": missing value',
        ),
    ],
)
def test_json_patch_failures_read_like_the_apiserver(ops, error):
    with pytest.raises(PatchError) as exc:
        apply_json_patch(NODE, ops)
    assert str(exc.value) == error
    assert not exc.value.bad_request


def test_json_patch_ops_with_escaped_pointers_and_append():
    doc = {"metadata": {"annotations": {"gpu-monitor.io/owner": "x"}}, "spec": {"taints": []}}
    out = apply_json_patch(
        doc,
        [
            {"op": "test", "path": "/metadata/annotations/gpu-monitor.io~1owner", "value": "x"},
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "k"}},
            {"op": "copy", "from": "/spec/taints/0", "path": "/spec/taints/-"},
            {
                "op": "move",
                "from": "/metadata/annotations/gpu-monitor.io~1owner",
                "path": "/metadata/owner",
            },
        ],
    )
    assert out == {
        "metadata": {"annotations": {}, "owner": "x"},
        "spec": {"taints": [{"key": "k"}, {"key": "k"}]},
    }
    with pytest.raises(PatchError) as exc:
        apply_json_patch(doc, {"op": "add"})
    assert exc.value.bad_request


def test_json_equality_does_not_confuse_true_and_one():
    assert not json_equal(True, 1)
    assert json_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]})


@pytest.mark.parametrize(
    ("selector", "labels", "match"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web,tier!=db", {"app": "web", "tier": "db"}, False),
        ("app in (web, api),!legacy", {"app": "api"}, True),
        ("app notin (web)", {}, True),
        ("gpu-monitor.io/node=n1", {"gpu-monitor.io/node": "n2"}, False),
        ("nvidia.com/gpu.present", {"nvidia.com/gpu.present": "true"}, True),
        ("", {"x": "y"}, True),
    ],
)
def test_label_selector_syntax(selector, labels, match):
    assert parse_label_selector(selector)(labels) is match


def test_bad_selectors_are_400():
    with pytest.raises(ApiError) as exc:
        parse_label_selector("app in web")
    assert exc.value.code == 400
    fake = FakeApiServer()
    with pytest.raises(ApiError) as exc:
        parse_field_selector(fake.resource("", "pods"), "spec.nope=1")
    assert exc.value.body["message"] == "field label not supported: spec.nope"


# ------------------------------------------------------------------------------------ discovery


def test_discovery_advertises_policy_v1_eviction(kube_client):
    assert "v1" in client.CoreApi(kube_client).get_api_versions().versions
    groups = {
        g.name: g.preferred_version.version
        for g in client.ApisApi(kube_client).get_api_versions().groups
    }
    assert groups["policy"] == "v1" and groups["gpu-monitor.io"] == "v1alpha1"
    assert {"apps", "coordination.k8s.io", "batch", "events.k8s.io"} <= groups.keys()
    res = {r.name: r for r in client.CoreV1Api(kube_client).get_api_resources().resources}
    ev = res["pods/eviction"]
    assert (ev.group, ev.version, ev.kind) == ("policy", "v1", "Eviction")
    assert "nodes/status" in res and res["nodes"].namespaced is False


# ----------------------------------------------------------------------------------------- nodes


def test_list_nodes_by_label_and_name(fake_api, core):
    fake_api.add_node("gpu-1", gpus=8)
    fake_api.add_node("gpu-2", gpus=8)
    fake_api.add_node("cpu-1")
    gpu = core.list_node(label_selector="nvidia.com/gpu.present=true")
    assert [n.metadata.name for n in gpu.items] == ["gpu-1", "gpu-2"]
    assert int(gpu.metadata.resource_version) == fake_api.resource_version
    one = core.list_node(field_selector="metadata.name=cpu-1")
    assert [n.metadata.name for n in one.items] == ["cpu-1"]


def test_cordon_patch_bumps_resource_version_and_a_noop_does_not(fake_api, core):
    fake_api.node_lifecycle_controller = False
    before = fake_api.add_node("n1")["metadata"]["resourceVersion"]
    after = core.patch_node("n1", {"spec": {"unschedulable": True}})
    assert after.spec.unschedulable is True
    assert int(after.metadata.resource_version) > int(before)
    again = core.patch_node("n1", {"spec": {"unschedulable": True}})
    assert again.metadata.resource_version == after.metadata.resource_version
    assert fake_api.requests[-1].content_type == "application/strategic-merge-patch+json"


def test_node_status_patch_merges_conditions_by_type(fake_api, core):
    fake_api.add_node("n1")
    ours = {
        "type": "GpuHealthy",
        "status": "False",
        "reason": "Xid79",
        "message": "GPU fell off the bus",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
    }
    node = core.patch_node_status("n1", {"status": {"conditions": [ours]}})
    types = {c.type: c for c in node.status.conditions}
    assert types["Ready"].status == "True"  # kubelet's condition survives
    assert types["GpuHealthy"].reason == "Xid79"
    node = core.patch_node_status(
        "n1", {"status": {"conditions": [{**ours, "status": "True", "reason": "Ok"}]}}
    )
    assert [c.type for c in node.status.conditions].count("GpuHealthy") == 1
    # the wrong patch type really does wipe kubelet's conditions
    node = core.patch_node_status(
        "n1", {"status": {"conditions": [ours]}}, _content_type="application/merge-patch+json"
    )
    assert [c.type for c in node.status.conditions] == ["GpuHealthy"]


def test_status_subresource_split(fake_api, core):
    fake_api.add_node("n1")
    node = core.patch_node("n1", {"status": {"conditions": []}, "metadata": {"labels": {"x": "y"}}})
    assert node.metadata.labels["x"] == "y" and len(node.status.conditions) == 4
    node = core.patch_node_status(
        "n1",
        {
            "spec": {"unschedulable": True},
            "metadata": {"labels": {"z": "1"}},
            "status": {"conditions": [{"type": "A", "status": "True"}]},
        },
    )
    assert not node.spec.unschedulable and "z" not in node.metadata.labels
    assert len(node.status.conditions) == 5


def test_taints_are_atomic_under_strategic_merge(fake_api, core):
    fake_api.add_node("n1", taints=[{"key": "other.io/maintenance", "effect": "NoSchedule"}])
    node = core.patch_node(
        "n1",
        {
            "spec": {
                "taints": [
                    {"key": "gpu-monitor.io/unhealthy", "value": "xid79", "effect": "NoSchedule"}
                ]
            }
        },
    )
    assert [t.key for t in node.spec.taints] == ["gpu-monitor.io/unhealthy"]


def test_guarded_json_patch_succeeds_then_fails_422_on_a_stale_resource_version(fake_api, core):
    fake_api.node_lifecycle_controller = False
    fake_api.add_node("n1", taints=[{"key": "other.io/maintenance", "effect": "NoSchedule"}])
    rv = core.read_node("n1").metadata.resource_version
    add = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {
            "op": "add",
            "path": "/spec/taints/-",
            "value": {"key": "gpu-monitor.io/unhealthy", "effect": "NoSchedule"},
        },
    ]
    node = core.patch_node("n1", add)
    assert [t.key for t in node.spec.taints] == ["other.io/maintenance", "gpu-monitor.io/unhealthy"]
    assert fake_api.requests[-1].content_type == "application/json-patch+json"
    with pytest.raises(ApiException) as exc:
        core.patch_node("n1", add)
    assert exc.value.status == 422
    body = status_of(exc.value)
    assert body["reason"] == "Invalid"
    assert body["message"] == "the server rejected our request due to an error in our request"
    assert body["details"]["causes"] == [
        {
            "reason": "UnexpectedServerResponse",
            "message": "testing value /metadata/resourceVersion failed: test failed",
        }
    ]
    assert len(core.read_node("n1").spec.taints) == 2


def test_resource_version_in_a_merge_patch_is_a_precondition(fake_api, core):
    fake_api.add_node("n1")
    with pytest.raises(ApiException) as exc:
        core.patch_node(
            "n1", {"metadata": {"resourceVersion": "1"}, "spec": {"unschedulable": True}}
        )
    assert exc.value.status == 409 and status_of(exc.value)["reason"] == "Conflict"


def test_put_with_a_stale_resource_version_is_409(fake_api, core):
    fake_api.add_node("n1")
    node = core.read_node("n1")
    core.patch_node("n1", {"metadata": {"labels": {"touched": "yes"}}})
    node.spec.unschedulable = True
    with pytest.raises(ApiException) as exc:
        core.replace_node("n1", node)
    body = status_of(exc.value)
    assert exc.value.status == 409
    assert body["message"] == (
        'Operation cannot be fulfilled on nodes "n1": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert body["details"] == {"name": "n1", "kind": "nodes"}
    fresh = core.read_node("n1")
    fresh.spec.unschedulable = True
    assert core.replace_node("n1", fresh).spec.unschedulable is True


def test_invalid_taints_are_422(fake_api, core):
    fake_api.add_node("n1")
    with pytest.raises(ApiException) as exc:
        core.patch_node("n1", {"spec": {"taints": [{"key": "a", "effect": "Sometimes"}]}})
    body = status_of(exc.value)
    assert (
        exc.value.status == 422 and body["details"]["causes"][0]["field"] == "spec.taints[0].effect"
    )


def test_node_lifecycle_controller_mirrors_unschedulable_as_a_taint(fake_api, core):
    fake_api.add_node("n1")
    core.patch_node("n1", {"spec": {"unschedulable": True}})
    eventually(
        lambda: (
            [t.key for t in core.read_node("n1").spec.taints or []]
            == ["node.kubernetes.io/unschedulable"]
        )
    )
    core.patch_node("n1", {"spec": {"unschedulable": None}})
    eventually(lambda: not core.read_node("n1").spec.taints)


def test_dry_run_changes_nothing(fake_api, core):
    fake_api.add_node("n1")
    rv = core.read_node("n1").metadata.resource_version
    assert core.patch_node(
        "n1", {"spec": {"unschedulable": True}}, dry_run="All"
    ).spec.unschedulable
    node = core.read_node("n1")
    assert not node.spec.unschedulable and node.metadata.resource_version == rv


# ------------------------------------------------------------------------------------------ pods


def test_list_pods_by_node_and_phase_across_namespaces_with_paging(fake_api, core):
    for i in range(5):
        fake_api.add_pod(f"ns{i % 2}", f"p{i}", node="n1")
    fake_api.add_pod("ns0", "elsewhere", node="n2")
    fake_api.add_pod("ns1", "done", node="n1", phase="Succeeded")
    page = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1", limit=2)
    names = [p.metadata.name for p in page.items]
    list_rv = page.metadata.resource_version
    fake_api.add_pod("ns0", "late", node="n1")  # not in the snapshot the pages come from
    while page.metadata._continue:
        page = core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName=n1", limit=2, _continue=page.metadata._continue
        )
        assert page.metadata.resource_version == list_rv
        names += [p.metadata.name for p in page.items]
    assert names == ["p0", "p2", "p4", "done", "p1", "p3"]
    running = core.list_pod_for_all_namespaces(
        field_selector="spec.nodeName=n1,status.phase=Running"
    )
    assert "done" not in [p.metadata.name for p in running.items] and len(running.items) == 6
    assert [
        p.metadata.name
        for p in core.list_namespaced_pod("ns1", field_selector="spec.nodeName=n1").items
    ] == ["done", "p1", "p3"]
    with pytest.raises(ApiException) as exc:
        core.list_pod_for_all_namespaces(field_selector="spec.gpu=1")
    assert exc.value.status == 400


def wire_get(fake_api: FakeApiServer, path: str) -> dict:
    with urllib.request.urlopen(fake_api.url + path, timeout=5) as resp:
        return json.loads(resp.read())


def test_builtin_list_items_carry_no_kind_but_get_does(fake_api):
    fake_api.add_pod("ns", "p", node="n1")
    body = wire_get(fake_api, "/api/v1/pods")
    assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
    assert "kind" not in body["items"][0] and body["items"][0]["metadata"]["name"] == "p"
    got = wire_get(fake_api, "/api/v1/namespaces/ns/pods/p")
    assert got["kind"] == "Pod" and got["apiVersion"] == "v1"


def test_owner_references_for_daemonset_and_mirror_pods(fake_api, core):
    fake_api.add_node("n1")
    fake_api.add_pod("ns", "agent-1", node="n1", daemonset="agent")
    fake_api.add_pod("kube-system", "etcd-n1", node="n1", mirror=True)
    ds = client.AppsV1Api(core.api_client).read_namespaced_daemon_set("agent", "ns")
    agent = core.read_namespaced_pod("agent-1", "ns")
    ref = agent.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.uid, ref.controller) == (
        "DaemonSet",
        "agent",
        ds.metadata.uid,
        True,
    )
    mirror = core.read_namespaced_pod("etcd-n1", "kube-system")
    assert "kubernetes.io/config.mirror" in mirror.metadata.annotations
    assert mirror.metadata.owner_references[0].kind == "Node"


def test_api_created_pods_are_started_by_the_fake_kubelet(fake_api, core):
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name="job-1"),
        spec=client.V1PodSpec(node_name="n1", containers=[client.V1Container(name="c", image="i")]),
    )
    created = core.create_namespaced_pod("default", body)
    assert created.status.phase == "Pending" and created.metadata.uid
    eventually(lambda: core.read_namespaced_pod("job-1", "default").status.phase == "Running")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("default", body)
    assert exc.value.status == 409 and status_of(exc.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod("missing", body)
    assert (
        exc.value.status == 404
        and status_of(exc.value)["message"] == 'namespaces "missing" not found'
    )


def test_graceful_delete_then_kubelet_finishes(fake_api, core):
    fake_api.add_pod("ns", "p", node="n1", grace_period=30, stop_after=0.3)
    deleted = core.delete_namespaced_pod("p", "ns")
    assert deleted.metadata.deletion_timestamp is not None
    assert deleted.metadata.deletion_grace_period_seconds == 30
    assert core.read_namespaced_pod("p", "ns").metadata.deletion_timestamp is not None
    eventually(lambda: pod_gone(core, "ns", "p"))


def test_grace_period_zero_deletes_at_once(fake_api, core):
    fake_api.add_pod("ns", "p", node="n1")
    core.delete_namespaced_pod("p", "ns", grace_period_seconds=0)
    assert pod_gone(core, "ns", "p")


def test_hung_pod_stays_terminating_until_finished(fake_api, core):
    fake_api.time_scale = 0.01
    fake_api.add_pod("ns", "stuck", node="n1", grace_period=10)
    fake_api.hang_pod_deletion("ns", "stuck")
    core.delete_namespaced_pod("stuck", "ns")
    time.sleep(0.5)  # 5x the scaled grace period
    assert core.read_namespaced_pod("stuck", "ns").metadata.deletion_timestamp is not None
    fake_api.finish_pod_deletion("ns", "stuck")
    assert pod_gone(core, "ns", "stuck")


def test_statefulset_style_recreation_gives_a_new_uid(fake_api, core):
    old = fake_api.add_pod("ns", "db-0", node="n1", owner=("StatefulSet", "db"), stop_after=0.1)
    fake_api.recreate_pod_on_deletion("ns", "db-0")
    core.delete_namespaced_pod("db-0", "ns")
    new = eventually(
        lambda: (
            (p := fake_api.pod("ns", "db-0"))
            and p["metadata"]["uid"] != old["metadata"]["uid"]
            and p
        )
    )
    assert new["metadata"].get("deletionTimestamp") is None


def test_delete_precondition_on_uid_is_409(fake_api, core):
    fake_api.add_pod("ns", "p", node="n1")
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_pod(
            "p",
            "ns",
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid")),
        )
    assert (
        exc.value.status == 409
        and "Precondition failed: UID in precondition" in status_of(exc.value)["message"]
    )


# ------------------------------------------------------------------------------------- eviction


def test_eviction_without_pdb_is_201_and_the_pod_goes(fake_api, core):
    fake_api.add_pod("ns", "web-1", node="n1", stop_after=0.2)
    core.create_namespaced_pod_eviction("web-1", "ns", eviction("web-1", "ns"))
    req = fake_api.requests[-1]
    assert (req.status, req.content_type) == (201, None)  # the Python client sends no Content-Type
    pod = core.read_namespaced_pod("web-1", "ns")
    assert pod.metadata.deletion_timestamp is not None
    assert any(
        c.type == "DisruptionTarget" and c.reason == "EvictionByEvictionAPI"
        for c in pod.status.conditions
    )
    eventually(lambda: pod_gone(core, "ns", "web-1"))


def test_eviction_blocked_by_pdb_is_429_until_another_replica_is_healthy(fake_api, core):
    fake_api.add_pod("ns", "web-1", node="n1", labels={"app": "web"}, stop_after=0.1)
    fake_api.set_pdb("ns", "web-pdb", match_labels={"app": "web"}, min_available=1)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("web-1", "ns", eviction("web-1", "ns"))
    assert exc.value.status == 429
    assert "Retry-After" not in exc.value.headers
    assert status_of(exc.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web-pdb needs 1 healthy pods and has 1 currently",
                }
            ]
        },
        "code": 429,
    }
    fake_api.add_pod("ns", "web-2", node="n2", labels={"app": "web"})
    pdb = client.PolicyV1Api(core.api_client).read_namespaced_pod_disruption_budget("web-pdb", "ns")
    assert (
        pdb.status.current_healthy,
        pdb.status.desired_healthy,
        pdb.status.disruptions_allowed,
    ) == (2, 1, 1)
    core.create_namespaced_pod_eviction("web-1", "ns", eviction("web-1", "ns"))
    with pytest.raises(ApiException) as exc:  # the budget is spent while web-1 terminates
        core.create_namespaced_pod_eviction("web-2", "ns", eviction("web-2", "ns"))
    assert exc.value.status == 429


def test_max_unavailable_percentage_rounds_up(fake_api, core):
    for i in range(3):
        fake_api.add_pod("ns", f"w{i}", node="n1", labels={"app": "w"})
    pdb = fake_api.set_pdb("ns", "w", match_labels={"app": "w"}, max_unavailable="34%")
    assert (pdb["status"]["desiredHealthy"], pdb["status"]["disruptionsAllowed"]) == (1, 2)


def test_eviction_of_a_gone_pod_is_404(core):
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("ghost", "default", eviction("ghost", "default"))
    assert exc.value.status == 404 and status_of(exc.value)["details"] == {
        "name": "ghost",
        "kind": "pods",
    }


def test_eviction_with_two_pdbs_is_500_without_a_reason(fake_api, core):
    fake_api.add_pod("ns", "web-1", node="n1", labels={"app": "web", "tier": "front"})
    fake_api.set_pdb("ns", "a", match_labels={"app": "web"}, max_unavailable=1)
    fake_api.set_pdb("ns", "b", match_labels={"tier": "front"}, max_unavailable=1)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("web-1", "ns", eviction("web-1", "ns"))
    body = status_of(exc.value)
    assert exc.value.status == 500 and "reason" not in body
    assert body["message"].startswith("This pod has more than one PodDisruptionBudget")


def test_injected_500_on_eviction(fake_api, core):
    fake_api.add_pod("ns", "web-1", node="n1")
    fault = fake_api.inject("POST", r"/api/v1/namespaces/ns/pods/[^/]+/eviction", status=500)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("web-1", "ns", eviction("web-1", "ns"))
    assert exc.value.status == 500 and status_of(exc.value)["reason"] == "InternalError"
    assert fault.hits == 1
    assert (
        fake_api.pod("ns", "web-1")["metadata"].get("deletionTimestamp") is None
    )  # state untouched
    core.create_namespaced_pod_eviction("web-1", "ns", eviction("web-1", "ns"))  # times=1: spent


def test_stale_pdb_is_429_with_retry_after_10(fake_api, core):
    fake_api.add_pod("ns", "web-1", node="n1", labels={"app": "web"})
    fake_api.set_pdb("ns", "web-pdb", match_labels={"app": "web"}, max_unavailable=1, stale=True)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("web-1", "ns", eviction("web-1", "ns"))
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "10"
    assert status_of(exc.value)["details"]["retryAfterSeconds"] == 10


def test_pinned_disruptions_allowed_is_decremented_by_evictions(fake_api, core):
    for i in range(3):
        fake_api.add_pod("ns", f"w{i}", node="n1", labels={"app": "w"}, stop_after=5)
    fake_api.set_pdb("ns", "w", match_labels={"app": "w"}, min_available=0, disruptions_allowed=1)
    core.create_namespaced_pod_eviction("w0", "ns", eviction("w0", "ns"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("w1", "ns", eviction("w1", "ns"))
    assert exc.value.status == 429


@pytest.mark.parametrize(
    ("phase", "ready", "policy"), [("Pending", True, None), ("Running", False, "AlwaysAllow")]
)
def test_eviction_ignores_the_pdb_for_pending_or_unhealthy_pods(
    fake_api, core, phase, ready, policy
):
    fake_api.add_pod("ns", "w", node="n1", labels={"app": "w"}, phase=phase, ready=ready)
    fake_api.set_pdb(
        "ns", "w", match_labels={"app": "w"}, min_available=1, unhealthy_pod_eviction_policy=policy
    )
    core.create_namespaced_pod_eviction("w", "ns", eviction("w", "ns"))
    assert fake_api.pod("ns", "w")["metadata"]["deletionTimestamp"]


def test_eviction_in_a_terminating_namespace_is_403_namespace_terminating(fake_api, core):
    fake_api.add_pod("doomed", "p", node="n1")
    fake_api.set_namespace_terminating("doomed")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod_eviction("p", "doomed", eviction("p", "doomed"))
    body = status_of(exc.value)
    assert (
        exc.value.status == 403 and body["details"]["causes"][0]["reason"] == "NamespaceTerminating"
    )


def test_eviction_delete_options_grace_period(fake_api, core):
    fake_api.add_pod("ns", "p", node="n1", grace_period=300)
    core.create_namespaced_pod_eviction("p", "ns", eviction("p", "ns", grace_period_seconds=0))
    assert pod_gone(core, "ns", "p")


# ------------------------------------------------------------------------------------ configmaps


def test_configmap_compare_and_swap(fake_api, core):
    fake_api.add_namespace("gpu-monitor")
    cm = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="gpu-monitor-breaker"), data={"state": "closed"}
    )
    created = core.create_namespaced_config_map("gpu-monitor", cm)
    mine = core.read_namespaced_config_map("gpu-monitor-breaker", "gpu-monitor")
    theirs = core.read_namespaced_config_map("gpu-monitor-breaker", "gpu-monitor")
    theirs.data["slots"] = '{"n2": 1}'
    core.replace_namespaced_config_map("gpu-monitor-breaker", "gpu-monitor", theirs)
    mine.data["slots"] = '{"n1": 1}'
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map("gpu-monitor-breaker", "gpu-monitor", mine)
    assert exc.value.status == 409 and status_of(exc.value)["details"]["kind"] == "configmaps"
    fresh = core.read_namespaced_config_map("gpu-monitor-breaker", "gpu-monitor")
    assert fresh.data["slots"] == '{"n2": 1}' and fresh.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_config_map(
            "gpu-monitor-breaker",
            "gpu-monitor",
            {
                "metadata": {"resourceVersion": mine.metadata.resource_version},
                "data": {"state": "tripped"},
            },
        )
    assert exc.value.status == 409
    patched = core.patch_namespaced_config_map(
        "gpu-monitor-breaker", "gpu-monitor", {"data": {"state": "tripped"}}
    )
    assert patched.data == {"state": "tripped", "slots": '{"n2": 1}'}


# ------------------------------------------------------------------------------ custom resources


def report(name: str, node: str) -> dict:
    return {
        "apiVersion": f"{GPU_GROUP}/{GPU_VERSION}",
        "kind": "GPUHealthReport",
        "metadata": {"name": name, "labels": {"gpu-monitor.io/node": node}},
        "spec": {"node": node, "reason": "sdc", "source": "trainer"},
    }


def test_custom_resource_crud_and_label_selection(fake_api, custom):
    fake_api.add_namespace("gpu-monitor")
    args = (GPU_GROUP, GPU_VERSION, "gpu-monitor", GPU_PLURAL)
    a = custom.create_namespaced_custom_object(*args, report("r1", "n1"))
    custom.create_namespaced_custom_object(*args, report("r2", "n2"))
    assert a["metadata"]["generation"] == 1 and a["metadata"]["uid"]
    mine = custom.list_namespaced_custom_object(*args, label_selector="gpu-monitor.io/node=n1")
    assert [i["metadata"]["name"] for i in mine["items"]] == ["r1"]
    assert mine["items"][0]["kind"] == "GPUHealthReport"  # custom resource lists keep kind
    patched = custom.patch_namespaced_custom_object(*args, "r1", {"spec": {"reason": "xid"}})
    assert patched["spec"] == {"node": "n1", "reason": "xid", "source": "trainer"}
    assert patched["metadata"]["generation"] == 2
    st = custom.patch_namespaced_custom_object_status(*args, "r1", {"status": {"seen": True}})
    assert st["status"] == {"seen": True} and st["metadata"]["generation"] == 2
    no_rv = {k: v for k, v in patched.items()}
    no_rv["metadata"] = {k: v for k, v in patched["metadata"].items() if k != "resourceVersion"}
    with pytest.raises(ApiException) as exc:  # custom resources refuse unconditional updates
        custom.replace_namespaced_custom_object(*args, "r1", no_rv)
    assert exc.value.status == 422
    with pytest.raises(ApiException) as exc:  # and strategic merge
        custom.patch_namespaced_custom_object(
            *args, "r1", {"spec": {}}, _content_type="application/strategic-merge-patch+json"
        )
    assert exc.value.status == 415
    custom.delete_namespaced_custom_object(*args, "r1")
    with pytest.raises(ApiException) as exc:
        custom.get_namespaced_custom_object(*args, "r1")
    assert status_of(exc.value)["message"] == 'gpuhealthreports.gpu-monitor.io "r1" not found'


def test_finalizers_hold_deletion(fake_api, custom):
    fake_api.add_namespace("gpu-monitor")
    args = (GPU_GROUP, GPU_VERSION, "gpu-monitor", GPU_PLURAL)
    body = report("r1", "n1")
    body["metadata"]["finalizers"] = ["gpu-monitor.io/consumed"]
    custom.create_namespaced_custom_object(*args, body)
    custom.delete_namespaced_custom_object(*args, "r1")
    assert custom.get_namespaced_custom_object(*args, "r1")["metadata"]["deletionTimestamp"]
    custom.patch_namespaced_custom_object(*args, "r1", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as exc:
        custom.get_namespaced_custom_object(*args, "r1")
    assert exc.value.status == 404


def test_leases_and_jobs_are_served(fake_api, kube_client):
    coord = client.CoordinationV1Api(kube_client)
    lease = coord.create_namespaced_lease(
        "default",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="breaker"),
            spec=client.V1LeaseSpec(holder_identity="n1"),
        ),
    )
    lease.spec.holder_identity = "n2"
    assert coord.replace_namespaced_lease("breaker", "default", lease).spec.holder_identity == "n2"
    with pytest.raises(ApiException) as exc:
        coord.replace_namespaced_lease("breaker", "default", lease)
    assert exc.value.status == 409
    batch = client.BatchV1Api(kube_client)
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="retest"),
        spec=client.V1JobSpec(
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never", containers=[client.V1Container(name="c", image="i")]
                )
            )
        ),
    )
    assert batch.create_namespaced_job("default", job).metadata.generation == 1


# ----------------------------------------------------------------------------------------- events


def node_event(ns: str, **extra) -> client.CoreV1Event:
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="n1."),
        involved_object=client.V1ObjectReference(
            kind="Node", name="n1", uid="n1", api_version="v1"
        ),
        reason="GpuXid",
        message="Xid 79",
        type="Warning",
        source=client.V1EventSource(component="gpu-monitor", host="n1"),
        **extra,
    )


def test_core_events_for_a_node_belong_in_default(fake_api, core):
    fake_api.add_namespace("gpu-monitor")
    ev = core.create_namespaced_event("default", node_event("default"))
    assert ev.metadata.name.startswith("n1.")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_event("gpu-monitor", node_event("gpu-monitor"))
    body = status_of(exc.value)
    assert (
        exc.value.status == 422
        and body["details"]["causes"][0]["field"] == "involvedObject.namespace"
    )
    patched = core.patch_namespaced_event(ev.metadata.name, "default", {"count": 2})
    assert patched.count == 2
    listed = core.list_namespaced_event(
        "default", field_selector="involvedObject.name=n1,reason=GpuXid"
    )
    assert [e.metadata.name for e in listed.items] == [ev.metadata.name]


def test_events_k8s_io_is_another_view_of_core_events(fake_api, kube_client):
    evapi = client.EventsV1Api(kube_client)
    body = client.EventsV1Event(
        metadata=client.V1ObjectMeta(name="n1.gpu"),
        event_time=time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
        regarding=client.V1ObjectReference(kind="Node", name="n1"),
        reason="GpuXid",
        note="Xid 79",
        type="Warning",
        action="Quarantine",
        reporting_controller="gpu-monitor.io/daemon",
        reporting_instance="n1",
    )
    created = evapi.create_namespaced_event("default", body)
    assert created.regarding.name == "n1" and created.note == "Xid 79"
    core_view = client.CoreV1Api(kube_client).read_namespaced_event("n1.gpu", "default")
    assert core_view.involved_object.name == "n1" and core_view.message == "Xid 79"
    assert core_view.reporting_component == "gpu-monitor.io/daemon"
    assert (
        evapi.patch_namespaced_event("n1.gpu", "default", {"note": "Xid 79 again"}).note
        == "Xid 79 again"
    )
    listed = evapi.list_namespaced_event("default", field_selector="regarding.name=n1")
    assert [e.metadata.name for e in listed.items] == ["n1.gpu"]
    body.metadata = client.V1ObjectMeta(name="bad")
    body.action = None
    with pytest.raises(ApiException) as exc:
        evapi.create_namespaced_event("default", body)
    assert exc.value.status == 422


# ------------------------------------------------------------------------------------------ watch


def test_watch_nodes_sees_a_modification(fake_api, core):
    fake_api.add_node("n1")
    fake_api.add_node("n2")

    def cordon_later() -> None:
        fake_api.wait_for_request("GET", "/api/v1/nodes")
        time.sleep(0.1)
        with client.ApiClient(client.Configuration(host=fake_api.url)) as other:
            client.CoreV1Api(other).patch_node("n1", {"spec": {"unschedulable": True}})

    t = threading.Thread(target=cordon_later, daemon=True)
    t.start()
    w = watch.Watch()
    seen = []
    for ev in w.stream(core.list_node, timeout_seconds=5):
        seen.append((ev["type"], ev["object"].metadata.name))
        if ev["type"] == "MODIFIED":
            assert ev["object"].spec.unschedulable is True
            w.stop()
    t.join()
    assert seen[:2] == [("ADDED", "n1"), ("ADDED", "n2")] and ("MODIFIED", "n1") in seen
    assert fake_api.requests[0].params["watch"] == "true"


def test_watch_from_a_resource_version_and_field_selector(fake_api, core):
    fake_api.node_lifecycle_controller = False
    fake_api.add_node("n1")
    fake_api.add_node("n2")
    rv = core.list_node().metadata.resource_version
    core.patch_node("n2", {"metadata": {"labels": {"x": "1"}}})
    core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
    core.delete_node("n1")
    events = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            core.list_node,
            resource_version=rv,
            field_selector="metadata.name=n1",
            timeout_seconds=1,
        )
    ]
    assert events == [("MODIFIED", "n1"), ("DELETED", "n1")]


def test_watch_after_compaction_is_410(fake_api, core):
    fake_api.add_node("n1")
    rv = core.list_node().metadata.resource_version
    core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
    fake_api.compact()
    with pytest.raises(ApiException) as exc:
        list(
            watch.Watch().stream(
                core.list_node, resource_version=str(int(rv) - 1), timeout_seconds=1
            )
        )
    assert exc.value.status == 410


def test_watch_custom_resources_for_this_node(fake_api, custom):
    fake_api.add_namespace("gpu-monitor")
    args = (GPU_GROUP, GPU_VERSION, "gpu-monitor", GPU_PLURAL)

    def create_later() -> None:
        fake_api.wait_for_request(
            "GET", f"/apis/{GPU_GROUP}/{GPU_VERSION}/namespaces/gpu-monitor/{GPU_PLURAL}"
        )
        with client.ApiClient(client.Configuration(host=fake_api.url)) as other:
            c = client.CustomObjectsApi(other)
            c.create_namespaced_custom_object(*args, report("other", "n2"))
            c.create_namespaced_custom_object(*args, report("mine", "n1"))

    threading.Thread(target=create_later, daemon=True).start()
    w = watch.Watch()
    for ev in w.stream(
        custom.list_namespaced_custom_object,
        *args,
        label_selector="gpu-monitor.io/node=n1",
        timeout_seconds=5,
    ):
        assert (ev["type"], ev["object"]["metadata"]["name"]) == ("ADDED", "mine")
        w.stop()
        break
    else:
        pytest.fail("no event")


# ----------------------------------------------------------------------------------------- faults


def test_injected_errors_surface_as_api_exceptions_with_status_bodies(fake_api, core):
    fake_api.add_node("n1")
    fake_api.inject("PATCH", "/api/v1/nodes/n1", status=409, times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            core.patch_node("n1", {"spec": {"unschedulable": True}})
        assert exc.value.status == 409 and status_of(exc.value)["reason"] == "Conflict"
    assert core.patch_node("n1", {"spec": {"unschedulable": True}}).spec.unschedulable
    fake_api.inject("PATCH", "/api/v1/nodes/n1", status=429, retry_after=3)
    with pytest.raises(ApiException) as exc:  # PATCH is never retried by the client
        core.patch_node("n1", {"spec": {"unschedulable": False}})
    assert exc.value.headers["Retry-After"] == "3" and status_of(exc.value)["code"] == 429
    fake_api.inject("GET", "/api/v1/nodes/n1", status=503)
    with pytest.raises(ApiException) as exc:  # without Retry-After, a GET is not retried either
        core.read_node("n1")
    assert exc.value.status == 503 and status_of(exc.value)["reason"] == "ServiceUnavailable"


def test_urllib3_retries_a_get_answered_429_with_retry_after(fake_api, core):
    """Real client behaviour the drain code must know: urllib3's default Retry honours
    Retry-After on 429/503 for idempotent methods, so such a GET never raises."""
    fake_api.add_node("n1")
    fake_api.inject("GET", "/api/v1/nodes/n1", status=429, retry_after=1)
    assert core.read_node("n1").metadata.name == "n1"
    assert [r.status for r in fake_api.requests] == [429, 200]


def test_dropped_connection_surfaces_as_a_urllib3_error(fake_api, core):
    fake_api.add_node("n1")
    fake_api.drop_connections(times=1, method="PATCH")
    with pytest.raises(urllib3.exceptions.HTTPError):  # PATCH is not retried by urllib3
        core.patch_node("n1", {"spec": {"unschedulable": True}})
    assert not fake_api.node("n1")["spec"].get("unschedulable")
    assert [r.status for r in fake_api.requests] == [0]
    fake_api.drop_connections(times=1, method="GET")
    assert core.read_node("n1").metadata.name == "n1"  # GET: urllib3 retries transparently
    assert [r.status for r in fake_api.requests[1:]] == [0, 200]


def test_delay_beyond_the_client_timeout_is_a_timeout(fake_api, core):
    fake_api.add_node("n1")
    fake_api.inject_delay("PATCH", "/api/v1/nodes/n1", seconds=1.0)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.patch_node("n1", {"spec": {"unschedulable": True}}, _request_timeout=0.2)


def test_a_fault_gated_by_a_predicate_lasts_while_it_holds(fake_api, core):
    fake_api.add_node("n1")
    outage = {"on": True}
    fault = fake_api.inject(
        "GET", "/api/v1/nodes/n1", status=503, times=None, active=lambda: outage["on"]
    )
    for _ in range(3):
        with pytest.raises(ApiException) as exc:
            core.read_node("n1")
        assert exc.value.status == 503
    outage["on"] = False
    assert core.read_node("n1").metadata.name == "n1"
    assert fault.hits == 3


def test_a_hook_runs_before_the_request_it_matches_narrowed_by_content_type(fake_api, core):
    fake_api.add_node("n1")
    seen = []

    def operator_cordons(request):
        seen.append((request.method, request.content_type, request.status))
        fake_api.add_node("n1", unschedulable=True)  # lands before the request is served

    fake_api.on_request(
        "PATCH",
        "/api/v1/nodes/n1",
        operator_cordons,
        content_type="application/strategic-merge-patch+json",
    )
    rv = core.read_node("n1").metadata.resource_version
    core.patch_node("n1", [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}])
    assert seen == []  # a JSON patch: not the hook's Content-Type
    rv = core.read_node("n1").metadata.resource_version
    with pytest.raises(ApiException) as exc:
        core.patch_node("n1", {"metadata": {"resourceVersion": rv}, "spec": {"unschedulable": True}})
    assert exc.value.status == 409  # the hook's write moved the resourceVersion first
    assert seen == [("PATCH", "application/strategic-merge-patch+json", 0)]
    core.patch_node("n1", {"metadata": {"labels": {"x": "y"}}})
    assert len(seen) == 1  # times=1


def test_server_down_then_back_on_the_same_port_with_its_state(fake_api, core):
    fake_api.add_node("n1")
    port = fake_api.port
    fake_api.stop()
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.read_node("n1", _request_timeout=1)
    fake_api.start()
    assert fake_api.port == port
    assert core.read_node("n1").metadata.name == "n1"


def test_request_log_records_the_wire(fake_api, core):
    fake_api.add_node("n1")
    core.patch_node("n1", {"spec": {"unschedulable": True}}, field_manager="gpu-monitor")
    (req,) = fake_api.requests
    assert (req.method, req.path, req.params, req.content_type, req.json, req.status) == (
        "PATCH",
        "/api/v1/nodes/n1",
        {"fieldManager": "gpu-monitor"},
        "application/strategic-merge-patch+json",
        {"spec": {"unschedulable": True}},
        200,
    )
    assert fake_api.sequence() == [
        ("PATCH", "/api/v1/nodes/n1", "application/strategic-merge-patch+json")
    ]
    fake_api.clear_requests()
    assert fake_api.requests == []


def test_delete_answers_a_status_without_code_and_deletecollection_lists_the_deleted(
    fake_api, core
):
    fake_api.add_namespace("gpu-monitor")
    for name in ("a", "b", "keep"):
        core.create_namespaced_config_map(
            "gpu-monitor",
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(
                    name=name, labels={"doomed": str(name != "keep").lower()}
                )
            ),
        )
    uid = core.read_namespaced_config_map("a", "gpu-monitor").metadata.uid
    core.delete_namespaced_config_map("a", "gpu-monitor")
    (req,) = [r for r in fake_api.requests if r.method == "DELETE"]
    assert req.status == 200
    body = wire_get(fake_api, "/api/v1/namespaces/gpu-monitor/configmaps")
    assert [i["metadata"]["name"] for i in body["items"]] == ["b", "keep"]
    resp = urllib.request.urlopen(
        urllib.request.Request(
            fake_api.url + "/api/v1/namespaces/gpu-monitor/configmaps/b", method="DELETE"
        ),
        timeout=5,
    )
    b_uid = body["items"][0]["metadata"]["uid"]
    assert json.loads(resp.read()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "b", "kind": "configmaps", "uid": b_uid},
    }
    assert uid and uid != b_uid
    core.create_namespaced_config_map(
        "gpu-monitor",
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c", labels={"doomed": "true"})),
    )
    req = urllib.request.Request(
        fake_api.url + "/api/v1/namespaces/gpu-monitor/configmaps?labelSelector=doomed%3Dtrue",
        method="DELETE",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        gone = json.loads(resp.read())
    assert gone["kind"] == "ConfigMapList" and [i["metadata"]["name"] for i in gone["items"]] == [
        "c"
    ]
    core.delete_collection_namespaced_config_map("gpu-monitor", label_selector="doomed=true")
    assert [c.metadata.name for c in core.list_namespaced_config_map("gpu-monitor").items] == [
        "keep"
    ]


def test_api_groups_limits_what_discovery_offers():
    with FakeApiServer(api_groups=("policy",)) as server:
        body = wire_get(server, "/apis")
        assert [g["name"] for g in body["groups"]] == ["policy"]
        with pytest.raises(urllib.error.HTTPError) as exc:
            wire_get(server, "/apis/apps/v1/namespaces/ns/daemonsets/agent")
        assert exc.value.code == 404
        server.add_pod("ns", "p", node="n1", labels={"app": "p"})  # PDBs still count internally
        assert (
            server.set_pdb("ns", "p", match_labels={"app": "p"}, min_available=1)["status"][
                "currentHealthy"
            ]
            == 1
        )
