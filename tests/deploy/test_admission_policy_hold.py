"""The own-node hold policy admits the cleaner's hold pod (as ``build_hold_pod`` makes it) and
nothing else the daemon could create; the pod policy lets a daemon delete its own node's hold
while it is still Pending. Evaluated with the CEL runtime of tests/deploy/test_admission_policy.py."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpu_monitor.cleaning.hold import HoldSpec, build_hold_pod
from tests.deploy.deploy_helpers import NAMESPACE, component_objects, find
from tests.deploy.test_admission_policy import (
    NODE_CLAIM,
    USERNAME,
    admission_fixture,
    own_node_policy,
)

POLICY = "gpu-monitor-own-node-hold"
NODE = "gpu-node-1"

admission = admission_fixture(POLICY)
pods_admission = admission_fixture("gpu-monitor-own-node-pods")


def hold(node: str = NODE) -> dict[str, Any]:
    return build_hold_pod(node, 8, HoldSpec(namespace=NAMESPACE))


def request(op: str = "CREATE", claim: str | None = NODE, namespace: str = NAMESPACE,
            username: str = USERNAME) -> dict[str, Any]:
    extra = {NODE_CLAIM: [claim]} if claim is not None else {}
    return {"operation": op, "namespace": namespace, "subResource": "",
            "userInfo": {"username": username, "extra": extra}}


def test_the_policy_matches_pod_creates_and_fails_closed():
    spec = own_node_policy(POLICY)["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert [(r["operations"], r["resources"]) for r in spec["matchConstraints"]["resourceRules"]
            ] == [(["CREATE"], ["pods"])]
    binding = find(component_objects("own-node-admission"), "ValidatingAdmissionPolicyBinding",
                   POLICY)
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_the_hold_the_cleaner_builds_is_admitted(admission):
    assert admission.review(request(), hold(), None) == (True, "admitted")


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def apply(pod: dict) -> None:
        *parents, last = path.split(".")
        node = pod
        for key in parents:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        node[last] = value
    return apply


PIN_ELSEWHERE = [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                   "values": ["gpu-node-2"]}]}]


@pytest.mark.parametrize(("change", "word"), [
    (_set("metadata.name", "gpu-monitor-hold-gpu-node-2"), "may create only its hold"),
    (_set("metadata.name", "miner"), "may create only its hold"),
    (_set("spec.nodeName", NODE), "through the scheduler"),
    (_set("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
          "nodeSelectorTerms", PIN_ELSEWHERE), "through the scheduler"),
    (_set("spec.affinity", {}), "through the scheduler"),
    (_set("spec.priorityClassName", "system-node-critical"), "PriorityClass"),
    (_set("spec.volumes", [{"name": "root", "hostPath": {"path": "/"}}]), "reach nothing"),
    (_set("spec.hostPID", True), "reach nothing"),
    (_set("spec.automountServiceAccountToken", True), "reach nothing"),
    (_set("spec.containers.0.securityContext", {"privileged": True}), "reach nothing"),
    (_set("spec.containers.0.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}}),
     "reach nothing"),
    (_set("spec.initContainers", [{"name": "x", "image": "busybox"}]), "reach nothing"),
])
def test_every_departure_from_the_hold_is_refused(admission, change, word):
    pod = copy.deepcopy(hold())
    change(pod)
    ok, why = admission.review(request(), pod, None)
    assert not ok and word in why, why


def test_another_namespace_and_no_node_claim_are_refused(admission):
    ok, why = admission.review(request(namespace="team"), hold(), None)
    assert not ok and "own namespace" in why
    ok, why = admission.review(request(claim=None), hold(), None)
    assert not ok and NODE_CLAIM in why


def test_other_users_are_not_this_policys_business(admission):
    assert admission.review(request(username="system:serviceaccount:team:default"),
                            {"metadata": {"name": "x"}, "spec": {}}, None) == (True, "not matched")


def test_the_own_pending_hold_may_be_deleted_another_nodes_may_not(pods_admission):
    pending = hold()  # not bound: no spec.nodeName
    assert pods_admission.review(request("DELETE"), None, pending) == (True, "admitted")
    ok, why = pods_admission.review(request("DELETE"), None, hold("gpu-node-2"))
    assert not ok and "own node" in why
    elsewhere = copy.deepcopy(pending)
    elsewhere["metadata"]["namespace"] = "team"  # the same name in someone else's namespace
    ok, _ = pods_admission.review(request("DELETE"), None, elsewhere)
    assert not ok
