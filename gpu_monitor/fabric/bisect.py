"""The bisection planner: from a failed group probe to the node(s) to blame, in few probes.

Why a planner and not a loop: each probe is a Kubernetes Job that takes minutes, may be
preempted, and needs GPUs that may be busy right now. So the planner is a pure state machine
the scheduler drives (``next_probe`` -> launch -> ``record``), and ``bisect`` runs the same
machine against a synchronous oracle for tests and for reasoning about bounds.

The plan (Google cluster-health-scanner's second pass, made adaptive):

1. A failed group is split into halves; each half is re-tested *together with a known-good
   node* (a node that passed recently and is not under suspicion), so every probe still
   crosses the fabric and a half of one node is a pair test.
2. A half that passes clears its nodes (and they become known-good nodes for later probes);
   a half that fails is split again, down to single nodes, whose pair test with a known-good
   node names them.
3. When no known-good node is available, halves of two or more nodes are tested alone; the
   first half that passes provides one. A single node with no known-good partner is left
   *inconclusive*, never blamed.
4. A probe that was abandoned (preempted) or undecided (``unknown``: e.g. the transport fell
   back to sockets) is retried ``retries`` times, then its nodes are inconclusive.
5. ``suspects`` (ranks the probe itself named, e.g. the one whose data arrived corrupted) are
   pair-tested first; the rest of the group is then re-tested as a whole, and bisected only if
   it still fails.

Bounds: one bad node among n costs at most 2 x ceil(log2 n) probes (two halves per level;
``probe_bound``); d bad nodes cost at most d times that, and never more than 2n - 2 (every set
of the split tree once), the default ``max_probes``. What is left untested when the cap is
reached is inconclusive.

A node is blamed only by a failing probe whose other members are all known-good; a group whose
halves all pass (the fault needs the whole group, or was transient) blames nobody, and neither
does a bisection in which no probe passed at all (then the known-good node, the probe itself
or the whole fabric may be what is broken).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ABANDONED",
    "FAIL",
    "OUTCOMES",
    "PASS",
    "UNKNOWN",
    "BisectResult",
    "Bisection",
    "PlannedProbe",
    "bisect",
    "probe_bound",
]

PASS = "pass"
FAIL = "fail"
ABANDONED = "abandoned"
UNKNOWN = "unknown"
OUTCOMES = (PASS, FAIL, ABANDONED, UNKNOWN)


@dataclass(frozen=True)
class PlannedProbe:
    """One probe to run: ``subject`` (the nodes under test) plus ``partner`` (a known-good
    node, or None when the subject is tested alone). ``nodes`` is what the Job must span."""

    subject: tuple[str, ...]
    partner: str | None = None
    attempt: int = 0

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.subject + ((self.partner,) if self.partner else ())

    @property
    def is_pair(self) -> bool:
        return len(self.subject) == 1 and self.partner is not None


@dataclass(frozen=True)
class ProbeRecord:
    probe: PlannedProbe
    outcome: str


@dataclass(frozen=True)
class BisectResult:
    """``bad``: named by a failing pair test; ``inconclusive``: could not be decided (no
    partner, probes abandoned, the cap reached); ``cleared``: passed a probe."""

    bad: tuple[str, ...]
    inconclusive: tuple[str, ...]
    cleared: tuple[str, ...]
    probes: tuple[ProbeRecord, ...] = ()

    @property
    def localized(self) -> bool:
        return bool(self.bad)


def probe_bound(n: int, bad: int = 1) -> int:
    """The most probes ``bad`` bad nodes among ``n`` can cost (without suspects or retries)."""
    if n <= 1:
        return bad
    return max(1, bad) * 2 * math.ceil(math.log2(n))


def _halves(nodes: Sequence[str]) -> list[tuple[str, ...]]:
    mid = (len(nodes) + 1) // 2
    return [tuple(nodes[:mid]), tuple(nodes[mid:])] if len(nodes) > 1 else [tuple(nodes)]


@dataclass
class Bisection:
    """The planner. ``nodes``: the failed group; ``known_good``: nodes that passed recently
    (outside the group); ``suspects``: nodes the failed probe itself named."""

    nodes: Sequence[str]
    known_good: Iterable[str] = ()
    suspects: Iterable[str] = ()
    max_probes: int | None = None
    retries: int = 1
    _queue: list[tuple[tuple[str, ...], int]] = field(default_factory=list, init=False)
    _good: list[str] = field(default_factory=list, init=False)
    _bad: list[str] = field(default_factory=list, init=False)
    _inconclusive: list[str] = field(default_factory=list, init=False)
    _cleared: list[str] = field(default_factory=list, init=False)
    _history: list[ProbeRecord] = field(default_factory=list, init=False)
    _in_flight: PlannedProbe | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.nodes = tuple(dict.fromkeys(self.nodes))
        members = set(self.nodes)
        self._good = [g for g in dict.fromkeys(self.known_good) if g not in members]
        suspects = [s for s in dict.fromkeys(self.suspects) if s in members]
        rest = tuple(n for n in self.nodes if n not in suspects)
        self._queue = [((s,), 0) for s in suspects]
        if suspects:
            if rest:
                self._queue.append((rest, 0))
        else:
            self._queue += [(h, 0) for h in _halves(rest) if h]
        if self.max_probes is None:
            # Every set of the binary split tree once (2n - 2: every node bad), the suspects'
            # pair tests and the rest's re-test, and the retries.
            self.max_probes = max(1, 2 * len(self.nodes) - 2) + 2 * len(suspects) + \
                2 * self.retries

    # --- the state machine -------------------------------------------------------------------

    @property
    def good_nodes(self) -> tuple[str, ...]:
        return tuple(self._good)

    @property
    def probes_used(self) -> int:
        return len(self._history)

    @property
    def done(self) -> bool:
        return self._in_flight is None and not self._runnable_exists()

    def _runnable_exists(self) -> bool:
        if not self._queue:
            return False
        if self.probes_used >= (self.max_probes or 0):
            return False
        # A lone node needs a partner; a larger set can always run alone.
        return any(len(s) > 1 for s, _ in self._queue) or bool(self._good)

    def next_probe(self, available: Iterable[str] | None = None) -> PlannedProbe | None:
        """The next probe, or None (finished, a probe in flight, or waiting for a partner
        among ``available`` nodes; None for ``available`` means every node is)."""
        if self._in_flight is not None:
            return None
        if not self._runnable_exists():
            self._finish()
            return None
        avail = None if available is None else set(available)
        partners = [g for g in self._good if avail is None or g in avail]
        for i, (subject, attempt) in enumerate(self._queue):
            if avail is not None and not set(subject) <= avail:
                continue
            if partners:
                probe = PlannedProbe(subject, partners[0], attempt)
            elif len(subject) > 1:
                probe = PlannedProbe(subject, None, attempt)
            else:
                continue
            del self._queue[i]
            self._in_flight = probe
            return probe
        return None

    def record(self, probe: PlannedProbe, outcome: str) -> None:
        """The outcome of ``probe`` (``pass``, ``fail``, ``abandoned`` or ``unknown``)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown probe outcome {outcome!r} (one of {', '.join(OUTCOMES)})")
        if probe != self._in_flight:
            raise ValueError(f"{probe} is not the probe in flight ({self._in_flight})")
        self._in_flight = None
        self._history.append(ProbeRecord(probe, outcome))
        subject = probe.subject
        if outcome == PASS:
            self._cleared += [n for n in subject if n not in self._cleared]
            self._good += [n for n in subject if n not in self._good]
        elif outcome == FAIL:
            if len(subject) == 1:  # a pair test with a known-good node: this one is bad
                self._bad.append(subject[0])
            else:  # split; the halves run with a partner when one is known by then
                self._queue += [(h, 0) for h in _halves(subject)]
        elif probe.attempt < self.retries:
            self._queue.append((subject, probe.attempt + 1))
        else:
            self._inconclusive += [n for n in subject if n not in self._inconclusive]
        if not self._runnable_exists():
            self._finish()

    def _finish(self) -> None:
        """Whatever is still queued can no longer be decided."""
        if self._in_flight is not None:
            return
        for subject, _ in self._queue:
            self._inconclusive += [n for n in subject if n not in self._inconclusive]
        self._queue = []

    def abort(self) -> None:
        """Give up (e.g. the bisection timed out): queued and in-flight nodes inconclusive."""
        if self._in_flight is not None:
            self._queue.append((self._in_flight.subject, self.retries))
            self._in_flight = None
        self._finish()

    def result(self) -> BisectResult:
        bad = list(self._bad)
        inconclusive = list(self._inconclusive)
        if bad and not any(r.outcome == PASS for r in self._history):
            # Nothing passed at all: the partner, the probe or the whole fabric may be what
            # is broken. Blame nobody.
            inconclusive += [n for n in bad if n not in inconclusive]
            bad = []
        decided = set(bad) | set(self._cleared)
        return BisectResult(
            bad=tuple(bad),
            inconclusive=tuple(n for n in inconclusive if n not in decided),
            cleared=tuple(self._cleared),
            probes=tuple(self._history),
        )


def bisect(nodes: Sequence[str], oracle: Callable[[tuple[str, ...]], str | bool],
           known_good: Iterable[str] = (), suspects: Iterable[str] = (),
           max_probes: int | None = None, retries: int = 1) -> BisectResult:
    """Run the planner against ``oracle(nodes) -> outcome`` (True/False mean pass/fail)."""
    plan = Bisection(nodes, known_good, suspects, max_probes, retries)
    while (probe := plan.next_probe()) is not None:
        got = oracle(probe.nodes)
        outcome = (PASS if got else FAIL) if isinstance(got, bool) else str(got)
        plan.record(probe, outcome)
    return plan.result()
