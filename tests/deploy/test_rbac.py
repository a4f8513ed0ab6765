"""The daemon's RBAC grants exactly what the code declares it uses, and no more.

One source of truth: ``gpu_monitor.remediate.k8s.delivery.RBAC_RULES`` lists every (apiGroup,
resource, verbs) the Kubernetes layer calls. The rules bound to the daemon's ServiceAccount by
the base plus the force-delete component must equal it verb for verb; the base alone must lack
pods ``delete`` (only ``drain.force_delete`` uses it); the breaker ConfigMap is reachable only
by name; no rule uses a wildcard.
"""

from __future__ import annotations

from tests.deploy.deploy_helpers import (
    NAMESPACE,
    SERVICE_ACCOUNT,
    base_objects,
    component_objects,
    find,
    find_all,
)

Triple = tuple[str, str, str]


def _kube():
    import gpu_monitor.remediate.k8s.delivery as kube

    assert hasattr(kube, "RBAC_RULES"), "gpu_monitor.remediate.k8s.delivery declares no RBAC_RULES"
    return kube


def _declared() -> set[Triple]:
    """What remediation's delivery and the fail-fast notice declare, together."""
    from gpu_monitor.failfast.pods import RBAC_RULES as FAILFAST_RULES

    return {(group, resource, verb)
            for group, resource, verbs in (*_kube().RBAC_RULES, *FAILFAST_RULES)
            for verb in verbs}


def _bound_rules(docs) -> list[tuple[dict, dict]]:
    """(role, rule) for every rule a binding gives the daemon's ServiceAccount."""
    roles = {(d["kind"], d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out = []
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == SERVICE_ACCOUNT
                   and s.get("namespace") == NAMESPACE for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        role = roles.get((ref["kind"], ref["name"]))
        assert role is not None, f"{b['kind']} {b['metadata']['name']} binds a missing {ref}"
        if b["kind"] == "RoleBinding":
            assert role["kind"] == "ClusterRole" or (
                role["metadata"]["namespace"] == b["metadata"]["namespace"])
        out += [(role, rule) for rule in role["rules"]]
    return out


def _triples(bound) -> set[Triple]:
    return {(group, resource, verb)
            for _role, rule in bound
            for group in rule["apiGroups"] for resource in rule["resources"]
            for verb in rule["verbs"]}


def test_base_and_force_delete_grant_exactly_the_declared_rules():
    bound = _bound_rules(base_objects() + component_objects("force-delete"))
    granted, declared = _triples(bound), _declared()
    assert granted == declared, (
        f"granted but not declared: {sorted(granted - declared)}; "
        f"declared but not granted: {sorted(declared - granted)}")


def test_the_base_alone_cannot_delete_pods():
    granted = _triples(_bound_rules(base_objects()))
    assert ("", "pods", "delete") not in granted, "pods delete belongs to components/force-delete"
    assert ("", "pods/eviction", "create") in granted, "drains go through the Eviction API"
    missing = _declared() - granted - {("", "pods", "delete")}
    assert not missing, f"the base lacks {sorted(missing)}"


def test_configmaps_are_reachable_only_by_the_breaker_name_in_our_namespace():
    from gpu_monitor.remediate.k8s.breaker import BREAKER_CONFIGMAP

    docs = base_objects()
    for role, rule in _bound_rules(docs):
        if "configmaps" not in rule["resources"]:
            continue
        assert role["kind"] == "Role" and role["metadata"]["namespace"] == NAMESPACE
        assert rule.get("resourceNames") == [BREAKER_CONFIGMAP], (
            f"{role['kind']} {role['metadata']['name']} grants configmaps beyond the breaker")
        assert "create" not in rule["verbs"], "create cannot be limited by name"
    breaker = find(docs, "ConfigMap", BREAKER_CONFIGMAP)
    assert breaker["metadata"]["namespace"] == NAMESPACE, "the breaker must be pre-created"
    assert not breaker.get("data"), (
        "the pre-created breaker ships without data: re-applying the manifests must not reset "
        "the live breaker's slots or close a tripped breaker")


def test_no_rule_uses_a_wildcard():
    docs = base_objects() + component_objects("force-delete")
    for role in find_all(docs, "ClusterRole") + find_all(docs, "Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), (
                    f"{role['kind']} {role['metadata']['name']}: wildcard in {key}")


def test_the_report_writer_role_may_only_create_reports():
    from gpu_monitor.remediate.reports import GROUP, PLURAL

    writer = find(base_objects(), "ClusterRole", "gpu-monitor-report-writer")
    assert writer["rules"] == [{"apiGroups": [GROUP], "resources": [PLURAL],
                                "verbs": ["create"]}]


def test_the_comparison_fails_when_a_verb_is_added():
    docs = base_objects() + component_objects("force-delete")
    role = find(docs, "ClusterRole", "gpu-monitor")
    role["rules"][0]["verbs"].append("update")
    assert _triples(_bound_rules(docs)) != _declared()


def test_the_cleaning_component_grants_the_holds_rules_in_our_namespace_only():
    from gpu_monitor.cleaning.hold import PRIORITY_CLASS, RBAC_RULES

    docs = base_objects() + component_objects("cleaning")
    extra = _triples(_bound_rules(docs)) - _triples(_bound_rules(base_objects()))
    assert extra == {(g, r, v) for g, r, verbs in RBAC_RULES for v in verbs}
    for role, rule in _bound_rules(component_objects("cleaning") + base_objects()):
        if "create" in rule["verbs"] and "pods" in rule["resources"]:
            assert role["kind"] == "Role" and role["metadata"]["namespace"] == NAMESPACE
    pc = find(component_objects("cleaning"), "PriorityClass", PRIORITY_CLASS)
    assert (pc["value"], pc["preemptionPolicy"]) == (1_000_000_000, "Never")
