"""The check between workloads, decided: what the cleaner does next, given what it sees.

Pure: ``step`` takes what the daemon read (``NodeView``: the node's GPU workloads, our hold
pod, whether the node is quarantined) and what it remembers (``Memory``, kept in the store so
a restart resumes), and returns the actions to take and the new memory. The daemon's loop
(``loop.py``) reads, calls ``step``, acts, and stores the memory before it acts on it.

The hold (docs/cleaning.md#the-hold): a pod of our highest user PriorityClass
(``gpu-monitor-cleaning``, preemptionPolicy Never) that requests every GPU of the node and is
pinned to it by node affinity. It is created, Pending, while a workload holds the GPUs, so the
moment the last GPU pod leaves, the Kubernetes scheduler binds it ahead of any pending workload
of lower priority. While it is bound no workload can get the GPUs; the suite runs; a pass
deletes it and releases the node.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from gpu_monitor.model import Verdict, iso, parse_iso

#: Why the hold is deleted (an Event's reason and the metric label say these words).
RELEASED = "Passed"
QUARANTINED = "Quarantined"
REFUSED = "Refused"
GIVEN_BACK = "NotPassed"  # no pass, and no quarantine took the node: back to work, uncleaned

#: The cleaner's state, as metrics and ``gpu-monitor status`` say it.
STATE_OFF = "off"
STATE_IN_USE = "in_use"          # a workload holds the GPUs; the hold waits behind it
STATE_WAITING = "waiting"        # no workload, the hold is not bound yet
STATE_CLEANING = "cleaning"      # the hold is bound; the suite runs (or is due)
STATE_RETRYING = "retrying"      # the suite could not give an answer; held, tried again later
STATE_FAILED = "failed"          # the suite failed; held until quarantine, or a later pass
STATE_CLEAN = "clean"            # passed since the last workload; not held
STATE_QUARANTINED = "quarantined"
STATE_UNCLEAN = "unclean"        # given back without a pass; cleaned after its next workload
STATE_PROVISIONING = "provisioning"  # the bootstrap gate has not passed: it cleans the node

@dataclass(frozen=True)
class Workload:
    """A pod on the node that holds GPUs and is not ours (not terminal)."""

    namespace: str
    name: str
    gpus: int
    started: datetime | None  # status.startTime; None before the kubelet accepts it


@dataclass(frozen=True)
class Hold:
    """Our hold pod as the API server has it."""

    name: str
    bound: bool     # spec.nodeName is set: the scheduler placed it
    running: bool   # status.phase Running: the kubelet admitted it, the GPUs are its
    deleting: bool  # metadata.deletionTimestamp is set
    refused: bool = False  # phase Failed/Succeeded: the kubelet refused or ended it


@dataclass(frozen=True)
class NodeView:
    workloads: tuple[Workload, ...]
    hold: Hold | None
    quarantined: bool
    #: The bootstrap gate has not passed yet (its taint holds the node; its suite runs).
    provisioning: bool = False
    #: When the bootstrap gate's suite passed (None: no pass recorded).
    provisioned_at: datetime | None = None


@dataclass(frozen=True)
class Memory:
    """What the cleaner must not forget across a restart (stored as JSON)."""

    dirty: bool = True  # a workload may have used the GPUs since the last pass (start: yes)
    idle_since: datetime | None = None  # when the node was last seen with no GPU workload
    attempts: int = 0                   # suite runs without an answer since the hold bound
    next_try: datetime | None = None    # after an unknown: not before this
    held_failed: bool = False           # the last run failed: held for remediation's answer
    last_clean: datetime | None = None
    missed: int = 0  # workloads that started on a node not cleaned since the one before
    given_up: bool = False  # given back without a pass: not held again before a workload ran
    given_back: int = 0     # times a node was given back without a pass

    def to_json(self) -> dict:
        def t(v: datetime | None) -> str | None:
            return iso(v) if v else None
        return {"dirty": self.dirty, "idle_since": t(self.idle_since),
                "attempts": self.attempts, "next_try": t(self.next_try),
                "held_failed": self.held_failed, "last_clean": t(self.last_clean),
                "missed": self.missed, "given_up": self.given_up,
                "given_back": self.given_back}

    @classmethod
    def from_json(cls, data: dict) -> Memory:
        def t(v: object) -> datetime | None:
            return parse_iso(v) if isinstance(v, str) else None
        return cls(dirty=bool(data.get("dirty", True)), idle_since=t(data.get("idle_since")),
                   attempts=int(data.get("attempts") or 0), next_try=t(data.get("next_try")),
                   held_failed=bool(data.get("held_failed")), last_clean=t(data.get("last_clean")),
                   missed=int(data.get("missed") or 0), given_up=bool(data.get("given_up")),
                   given_back=int(data.get("given_back") or 0))


@dataclass(frozen=True)
class CreateHold:
    pass


@dataclass(frozen=True)
class DeleteHold:
    why: str


@dataclass(frozen=True)
class RunSuite:
    attempt: int


Action = CreateHold | DeleteHold | RunSuite


@dataclass(frozen=True)
class Step:
    state: str
    actions: tuple[Action, ...]
    memory: Memory
    missed_now: int = 0  # workloads this step found started on an uncleaned node


def _missed(view: NodeView, mem: Memory) -> int:
    """Workloads that started after the node was seen idle while it was still dirty: the race
    the hold cannot close (docs/cleaning.md#the-race-that-remains)."""
    if not mem.dirty or mem.idle_since is None:
        return 0
    # startTime has a resolution of one second: a workload started in the second the node was
    # seen idle counts (an alarm too many, never one too few).
    since = mem.idle_since.replace(microsecond=0)
    return sum(1 for w in view.workloads if w.started is not None and w.started >= since)


def step(view: NodeView, mem: Memory, now: datetime) -> Step:
    """The next actions. Never runs the suite beside a workload; never deletes a hold it did
    not see; while a hold is being deleted no other is created (one name, one hold)."""
    going = view.hold is not None and view.hold.deleting
    hold = None if going else view.hold
    create: tuple[Action, ...] = () if going else (CreateHold(),)  # one hold at a time
    if view.quarantined:
        # Quarantine's own taint and drain hold the node now, and it returns to service only
        # after a retest passes: that retest is the cleaning.
        mem = replace(mem, dirty=False, attempts=0, next_try=None, idle_since=None,
                      held_failed=False)
        acts: tuple[Action, ...] = (DeleteHold(QUARANTINED),) if hold else ()
        return Step(STATE_QUARANTINED, acts, mem)
    if view.provisioning:
        # The bootstrap gate's taint keeps work off the node and its suite runs: a second
        # suite would share the GPUs with it. Its pass counts as the node's clean (below) when
        # no workload was seen since the node was seen idle.
        if view.workloads:
            mem = replace(mem, dirty=True, idle_since=None)
        elif mem.idle_since is None:
            mem = replace(mem, idle_since=now)
        return Step(STATE_PROVISIONING, (), mem)
    if hold is not None and hold.refused:
        # The kubelet refused it (a workload got the GPUs first, OutOf<resource>) or it ended:
        # it holds nothing. Deleted; the next step makes a new one.
        return Step(STATE_IN_USE if view.workloads else STATE_WAITING,
                    (DeleteHold(REFUSED),), mem)
    if view.workloads:
        missed = _missed(view, mem)
        mem = replace(mem, dirty=True, idle_since=None, attempts=0, next_try=None,
                      held_failed=False, given_up=False, missed=mem.missed + missed)
        if hold is None:
            return Step(STATE_IN_USE, create, mem, missed)
        return Step(STATE_IN_USE, (), mem, missed)
    if mem.idle_since is None:
        mem = replace(mem, idle_since=now)
    if mem.dirty and view.provisioned_at is not None and view.provisioned_at >= mem.idle_since:
        # The bootstrap suite passed since the node was last seen in use: that was its clean.
        mem = replace(mem, dirty=False, attempts=0, next_try=None, held_failed=False,
                      last_clean=view.provisioned_at)
    if not mem.dirty:
        # A hold still there on a clean node is one a killed daemon had not deleted yet after
        # recording the pass: it is given back now.
        return Step(STATE_CLEAN, (DeleteHold(RELEASED),) if hold else (), mem)
    if mem.given_up:
        return Step(STATE_UNCLEAN, (DeleteHold(GIVEN_BACK),) if hold else (), mem)
    if hold is None:
        return Step(STATE_WAITING, create, mem)
    if not (hold.bound and hold.running):
        return Step(STATE_WAITING, (), mem)
    if mem.next_try is not None and now < mem.next_try:
        return Step(STATE_FAILED if mem.held_failed else STATE_RETRYING, (), mem)
    if mem.held_failed:
        # Remediation had retry_after_s to quarantine the node and did not (off, dry-run, the
        # fleet's breaker, a hysteresis): taking nodes out of service is its decision, behind
        # its breaker, never the cleaner's alone. Back to work, uncleaned.
        return _give_back(mem)
    return Step(STATE_CLEANING, (RunSuite(mem.attempts + 1),), mem)


def _give_back(mem: Memory) -> Step:
    mem = replace(mem, attempts=0, next_try=None, held_failed=False, given_up=True,
                  given_back=mem.given_back + 1)
    return Step(STATE_UNCLEAN, (DeleteHold(GIVEN_BACK),), mem)


def after_suite(mem: Memory, verdict: Verdict, now: datetime, *, retry_after_s: float,
                max_attempts: int = 3) -> Step:
    """What a finished suite run means: a pass releases the node; a fail keeps it held for
    ``retry_after_s`` while remediation (which has the results, stored like any bootstrap's)
    quarantines it, then gives it back; an unknown (a required check could not run, the budget
    ran out, the hold was lost) is no pass: held and tried again after ``retry_after_s``, up to
    ``max_attempts`` runs, then given back. The cleaner never keeps a node out of service past
    that on its own: a fleet-wide fault (a tool missing everywhere, a threshold too strict)
    must not hold every node."""
    if verdict is Verdict.HEALTHY:
        mem = replace(mem, dirty=False, attempts=0, next_try=None, held_failed=False,
                      last_clean=now)
        return Step(STATE_CLEAN, (DeleteHold(RELEASED),), mem)
    if verdict is Verdict.UNHEALTHY:
        # Remediation sees the failed results and quarantines (then the cleaner steps aside).
        mem = replace(mem, attempts=0, held_failed=True,
                      next_try=now + timedelta(seconds=retry_after_s))
        return Step(STATE_FAILED, (), mem)
    if mem.attempts + 1 >= max_attempts:
        return _give_back(mem)
    mem = replace(mem, attempts=mem.attempts + 1,
                  next_try=now + timedelta(seconds=retry_after_s))
    return Step(STATE_RETRYING, (), mem)
