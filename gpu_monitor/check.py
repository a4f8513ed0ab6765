"""The check interface: declared metadata plus ``run`` / ``poll`` / ``on_kmsg``.

A check is a class in its own module under ``checks/`` whose class attributes declare what it is
(name = module name, kinds, summary, requirements, interval, timeout, every reason it may emit).
The declaration drives the runner (requirement gate, timeout), the docs catalog, the metrics
(every declared reason's counter starts at 0) and the test markers. A check reads the host only
through its ``Context`` and returns ``Result`` values; it never touches Prometheus, Kubernetes or
another check.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gpu_monitor.clock import Clock
from gpu_monitor.model import NODE, Action, Kind, Result, Status

if TYPE_CHECKING:  # pragma: no cover
    from gpu_monitor.config import Config
    from gpu_monitor.host import Host
    from gpu_monitor.profiles import Profile
    from gpu_monitor.state import Store

# Reasons the framework itself emits on behalf of any check.
FRAMEWORK_REASONS = (
    "Ok",
    "Cleared",
    "Timeout",
    "CheckCrashed",
    "RequirementMissing",
    "NoResult",
    "GpuBusy",
    "MigEnabled",
)

# Requirement tokens a check may declare; ``Host.unmet`` explains each one that is missing.
REQUIREMENTS = frozenset(
    {"nvml", "gpu", "torch", "root", "dcgm", "perftest", "infiniband", "kmsg", "idle", "nvswitch"}
)


@dataclass
class Context:
    """Everything a check may use: the host's readers, expectations, time, and history."""

    host: Host
    profile: Profile
    config: Config
    node: str = "localhost"
    clock: Clock = field(default_factory=Clock)
    store: Store | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("gpu_monitor.check"))
    force: bool = False
    one_shot: bool = True  # False inside the daemon (windowed checks then use history)

    def setting(self, check: str, key: str, default: Any = None) -> Any:
        """A check's setting: config ``checks.<check>.<key>`` over the profile's, else default."""
        value = self.config.check_setting(check, key)
        if value is not None:
            return value
        value = self.profile.check_setting(check, key)
        return default if value is None else value


class Check:
    """Base class. Subclasses set the class attributes and override what they support."""

    name: ClassVar[str] = ""
    kinds: ClassVar[frozenset[Kind]] = frozenset()
    summary: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    interval: ClassVar[float] = 0.0  # passive poll interval, seconds (0 = event-driven only)
    timeout: ClassVar[float] = 60.0
    reasons: ClassVar[tuple[str, ...]] = ()
    invasive: ClassVar[bool] = False  # loads the GPUs; refuses to run beside foreign processes

    # --- what a check implements -------------------------------------------------------

    def run(self, ctx: Context) -> Sequence[Result]:
        """One-shot evaluation (bootstrap, ``gpu-monitor check``). Passive checks default to
        one poll."""
        return self.poll(ctx)

    def poll(self, ctx: Context) -> Sequence[Result]:
        raise NotImplementedError(f"{self.name} has no poll()")

    def on_kmsg(self, record: Any, ctx: Context) -> Sequence[Result]:
        """Event-driven passive checks receive every kernel-log record."""
        return ()

    # --- helpers -------------------------------------------------------------------------

    @classmethod
    def all_reasons(cls) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for r in (*FRAMEWORK_REASONS, *cls.reasons):
            seen[r] = None
        return tuple(seen)

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {
            "name": cls.name,
            "kinds": sorted(k.value for k in cls.kinds),
            "summary": cls.summary,
            "requires": sorted(cls.requires),
            "interval_s": cls.interval,
            "timeout_s": cls.timeout,
            "reasons": list(cls.reasons),
        }

    def result(
        self,
        ctx: Context,
        status: Status,
        target: str = NODE,
        reason: str = "Ok",
        message: str = "",
        details: Mapping[str, Any] | None = None,
        action: Action = Action.NONE,
    ) -> Result:
        return Result(
            check=self.name,
            status=status,
            target=target,
            reason=reason,
            message=message,
            details=dict(details or {}),
            action=action,
            observed_at=ctx.clock.now(),
        )

    def ok(self, ctx: Context, target: str = NODE, message: str = "",
           details: Mapping[str, Any] | None = None) -> Result:
        return self.result(ctx, Status.OK, target, "Ok", message, details)
