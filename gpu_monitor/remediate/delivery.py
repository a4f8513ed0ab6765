"""Node delivery: the one interface every write of the remediator goes through.

Why: the policy and the quarantine lifecycle are the same wherever gpu-monitor runs; what
differs is how a node is taken out of service and given back. On Kubernetes that is a
NodeCondition, an Event, a taint, a cordon, a drain through the Eviction API and a slot in the
breaker ConfigMap (remediate/k8s/); on a Slurm cluster it would be ``scontrol update
State=DRAIN Reason=...``, an optional requeue of the node's jobs, ``State=RESUME`` and a breaker
counted over ``sinfo``. A second backend is a new implementation of ``NodeDelivery``, never a
fork of policy.py or lifecycle.py.

The contract every implementation keeps (the lifecycle relies on it):

1. **Idempotent and resumable.** ``quarantine``, ``release``, ``mark_replace`` and
   ``record_drain`` may be repeated after a crash at any point; each re-reads what it must and
   writes only what is missing.
2. **Only our own changes are undone.** ``release`` returns the node to service only if
   gpu-monitor took it out (an administrator's own cordon or drain stays); a human who returns
   the node to service during our quarantine shows in ``NodeFacts.returned_by_human`` and is
   never overruled (no second cordon, no drain, reset or reboot against that decision).
3. **Notices never hold up a step.** ``event`` queues and returns; ``flush_events`` makes one
   attempt and never waits; a notice given up on is told to the ``on_event_dropped`` listener.
4. **Failures carry meaning.** A step that could not complete raises one of ``errors`` (the
   remediator logs it and tries again on its next tick); anything else is a bug.
5. **Facts, not representation.** The lifecycle reads the node only through ``NodeFacts``; how
   a backend spells them (labels and annotations, a Slurm reason string) stays inside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from gpu_monitor.remediate.breaker import FleetBreaker
from gpu_monitor.remediate.policy import ConditionWant

__all__ = ["DrainResult", "NodeDelivery", "NodeFacts", "QuarantineOutcome", "Request"]


class Request:
    """What an operator may ask of a node's daemon through the backend (``gpu-monitor
    quarantine release|retest``)."""

    RELEASE = "release"
    RETEST = "retest"


@dataclass(frozen=True)
class NodeFacts:
    """The node as the backend shows it, in the lifecycle's words."""

    labels: Mapping[str, str] = field(default_factory=dict)  # the policy's exclusion label
    state: str | None = None  # the lifecycle state mirrored on the node; None: never mirrored
    replace_marked: bool = False  # labelled for replacement
    release_requested: bool = False
    retest_requested: bool = False
    returned_by_human: bool = False  # a human put the node back in service during our quarantine


@dataclass(frozen=True)
class QuarantineOutcome:
    """What one ``quarantine`` found and did."""

    cordon_pre_existing: bool  # out of service before we acted: that stays theirs
    cordoned: bool  # we took it out of service in this call
    tainted: bool  # we added or re-valued our mark (a taint) in this call
    human_uncordoned: bool  # a human returned it to service since our own cordon
    human_untainted: bool  # a human removed our mark since we set it


class DrainResult(Protocol):
    """How a drain ended (remediate/k8s/drain.py's ``DrainReport`` is one)."""

    @property
    def ok(self) -> bool: ...

    @property
    def cancelled(self) -> bool: ...

    def summary(self) -> str: ...


class NodeDelivery(Protocol):
    """Every write the remediator makes to its own node, and what it reads back."""

    #: exceptions meaning "this step did not complete; try again on the next tick"
    errors: tuple[type[BaseException], ...]
    #: the drain's one global deadline, counted from the drain's first start across restarts
    drain_timeout_s: float

    @property
    def breaker(self) -> FleetBreaker:
        """The fleet circuit breaker this backend shares with the other nodes."""
        ...

    def facts(self) -> NodeFacts | None:
        """The node as of the last read or write (None before the first)."""
        ...

    def read(self) -> NodeFacts:
        """Read the node again."""
        ...

    def load_conditions(self, types: Iterable[str]) -> None:
        """At start-up: read back the problem conditions already published (kept, not reset)."""
        ...

    def publish_conditions(self, wants: Sequence[ConditionWant], now: datetime, *,
                           force: bool = False) -> bool:
        """Publish the problem conditions when one changed or a heartbeat is due (``force``:
        now); True when written."""
        ...

    def event(self, reason: str, message: str, *, warning: bool = False) -> bool:
        """Queue a notice about the node and try to deliver what waits, without waiting; False
        when it repeats one sent or waiting (guarantee 3)."""
        ...

    def event_delivered(self, reason: str, message: str) -> bool:
        """Whether the notice (reason, message) given to ``event`` was accepted (``event`` only
        queues): what a caller that must announce something exactly once waits for."""
        ...

    def flush_events(self) -> None:
        """One more attempt at the notices still waiting, never waiting."""
        ...

    def on_event_dropped(self, listener: Callable[[str, str], None]) -> None:
        """Tell ``listener(reason, why)`` of each notice given up on."""
        ...

    def mirror_state(self, state: str) -> None:
        """Show the lifecycle state on the node (only when it changes)."""
        ...

    def quarantine(self, reason: str, state: str, now: datetime) -> QuarantineOutcome:
        """Take the node out of service for ``reason`` (guarantees 1 and 2)."""
        ...

    def quarantine_text(self, reason: str) -> str:
        """How a quarantine for ``reason`` shows, for a person ("cordoned and tainted ...")."""
        ...

    def drain(self, remaining_s: float, cancel: threading.Event,
              on_outcome: Callable[[str], None]) -> DrainResult:
        """Move the node's workloads off within ``remaining_s``; ``on_outcome(result)`` per
        workload for the metrics."""
        ...

    def record_drain(self, status: str) -> None:
        """Show how the drain went on the node (``succeeded``, ``failed: <why>``)."""
        ...

    def mark_replace(self) -> None:
        """Mark the node for replacement (permanent until an operator releases it)."""
        ...

    def release(self, now: datetime) -> bool:
        """Return the node to service and drop our records (guarantee 2); True when we ended
        our own cordon."""
        ...

    def clear_request(self, request: str) -> None:
        """Forget an operator's ``Request`` once acted on."""
        ...

    def incoming_reports(self, store: Any, drop_dir: str | None) -> Any:
        """The ``reports.ReportSource`` of reports about this node (other detectors' findings
        through the backend, files dropped in ``drop_dir``)."""
        ...

    def bootstrap_held(self) -> bool:
        """Whether the node is still held back for its bootstrap suite (the bootstrap taint)."""
        ...

    def lift_bootstrap_hold(self) -> None:
        """Open the node for workloads once its bootstrap suite passed."""
        ...
