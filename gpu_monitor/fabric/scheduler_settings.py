"""What the fabric scheduler is told: one frozen settings value, from flags or a YAML mapping.

Why apart: the settings are shared by the scheduler's loop (scheduler.py), the Jobs it renders
(plan.py) and its command line (scheduler_command.py); keeping them in one small module lets
each import them without importing the others. Unknown keys are an error, and ``validate``
refuses combinations the loop could not honour (a lease it could not keep, groups that never
cross nodes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpu_monitor.fabric.idle import DEFAULT_CHECKS, PRIORITY_CLASS
from gpu_monitor.fabric.job_parts import ACTIVE_CHECK_RESOURCES, ACTIVE_CHECK_SHM, PROBE_RESOURCES
from gpu_monitor.fabric.pods import DEFAULT_TAINT_KEY, GPU_RESOURCE

DEFAULT_TOPOLOGY_LABELS = ("topology.kubernetes.io/rack", "nvidia.com/rail",
                           "network.topology.kubernetes.io/block")
DEFAULT_TEMPLATE = "/etc/gpu-monitor/fabric/job-template.yaml"


@dataclass(frozen=True)
class SchedulerSettings:
    """Everything the scheduler is told (flags, or a YAML mapping with these keys)."""

    namespace: str = "gpu-monitor"  # the scheduler's own: its Lease and record
    job_namespace: str = "gpu-monitor-jobs"  # the probe and idle-check Jobs (docs/fabric.md)
    instance: str = "gpu-monitor"  # app.kubernetes.io/instance of the Jobs
    identity: str = ""
    lease_name: str = "gpu-monitor-fabric-scheduler"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    interval_s: float = 30.0
    node_selector: str = "nvidia.com/gpu.present=true"
    gpu_resource: str = GPU_RESOURCE
    taint_key: str = DEFAULT_TAINT_KEY
    topology_labels: tuple[str, ...] = DEFAULT_TOPOLOGY_LABELS
    group_size: int = 8
    min_group_size: int = 2
    idle_for_s: float = 600.0
    probe_interval_s: float = 86400.0
    max_concurrent_probes: int = 2
    job_template: str = DEFAULT_TEMPLATE
    image: str | None = None
    rdma_resources: Mapping[str, str] = field(default_factory=dict)
    priority_class: str = PRIORITY_CLASS
    probe_args: tuple[str, ...] = ()
    schedule_timeout_s: float = 300.0
    probe_timeout_s: float = 1800.0
    bisect: bool = True
    bisect_timeout_s: float = 6 * 3600.0
    report_namespace: str = "gpu-monitor"
    report_cooldown_s: float = 86400.0
    state_configmap: str = "gpu-monitor-fabric-state"
    active_checks: bool = False
    active_check_interval_s: float = 7 * 86400.0
    active_check_list: tuple[str, ...] = DEFAULT_CHECKS
    active_check_deliver: str = "drop-dir"
    max_concurrent_active_checks: int = 4
    active_check_image: str | None = None
    probe_resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: dict(PROBE_RESOURCES))
    active_check_resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: dict(ACTIVE_CHECK_RESOURCES))
    active_check_shm_size: str = ACTIVE_CHECK_SHM
    stall_after_s: float = 300.0  # /healthz fails when the loop has not turned for this long

    def validate(self) -> SchedulerSettings:
        problems = []
        if self.min_group_size < 2:
            problems.append("min_group_size must be at least 2 (a probe must cross nodes)")
        if self.group_size < self.min_group_size:
            problems.append("group_size must be at least min_group_size")
        if not self.renew_deadline_s < self.lease_duration_s:
            problems.append("renew_deadline_s must be shorter than lease_duration_s")
        if self.retry_period_s <= 0 or self.interval_s <= 0:
            problems.append("retry_period_s and interval_s must be positive")
        if self.active_check_deliver not in ("drop-dir", "crd", "none"):
            problems.append("active_check_deliver must be drop-dir, crd or none")
        if self.job_namespace == self.namespace:
            problems.append("job_namespace must differ from namespace: Jobs in the scheduler's "
                            "(and daemon's) namespace could run with its ServiceAccounts")
        for key in ("probe_resources", "active_check_resources"):
            extra = set(getattr(self, key)) - {"requests", "limits"}
            if extra:
                problems.append(f"{key}: only requests and limits, not {sorted(extra)}")
        if self.stall_after_s <= self.lease_duration_s:
            # The loop turns at least every retry_period_s; a stall shorter than the lease
            # would restart a replica before the other could even take over.
            problems.append("stall_after_s must be longer than lease_duration_s")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def settings_from_mapping(data: Mapping[str, Any], base: SchedulerSettings | None = None
                          ) -> SchedulerSettings:
    """Settings from a YAML mapping; unknown keys are an error (a typo must not be ignored)."""
    known = {f.name: f for f in fields(SchedulerSettings)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown fabric-scheduler setting(s): {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("topology_labels", "probe_args", "active_check_list"):
            value = tuple(value or ())
        elif key == "rdma_resources":
            value = {str(k): str(v) for k, v in (value or {}).items()}
        elif key in ("probe_resources", "active_check_resources"):
            value = {str(sec): {str(k): str(v) for k, v in (vals or {}).items()}
                     for sec, vals in (value or {}).items()}
        values[key] = value
    return replace(base or SchedulerSettings(), **values).validate()

