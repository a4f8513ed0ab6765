"""The fleet circuit breaker on Slurm: the slots are gpu-monitor's own drains.

Slurm has no object every daemon can change by compare-and-swap, so the claim is made on the
node itself and checked afterwards:

1. read every node of the configured partitions (``scontrol show node -o``); the budget is
   ``budget_for(GPU nodes)`` (remediate/breaker.py), the GPU nodes being those whose ``Gres``
   names the configured GRES (``remediation.slurm.gres``; null: every node of the partitions);
   if gpu-monitor drains (reasons that parse as ours, in any state but ``replace``) already
   fill it, deny without touching the node;
2. drain our node with reason ``... state:claim`` (reason.py);
3. wait ``settle_s`` (> 1 s, the resolution of Slurm's reason time), then read again and order
   every gpu-monitor drain by (first drain time, node name): the first time is the ``since:``
   our reasons carry once granted, else Slurm's reason time;
4. if our node is among the first ``budget``, the slot is ours (the reason gets its ``since:``);
   otherwise give it back: resume the node (we drained it in step 2) and deny. A claim cut
   off between 2 and 4 (slurmctld went away) leaves ``state:claim``: the next claim goes
   straight to step 3, so the drain is never kept without its check.

The guarantee: **at most ``budget`` nodes keep a gpu-monitor drain**, however many claim at once
(20 failing nodes with a 10% budget of 20 GPU nodes: at most 2 end drained). Why: a drain
that orders before ours was stamped no later than our own second, so slurmctld handled it
before our re-read, which comes at least ``settle_s`` > 1 s after our drain; so the re-read sees
every drain that will ever order before ours (drains that give back only leave). A node keeps
its drain only if it saw fewer than ``budget`` before it; the last of the kept nodes in the
order has every other kept node before it, so there are at most ``budget``. Step 3's re-read
may count a drain that is about to be given back: the safe direction (a node is denied, its
claim retried after ``breaker_retry_s``).

What this breaker does not have, unlike the ConfigMap one: a latched ``tripped`` state and
``paused`` (there is no shared object to hold them). A denial is counted, evented and logged on
the denied node; slots expire only with their drain (a node gone for good is resumed or
removed by the administrator).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpu_monitor.clock import Clock
from gpu_monitor.remediate.breaker import BreakerStatus, Claim, Slot, budget_for
from gpu_monitor.remediate.slurm.reason import CLAIM, format_reason, parse_reason
from gpu_monitor.remediate.slurm.tools import NodeRecord, SlurmError, SlurmTools

log = logging.getLogger(__name__)

__all__ = ["SlurmBreaker", "SlurmBreakerSettings", "our_drains"]


@dataclass(frozen=True)
class SlurmBreakerSettings:
    budget_fraction: float = 0.10
    max_nodes: int = 20
    partitions: tuple[str, ...] = ()  # () : every partition
    gres: str | None = "gpu"  # None: every node of the partitions is a GPU node
    settle_s: float = 1.5


def _in_scope(rec: NodeRecord, partitions: tuple[str, ...]) -> bool:
    return not partitions or any(p in partitions for p in rec.partitions)


def gpu_node_count(nodes: Mapping[str, NodeRecord], s: SlurmBreakerSettings) -> int:
    def is_gpu(rec: NodeRecord) -> bool:
        if s.gres is None:
            return True
        return any(g.split(":", 1)[0] == s.gres for g in rec.gres.split(",") if g)

    return sum(1 for r in nodes.values() if _in_scope(r, s.partitions) and is_gpu(r))


def our_drains(nodes: Mapping[str, NodeRecord], partitions: tuple[str, ...]
               ) -> list[tuple[str, str, str]]:
    """(first drain time, node, reason token) of every gpu-monitor drain holding a slot, in
    the breaker's order."""
    out = []
    for rec in nodes.values():
        ours = parse_reason(rec.reason)
        if ours is None or ours.state == "replace" or not rec.drained \
                or not _in_scope(rec, partitions):
            continue
        out.append((ours.since or rec.reason_time, rec.name, ours.token))
    return sorted(out)


class SlurmBreaker:
    """``remediate.breaker.FleetBreaker`` over the partitions' drains. ``on_drained(node)`` is
    told of a drain this breaker made (the delivery keeps it as ours)."""

    def __init__(self, tools: SlurmTools, settings: SlurmBreakerSettings,
                 clock: Clock | None = None,
                 on_drained: Callable[[str], None] | None = None,
                 on_resumed: Callable[[str], None] | None = None):
        self.tools = tools
        self.settings = settings
        self.clock = clock or Clock()
        self.on_drained = on_drained
        self.on_resumed = on_resumed
        self.last: BreakerStatus | None = None

    def _status(self, nodes: Mapping[str, NodeRecord]) -> BreakerStatus:
        total = gpu_node_count(nodes, self.settings)
        budget = budget_for(total, self.settings.budget_fraction, self.settings.max_nodes)
        slots = {n: Slot(since, since, token)
                 for since, n, token in our_drains(nodes, self.settings.partitions)}
        self.last = BreakerStatus(slots=slots, budget=budget, gpu_nodes=total)
        return self.last

    def status(self) -> BreakerStatus:
        return self._status(self.tools.show_nodes())

    def _rank(self, node: str, nodes: Mapping[str, NodeRecord]) -> int | None:
        order = [n for _t, n, _tok in our_drains(nodes, self.settings.partitions)]
        return order.index(node) if node in order else None

    def claim(self, node: str, reason: str = "") -> Claim:
        try:
            return self._claim(node, reason)
        except SlurmError as err:
            log.error("breaker claim for %s failed: %s", node, err)
            return Claim(False, "error", self.last or BreakerStatus(exists=False))

    def _claim(self, node: str, reason: str) -> Claim:
        nodes = self.tools.show_nodes()
        st = self._status(nodes)
        mine = nodes.get(node)
        if mine is None:
            raise SlurmError(f"node {node} is not known to slurmctld")
        ours = parse_reason(mine.reason) if mine.drained else None
        if node in st.slots and ours is not None and ours.state != CLAIM:
            return Claim(True, "held", st)
        if mine.out_of_service and ours is None:
            # an administrator's drain or down: the node is out already and stays theirs
            return Claim(True, "claimed", st)
        assert st.budget is not None
        if node not in st.slots:  # else a claim interrupted after its drain: decide it now
            if len(st.slots) >= st.budget:
                return self._denied(node, reason, st)
            self.tools.drain(node, format_reason(reason or "Unknown", CLAIM))
            if self.on_drained is not None:
                self.on_drained(node)
        self.clock.sleep(self.settings.settle_s)
        nodes = self.tools.show_nodes()
        st = self._status(nodes)
        rank = self._rank(node, nodes)
        if rank is not None and rank < (st.budget or 0):
            return Claim(True, "claimed", st)
        if rank is not None:  # the drain is ours, made just now: give the slot back
            self.tools.resume(node)
            if self.on_resumed is not None:
                self.on_resumed(node)
            st = self._status(self.tools.show_nodes())
        return self._denied(node, reason, st)

    def _denied(self, node: str, reason: str, st: BreakerStatus) -> Claim:
        st = BreakerStatus(slots=st.slots, budget=st.budget, gpu_nodes=st.gpu_nodes,
                           tripped_by=node,
                           tripped_reason=f"{len(st.slots)}/{st.budget} held by gpu-monitor "
                                          f"drains of {st.gpu_nodes} GPU nodes; {node} wanted one "
                                          f"for {reason or 'a quarantine'}")
        self.last = st
        return Claim(False, "full", st)

    def would_allow(self, node: str) -> Claim:
        st = self.status()
        if node in st.slots:
            return Claim(True, "held", st)
        free = len(st.slots) < (st.budget or 0)
        return Claim(free, "claimed" if free else "full", st)

    def renew(self, node: str) -> bool:
        """A slot lasts as long as its drain: nothing to refresh."""
        return self.last is not None and node in self.last.slots

    def release(self, node: str, *, replaced: bool = False) -> bool:
        """The slot goes with our drain (the delivery's ``release`` resumes the node) or with
        the ``replace`` state in its reason (``mark_replace``): nothing else to write."""
        held = self.last is not None and node in self.last.slots
        if self.last is not None and held:
            slots = {n: s for n, s in self.last.slots.items() if n != node}
            self.last = BreakerStatus(slots=slots, budget=self.last.budget,
                                      gpu_nodes=self.last.gpu_nodes,
                                      replacements=self.last.replacements + int(replaced))
        return held
