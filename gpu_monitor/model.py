"""The shared vocabulary: statuses, actions, results, runs and reports.

Every part of gpu-monitor speaks in these frozen values and nothing else: checks produce
``Result`` objects, the runner wraps one check's run in a ``RunOutcome``, the store persists
them, the metrics collector and the remediation policy read them. Keeping the vocabulary in one small module means a check never needs to know who
consumes its output (detection is separate from delivery).

The JSON form of ``Report`` is a public contract (docs/report-schema.md, ``SCHEMA_VERSION``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from types import MappingProxyType
from typing import Any

from gpu_monitor import __version__

SCHEMA_VERSION = 1


class TokenEnum(str, Enum):
    """A vocabulary of stable lower-case tokens: ``str()`` of a member is its value, the word
    written to JSON, logs, labels and reasons (``str(Status.OK) == "ok"``, never
    ``"Status.OK"``). Every such enum derives from this one, so none spells it again."""

    def __str__(self) -> str:
        return self.value


class Status(TokenEnum):
    """Outcome of one check on one target.

    ``skipped``: not applicable here (no GPU, unsupported field, check disabled).
    ``unknown``: the check could not decide; never reported as ok, never acted on alone.
    ``degraded``: real evidence of a problem that does not yet warrant removal.
    ``failed``: real evidence that the node must not run workloads.
    """

    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    SKIPPED = "skipped"


# Severity order used to pick the "worst" of several results (skipped < ok < ...).
STATUS_SEVERITY = {
    Status.SKIPPED: 0,
    Status.OK: 1,
    Status.DEGRADED: 2,
    Status.UNKNOWN: 3,
    Status.FAILED: 4,
}


class Action(TokenEnum):
    """What a result suggests; the remediation policy decides what is actually done. Declared
    mildest first: that order is ``ACTION_SEVERITY``."""

    NONE = "none"
    WATCH = "watch"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    REPLACE = "replace"


ACTION_SEVERITY = {action: rank for rank, action in enumerate(Action)}


class Kind(TokenEnum):
    """When a check runs: at provisioning, continuously, or periodically on idle nodes."""

    BOOTSTRAP = "bootstrap"
    PASSIVE = "passive"
    PERIODIC = "periodic"


class Verdict(TokenEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


# Exit codes of one-shot commands (a public contract, see docs/cli.md).
EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2
EXIT_UNKNOWN = 3

VERDICT_EXIT = {
    Verdict.HEALTHY: EXIT_HEALTHY,
    Verdict.UNHEALTHY: EXIT_UNHEALTHY,
    Verdict.UNKNOWN: EXIT_UNKNOWN,
}


class UsageError(Exception):
    """Bad flags, config or profile: the command exits ``EXIT_USAGE`` (2) with this message.

    Raised wherever the mistake is found (the CLI's wiring, check selection, the daemon's
    listener, a subcommand) and turned into the exit code once, by ``cli.main``.
    """

_REASON_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(ts: datetime) -> str:
    """ISO 8601 in UTC with a ``Z`` suffix and microseconds dropped when zero."""
    if ts.tzinfo is None:
        raise ValueError("naive datetime: gpu-monitor timestamps are always UTC-aware")
    ts = ts.astimezone(timezone.utc)
    text = ts.isoformat(timespec="microseconds" if ts.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    ts = datetime.fromisoformat(text)
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return ts.astimezone(timezone.utc)


def is_reason(token: str) -> bool:
    """Reasons are stable CamelCase tokens (``Xid79``, ``RowRemapPending``)."""
    return bool(_REASON_RE.match(token))


# --- targets ---------------------------------------------------------------------------------

_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


def canonical_pci(address: str) -> str:
    """Normalise a PCI address to ``0000:3b:00.0`` (4-digit domain, lower case, function).

    Accepts NVML's ``00000000:3B:00.0``, the kernel log's ``PCI:0000:3b:00`` and the old
    ``0000:03:00`` form; a missing function means function 0 (GPUs are function 0).
    """
    m = _PCI_RE.match(address.strip())
    if not m:
        raise ValueError(f"not a PCI address: {address!r}")
    domain = int(m.group("domain") or "0", 16)
    if domain > 0xFFFF:
        # NVML pads the domain to 8 digits; real domains fit in 16 bits on every platform we know.
        raise ValueError(f"PCI domain out of range: {address!r}")
    bus = int(m.group("bus"), 16)
    dev = int(m.group("dev"), 16)
    fn = int(m.group("fn") or "0")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"


def gpu_target(index: int) -> str:
    return f"gpu:{index}"


def nvlink_target(gpu: int, link: int) -> str:
    return f"nvlink:{gpu}:{link}"


def p2p_target(src: int, dst: int) -> str:
    return f"p2p:{src}:{dst}"


def ib_target(device: str, port: int) -> str:
    return f"ib:{device}:{port}"


def pcie_target(address: str) -> str:
    return f"pcie:{canonical_pci(address)}"


def nvswitch_target(index: int) -> str:
    return f"nvswitch:{index}"


NODE = "node"


# --- results ---------------------------------------------------------------------------------


# Exact types that are neither mappings nor sequences to freeze (subclasses take the full path).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def freeze(value: Any, *, str_keys: bool = False) -> Any:
    """Nested dicts/lists -> read-only mappings/tuples, so that a frozen value (a result's
    details, a profile) has no part a reader could change. ``str_keys``: keys become text, as
    they will be in the value's JSON."""
    if type(value) in _SCALARS:  # most of a result's details: no ABC check per value
        return value
    if isinstance(value, Mapping):
        return MappingProxyType({(str(k) if str_keys else k): freeze(v, str_keys=str_keys)
                                 for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v, str_keys=str_keys) for v in value)
    return value


def thaw(value: Any, *, json_safe: bool = False) -> Any:
    """Read-only mappings/tuples -> plain dicts/lists (fresh copies). ``json_safe``: NaN, which
    JSON cannot carry, becomes None."""
    kind = type(value)
    if kind in _SCALARS:
        return None if json_safe and kind is float and value != value else value
    if isinstance(value, Mapping):
        return {k: thaw(v, json_safe=json_safe) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v, json_safe=json_safe) for v in value]
    if json_safe and isinstance(value, float) and value != value:
        return None
    return value


@dataclass(frozen=True)
class Result:
    """One finding of one check about one target."""

    check: str
    status: Status
    target: str = NODE
    reason: str = "Ok"
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    action: Action = Action.NONE
    observed_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "action", Action(self.action))
        if not is_reason(self.reason):
            raise ValueError(f"reason must be a CamelCase token, got {self.reason!r}")
        if self.observed_at.tzinfo is None:
            raise ValueError("observed_at must be timezone-aware (UTC)")
        object.__setattr__(self, "details", freeze(self.details, str_keys=True))

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status.value,
            "target": self.target,
            "reason": self.reason,
            "message": self.message,
            "details": thaw(self.details, json_safe=True),
            "action": self.action.value,
            "observed_at": iso(self.observed_at),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Result:
        return cls(
            check=data["check"],
            status=Status(data["status"]),
            target=data.get("target", NODE),
            reason=data.get("reason", "Ok"),
            message=data.get("message", ""),
            details=data.get("details") or {},
            action=Action(data.get("action", "none")),
            observed_at=parse_iso(data["observed_at"]),
        )


@dataclass(frozen=True)
class RunOutcome:
    """One run of one check: its results, and whether the run itself completed.

    ``success`` is the framework's view (node_exporter's ``scrape_collector_success``): the
    check ran to completion -- no crash, no timeout, its requirements met -- whatever its
    results say. ``error`` names why it did not (``timeout``, ``requirement-missing``, the
    exception's type).
    """

    check: str
    results: tuple[Result, ...]
    started_at: datetime
    duration_s: float
    success: bool
    error: str = ""


def verdict_of(results: Iterable[Result]) -> Verdict:
    """Any ``failed`` -> unhealthy; else any ``unknown`` -> unknown; else healthy."""
    statuses = {r.status for r in results}
    if Status.FAILED in statuses:
        return Verdict.UNHEALTHY
    if Status.UNKNOWN in statuses:
        return Verdict.UNKNOWN
    return Verdict.HEALTHY


@dataclass(frozen=True)
class Report:
    """The outcome of a suite run; ``to_dict`` is the public JSON contract (schema 1)."""

    node: str
    profile: str | None
    started_at: datetime
    finished_at: datetime
    results: tuple[Result, ...]
    tool_version: str = ""

    @property
    def verdict(self) -> Verdict:
        return verdict_of(self.results)

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "tool_version": self.tool_version or __version__,
            "node": self.node,
            "profile": self.profile,
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "verdict": self.verdict.value,
            "results": [r.to_dict() for r in self.results],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"unsupported report schema {data.get('schema')!r}")
        return cls(
            node=data["node"],
            profile=data.get("profile"),
            started_at=parse_iso(data["started_at"]),
            finished_at=parse_iso(data["finished_at"]),
            results=tuple(Result.from_dict(r) for r in data["results"]),
            tool_version=data.get("tool_version", ""),
        )
