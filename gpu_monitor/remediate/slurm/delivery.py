"""``SlurmDelivery``: the remediator's node delivery (remediate/delivery.py) on a Slurm cluster.

What each step is, as an administrator who runs NHC would do it by hand:

- **quarantine**: ``scontrol update NodeName=<node> State=DRAIN Reason="gpu-monitor: ..."``
  (reason.py); running jobs finish (Slurm's DRAIN), no new one starts. The breaker's claim
  (breaker.py) made the drain already; this writes the lifecycle state into the reason.
- **drain**: the jobs on the node (``squeue -w``) are requeued (``scontrol requeue``) when
  the quarantine's reason token is in ``remediation.slurm.requeue_on`` (``"*"``: every
  reason), then it waits, within the drain timeout, for the node to have no job left;
  jobs that outlast it make a failed drain, retried after the timeout (the node stays drained).
- **release**: ``State=RESUME``, only when the node's reason is still ours.
- **mirror_state** / **mark_replace**: the reason's ``state:`` word.

Whose drain it is: a node drained or down with a reason that is not ours was taken out by an
administrator: we never touch that reason nor resume that node (``cordon_pre_existing``). A
node we drained whose drain is gone (resumed) or whose reason was replaced was taken over by
an administrator: that is recorded in the store (it survives a restart) and respected, as
``NodeFacts.returned_by_human``: no second drain, and ``release`` resumes nothing.

Slurm has no NodeConditions or Events: the conditions are the results in the store
(``gpu-monitor status``, /metrics); a notice is a log line (the journal under systemd).
Every failing command is a ``SlurmError``: the step did not complete and is retried on the
next tick, with nothing lost (the lifecycle's record is in the store).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.model import Status
from gpu_monitor.remediate.delivery import NodeFacts, QuarantineOutcome
from gpu_monitor.remediate.policy import ConditionWant
from gpu_monitor.remediate.reports import ReportSource
from gpu_monitor.remediate.slurm.breaker import SlurmBreaker, SlurmBreakerSettings
from gpu_monitor.remediate.slurm.reason import CLAIM, STATES, format_reason, parse_reason
from gpu_monitor.remediate.slurm.tools import NodeRecord, SlurmError, SlurmTools

log = logging.getLogger(__name__)

__all__ = ["SlurmDelivery", "SlurmDrainReport", "SlurmSettings"]

KV_NAMESPACE = "remediation.slurm"
KV_OURS = "ownership"


@dataclass(frozen=True)
class SlurmSettings:
    partitions: tuple[str, ...] = ()
    gres: str | None = "gpu"
    requeue_on: tuple[str, ...] = ()
    command_timeout_s: float = 10.0
    drain_timeout_s: float = 900.0
    drain_poll_s: float = 2.0

    @classmethod
    def from_config(cls, config: Any) -> SlurmSettings:
        rem = config.remediation
        s = rem.slurm
        return cls(partitions=tuple(s.partitions), gres=s.gres, requeue_on=tuple(s.requeue_on),
                   command_timeout_s=float(s.command_timeout_s),
                   drain_timeout_s=float(rem.drain.timeout_s))


@dataclass(frozen=True)
class SlurmDrainReport:
    ok: bool
    cancelled: bool
    requeued: tuple[str, ...]
    left: tuple[str, ...]

    def summary(self) -> str:
        req = f"requeued {','.join(self.requeued)}; " if self.requeued else ""
        if self.ok:
            return f"{req}no job left on the node"
        return f"{req}{len(self.left)} job(s) still running ({','.join(self.left[:10])})"


class SlurmDelivery:
    """Our node's writes through ``scontrol``, behind ``remediate.delivery.NodeDelivery``.

    ``store``: where the ownership of our drain is remembered (None: only in memory)."""

    errors: tuple[type[BaseException], ...] = (SlurmError,)

    def __init__(self, node: str, settings: SlurmSettings | None = None, *,
                 breaker: SlurmBreakerSettings | None = None, clock: Clock | None = None,
                 store: Any = None, tools: SlurmTools | None = None):
        self.node_name = node
        self.settings = settings or SlurmSettings()
        self.clock = clock or Clock()
        self.store = store
        self.tools = tools or SlurmTools(self.settings.command_timeout_s)
        self._memory: dict[str, Any] = {}
        self._record: NodeRecord | None = None
        self._reason = ""  # the quarantine's reason token, for the drain's requeue policy
        self._events: list[tuple[str, str]] = []
        self._dropped: Callable[[str, str], None] | None = None
        self._breaker = SlurmBreaker(self.tools, breaker or SlurmBreakerSettings(
            partitions=self.settings.partitions, gres=self.settings.gres), self.clock,
            on_drained=lambda _n: self._own(drained=True, human=False),
            on_resumed=lambda _n: self._own(drained=False, human=False))

    @classmethod
    def from_config(cls, config: Any, node: str, clock: Clock | None = None,
                    store: Any = None) -> SlurmDelivery:
        rem = config.remediation
        settings = SlurmSettings.from_config(config)
        return cls(node, settings, clock=clock, store=store,
                   breaker=SlurmBreakerSettings(
                       budget_fraction=float(rem.breaker.budget_fraction),
                       max_nodes=int(rem.breaker.max_nodes), partitions=settings.partitions,
                       gres=settings.gres))

    # --- what we remember of our own drain -------------------------------------------------------

    def _ownership(self) -> dict[str, Any]:
        if self.store is None:
            return dict(self._memory)
        return dict(self.store.get_kv(KV_NAMESPACE, KV_OURS) or {})

    def _own(self, **kw: Any) -> None:
        new = {**self._ownership(), **kw}
        if self.store is None:
            self._memory = new
        else:
            self.store.set_kv(KV_NAMESPACE, KV_OURS, new)

    def _forget(self) -> None:
        self._memory = {}
        if self.store is not None:
            self.store.delete_kv(KV_NAMESPACE, KV_OURS)

    # --- the interface ---------------------------------------------------------------------------

    @property
    def breaker(self) -> SlurmBreaker:
        return self._breaker

    @property
    def drain_timeout_s(self) -> float:
        return self.settings.drain_timeout_s

    def on_event_dropped(self, listener: Callable[[str, str], None]) -> None:
        self._dropped = listener

    def _facts(self, rec: NodeRecord | None) -> NodeFacts | None:
        if rec is None:
            return None
        ours = parse_reason(rec.reason) if rec.drained else None
        return NodeFacts(labels={}, state=ours.state if ours else None,
                         replace_marked=ours is not None and ours.state == "replace",
                         returned_by_human=bool(self._ownership().get("human")))

    def facts(self) -> NodeFacts | None:
        return self._facts(self._record)

    def read(self) -> NodeFacts:
        rec = self.tools.show_node(self.node_name)
        self._record = rec
        self._notice_takeover(rec)
        facts = self._facts(rec)
        assert facts is not None
        return facts

    def _notice_takeover(self, rec: NodeRecord) -> bool:
        """Our drain gone (resumed) or its reason replaced: an administrator's decision,
        remembered; True when noticed now."""
        own = self._ownership()
        if not own.get("drained") or own.get("human"):
            return False
        if rec.drained and parse_reason(rec.reason) is not None:
            return False
        self._own(drained=False, human=True)
        how = (f"drained it again as {rec.reason!r}" if rec.out_of_service
               else f"resumed it (now {rec.state})")
        log.warning("node %s: an administrator %s during our quarantine; gpu-monitor will "
                    "not drain it again nor resume it", self.node_name, how)
        return True

    def load_conditions(self, types: Iterable[str]) -> None:
        return None  # no NodeConditions on Slurm: the results are in the store

    def publish_conditions(self, wants: Sequence[ConditionWant], now: datetime, *,
                           force: bool = False) -> bool:
        return False

    def event(self, reason: str, message: str, *, warning: bool = False) -> bool:
        if (reason, message) in self._events:
            return False
        self._events = [*self._events[-63:], (reason, message)]
        log.log(logging.WARNING if warning else logging.INFO, "node %s: %s: %s",
                self.node_name, reason, message)
        return True

    def event_delivered(self, reason: str, message: str) -> bool:
        return (reason, message) in self._events

    def flush_events(self) -> None:
        return None

    def _detail(self, token: str) -> tuple[str, ...]:
        """The check and targets of the standing results with reason ``token``."""
        if self.store is None:
            return ()
        try:
            found = [r for r in self.store.latest_results()
                     if r.reason == token and r.status in (Status.FAILED, Status.DEGRADED)]
        except Exception as exc:  # noqa: BLE001 - the reason's detail is a courtesy
            log.debug("cannot read results for the reason: %s", exc)
            return ()
        checks = sorted({r.check for r in found})
        return (*checks, *sorted({r.target for r in found if r.target}))

    def _write_reason(self, token: str, state: str, rec: NodeRecord) -> None:
        ours = parse_reason(rec.reason)
        since = (ours.since if ours and ours.since else rec.reason_time)
        text = format_reason(token, state, self._detail(token), since)
        if ours is not None and rec.reason == text and rec.drained:
            return
        self.tools.drain(self.node_name, text)
        self._record = self.tools.show_node(self.node_name)

    def mirror_state(self, state: str) -> None:
        rec = self._record or self.tools.show_node(self.node_name)
        ours = parse_reason(rec.reason) if rec.drained else None
        if ours is None or state not in STATES or ours.state == state:
            return
        self._write_reason(ours.token, state, rec)

    def quarantine(self, reason: str, state: str, now: datetime) -> QuarantineOutcome:
        self._reason = reason
        rec = self.tools.show_node(self.node_name)
        self._record = rec
        if self._notice_takeover(rec) or self._ownership().get("human"):
            return QuarantineOutcome(False, False, False, True, False)
        ours = parse_reason(rec.reason) if rec.drained else None
        if ours is None and rec.out_of_service:
            return QuarantineOutcome(True, False, False, False, False)  # theirs: untouched
        state = state if state in STATES else "quarantined"
        if ours is None:
            self.tools.drain(self.node_name, format_reason(reason, state, self._detail(reason)))
            self._own(drained=True, human=False)
            self._record = self.tools.show_node(self.node_name)
            rec = self._record
            self._write_reason(reason, state, rec)  # the since: of our first drain
            return QuarantineOutcome(False, True, True, False, False)
        first = ours.state == CLAIM  # the breaker's claim made the drain of this quarantine
        changed = ours.token != reason or ours.state != state or not ours.since
        self._own(drained=True, human=False)
        self._write_reason(reason, state, rec)
        return QuarantineOutcome(False, first, changed, False, False)

    def quarantine_text(self, reason: str) -> str:
        rec = self._record
        shown = rec.reason if rec is not None and parse_reason(rec.reason) else reason
        return f"drained in Slurm (Reason={shown!r})"

    def _requeues(self) -> bool:
        return "*" in self.settings.requeue_on or self._reason in self.settings.requeue_on

    def drain(self, remaining_s: float, cancel: threading.Event,
              on_outcome: Callable[[str], None]) -> SlurmDrainReport:
        requeued: tuple[str, ...] = ()
        jobs = self.tools.jobs_on(self.node_name)
        if jobs and self._requeues():
            self.tools.requeue(jobs)
            requeued = tuple(jobs)
            for _ in jobs:
                on_outcome("requeued")
            log.warning("node %s: requeued jobs %s (%s is in remediation.slurm.requeue_on)",
                        self.node_name, ",".join(jobs), self._reason)
        deadline = self.clock.monotonic() + max(0.0, remaining_s)
        while jobs:
            jobs = self.tools.jobs_on(self.node_name)
            if not jobs:
                break
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return SlurmDrainReport(False, False, requeued, tuple(jobs))
            if self.clock.wait(cancel, min(self.settings.drain_poll_s, left)):
                return SlurmDrainReport(False, True, requeued, tuple(jobs))
        return SlurmDrainReport(True, False, requeued, ())

    def record_drain(self, status: str) -> None:
        log.info("node %s: drain %s", self.node_name, status)

    def mark_replace(self) -> None:
        self.mirror_state("replace")

    def release(self, now: datetime) -> bool:
        rec = self.tools.show_node(self.node_name)
        self._record = rec
        self._notice_takeover(rec)
        ours = parse_reason(rec.reason) if rec.drained else None
        if ours is None:
            self._forget()
            return False
        self._record = self.tools.resume(self.node_name)
        self._forget()
        return True

    def clear_request(self, request: str) -> None:
        return None  # operator requests reach a Slurm node through its own CLI only

    def incoming_reports(self, store: Any, drop_dir: str | None) -> ReportSource:
        return ReportSource(self.node_name, store, self.clock, kube=None, drop_dir=drop_dir)

    def bootstrap_held(self) -> bool:
        return False  # on Slurm the bootstrap suite runs as prolog/epilog (slurm_hooks)

    def lift_bootstrap_hold(self) -> None:
        return None
