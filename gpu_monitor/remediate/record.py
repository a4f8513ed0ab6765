"""What remediation keeps in the state store: the quarantine record and the keys it lives under.

Why a type: the lifecycle resumes from this record after a crash at any point (lifecycle.py,
guarantee 1), so every field it relies on is named here, with its default, instead of being
looked up by string in a dict. The stored shape is the JSON object a daemon has always written
(``to_dict``/``from_dict`` keep its keys and spellings: times as RFC 3339 strings, the op as its
value, absent keys meaning their defaults), so a daemon upgraded mid-quarantine resumes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from gpu_monitor.model import iso, parse_iso
from gpu_monitor.remediate.policy import Op

__all__ = [
    "KV_BREAKER",
    "KV_DRY_RUN",
    "KV_NAMESPACE",
    "KV_POLICY",
    "KV_RECORD",
    "QuarantineRecord",
    "Retest",
    "delete_record",
    "load_record",
    "save_record",
]

KV_NAMESPACE = "remediation"
KV_POLICY = "policy"  # the policy's PolicyState (JSON text)
KV_RECORD = "quarantine"  # the QuarantineRecord (a JSON object)
KV_BREAKER = "breaker"  # the breaker status as last seen (for the metrics)
KV_DRY_RUN = "dry_run_decision"  # the last dry-run quarantine announced ("<op>:<reason>")


def _time(value: Any) -> datetime | None:
    return parse_iso(value) if value else None


def _put(out: dict[str, Any], key: str, value: Any, default: Any) -> None:
    if value != default:
        out[key] = iso(value) if isinstance(value, datetime) else value


@dataclass(frozen=True)
class Retest:
    """Where a retest stands: the GPU reset (``phase`` reset), then the suite (``suite``)."""

    started: datetime
    phase: str = "reset"
    needs_reset: bool = True
    retry_at: datetime | None = None  # an undecided suite runs again from then

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.phase, "needs_reset": self.needs_reset,
                               "started": iso(self.started)}
        _put(out, "retry_at", self.retry_at, None)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], now: datetime) -> Retest:
        return cls(started=_time(d.get("started")) or now, phase=str(d.get("phase") or "reset"),
                   needs_reset=bool(d.get("needs_reset", True)),
                   retry_at=_time(d.get("retry_at")))


@dataclass(frozen=True)
class QuarantineRecord:
    """One quarantine of this node, from the slot claim to the release."""

    op: Op  # what the quarantine does (cordon ... replace); may escalate, never de-escalate
    reason: str  # the most severe reason: the taint value
    since: datetime
    slot: bool = False  # a breaker slot is held for it
    applied: bool = False  # the node writes were made (re-checked when the node is re-read)
    announced: bool = False  # the Quarantined Event and action were recorded
    gpus: tuple[int, ...] | None = None  # the GPUs to reset (None: every GPU)
    drain: str = "none"  # none | pending | succeeded | failed
    drain_started: datetime | None = None  # the drain's one deadline counts from here
    drain_attempts: int = 0
    drain_detail: str = ""  # what the last failed drain said
    drain_next: datetime | None = None  # a failed drain is tried again from then
    retest: Retest | None = None
    boot_id: str | None = None  # the boot a reboot was asked in
    sentinel: str | None = None  # the reboot sentinel written for it
    replace_reason: str = ""
    replaced: bool = False  # labelled for replacement and announced
    releasing: bool = False  # the release started (it finishes after a crash)
    release_reason: str = ""

    def but(self, **changes: Any) -> QuarantineRecord:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op.value, "reason": self.reason,
                               "since": iso(self.since), "slot": self.slot,
                               "applied": self.applied, "drain": self.drain,
                               "gpus": None if self.gpus is None else list(self.gpus)}
        for key, default in (("announced", False), ("drain_started", None),
                             ("drain_attempts", 0), ("drain_detail", ""), ("drain_next", None),
                             ("boot_id", None), ("sentinel", None), ("replace_reason", ""),
                             ("replaced", False), ("releasing", False),
                             ("release_reason", "")):
            _put(out, key, getattr(self, key), default)
        if self.retest is not None:
            out["retest"] = self.retest.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], now: datetime) -> QuarantineRecord:
        """A record as any version wrote it; ``now`` stands in for a time that is missing."""
        gpus = d.get("gpus")
        retest = d.get("retest")
        return cls(
            op=Op(d.get("op") or Op.CORDON.value), reason=str(d.get("reason") or ""),
            since=_time(d.get("since")) or now, slot=bool(d.get("slot")),
            applied=bool(d.get("applied")), announced=bool(d.get("announced")),
            gpus=None if gpus is None else tuple(int(g) for g in gpus),
            drain=str(d.get("drain") or "none"), drain_started=_time(d.get("drain_started")),
            drain_attempts=int(d.get("drain_attempts") or 0),
            drain_detail=str(d.get("drain_detail") or ""),
            drain_next=_time(d.get("drain_next")),
            retest=Retest.from_dict(retest, now) if isinstance(retest, Mapping) else None,
            boot_id=d.get("boot_id"), sentinel=d.get("sentinel"),
            replace_reason=str(d.get("replace_reason") or ""), replaced=bool(d.get("replaced")),
            releasing=bool(d.get("releasing")), release_reason=str(d.get("release_reason") or ""))


def load_record(store: Any, now: datetime) -> QuarantineRecord | None:
    raw = store.get_kv(KV_NAMESPACE, KV_RECORD)
    return QuarantineRecord.from_dict(raw, now) if isinstance(raw, Mapping) and raw else None


def save_record(store: Any, record: QuarantineRecord) -> QuarantineRecord:
    store.set_kv(KV_NAMESPACE, KV_RECORD, record.to_dict())
    return record


def delete_record(store: Any) -> None:
    store.delete_kv(KV_NAMESPACE, KV_RECORD)
