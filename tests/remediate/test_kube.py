"""The Kubernetes wire (kube.py) against the fake apiserver: conditions, taints, events, retries,
the metadata-only GPU node count, and RBAC_RULES covering every request gpu-monitor makes."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_monitor.clock import FakeClock
from gpu_monitor.kube.errors import KubeError, KubeUnavailable
from gpu_monitor.kube.ratelimit import RateLimiter
from gpu_monitor.remediate.k8s.delivery import RBAC_RULES
from gpu_monitor.remediate.k8s.node import NodeClient
from gpu_monitor.remediate.reports import report_object
from tests.remediate.remediate_helpers import (
    NODE,
    TAINT_KEY,
    Resets,
    kube_for,
    our_conditions,
    our_taints,
    patch_as_human,
    remediator,
    seed_breaker,
    set_boot_id,
    xid,
)
from tests.waiting import eventually

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Want:
    type: str
    status: str
    reason: str
    message: str


@pytest.fixture
def fake(cluster):
    return cluster(NODE, breaker=False)


@pytest.fixture
def node(fake):
    kube = kube_for(fake, FakeClock(T0))
    try:
        yield NodeClient(kube, NODE, taint_key=TAINT_KEY)
    finally:
        kube.close()


# --- conditions ------------------------------------------------------------------------------------


def test_conditions_merge_by_type_and_keep_kubelets(fake, node):
    node.sync_conditions([Want("GPUXidError", "True", "Xid79", "gpu:3")], T0)
    conds = {c["type"]: c for c in fake.node(NODE)["status"]["conditions"]}
    assert conds["Ready"]["status"] == "True" and "MemoryPressure" in conds
    assert (conds["GPUXidError"]["status"], conds["GPUXidError"]["reason"]) == ("True", "Xid79")
    patch = [q for q in fake.requests if q.path.endswith("/status")][-1]
    assert patch.content_type == "application/strategic-merge-patch+json"


def test_transition_time_moves_only_on_a_status_or_reason_change(fake, node):
    clock = node.clock
    node.sync_conditions([Want("GPUXidError", "True", "Xid79", "a")], T0)
    t1 = T0 + timedelta(seconds=10)
    clock.advance(10)
    assert node.sync_conditions([Want("GPUXidError", "True", "Xid79", "b")], t1)  # message only
    c = our_conditions(fake.node(NODE))["GPUXidError"]
    assert c["lastTransitionTime"] == "2026-03-01T00:00:00Z" and c["message"] == "b"
    assert c["lastHeartbeatTime"] == "2026-03-01T00:00:10Z"
    t2 = T0 + timedelta(seconds=20)
    assert node.sync_conditions([Want("GPUXidError", "False", "NoProblem", "ok")], t2)
    assert our_conditions(fake.node(NODE))["GPUXidError"]["lastTransitionTime"] == \
        "2026-03-01T00:00:20Z"


def test_no_write_without_a_change_until_the_heartbeat_is_due(fake, node):
    want = [Want("GPUXidError", "False", "NoProblem", "ok")]
    assert node.sync_conditions(want, T0)
    node.clock.advance(60)
    assert not node.sync_conditions(want, T0 + timedelta(seconds=60))
    node.clock.advance(node.heartbeat_s)
    assert node.sync_conditions(want, T0 + timedelta(seconds=400))
    assert len([q for q in fake.requests if q.path.endswith("/status")]) == 2


def test_existing_conditions_are_read_back_not_reset(fake):
    old = {"type": "GPUXidError", "status": "True", "reason": "Xid79", "message": "m",
           "lastHeartbeatTime": "2025-01-01T00:00:00Z",
           "lastTransitionTime": "2025-01-01T00:00:00Z"}
    fake.add_node(NODE, gpus=8, conditions=[old])
    kube = kube_for(fake, FakeClock(T0))
    fresh = NodeClient(kube, NODE)  # a restarted daemon
    fresh.load_conditions(["GPUXidError"])
    fresh.sync_conditions([Want("GPUXidError", "True", "Xid79", "m")], T0)
    c = our_conditions(fake.node(NODE))["GPUXidError"]
    assert c["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    assert c["lastHeartbeatTime"] == "2026-03-01T00:00:00Z"


# --- taints and the ownership record ---------------------------------------------------------------


def test_quarantine_writes_record_and_taint_in_one_guarded_json_patch(fake, node):
    out = node.ensure_quarantined("Xid79", "quarantined", T0)
    assert out.cordoned and out.tainted and not out.cordon_pre_existing
    patches = [q for q in fake.requests if q.method == "PATCH"]
    first, cordon = patches
    assert first.content_type == "application/json-patch+json"
    assert first.json[0]["op"] == "test" and first.json[0]["path"] == "/metadata/resourceVersion"
    assert cordon.content_type == "application/strategic-merge-patch+json"
    assert cordon.json["spec"] == {"unschedulable": True}
    again = node.ensure_quarantined("Xid79", "quarantined", T0)
    assert not again.cordoned and not again.tainted
    assert len([q for q in fake.requests if q.method == "PATCH"]) == 2  # nothing to change


def test_a_stale_view_is_caught_by_the_test_op_and_the_other_writers_taint_kept(fake, node):
    stale = node.read()
    other = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
    patch_as_human(fake, NODE, {"spec": {"taints": [other]}})  # kubectl taint: the whole list
    node.ensure_quarantined("Xid79", "quarantined", T0, view=stale)
    taints = fake.node(NODE)["spec"]["taints"]
    assert other in taints and len(our_taints(fake.node(NODE))) == 1
    statuses = [q.status for q in fake.requests if q.method == "PATCH"]
    assert statuses[:3] == [200, 422, 200]  # human, our stale attempt, our retry


def test_taint_value_follows_the_most_severe_reason_and_only_ours_is_removed(fake, node):
    other = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
    fake.add_node(NODE, gpus=8, taints=[other])
    node.ensure_quarantined("Xid48", "quarantined", T0)
    node.ensure_quarantined("Xid79", "quarantined", T0)
    assert our_taints(fake.node(NODE)) == [{"key": TAINT_KEY, "value": "Xid79",
                                            "effect": "NoSchedule"}]
    view, uncordoned = node.release()
    assert uncordoned and not view.unschedulable
    # The node lifecycle controller drops its own unschedulable taint after the uncordon, on
    # its own time (as the real one does): wait for it rather than read at once.
    eventually(lambda: fake.node(NODE)["spec"].get("taints") == [other],
               what="only the operator's taint left")
    assert not any(k.startswith("gpu-monitor.io/") and k != "gpu-monitor.io/state"
                   for k in fake.node(NODE)["metadata"]["annotations"])


def test_a_pre_existing_cordon_is_recorded_and_kept_on_release(fake, node):
    fake.add_node(NODE, gpus=8, unschedulable=True)
    out = node.ensure_quarantined("Xid79", "quarantined", T0)
    assert out.cordon_pre_existing and not out.cordoned
    _, uncordoned = node.release()
    assert not uncordoned and fake.node(NODE)["spec"]["unschedulable"] is True


def test_events_name_the_node_and_repeat_only_after_the_window(fake, node):
    node.read()
    assert node.event("Xid79", "gpu:3", type="Warning")
    assert not node.event("Xid79", "gpu:3", type="Warning")  # deduplicated
    node.clock.advance(node.event_repeat_s + 1)
    assert node.event("Xid79", "gpu:3", type="Warning")
    events = fake.list("", "events")
    assert len(events) == 2
    e = events[0]
    assert e["metadata"]["namespace"] == "default"
    assert e["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE,
                                   "uid": fake.node(NODE)["metadata"]["uid"]}
    assert (e["type"], e["reason"], e["source"]) == ("Warning", "Xid79",
                                                     {"component": "gpu-monitor", "host": NODE})


# --- the client ------------------------------------------------------------------------------------


def test_transient_errors_are_retried_and_others_raised(fake):
    kube = kube_for(fake)
    fake.inject("GET", f"/api/v1/nodes/{NODE}", 503, times=2)
    assert kube.get_node(NODE)["metadata"]["name"] == NODE
    with pytest.raises(KubeError) as err:
        kube.get_node("nope")
    assert err.value.status == 404 and "not found" in err.value.message


def test_an_unreachable_api_server_gives_up_at_the_deadline(fake):
    kube = kube_for(fake, retry_deadline_s=0.5)
    fake.stop()
    with pytest.raises(KubeUnavailable):
        kube.get_node(NODE)


def test_gpu_nodes_are_counted_by_label_from_a_metadata_list(fake):
    for i in range(3):
        fake.add_node(f"gpu-{i}", gpus=8)
    fake.add_node("cpu-0")
    kube = kube_for(fake)
    assert kube.count_gpu_nodes() == 4
    lst = [q for q in fake.requests if q.path == "/api/v1/nodes"][-1]
    assert lst.params["labelSelector"] == "nvidia.com/gpu.present=true"


def test_rate_limiter_spaces_writes_after_the_burst():
    clock = FakeClock()
    rl = RateLimiter(qps=2.0, burst=2, clock=clock)
    waits = [rl.acquire() for _ in range(4)]
    assert waits[:2] == [0.0, 0.0] and waits[2] == pytest.approx(0.5)
    assert waits[3] == pytest.approx(0.5)


def test_try_acquire_never_sleeps_and_keeps_tokens_for_writes_that_wait():
    clock = FakeClock()
    rl = RateLimiter(qps=1.0, burst=4, clock=clock)
    assert [rl.try_acquire(keep=2) for _ in range(3)] == [True, True, False]
    assert clock.monotonic() == 1000.0  # never slept
    assert rl.acquire() == 0.0 and rl.acquire() == 0.0  # the kept tokens
    clock.advance(3)
    assert rl.try_acquire(keep=2)


def test_an_event_with_no_write_token_free_waits_without_delaying_anything(fake):
    clock = FakeClock(T0)
    kube = kube_for(fake, clock, qps=1.0)
    kube.limiter = RateLimiter(1.0, 3, clock)
    node = NodeClient(kube, NODE)
    node.read()
    kube.patch_node(NODE, {"metadata": {"labels": {"a": "1"}}})  # the node's own writes
    assert node.event("Xid79", "gpu:3")
    assert node.events.pending == 1 and clock.monotonic() == 1000.0  # queued, no sleep
    assert not node.events.backing_off  # no token is not a failure
    assert [q for q in fake.requests if q.method == "POST"] == []
    clock.advance(5)
    assert node.flush_events() == 1 and node.events.pending == 0


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["name", "server", "cluster", "user", "context", "token",
                         "current-context", "clusters", "contexts", "users", "x"]),
        inner, max_size=4),
    max_leaves=12))
@settings(deadline=None, derandomize=True, max_examples=150,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_kubeconfig_either_loads_or_raises_kubeconfig_error(tmp_path, doc):
    """Whatever the file holds, nothing but KubeConfigError leaves the start-up check."""
    import yaml

    from gpu_monitor.kube.config import kubeconfig_factory
    from gpu_monitor.kube.errors import KubeConfigError

    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    try:
        kubeconfig_factory(str(path))
    except KubeConfigError as exc:
        assert str(path) in str(exc)


def test_rate_limited_writes_under_a_burst_of_changes(fake):
    clock = FakeClock()
    kube = kube_for(fake, clock, qps=5.0)
    kube.limiter = RateLimiter(5.0, 2, clock)
    start = clock.monotonic()
    for i in range(6):
        kube.patch_node(NODE, {"metadata": {"labels": {"n": str(i)}}})
    assert clock.monotonic() - start == pytest.approx(0.8)


# --- RBAC ------------------------------------------------------------------------------------------

_CORE = re.compile(r"^/api/v1/(?:namespaces/(?P<ns>[^/]+)/)?(?P<res>[^/]+)(?:/(?P<name>[^/]+))?"
                   r"(?:/(?P<sub>[^/]+))?$")
_GROUP = re.compile(r"^/apis/(?P<group>[^/]+)/[^/]+/(?:namespaces/(?P<ns>[^/]+)/)?(?P<res>[^/]+)"
                    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


def rbac_of(method: str, path: str, query: str) -> tuple[str, str, str]:
    m = _CORE.match(path)
    group = ""
    if m is None:
        m = _GROUP.match(path)
        assert m is not None, path
        group = m["group"]
    if m["res"] == "namespaces" and m["name"] and not m["sub"]:
        raise AssertionError(path)
    res = m["res"] + (f"/{m['sub']}" if m["sub"] else "")
    verb = {"GET": "get" if m["name"] else ("watch" if "watch=" in query else "list"),
            "PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}[method]
    return group, res, verb


def test_rbac_rules_cover_every_request_of_a_whole_lifecycle(fake, tmp_path):
    """Every request a quarantine, drain, reset, retest, release, report and breaker cycle
    makes is allowed by RBAC_RULES - the manifests are tested against that constant."""
    seed_breaker(fake)
    fake.add_pod("train", "job-0", node=NODE, owner=("ReplicaSet", "j"), gpus=8, grace_period=1,
                 stop_after=0.1)
    kube = kube_for(fake)
    kube.create_custom("gpu-monitor.io", "v1alpha1", "gpu-monitor", "gpuhealthreports",
                       report_object(NODE, "SdcAlarm", "test", {}, T0, "gpu-monitor"))
    fake.clear_requests()
    r = remediator(fake, tmp_path, resets=Resets(),
                   retest=lambda: [], watch_reports=True)
    r.on_results([xid(79)])
    r.tick()
    set_boot_id(r.actuator.paths, "boot-2")
    r.tick()
    r.reports.stop()
    allowed = {(g, res, v) for g, res, verbs in RBAC_RULES for v in verbs}
    used = {rbac_of(q.method, q.path, q.query) for q in fake.requests}
    assert used <= allowed, used - allowed
    for must in [("", "pods/eviction", "create"), ("", "nodes/status", "patch"),
                 ("", "configmaps", "update"), ("gpu-monitor.io", "gpuhealthreports", "list")]:
        assert must in used


def test_rbac_rules_are_well_formed():
    seen = set()
    for group, res, verbs in RBAC_RULES:
        assert isinstance(group, str) and res and verbs
        assert set(verbs) <= {"get", "list", "watch", "create", "update", "patch", "delete"}
        assert (group, res) not in seen
        seen.add((group, res))


def test_watch_of_reports_runs_in_its_own_thread(fake, tmp_path):
    got = threading.Event()
    fake.add_namespace("gpu-monitor")
    r = remediator(fake, tmp_path)
    src = r.reports
    results = []

    def deliver(batch):
        results.extend(batch)
        got.set()

    src.start_watch(deliver)
    try:
        kube = kube_for(fake)
        kube.create_custom("gpu-monitor.io", "v1alpha1", "gpu-monitor", "gpuhealthreports",
                           report_object(NODE, "SdcAlarm", "sdc-library", {"step": 7},
                                         r.clock.now(), "gpu-monitor"))
        assert got.wait(10)
    finally:
        src.stop()
    assert [(x.check, x.reason) for x in results] == [("health_report", "SdcAlarm")]
