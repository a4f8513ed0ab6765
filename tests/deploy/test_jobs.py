"""Every Job gpu-monitor builds is one the API server accepts, on the oldest supported
Kubernetes and on the newest.

Why a test of its own: the fabric scheduler creates these Jobs at run time, long after
``kubectl apply`` succeeded, so a field an older API server requires (the
``podFailurePolicy.rules[].onPodConditions[].status`` that 1.28 to 1.34 demand) shows up only
as a probe that never starts. Here each builder's output, for each of its shapes, and the
ConfigMap's Job template are validated strictly against the schemas of
``MIN_KUBERNETES`` and of the newest release kubernetes-validate knows.
"""

from __future__ import annotations

import copy

import pytest

from gpu_monitor.fabric.idle import ActiveCheckSpec, build_active_check_job
from gpu_monitor.fabric.plan import load_template, render_probe_job
from gpu_monitor.fabric.scheduler_settings import SchedulerSettings
from tests.deploy.deploy_helpers import (
    DEPLOY,
    MIN_KUBERNETES,
    kubernetes_validate,
    validate_object,
)

TEMPLATE = DEPLOY / "fabric" / "job-template.yaml"


def _template() -> dict:
    return load_template(str(TEMPLATE))


def _probe_job(kind: str, **settings) -> dict:
    return render_probe_job(_template(), probe_id="0123456789", kind=kind,
                            nodes=["gpu-a", "gpu-b", "gpu-c"], group="rack=r1.0",
                            gpus_per_node=8, settings=SchedulerSettings(**settings))


#: Each shape a builder produces: (id, a function returning the Job).
BUILT_JOBS = [
    ("template", _template),
    ("probe-group", lambda: _probe_job("group")),
    ("probe-bisect-rdma-image-args", lambda: _probe_job(
        "bisect", rdma_resources={"rdma/ib": "8"}, image="registry.example.com/gm:1",
        probe_args=("--ops=all_reduce",))),
    ("active-check-drop-dir", lambda: build_active_check_job(
        "gpu-node-17.example", 8, ActiveCheckSpec(image="img:1"), probe_id="abcdef0123")),
    ("active-check-crd-profile", lambda: build_active_check_job(
        "gpu-node-17", 4, ActiveCheckSpec(deliver="crd", profile="h100-sxm-8"),
        probe_id="abcdef0123")),
    ("active-check-none", lambda: build_active_check_job(
        "n", 8, ActiveCheckSpec(deliver="none"), probe_id="abcdef0123")),
]


@pytest.mark.parametrize("build", [b for _, b in BUILT_JOBS], ids=[i for i, _ in BUILT_JOBS])
def test_every_job_the_code_builds_validates_on_old_and_current_kubernetes(build):
    kv = kubernetes_validate()
    validate_object(kv, build(), MIN_KUBERNETES, "a built Job")


def test_the_validation_refuses_a_pod_failure_policy_without_status_before_1_35():
    """The check has teeth: the very bug (no ``status``) fails the oldest schema."""
    kv = kubernetes_validate()
    for _, build in BUILT_JOBS:
        job = copy.deepcopy(build())
        for rule in job["spec"]["podFailurePolicy"]["rules"]:
            for cond in rule.get("onPodConditions") or []:
                cond.pop("status")
        with pytest.raises(kv.ValidationError, match="status"):
            kv.validate(job, MIN_KUBERNETES, strict=True)
