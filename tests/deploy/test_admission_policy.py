"""The own-node ValidatingAdmissionPolicy admits a daemon's writes to its own Node and nothing else.

No API server runs here, so the policy's CEL is evaluated the way the API server does it:
matchConditions, then the variables in order, then each validation in order, the first one
that is false denying with its message. The evaluator is Google's CEL runtime for Python
(``cel-expr-python``, with the optional-types extension Kubernetes enables); the Node objects
are plain maps with the fields the API server would show.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy.deploy_helpers import (
    NAMESPACE,
    SERVICE_ACCOUNT,
    component_objects,
    find,
)

USERNAME = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


POLICY = "gpu-monitor-own-node"


def own_node_policy(name: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy ``name`` of the own-node-admission component (the Node
    policy here, the pod policy in test_admission_policy_pods.py)."""
    return find(component_objects("own-node-admission"), "ValidatingAdmissionPolicy", name)


def _policy() -> dict[str, Any]:
    return own_node_policy(POLICY)


# --- structure (no CEL needed) -----------------------------------------------------------------


def test_the_policy_fails_closed_on_node_updates_by_our_service_account_only():
    policy = _policy()
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and "UPDATE" in rule["operations"]
    assert set(rule["resources"]) == {"nodes", "nodes/status"}
    (cond,) = spec["matchConditions"]
    assert f"'{USERNAME}'" in cond["expression"]
    binding = find(component_objects("own-node-admission"), "ValidatingAdmissionPolicyBinding",
                   "gpu-monitor-own-node")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"], "the binding must apply to every Node"


def test_the_first_validation_requires_the_node_claim_with_a_clear_message():
    first = _policy()["spec"]["validations"][0]
    assert NODE_CLAIM in first["message"] and "fail closed" in first["message"]
    assert "userNodeName != ''" in first["expression"]


# --- CEL ---------------------------------------------------------------------------------------


class Admission:
    """Evaluates the policy as the API server does (first false validation denies)."""

    def __init__(self, policy: dict[str, Any]):
        cel = pytest.importorskip(
            "cel_expr_python.cel",
            reason="cel-expr-python is not installed (pip install cel-expr-python; it is in the "
                   "test extra): the admission policy's CEL is not evaluated")
        ext_optional = pytest.importorskip("cel_expr_python.ext.ext_optional")
        dyn = cel.Type.DYN
        self.env = cel.NewEnv(
            variables={"request": dyn, "object": dyn, "oldObject": dyn, "variables": dyn},
            extensions=[ext_optional.ExtOptional()])
        spec = policy["spec"]
        self.conditions = [self.env.compile(c["expression"]) for c in spec["matchConditions"]]
        self.variables = [(v["name"], self.env.compile(v["expression"]))
                          for v in spec["variables"]]
        self.validations = []
        for v in spec["validations"]:
            msg = self.env.compile(v["messageExpression"]) if "messageExpression" in v else None
            self.validations.append((self.env.compile(v["expression"]), v.get("message"), msg))

    def _eval(self, expr, data: dict[str, Any]) -> Any:
        return expr.eval(data=data).plain_value()

    def variable(self, name: str, request, obj, old) -> Any:
        data = {"request": request, "object": obj, "oldObject": old, "variables": {}}
        for vname, expr in self.variables:
            data["variables"][vname] = self._eval(expr, data)
        return data["variables"][name]

    def review(self, request: dict[str, Any], obj: dict[str, Any],
               old: dict[str, Any]) -> tuple[bool, str]:
        data = {"request": request, "object": obj, "oldObject": old, "variables": {}}
        if not all(self._eval(c, data) is True for c in self.conditions):
            return True, "not matched"
        for name, expr in self.variables:
            data["variables"][name] = self._eval(expr, data)
        for expr, message, message_expr in self.validations:
            result = self._eval(expr, data)
            assert isinstance(result, bool), f"a validation returned {result!r}, not a bool"
            if not result:
                text = self._eval(message_expr, data) if message_expr is not None else message
                assert isinstance(text, str) and text
                return False, text
        return True, "admitted"


def admission_fixture(policy: str):
    """A module-scoped ``admission`` fixture: the :class:`Admission` of the own-node policy
    ``policy`` (``admission = admission_fixture(POLICY)`` in a test module)."""

    @pytest.fixture(scope="module")
    def admission() -> Admission:
        return Admission(own_node_policy(policy))

    return admission


admission = admission_fixture(POLICY)


def node(name: str = "gpu-node-1") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"],
            "providerID": f"aws:///us-east-1a/{name}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            ],
            "capacity": {"cpu": "192", "memory": "2113412Mi", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "190", "memory": "2000000Mi", "nvidia.com/gpu": "8"},
            "addresses": [{"type": "InternalIP", "address": "10.0.3.17"}],
        },
    }


def request(node_claim: str | None = "gpu-node-1", *, status: bool = False,
            username: str = USERNAME) -> dict[str, Any]:
    extra = {NODE_CLAIM: [node_claim]} if node_claim is not None else {}
    return {"operation": "UPDATE", "subResource": "status" if status else "",
            "userInfo": {"username": username, "extra": extra}}


def quarantine(n: dict[str, Any]) -> dict[str, Any]:
    """What gpu-monitor's NodeClient writes when it quarantines its node."""
    n = copy.deepcopy(n)
    n["spec"]["unschedulable"] = True
    n["spec"]["taints"].append({"key": "gpu-monitor.io/unhealthy", "value": "Xid79",
                                "effect": "NoSchedule"})
    n["metadata"]["labels"]["gpu-monitor.io/state"] = "quarantined"
    n["metadata"]["annotations"].update({"gpu-monitor.io/quarantine-reason": "Xid79",
                                         "gpu-monitor.io/cordoned-at": "2026-05-01T12:00:00Z"})
    return n


def with_condition(n: dict[str, Any], ctype: str, status: str = "True") -> dict[str, Any]:
    n = copy.deepcopy(n)
    n["status"]["conditions"].append({"type": ctype, "status": status, "reason": "Xid79"})
    return n


def test_a_daemon_may_quarantine_its_own_node(admission):
    old = node()
    assert admission.review(request(), quarantine(old), old) == (True, "admitted")


def test_a_daemon_may_return_its_own_node_to_service(admission):
    old = quarantine(node())
    new = node()  # taint, label, annotations gone; uncordoned
    assert admission.review(request(), new, old)[0] is True


def test_a_daemon_may_set_its_own_condition_types(admission):
    old = node()
    for ctype in admission.variable("ourConditionTypes", request(), old, old):
        assert admission.review(request(status=True), with_condition(old, ctype), old)[0], ctype


def test_another_node_is_refused_naming_both_nodes(admission):
    old = node("gpu-node-2")
    allowed, message = admission.review(request("gpu-node-1"), quarantine(old), old)
    assert not allowed
    assert "gpu-node-1" in message and "gpu-node-2" in message


@pytest.mark.parametrize("claim", [None, ""], ids=["claim-absent", "claim-empty"])
def test_without_the_node_claim_every_write_is_refused_with_the_claim_message(admission, claim):
    old = node()
    allowed, message = admission.review(request(claim), quarantine(old), old)
    assert not allowed
    assert NODE_CLAIM in message and "fail closed" in message


def _change(path: str):
    def apply(n):
        n = copy.deepcopy(n)
        if path == "foreign-taint-removed":
            n["spec"]["taints"] = []
        elif path == "foreign-taint-added":
            n["spec"]["taints"].append({"key": "example.com/maintenance", "effect": "NoExecute"})
        elif path == "foreign-label-added":
            n["metadata"]["labels"]["node-role.kubernetes.io/gpu"] = ""
        elif path == "foreign-label-changed":
            n["metadata"]["labels"]["nvidia.com/gpu.present"] = "false"
        elif path == "foreign-annotation-removed":
            del n["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"]
        elif path == "provider-id-changed":
            n["spec"]["providerID"] = "aws:///us-east-1a/other"
        elif path == "pod-cidr-changed":
            n["spec"]["podCIDRs"] = ["10.244.9.0/24"]
        return n
    return apply


@pytest.mark.parametrize("change,word", [
    ("foreign-taint-removed", "taints"),
    ("foreign-taint-added", "taints"),
    ("foreign-label-added", "labels"),
    ("foreign-label-changed", "labels"),
    ("foreign-annotation-removed", "annotations"),
    ("provider-id-changed", "spec"),
    ("pod-cidr-changed", "spec"),
])
def test_changes_outside_gpu_monitor_fields_of_the_own_node_are_refused(admission, change, word):
    old = node()
    allowed, message = admission.review(request(), _change(change)(quarantine(old)), old)
    assert not allowed, change
    assert word in message


def test_kubelet_conditions_capacity_and_addresses_cannot_be_changed(admission):
    old = node()
    ready_false = copy.deepcopy(old)
    ready_false["status"]["conditions"][1]["status"] = "False"
    allowed, message = admission.review(request(status=True), ready_false, old)
    assert not allowed and "NodeCondition" in message
    no_gpus = copy.deepcopy(old)
    no_gpus["status"]["capacity"]["nvidia.com/gpu"] = "0"
    allowed, message = admission.review(request(status=True), no_gpus, old)
    assert not allowed and "capacity" in message
    allowed, _ = admission.review(request(status=True), with_condition(old, "NetworkUnavailable"),
                                  old)
    assert not allowed


def test_requests_by_other_users_are_not_this_policys_business(admission):
    old = node("gpu-node-2")
    allowed, why = admission.review(request(None, username="kubernetes-admin"),
                                    _change("foreign-taint-removed")(old), old)
    assert (allowed, why) == (True, "not matched")


def test_condition_types_are_the_codes_problem_classes(admission):
    from gpu_monitor.remediate.conditions import PROBLEM_CLASSES
    from gpu_monitor.remediate.policy import DEFAULT_CONDITION

    old = node()
    listed = admission.variable("ourConditionTypes", request(), old, old)
    assert set(listed) == set(PROBLEM_CLASSES.values()) | {DEFAULT_CONDITION}


def test_the_prefix_is_the_codes_and_covers_our_taint_keys(admission):
    from gpu_monitor.config import DEFAULT_TAINT_KEY
    from gpu_monitor.remediate.k8s.node import LABEL_STATE, PREFIX

    old = node()
    prefix = admission.variable("prefix", request(), old, old)
    assert prefix == PREFIX
    for key in (DEFAULT_TAINT_KEY, "gpu-monitor.io/bootstrap", LABEL_STATE):
        assert key.startswith(prefix), key
