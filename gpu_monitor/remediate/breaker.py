"""The fleet circuit breaker: how many nodes may be quarantined at once, shared by every daemon.

Why: a false positive that is common to the fleet (a driver bug, a bad rule, a flaky fabric
switch) must not take the fleet out of service - the failure draino's users report. So a
quarantine needs a slot in a budget every daemon shares, and the lifecycle asks for one before
its first cordon (or drain). This module holds what every backend's breaker answers in
(``BreakerStatus``, ``Claim``), the budget arithmetic, and the interface (``FleetBreaker``);
remediate/k8s/breaker.py keeps the slots in a ConfigMap changed only by compare-and-swap.

What a breaker guarantees, whatever it is built on:

1. **At most ``budget`` slots are ever held**: ``budget = min(ceil(budget_fraction x GPU
   nodes), max_nodes)`` (``budget_for``), the GPU nodes counted when a slot is claimed.
2. **No slot, no quarantine, and the breaker trips**: a denied claim records who, when and why;
   while tripped every new claim is denied; holders keep their slots and may release them.
   Only an operator closes it (``gpu-monitor breaker reset``), and a storm cooldown then still
   denies new claims, so a fleet-wide cause that is being fixed does not refill the budget.
3. ``paused`` denies new claims without tripping.
4. Slots are released on return to service or once the node is labelled for replacement
   (counted in ``replacements``); a slot not renewed within its ttl (its holder vanished) is
   dropped by the next writer.
5. A missing or unreadable breaker denies (fails closed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from gpu_monitor.model import parse_iso

__all__ = [
    "CLOSED",
    "TRIPPED",
    "BreakerStatus",
    "Claim",
    "FleetBreaker",
    "Slot",
    "budget_for",
]

CLOSED = "closed"
TRIPPED = "tripped"


def budget_for(gpu_nodes: int, fraction: float, max_nodes: int) -> int:
    """Slots for a fleet: the fraction rounded up (as NHC's maxUnhealthy), capped; a fleet
    where no node carries the GPU label still counts the claiming node itself."""
    return max(0, min(math.ceil(max(1, gpu_nodes) * fraction - 1e-9), max_nodes))



@dataclass(frozen=True)
class Slot:
    since: str
    renewed: str
    reason: str = ""


@dataclass(frozen=True)
class BreakerStatus:
    """A snapshot of the fleet's breaker (``exists`` False: it is missing)."""

    exists: bool = True
    state: str = CLOSED
    paused: bool = False
    slots: Mapping[str, Slot] = field(default_factory=dict)
    tripped_at: str = ""
    tripped_by: str = ""
    tripped_reason: str = ""
    reset_at: str = ""
    replacements: int = 0
    budget: int | None = None  # known after a claim counted the GPU nodes
    gpu_nodes: int | None = None

    def live_slots(self, now: datetime, ttl_s: float) -> dict[str, Slot]:
        out = {}
        for node, s in self.slots.items():
            try:
                age = (now - parse_iso(s.renewed)).total_seconds()
            except ValueError:
                continue
            if age <= ttl_s:
                out[node] = s
        return out

    def cooling_until(self, cooldown_s: float) -> datetime | None:
        if not self.reset_at:
            return None
        try:
            from datetime import timedelta

            return parse_iso(self.reset_at) + timedelta(seconds=cooldown_s)
        except ValueError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return {"exists": self.exists, "state": self.state, "paused": self.paused,
                "slots": {n: {"since": s.since, "renewed": s.renewed, "reason": s.reason}
                          for n, s in sorted(self.slots.items())},
                "trippedAt": self.tripped_at, "trippedBy": self.tripped_by,
                "trippedReason": self.tripped_reason, "resetAt": self.reset_at,
                "replacements": self.replacements, "budget": self.budget,
                "gpuNodes": self.gpu_nodes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BreakerStatus:
        return cls(exists=bool(d.get("exists", True)), state=str(d.get("state", CLOSED)),
                   paused=bool(d.get("paused")),
                   slots={n: Slot(str(s.get("since", "")), str(s.get("renewed", "")),
                                  str(s.get("reason", "")))
                          for n, s in (d.get("slots") or {}).items()},
                   tripped_at=str(d.get("trippedAt") or ""), tripped_by=str(d.get("trippedBy") or ""),
                   tripped_reason=str(d.get("trippedReason") or ""),
                   reset_at=str(d.get("resetAt") or ""), replacements=int(d.get("replacements") or 0),
                   budget=d.get("budget"), gpu_nodes=d.get("gpuNodes"))



@dataclass(frozen=True)
class Claim:
    granted: bool
    why: str  # "claimed" | "held" | "tripped" | "paused" | "cooldown" | "missing" | "error"
    #         | "full" (a breaker without a latched trip: remediate/slurm/breaker.py)
    status: BreakerStatus
    tripped_now: bool = False  # this claim is the one that tripped the breaker

    @property
    def message(self) -> str:
        st = self.status
        used = len(st.slots)
        if self.granted:
            return f"breaker slot {self.why} ({used}/{st.budget if st.budget is not None else '?'})"
        return {
            "tripped": (f"breaker tripped by {st.tripped_by or '?'} at {st.tripped_at or '?'} "
                        f"({st.tripped_reason or 'budget exhausted'}); "
                        "quarantine refused until `gpu-monitor breaker reset`"),
            "paused": "breaker paused by an operator; quarantine refused",
            "cooldown": f"breaker in its storm cooldown after a reset at {st.reset_at}",
            "missing": "breaker ConfigMap is missing; quarantine refused (fail closed)",
            "full": (f"no free breaker slot ({st.tripped_reason or f'{used}/{st.budget}'}); "
                     "quarantine refused, the claim is retried later"),
        }.get(self.why, f"breaker claim failed: {self.why}")



class FleetBreaker(Protocol):
    """What the lifecycle asks of the fleet's breaker (remediate/k8s/breaker.py is one)."""

    #: the status as of the last read or write (saved in the store for the metrics)
    last: BreakerStatus | None

    def claim(self, node: str, reason: str = "") -> Claim:
        """A slot for ``node`` (already holding one is a grant)."""
        ...

    def would_allow(self, node: str) -> Claim:
        """What ``claim`` would answer now, writing nothing (dry-run)."""
        ...

    def renew(self, node: str) -> bool:
        """Refresh the node's slot so it does not expire; False when it holds none."""
        ...

    def release(self, node: str, *, replaced: bool = False) -> bool:
        """Give the slot back (return to service, or labelled for replacement)."""
        ...

    def status(self) -> BreakerStatus:
        """Read the breaker now."""
        ...
