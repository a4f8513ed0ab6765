"""The fleet circuit breaker on Kubernetes: its slots in one ConfigMap, changed by compare-and-swap.

Why a ConfigMap: one pre-created object (``gpu-monitor-breaker`` in the gpu-monitor namespace,
which RBAC can restrict by name) that every daemon reads and writes with a PUT carrying the
resourceVersion it read; a 409 means another daemon won: re-read and decide again. So
simultaneous failures on many nodes cannot all pass (remediate/breaker.py states what a
breaker guarantees; this module keeps those guarantees on the API server). GPU nodes are
counted (label ``nvidia.com/gpu.present=true``, a metadata-only list) when a slot is claimed.

Data keys (strings, as ConfigMap data must be): ``state`` (closed|tripped), ``paused``
("true"/"false"), ``slots`` (JSON: node -> {since, renewed, reason}), ``trippedAt``,
``trippedBy``, ``trippedReason``, ``resetAt``, ``replacements``.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.kube.errors import KubeError
from gpu_monitor.model import iso
from gpu_monitor.remediate.breaker import (
    CLOSED,
    TRIPPED,
    BreakerStatus,
    Claim,
    Slot,
    budget_for,
)

log = logging.getLogger(__name__)

__all__ = ["BREAKER_CONFIGMAP", "BreakerSettings", "ConfigMapBreaker"]

BREAKER_CONFIGMAP = "gpu-monitor-breaker"


@dataclass(frozen=True)
class BreakerSettings:
    budget_fraction: float = 0.10
    max_nodes: int = 20
    cooldown_s: float = 600.0
    ttl_s: float = 3600.0
    namespace: str = "gpu-monitor"
    name: str = BREAKER_CONFIGMAP
    cas_attempts: int = 200

    @classmethod
    def from_config(cls, breaker: Any, namespace: str = "gpu-monitor") -> BreakerSettings:
        return cls(budget_fraction=float(breaker.budget_fraction), max_nodes=int(breaker.max_nodes),
                   cooldown_s=float(breaker.cooldown_s), ttl_s=float(breaker.ttl_s),
                   namespace=namespace)



def _parse(cm: Mapping[str, Any] | None) -> BreakerStatus:
    if cm is None:
        return BreakerStatus(exists=False)
    data = cm.get("data") or {}
    try:
        raw = json.loads(data.get("slots") or "{}")
    except ValueError:
        log.error("breaker ConfigMap: unreadable slots %r; treating as full", data.get("slots"))
        raw = None
    slots: dict[str, Slot] = {}
    if isinstance(raw, dict):
        for node, s in raw.items():
            if isinstance(s, Mapping):
                slots[str(node)] = Slot(str(s.get("since", "")), str(s.get("renewed", "")),
                                        str(s.get("reason", "")))
    state = str(data.get("state") or CLOSED).lower()
    if raw is None:
        state = TRIPPED
    try:
        replacements = int(data.get("replacements") or 0)
    except ValueError:
        replacements = 0
    return BreakerStatus(exists=True, state=TRIPPED if state == TRIPPED else CLOSED,
                         paused=str(data.get("paused", "")).lower() == "true", slots=slots,
                         tripped_at=str(data.get("trippedAt") or ""),
                         tripped_by=str(data.get("trippedBy") or ""),
                         tripped_reason=str(data.get("trippedReason") or ""),
                         reset_at=str(data.get("resetAt") or ""), replacements=replacements)


def _render(cm: Mapping[str, Any], st: BreakerStatus) -> dict[str, Any]:
    body = {k: v for k, v in cm.items() if k not in ("data",)}
    body["data"] = {
        **(cm.get("data") or {}),
        "state": st.state,
        "paused": "true" if st.paused else "false",
        "slots": json.dumps({n: {"since": s.since, "renewed": s.renewed, "reason": s.reason}
                             for n, s in sorted(st.slots.items())}, sort_keys=True),
        "trippedAt": st.tripped_at,
        "trippedBy": st.tripped_by,
        "trippedReason": st.tripped_reason,
        "resetAt": st.reset_at,
        "replacements": str(st.replacements),
    }
    return body



class ConfigMapBreaker:
    """Claims, renews and releases this node's slot; the CLI's status/pause/resume/reset."""

    def __init__(self, kube: Any, settings: BreakerSettings, clock: Clock | None = None,
                 rng: random.Random | None = None):
        self.kube = kube
        self.settings = settings
        self.clock = clock or Clock()
        self.rng = rng or random.Random()
        self.last: BreakerStatus | None = None

    def read(self) -> tuple[dict[str, Any] | None, BreakerStatus]:
        cm = self.kube.get_configmap(self.settings.namespace, self.settings.name)
        st = _parse(cm)
        self.last = st if self.last is None else _with_counts(st, self.last)
        return cm, st

    def status(self) -> BreakerStatus:
        return self.read()[1]

    def _update(self, change: Callable[[BreakerStatus, datetime], BreakerStatus | None]
                ) -> tuple[BreakerStatus, bool]:
        """Read-modify-write until the write wins (409: someone else wrote first).
        ``change`` returns the new status, or None to leave the ConfigMap alone."""
        for _ in range(self.settings.cas_attempts):
            cm, st = self.read()
            now = self.clock.now()
            new = change(st, now)
            if new is None or cm is None:
                return st, False
            try:
                self.kube.replace_configmap(self.settings.namespace, self.settings.name,
                                            _render(cm, new))
            except KubeError as err:
                if err.status == 409:
                    self.clock.sleep(self.rng.uniform(0.005, 0.05))
                    continue
                raise
            self.last = _with_counts(new, self.last)
            return new, True
        raise KubeError(409, "Conflict", f"breaker ConfigMap kept changing; gave up after "
                                         f"{self.settings.cas_attempts} attempts")

    # --- the daemon's side --------------------------------------------------------------------

    def claim(self, node: str, reason: str = "") -> Claim:
        """A slot for ``node`` (already holding one is a grant)."""
        gpu_nodes: list[int] = []
        outcome: dict[str, Any] = {"why": "", "tripped_now": False}

        def change(st: BreakerStatus, now: datetime) -> BreakerStatus | None:
            outcome["tripped_now"] = False  # decided afresh on every compare-and-swap round
            live = st.live_slots(now, self.settings.ttl_s)
            if node in st.slots:
                outcome["why"] = "held"
                slots = {**live, node: Slot(st.slots[node].since, iso(now),
                                            reason or st.slots[node].reason)}
                return _replace(st, slots=slots)
            if st.paused:
                outcome["why"] = "paused"
                return None
            if st.state == TRIPPED:
                outcome["why"] = "tripped"
                return None
            until = st.cooling_until(self.settings.cooldown_s)
            if until is not None and now < until:
                outcome["why"] = "cooldown"
                return None
            if not gpu_nodes:  # counted once per claim, not per compare-and-swap round
                gpu_nodes.append(self.kube.count_gpu_nodes())
            budget = budget_for(gpu_nodes[0], self.settings.budget_fraction,
                                self.settings.max_nodes)
            if len(live) >= budget:
                outcome["why"] = "tripped"
                outcome["tripped_now"] = True
                return _replace(st, slots=live, state=TRIPPED, tripped_at=iso(now),
                                tripped_by=node,
                                tripped_reason=f"no free slot: {len(live)}/{budget} in use "
                                               f"({gpu_nodes[0]} GPU nodes); {node} wanted one "
                                               f"for {reason or 'a quarantine'}")
            outcome["why"] = "claimed"
            return _replace(st, slots={**live, node: Slot(iso(now), iso(now), reason)})

        try:
            st, _written = self._update(change)
        except KubeError as err:
            log.error("breaker claim for %s failed: %s", node, err)
            return Claim(False, "error", self.last or BreakerStatus(exists=False))
        if not st.exists:
            return Claim(False, "missing", st)
        if gpu_nodes:
            budget = budget_for(gpu_nodes[0], self.settings.budget_fraction,
                                self.settings.max_nodes)
            st = _replace(st, budget=budget, gpu_nodes=gpu_nodes[0])
            self.last = st
        granted = outcome["why"] in ("claimed", "held")
        return Claim(granted, outcome["why"], st, outcome["tripped_now"])

    def would_allow(self, node: str) -> Claim:
        """A read-only claim (dry-run): what ``claim`` would answer now, writing nothing."""
        _cm, st = self.read()
        now = self.clock.now()
        if not st.exists:
            return Claim(False, "missing", st)
        if node in st.slots:
            return Claim(True, "held", st)
        if st.paused:
            return Claim(False, "paused", st)
        if st.state == TRIPPED:
            return Claim(False, "tripped", st)
        until = st.cooling_until(self.settings.cooldown_s)
        if until is not None and now < until:
            return Claim(False, "cooldown", st)
        total = self.kube.count_gpu_nodes()
        budget = budget_for(total, self.settings.budget_fraction, self.settings.max_nodes)
        st = _replace(st, budget=budget, gpu_nodes=total)
        live = st.live_slots(now, self.settings.ttl_s)
        return Claim(len(live) < budget, "claimed" if len(live) < budget else "tripped", st)

    def renew(self, node: str) -> bool:
        """Refresh this node's slot so it does not expire; False when it holds none."""
        held = {"ok": False}

        def change(st: BreakerStatus, now: datetime) -> BreakerStatus | None:
            if node not in st.slots:
                return None
            held["ok"] = True
            s = st.slots[node]
            return _replace(st, slots={**st.slots, node: Slot(s.since, iso(now), s.reason)})

        self._update(change)
        return held["ok"]

    def release(self, node: str, *, replaced: bool = False) -> bool:
        """Give the slot back (return to service, or labelled for replacement)."""
        done = {"ok": False}

        def change(st: BreakerStatus, now: datetime) -> BreakerStatus | None:
            if node not in st.slots and not replaced:
                return None
            done["ok"] = node in st.slots
            slots = {n: s for n, s in st.slots.items() if n != node}
            return _replace(st, slots=slots,
                            replacements=st.replacements + (1 if replaced else 0))

        self._update(change)
        return done["ok"]

    # --- the operator's side ------------------------------------------------------------------

    def pause(self, paused: bool = True) -> BreakerStatus:
        return self._update(lambda st, now: _replace(st, paused=paused)
                            if st.paused != paused else None)[0]

    def reset(self) -> BreakerStatus:
        """Close a tripped breaker; the storm cooldown starts now. Expired slots are dropped."""
        def change(st: BreakerStatus, now: datetime) -> BreakerStatus:
            return _replace(st, state=CLOSED, tripped_at="", tripped_by="", tripped_reason="",
                            reset_at=iso(now), slots=st.live_slots(now, self.settings.ttl_s))

        return self._update(change)[0]


def _replace(st: BreakerStatus, **kw: Any) -> BreakerStatus:
    return replace(st, **kw)


def _with_counts(st: BreakerStatus, prev: BreakerStatus | None) -> BreakerStatus:
    """Keep the last known budget/GPU count on a freshly read status (the ConfigMap has none)."""
    if prev is None or st.budget is not None:
        return st
    return _replace(st, budget=prev.budget, gpu_nodes=prev.gpu_nodes)
