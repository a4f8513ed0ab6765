"""The check interface: declared metadata plus ``run`` / ``poll`` / ``on_kmsg``.

A check is a class in its own module under ``checks/`` whose class attributes declare all there
is to know about it: what it is (name = module name, kinds, summary, requirements, interval,
timeout, every reason it may emit), whether a bootstrap requires it, its typed settings and
their defaults (``settings``, one ``Setting`` per key) and the profile sections it is judged
against (``sections``), the NodeCondition its findings raise (``condition``) and the metric
families it exports (``metrics``, built from its results by a pure function).

The declaration is the only place that knows the check: the runner (requirement gate,
timeout), the profile and config schemas (``gpu_monitor.profiles.settings``), the remediation
policy's problem classes, the metrics collector, docs/checks.md, docs/configuration.md and
docs/metrics.md are all composed from it. A check reads the host only through its ``Context``
and returns ``Result`` values; it never touches Prometheus, Kubernetes or another check.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from gpu_monitor.clock import Clock
from gpu_monitor.metric_families import CheckMetric
from gpu_monitor.model import NODE, STATUS_SEVERITY, Action, Kind, Result, Status
from gpu_monitor.profiles.schema import Spec

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
    "DisabledByConfig",
    "NoResult",
    "GpuBusy",
    "MigEnabled",
    "KmsgOverrun",
    "KmsgUnavailable",
)

# Requirement tokens a check may declare; ``Host.unmet`` explains each one that is missing.
REQUIREMENTS = frozenset(
    {"nvml", "gpu", "torch", "root", "dcgm", "perftest", "infiniband", "kmsg", "idle", "nvswitch"}
)


@dataclass(frozen=True)
class Setting:
    """One setting a check reads (``checks.<check>.<key>`` in a profile or the config).

    ``spec`` is its type and domain: a file that sets it is refused at load unless the value
    fits, so the check never sees a value of the wrong type. ``default`` is the value when no
    profile or config sets it (None: no default; the check's section or its code decides); a
    profile lists only what differs from it. ``meaning``, ``source`` and the defaults are what
    docs/configuration.md shows. ``at_most`` names another of the check's keys this one may not
    exceed (a degraded threshold and its failed one)."""

    spec: Spec
    default: Any = None
    meaning: str = ""
    source: str = ""
    at_most: str = ""


@dataclass(frozen=True)
class Finding:
    """One thing a check found about a target, before the target's one result is chosen
    (``target``: a check that judges several targets at once says which)."""

    status: Status
    reason: str
    message: str
    action: Action = Action.NONE
    evidence: Mapping[str, Any] = field(default_factory=dict)
    target: str = NODE


def worst(findings: Sequence[Finding], priority: Sequence[str] = ()) -> Finding | None:
    """The finding a target's one result shows: the most serious status, then the reason
    earliest in ``priority`` (the check's own order of what matters most)."""
    if not findings:
        return None
    rank = {r: i for i, r in enumerate(priority)}
    return max(findings, key=lambda f: (STATUS_SEVERITY[f.status],
                                        -rank.get(f.reason, len(priority))))


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
    # Inside the daemon: why its kernel-log follower is not reading now (None while it reads),
    # so event-driven checks make no claim about a log nobody is reading.
    kmsg_error: str | None = None
    # Inside the daemon: the boot id its kernel-log follower read once when it opened the log
    # (None: read /proc each time). A boot id changes only with a reboot, which ends the daemon.
    kmsg_boot_id: str | None = None
    # ``setting`` answers per (check, key) for the config and profile they were read from.
    _settings: dict[tuple[str, str], Any] = field(default_factory=dict, init=False,
                                                  repr=False, compare=False)
    _settings_of: tuple[Any, Any, bool] | None = field(default=None, init=False, repr=False,
                                                 compare=False)

    def required(self, check: Check | type[Check]) -> bool:
        """Whether a bootstrap must run ``check``: ``checks.<name>.required`` from the config,
        else from the profile, else the check's declaration."""
        try:
            value = self.setting(check.name, "required", None)
        except Exception:  # noqa: BLE001 - a stub profile or config: the declaration decides
            value = None
        return bool(check.required) if value is None else bool(value)

    def setting(self, check: str, key: str, default: Any = None) -> Any:
        """A check's setting: config ``checks.<check>.<key>`` over the profile's, else default.

        ``key`` must be declared for ``check`` (``profiles.declared_settings``): an undeclared
        one raises ``UndeclaredSetting`` instead of quietly giving ``default``, because no file
        could ever set it and its value would never have been type-checked."""
        from gpu_monitor.profiles import setting_spec

        setting_spec(check, key)
        cache = self._settings_cache()
        if cache is not None and (check, key) in cache:
            value = cache[check, key]
        else:
            value = self.config.check_setting(check, key)
            if value is None:
                value = self.profile.check_setting(check, key)
            if cache is not None:
                cache[check, key] = value
        return default if value is None else value

    def _settings_cache(self) -> dict[tuple[str, str], Any] | None:
        """The answers read from this config and profile, when neither can change (a frozen
        ``Config`` whose check blocks are read-only mappings, and a ``Profile``, whose data is
        frozen): the follower asks a few settings per event. None otherwise (a stub, a config
        built with plain dicts), and a new config or profile assigned starts a new cache."""
        of = self._settings_of
        if of is not None and of[0] is self.config and of[1] is self.profile:
            return self._settings if of[2] else None
        self._settings = {}
        self._settings_of = (self.config, self.profile, _immutable(self.config, self.profile))
        return self._settings if self._settings_of[2] else None


def _immutable(config: Any, profile: Any) -> bool:
    """Whether ``Context.setting`` may keep what it read from these (see there)."""
    from gpu_monitor.config import Config
    from gpu_monitor.profiles.profile import Profile

    checks = getattr(config, "checks", None)
    return (type(config) is Config and type(profile) is Profile
            and isinstance(checks, MappingProxyType)
            and all(isinstance(block, MappingProxyType) for block in checks.values())
            and isinstance(profile.data, MappingProxyType))


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
    # A bootstrap must run this check to pass: when a tool or runtime it needs is missing (see
    # Host.requirement_gap: no dcgmi, no torch, no perftest where RDMA ports are expected) the
    # bootstrap's verdict is `unknown`, not `healthy`. Not-applicable skips (no GPU expected, no
    # NVSwitch, no RDMA port expected) never count. A profile or the config may override it per
    # SKU: ``checks.<name>.required``.
    required: ClassVar[bool] = False
    # Skip reasons the check's own code gives when a tool or runtime it needs turns out to be
    # missing (the requirement gate cannot see everything: dcgmi installed but no host engine).
    # For a required check in a bootstrap the runner reports them `unknown`.
    unavailable_reasons: ClassVar[tuple[str, ...]] = ()
    # Its settings, one per key (``Setting``: type, default, meaning, source), and the profile
    # hardware sections it is judged against, in the order ``Profile.check_setting`` looks
    # (``("fabric", "nccl")``): their keys are its settings too.
    settings: ClassVar[Mapping[str, Setting]] = MappingProxyType({})
    sections: ClassVar[tuple[str, ...]] = ()
    # A line docs/configuration.md prints under the check's settings (what it judges without
    # a setting).
    settings_note: ClassVar[str] = ""
    # The NodeCondition type its degraded/failed findings set (status True = the problem is
    # present, as node-problem-detector does); None: the shared ``GPUProblem``. Built-in checks
    # only: the admission policy lists every condition type a node may set.
    condition: ClassVar[str | None] = None
    # The metric families it exports, each built from its newest results (``CheckMetric``).
    metrics: ClassVar[tuple[CheckMetric, ...]] = ()

    # --- what a check implements -------------------------------------------------------

    def run(self, ctx: Context) -> Sequence[Result]:
        """One-shot evaluation (bootstrap, ``gpu-monitor check``). Passive checks default to
        one poll."""
        return self.poll(ctx)

    def poll(self, ctx: Context) -> Sequence[Result]:
        raise NotImplementedError(f"{self.name} has no poll()")

    #: Literals one of which a kernel-log record's raw text must hold for ``on_kmsg`` to find
    #: anything in it. The daemon hands the check only such records (and a followed text log
    #: skips lines no check wants without parsing them); the one-shot scan searches for the
    #: same ones. Empty: every record.
    kmsg_literals: tuple[str, ...] = ()

    def on_kmsg(self, record: Any, ctx: Context) -> Sequence[Result]:
        """Event-driven passive checks receive the kernel-log records that hold one of their
        ``kmsg_literals`` (every record when they declare none)."""
        return ()

    def wake_at(self) -> float | None:
        """When the check wants its next poll sooner than its interval: epoch seconds on the
        context clock's ``now()``, asked by the daemon after each poll (None: the interval).
        A check whose verdict changes at an instant it can compute (an outage crossing a
        tolerance) names that instant, so the daemon polls then instead of up to one interval
        later."""
        return None

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
            "required": cls.required,
            "interval_s": cls.interval,
            "timeout_s": cls.timeout,
            "reasons": list(cls.reasons),
            "settings": sorted(cls.settings),
            "metrics": [m.name for m in cls.metrics],
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


class ClearTracker:
    """Turns "problem ended" into an explicit ``Cleared`` result, once per target.

    Passive checks pass every poll's results through ``track``; a target that was degraded or
    failed on the previous poll and is ok now is reported as ``ok`` with reason ``Cleared``
    (details carry the reason that ended), so consumers see the transition. The set of
    problem targets is persisted in the store's key/value table when one is given, so a
    restart still clears what was open before it.
    """

    def __init__(self, check_name: str):
        self.check_name = check_name
        self._open: dict[str, str] | None = None

    def _load(self, ctx: Context) -> dict[str, str]:
        if self._open is None:
            stored = None
            if ctx.store is not None:
                try:
                    stored = ctx.store.get_kv("cleared", self.check_name)
                except Exception:  # noqa: BLE001 - history is best effort here
                    stored = None
            self._open = dict(stored or {})
        return self._open

    def track(self, ctx: Context, results: Sequence[Result]) -> list[Result]:
        open_ = self._load(ctx)
        out: list[Result] = []
        now_bad: dict[str, str] = {}
        for r in results:
            if r.status in (Status.DEGRADED, Status.FAILED):
                now_bad[r.target] = r.reason
            out.append(r)
        for r in list(out):
            if r.status is Status.OK and r.target in open_ and r.target not in now_bad:
                out[out.index(r)] = Result(
                    check=r.check, status=Status.OK, target=r.target, reason="Cleared",
                    message=f"{open_[r.target]} cleared on {r.target}" + (
                        f": {r.message}" if r.message else ""),
                    details={**dict(r.details), "cleared_reason": open_[r.target]},
                    action=r.action, observed_at=r.observed_at,
                )
        # Targets not reported at all this poll keep their open state (unknown is not cleared).
        seen = {r.target for r in results if r.status in (Status.OK, Status.DEGRADED,
                                                          Status.FAILED)}
        new_open = {t: reason for t, reason in open_.items() if t not in seen}
        new_open.update(now_bad)
        if new_open != open_ and ctx.store is not None:
            try:
                ctx.store.set_kv("cleared", self.check_name, new_open)
            except Exception:  # noqa: BLE001
                pass
        self._open = new_open
        return out
