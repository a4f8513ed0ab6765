"""The Kubernetes delivery's RBAC_RULES (remediate/k8s/delivery.py) cover every request a whole
remediation lifecycle makes, and are well formed; the manifests are tested against them."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from gpu_monitor.remediate.k8s.delivery import RBAC_RULES
from gpu_monitor.remediate.reports import report_object
from tests.kube.client_helpers import kube_for
from tests.remediate.remediate_helpers import (
    NODE,
    Resets,
    remediator,
    seed_breaker,
    set_boot_id,
    xid,
)

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


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


@pytest.fixture
def fake(cluster):
    return cluster(NODE, breaker=False)


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
