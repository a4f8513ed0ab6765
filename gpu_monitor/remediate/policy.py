"""The remediation policy: results + node facts + settings -> what should happen. Pure.

Why pure: every other part of remediation (the Kubernetes writes, the breaker, the lifecycle)
only carries out what this module decides, so the decisions can be read and tested as tables,
without a cluster, a clock or a store.

Guarantees:

1. **Never acts on unknown alone.** An ``unknown`` result (the check could not decide) never
   contributes an operation; only ``degraded``/``failed`` results with real evidence do.
2. **Degraded signals wait.** A ``degraded`` result escalates past "event" only once the same
   (check, target, reason) was seen on ``hysteresis_polls`` consecutive observations **and**
   for ``hysteresis_s`` seconds. ``failed`` results act at once.
3. **Configuration wins over the check's suggestion**, most specific first:
   ``checks.<check>.remediation: {<Reason>: op}`` > ``{<Reason>: op}`` at remediation level
   (``remediation.overrides`` when the config declares it) > ``checks.<check>.remediation: op``
   > the result's own ``action``. ``ignore`` drops the finding.
4. **Observe-only checks and excluded nodes** never produce a node-changing operation: an
   observe-only check's findings are only reported as suppressed; on a node labelled
   ``gpu-monitor.io/exclude=true`` the strongest operation is capped at ``event``.

The vocabulary: ``Op`` (event, cordon, drain, reset_gpu, reboot, replace), ordered by severity;
every op from ``cordon`` up quarantines the node (cordon + taint), from ``drain`` up also drains.
A result's own suggestion maps onto it in the order of ``model.ACTION_SEVERITY`` (a more severe
action never asks for a lesser op). A ``Trigger`` is a result that drives an op (the check's
``Finding`` is what a check found; this is what the policy does about it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from gpu_monitor.model import (
    STATUS_SEVERITY,
    Action,
    Result,
    Status,
    TokenEnum,
    iso,
    parse_iso,
)

__all__ = [
    "CONDITION_HEALTHY_REASON",
    "DEFAULT_CONDITION",
    "EXCLUDE_LABEL",
    "REPORT_CHECK",
    "ConditionWant",
    "Decision",
    "Op",
    "PolicySettings",
    "PolicyState",
    "Signal",
    "Trigger",
    "decide",
    "gpu_indices",
    "observe",
    "op_for",
]


class Op(TokenEnum):
    """A node operation, in increasing severity: the declaration order is the one severity
    order of remediation (``severity``); nothing else spells it."""

    EVENT = "event"  # an Event and a log line; nothing on the node changes
    CORDON = "cordon"  # quarantine: cordon + taint
    DRAIN = "drain"  # quarantine and drain
    RESET_GPU = "reset_gpu"  # quarantine, drain, reset the GPUs, retest
    REBOOT = "reboot"  # quarantine, drain, ask for a reboot (Kured sentinel), retest
    REPLACE = "replace"  # quarantine, drain, label for replacement (permanent)

    @property
    def severity(self) -> int:
        return _OP_SEVERITY[self]

    @property
    def quarantines(self) -> bool:
        return self.severity >= _OP_SEVERITY[Op.CORDON]

    @property
    def drains(self) -> bool:
        return self.severity >= _OP_SEVERITY[Op.DRAIN]


_OP_SEVERITY = {op: rank for rank, op in enumerate(Op, start=1)}

IGNORE = "ignore"
EXCLUDE_LABEL = "gpu-monitor.io/exclude"
#: The pseudo-check name under which GPUHealthReports (CRs and dropped files) enter the policy.
REPORT_CHECK = "health_report"

#: A failed/degraded result's own suggestion -> op. ``none`` on a *failed* result still keeps
#: work off the node (cordon); on a degraded one it is only worth an Event.
_ACTION_OPS_FAILED = {Action.NONE: Op.CORDON, Action.WATCH: Op.EVENT, Action.RESET_GPU: Op.RESET_GPU,
                      Action.REBOOT: Op.REBOOT, Action.REPLACE: Op.REPLACE}
_ACTION_OPS_DEGRADED = {**_ACTION_OPS_FAILED, Action.NONE: Op.EVENT}

#: The NodeCondition of a check that declares none (and of plugins); the declared ones reach the
#: policy as ``PolicySettings.problem_classes`` (remediate/conditions.py composes them).
DEFAULT_CONDITION = "GPUProblem"
CONDITION_HEALTHY_REASON = "NoProblem"


# --- settings ------------------------------------------------------------------------------------


def _parse_op(value: Any) -> Op | None | str:
    text = str(value).strip().lower()
    if text == IGNORE:
        return IGNORE
    try:
        return Op(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class PolicySettings:
    """What the policy reads from the configuration (``from_config``), as plain values."""

    hysteresis_polls: int = 3
    hysteresis_s: float = 300.0
    observe_only: frozenset[str] = frozenset()
    # "check/Reason", "Reason" or "check" -> an Op value or "ignore".
    overrides: Mapping[str, str] = field(default_factory=dict)
    # Problem classes: check -> the NodeCondition type its findings set (status True = the
    # problem is present, as node-problem-detector does); a check not listed sets
    # DEFAULT_CONDITION. Handed in, so the policy stays a pure function of its inputs.
    problem_classes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.overrides.items() if _parse_op(v) is None}
        if bad:
            raise ValueError(f"unknown remediation operation(s) {bad}; expected one of "
                             f"{[o.value for o in Op] + [IGNORE]}")
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))
        object.__setattr__(self, "problem_classes", MappingProxyType(dict(self.problem_classes)))

    def condition_type(self, check: str) -> str:
        return self.problem_classes.get(check, DEFAULT_CONDITION)

    @classmethod
    def from_config(cls, config: Any, problem_classes: Mapping[str, str] | None = None
                    ) -> PolicySettings:
        rem = config.remediation
        overrides: dict[str, str] = {}
        for key, value in (getattr(rem, "overrides", None) or {}).items():
            overrides[str(key)] = str(value)
        observe: set[str] = set()
        for check, block in (config.checks or {}).items():
            if config.check_observe_only(check):
                observe.add(check)
            spec = (block or {}).get("remediation")
            if isinstance(spec, Mapping):
                for reason, value in spec.items():
                    overrides[f"{check}/{reason}"] = str(value)
            elif spec is not None:
                overrides[check] = str(spec)
        return cls(hysteresis_polls=int(rem.hysteresis_polls), hysteresis_s=float(rem.hysteresis_s),
                   observe_only=frozenset(observe), overrides=overrides,
                   problem_classes=problem_classes or {})


def op_for(result: Result, settings: PolicySettings) -> Op | None:
    """The operation a non-ok result asks for (before hysteresis); None = ignore it."""
    for key in (f"{result.check}/{result.reason}", result.reason, result.check):
        if key in settings.overrides:
            got = _parse_op(settings.overrides[key])
            return None if got == IGNORE else got  # type: ignore[return-value]
    table = _ACTION_OPS_FAILED if result.status is Status.FAILED else _ACTION_OPS_DEGRADED
    return table[result.action]


# --- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signal:
    """Hysteresis memory of one degraded (check, target, reason)."""

    first_seen: datetime
    polls: int


def _signal_key(r: Result) -> str:
    return f"{r.check}|{r.target}|{r.reason}"


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between observations (persisted by the remediator).

    ``standing``: the latest non-ok results per (check, target); an observation of a
    (check, target) replaces what stood for it, so an ``ok`` clears it. ``seen``: checks that
    reported at least once (their condition is written, True or False).
    """

    standing: tuple[Result, ...] = ()
    signals: Mapping[str, Signal] = field(default_factory=dict)
    seen: frozenset[str] = frozenset()

    def to_json(self) -> str:
        return json.dumps({
            "standing": [r.to_dict() for r in self.standing],
            "signals": {k: [iso(s.first_seen), s.polls] for k, s in sorted(self.signals.items())},
            "seen": sorted(self.seen),
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> PolicyState:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(standing=tuple(Result.from_dict(r) for r in data.get("standing", [])),
                   signals={k: Signal(parse_iso(v[0]), int(v[1]))
                            for k, v in (data.get("signals") or {}).items()},
                   seen=frozenset(data.get("seen") or ()))

    def without(self, checks: Iterable[str] | None = None) -> PolicyState:
        """Forget the standing results (and their hysteresis) of ``checks`` (None: all)."""
        if checks is None:
            return PolicyState(seen=self.seen)
        drop = set(checks)
        return PolicyState(standing=tuple(r for r in self.standing if r.check not in drop),
                           signals={k: s for k, s in self.signals.items()
                                    if k.split("|", 1)[0] not in drop},
                           seen=self.seen)


def observe(state: PolicyState, results: Iterable[Result]) -> PolicyState:
    """Fold one batch of results (one run's, or one kernel-log record's) into the state."""
    batch = list(results)
    if not batch:
        return state
    touched = {(r.check, r.target) for r in batch}
    standing = [r for r in state.standing if (r.check, r.target) not in touched]
    standing += [r for r in batch if r.status not in (Status.OK, Status.SKIPPED)]
    signals = {k: s for k, s in state.signals.items()
               if tuple(k.split("|", 2)[:2]) not in touched}
    for r in batch:
        if r.status is not Status.DEGRADED:
            continue
        key = _signal_key(r)
        old = state.signals.get(key)
        prev = signals.get(key)
        base = prev or old
        signals[key] = (Signal(base.first_seen, base.polls + 1) if base
                        else Signal(r.observed_at, 1))
    standing.sort(key=lambda r: (r.check, r.target, r.reason))
    return PolicyState(standing=tuple(standing), signals=signals,
                       seen=state.seen | {r.check for r in batch})


# --- decisions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trigger:
    """A result that drives (or will drive, past hysteresis) an operation."""

    result: Result
    op: Op  # what it does now
    wanted: Op  # what it asks for once past hysteresis

    @property
    def pending(self) -> bool:
        return self.op is not self.wanted


@dataclass(frozen=True)
class ConditionWant:
    """Desired state of one of our NodeConditions."""

    type: str
    status: str  # "True" (problem present) or "False"
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    op: Op | None  # the strongest operation wanted now (None: nothing to do)
    reason: str  # the most severe finding's reason ("" when none): the taint value
    triggers: tuple[Trigger, ...] = ()  # most severe first
    suppressed: tuple[tuple[Result, str], ...] = ()  # (result, why it does not count)
    conditions: tuple[ConditionWant, ...] = ()
    excluded: bool = False

    @property
    def quarantine(self) -> bool:
        return self.op is not None and self.op.quarantines

    @property
    def pending(self) -> tuple[Trigger, ...]:
        return tuple(t for t in self.triggers if t.pending)

    @property
    def clear(self) -> bool:
        """Nothing wants more than an event: a quarantined node may return to service."""
        return self.op is None or not self.op.quarantines and not any(
            t.wanted.quarantines for t in self.triggers)

    def at_least(self, op: Op) -> tuple[Trigger, ...]:
        """The triggers that drive ``op`` or a more severe one now."""
        return tuple(t for t in self.triggers if t.op.severity >= op.severity)


def _trigger_key(f: Trigger) -> tuple:
    r = f.result
    return (-f.op.severity, -f.wanted.severity, -STATUS_SEVERITY[r.status], r.observed_at,
            r.check, r.target, r.reason)


def _message(triggers: Sequence[Trigger]) -> str:
    head = triggers[0].result
    text = f"{head.check} {head.target}: {head.reason}"
    if head.message:
        text += f" ({head.message})"
    if len(triggers) > 1:
        text += f"; and {len(triggers) - 1} more"
    return text[:1024]


def decide(state: PolicyState, settings: PolicySettings, now: datetime, *,
           node_labels: Mapping[str, str] | None = None) -> Decision:
    """What the standing results ask for now. Pure."""
    triggers: list[Trigger] = []
    suppressed: list[tuple[Result, str]] = []
    for r in state.standing:
        if r.status in (Status.OK, Status.SKIPPED):
            continue
        if r.status is Status.UNKNOWN:
            suppressed.append((r, "unknown: the check could not decide"))
            continue
        if r.check in settings.observe_only:
            suppressed.append((r, "observe-only check"))
            continue
        wanted = op_for(r, settings)
        if wanted is None:
            suppressed.append((r, "ignored by configuration"))
            continue
        op = wanted
        if r.status is Status.DEGRADED and wanted.severity > Op.EVENT.severity:
            sig = state.signals.get(_signal_key(r))
            held = (now - sig.first_seen).total_seconds() if sig else 0.0
            if sig is None or sig.polls < settings.hysteresis_polls or held < settings.hysteresis_s:
                op = Op.EVENT
        triggers.append(Trigger(r, op, wanted))
    triggers.sort(key=_trigger_key)
    excluded = (node_labels or {}).get(EXCLUDE_LABEL, "").lower() == "true"
    op = triggers[0].op if triggers else None
    if excluded and op is not None and op.quarantines:
        op = Op.EVENT
    by_class: dict[str, list[Trigger]] = {}
    for f in triggers:
        if f.result.status is Status.FAILED or not f.pending:
            by_class.setdefault(settings.condition_type(f.result.check), []).append(f)
    classes = sorted({settings.condition_type(c) for c in state.seen} | set(by_class))
    conditions = []
    for ctype in classes:
        active = by_class.get(ctype)
        if active:
            conditions.append(ConditionWant(ctype, "True", active[0].result.reason,
                                            _message(active)))
        else:
            conditions.append(ConditionWant(ctype, "False", CONDITION_HEALTHY_REASON,
                                            "gpu-monitor sees no problem of this class"))
    reason = triggers[0].result.reason if triggers else ""
    return Decision(op=op, reason=reason, triggers=tuple(triggers), suppressed=tuple(suppressed),
                    conditions=tuple(conditions), excluded=excluded)


def gpu_indices(triggers: Iterable[Trigger]) -> list[int] | None:
    """GPU indices named by ``gpu:<N>`` targets; None when a trigger is not about one GPU
    (then every GPU is concerned)."""
    out: set[int] = set()
    for f in triggers:
        kind, _, rest = f.result.target.partition(":")
        if kind != "gpu" or not rest.isdigit():
            return None
        out.add(int(rest))
    return sorted(out) if out else None
