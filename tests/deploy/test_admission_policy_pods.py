"""The own-node pod policy admits the fail-fast notice's pod writes (the GPUMonitorFabricFault
condition, a deletion) only for pods on the daemon's own node, evaluated with the same CEL
runtime as the Node policy (tests/deploy/test_admission_policy.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_monitor.failfast.pods import CONDITION_TYPE
from tests.deploy.deploy_helpers import component_objects, find
from tests.deploy.test_admission_policy import (
    NODE_CLAIM,
    USERNAME,
    admission_fixture,
    own_node_policy,
)

POLICY = "gpu-monitor-own-node-pods"


def _policy() -> dict[str, Any]:
    return own_node_policy(POLICY)


admission = admission_fixture(POLICY)


def pod(node: str = "gpu-node-1") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer-0", "namespace": "ml", "uid": "u-1"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "train:1"}]},
        "status": {
            "phase": "Running", "podIP": "10.244.3.9",
            "conditions": [{"type": "Ready", "status": "True"},
                           {"type": "PodScheduled", "status": "True"}],
        },
    }


def with_fault(p: dict[str, Any]) -> dict[str, Any]:
    p = copy.deepcopy(p)
    p["status"]["conditions"].append({"type": CONDITION_TYPE, "status": "True",
                                      "reason": "PortDownExceededNcclTimeout"})
    return p


def request(op: str = "UPDATE", claim: str | None = "gpu-node-1",
            username: str = USERNAME) -> dict[str, Any]:
    extra = {NODE_CLAIM: [claim]} if claim is not None else {}
    return {"operation": op, "subResource": "status" if op == "UPDATE" else "",
            "userInfo": {"username": username, "extra": extra}}


def test_the_policy_matches_pod_status_updates_and_pod_deletes_failing_closed():
    spec = _policy()["spec"]
    assert spec["failurePolicy"] == "Fail"
    rules = {(tuple(r["operations"]), tuple(r["resources"]))
             for r in spec["matchConstraints"]["resourceRules"]}
    assert rules == {(("UPDATE",), ("pods/status",)), (("DELETE",), ("pods",))}
    binding = find(component_objects("own-node-admission"), "ValidatingAdmissionPolicyBinding",
                   POLICY)
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_the_condition_on_a_pod_of_the_own_node_is_admitted(admission):
    assert admission.review(request(), with_fault(pod()), pod()) == (True, "admitted")


def test_a_pod_on_another_node_is_refused_naming_both(admission):
    ok, why = admission.review(request(), with_fault(pod("gpu-node-2")), pod("gpu-node-2"))
    assert not ok and "gpu-node-1" in why and "ml/trainer-0" in why and "gpu-node-2" in why


def test_deleting_a_pod_of_the_own_node_only(admission):
    assert admission.review(request("DELETE"), None, pod()) == (True, "admitted")
    ok, why = admission.review(request("DELETE"), None, pod("gpu-node-2"))
    assert not ok and "gpu-node-2" in why


@pytest.mark.parametrize("op", ["UPDATE", "DELETE"])
def test_without_the_node_claim_every_pod_write_is_refused(admission, op):
    ok, why = admission.review(request(op, claim=None), with_fault(pod()) if op == "UPDATE"
                               else None, pod())
    assert not ok and NODE_CLAIM in why


def test_kubelet_conditions_and_other_status_fields_cannot_be_changed(admission):
    flipped = with_fault(pod())
    flipped["status"]["conditions"][0]["status"] = "False"  # the kubelet's Ready
    ok, why = admission.review(request(), flipped, pod())
    assert not ok and CONDITION_TYPE in why
    phase = with_fault(pod())
    phase["status"]["phase"] = "Failed"
    ok, why = admission.review(request(), phase, pod())
    assert not ok and "only status.conditions" in why


def test_other_users_are_not_this_policys_business(admission):
    assert admission.review(request(username="system:node:gpu-node-2"),
                            with_fault(pod("gpu-node-2")), pod("gpu-node-2")) == (
        True, "not matched")
