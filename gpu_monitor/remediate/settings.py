"""What the remediator reads from the configuration, and how often it does what: plain values.

Why apart: the remediator takes these as constructor parameters (built once from the config by
``from_config``), so the lifecycle never reaches into the config object and a test states the
few values it changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.remediate.conditions import PROBLEM_CLASSES
from gpu_monitor.remediate.policy import PolicySettings

__all__ = ["RemediationSettings", "Timing"]


@dataclass(frozen=True)
class RemediationSettings:
    enabled: bool = False
    dry_run: bool = True
    policy: PolicySettings = field(
        default_factory=lambda: PolicySettings(problem_classes=PROBLEM_CLASSES))
    retest_max_failures: int = 2  # failed retests before the node is labelled for replacement
    retest_retry_s: float = 600.0  # an undecided retest runs again after this long
    breaker_ttl_s: float = 3600.0  # a slot not renewed for this long expires (renewed at 1/3)

    @classmethod
    def from_config(cls, config: Any) -> RemediationSettings:
        rem = config.remediation
        return cls(enabled=bool(rem.enabled), dry_run=bool(rem.dry_run),
                   policy=PolicySettings.from_config(config, PROBLEM_CLASSES),
                   retest_max_failures=int(rem.retest_max_failures),
                   retest_retry_s=float(config.daemon.bootstrap_retry_s),
                   breaker_ttl_s=float(rem.breaker.ttl_s))


@dataclass(frozen=True)
class Timing:
    """The remediator's periods, in seconds."""

    tick_s: float = 2.0  # the background loop's tick (also woken by every batch of results)
    node_sync_s: float = 60.0  # re-read the node (human overrides, lost writes)
    breaker_retry_s: float = 60.0  # a suspect node denied a slot asks again after this long
    breaker_refresh_s: float = 300.0  # re-read the breaker for the metrics
    report_poll_s: float = 300.0  # list the health reports (a watch makes it prompt)
    max_backoff_s: float = 300.0  # the longest wait after failed ticks
