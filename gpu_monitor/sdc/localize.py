"""Ring replay bookkeeping: who replays whom, which pairs disagree, who is to blame.

Why a module of its own: the same decisions serve the training library (one rank per GPU,
across nodes) and the node probe (one process per local device). Everything here is pure: it
takes already-computed results (any values that compare with ``==``: tuples of fingerprint
numbers, bytes) and returns plain data, needs no process group and imports no torch.

Guarantees (SPEC-SDC.md "Ring replay audit"):

1. Rank ``r`` replays the micro-batch of ``(r + peer_offset) mod n``; the pair
   ``(target, replayer)`` mismatches when the target's own result differs from the replayer's
   replay of it.
2. A rank is a culprit when it appears in two mismatched pairs with two *different* partners:
   its own work was wrong and its replay of another rank's work was wrong. (In a ring cycle of
   length 2, e.g. a world of 2, both pairs join the same two ranks and cannot single one out;
   they are confirmed instead.)
3. When more than half of the ranks would be culprits, no rank is named: every replay
   disagreeing means a non-deterministic model or a ``rebuild_batch`` that returns different
   data (software), not a hardware fault.
4. Pairs not touching a culprit are ambiguous and get a confirmation by a third rank, chosen on a
   node that is neither the target's nor (if possible) the replayer's; the suspect's work is never
   judged by the suspect alone.
5. Weights: for each differing tensor the copy held by a strict majority (> n/2) is right; with
   no strict majority nobody is named.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = [
    "KINDS",
    "Confirmation",
    "Localization",
    "choose_third",
    "classify",
    "confirmation_work",
    "divergent_ranks",
    "localize",
    "majority",
    "mismatched_pairs",
    "plan_confirmations",
    "ranks_per_node",
    "replayer_of",
    "ring_offset",
    "single_node",
    "software_problem",
    "target_of",
    "topology_problems",
    "verdicts",
]

PERSISTENT = "persistent"
TRANSIENT = "transient"
UNCLEAR = "unclear"
REPLAYER_WRONG = "replayer computed wrong"
UNATTRIBUTABLE = "unattributable"
KINDS = (PERSISTENT, TRANSIENT, UNCLEAR, REPLAYER_WRONG, UNATTRIBUTABLE)

SOFTWARE_NOTE = (
    "more than half of the ranks would be culprits: the replays disagree almost everywhere, "
    "so the model is not deterministic or rebuild_batch returns different data; "
    "a software problem, not hardware - no rank is named"
)

Pair = tuple[int, int]


def target_of(replayer: int, n: int, peer_offset: int) -> int:
    """The rank whose micro-batch ``replayer`` recomputes."""
    return (replayer + peer_offset) % n


def replayer_of(target: int, n: int, peer_offset: int) -> int:
    """The rank that recomputes ``target``'s micro-batch."""
    return (target - peer_offset) % n


def mismatched_pairs(
    own: Sequence[Hashable], replays: Sequence[Hashable], peer_offset: int
) -> list[Pair]:
    """``(target, replayer)`` for every target whose own result its replayer did not reproduce.

    ``own[r]`` is rank r's result for its own micro-batch, ``replays[r]`` rank r's result for
    the micro-batch of ``target_of(r)``.
    """
    n = len(own)
    if len(replays) != n:
        raise ValueError(f"{len(own)} own results but {len(replays)} replays")
    out = []
    for t in range(n):
        r = replayer_of(t, n, peer_offset)
        if own[t] != replays[r]:
            out.append((t, r))
    return out


@dataclass(frozen=True)
class Localization:
    """What the ring table says: named culprits and the pairs that need a confirmation."""

    pairs: tuple[Pair, ...]
    culprits: tuple[int, ...]
    ambiguous: tuple[Pair, ...]
    note: str | None = None


def localize(pairs: Sequence[Pair], n: int, peer_offset: int) -> Localization:
    """Culprits (in two mismatched pairs with different partners) and the ambiguous rest."""
    pairs = tuple(sorted(tuple(p) for p in pairs))
    as_target = {t for t, _ in pairs}
    as_replayer = {r for _, r in pairs}
    culprits = sorted(
        x
        for x in as_target & as_replayer
        if replayer_of(x, n, peer_offset) != target_of(x, n, peer_offset)
    )
    if len(culprits) * 2 > n:
        return Localization(pairs, (), (), SOFTWARE_NOTE)
    bad = set(culprits)
    ambiguous = tuple(p for p in pairs if not (set(p) & bad))
    return Localization(pairs, tuple(culprits), ambiguous)


def choose_third(
    target: int,
    replayer: int,
    n: int,
    peer_offset: int,
    nodes: Sequence[str] | None = None,
) -> int | None:
    """The rank that confirms pair (target, replayer), or None when no independent one exists.

    Preference: ``target + k * peer_offset`` for k = 1, 2, ..., then every other rank; the
    first one that is neither of the pair, not on the target's node, and not on the replayer's
    node; failing that, the first not on the target's node. ``nodes=None`` treats every rank as
    its own node (the node probe: one device per rank).
    """

    def node(x: int) -> object:
        return x if nodes is None else nodes[x]

    order = [(target + k * peer_offset) % n for k in range(1, n)]
    order += [(target + j) % n for j in range(1, n)]
    seen: list[int] = []
    for c in order:
        if c in (target, replayer) or c in seen:
            continue
        seen.append(c)
    off_target = [c for c in seen if node(c) != node(target)]
    best = [c for c in off_target if node(c) != node(replayer)]
    if best:
        return best[0]
    return off_target[0] if off_target else None


def single_node(nodes: Sequence[str]) -> bool:
    """Whether every rank of a group of at least 2 is on one node (the common 8-GPU job)."""
    return len(nodes) >= 2 and len(set(nodes)) == 1


def ring_offset(nodes: Sequence[str], peer_offset: int) -> int:
    """The ring offset a layout runs with: ``peer_offset``, except on a single node where it
    would make ranks replay themselves (``peer_offset`` = ranks per node, the multi-node
    setting): there the ring goes to the next GPU (offset 1)."""
    if single_node(nodes) and peer_offset % len(nodes) == 0:
        return 1
    return peer_offset


def ranks_per_node(nodes: Sequence[str]) -> int | None:
    """The number of ranks on each node, None when nodes hold different numbers."""
    counts = set(Counter(nodes).values())
    return counts.pop() if len(counts) == 1 else None


def topology_problems(nodes: Sequence[str], peer_offset: int) -> list[str]:
    """Why a layout cannot be audited (empty when it can): replayer or third on the target's node.

    A group on a single node is accepted (replays run across the node's GPUs, with
    ``ring_offset``; the third of a pair is then another GPU of the same node, so callers plan
    confirmations with ``nodes=None``). Where the layout spans nodes, a replayer or a confirming
    third on its target's node is refused.
    """
    n = len(nodes)
    if n < 2:
        return [f"the ring replay needs at least 2 ranks, got {n}"]
    if single_node(nodes):
        return []
    if peer_offset % n == 0:
        return [f"peer_offset={peer_offset} is a multiple of the world size {n}: ranks replay themselves"]
    problems = []
    for t in range(n):
        r = replayer_of(t, n, peer_offset)
        if nodes[r] == nodes[t]:
            problems.append(
                f"rank {r} would replay rank {t} but both are on node {nodes[t]!r}"
            )
            continue
        others = [c for c in range(n) if c not in (t, r)]
        if others and choose_third(t, r, n, peer_offset, nodes) is None:
            problems.append(
                f"every rank that could confirm pair ({t}, {r}) is on rank {t}'s node {nodes[t]!r}"
            )
    return problems


def classify(
    original: Hashable, replay: Hashable, third: Hashable, recompute: Hashable | None
) -> tuple[str | None, str]:
    """(who is suspect: "target" / "replayer" / None, kind) for a confirmed mismatched pair.

    ``original``: the target's own result; ``replay``: the replayer's; ``third``: the third
    rank's replay; ``recompute``: the target's recomputation of its own micro-batch.
    """
    if third == original:
        return "replayer", REPLAYER_WRONG
    if third == replay:
        if recompute == original:
            return "target", PERSISTENT
        if recompute == third:
            return "target", TRANSIENT
        return "target", UNCLEAR
    return None, UNATTRIBUTABLE


@dataclass(frozen=True)
class Confirmation:
    """One ambiguous pair and the rank chosen to replay it a third time (None: nobody can)."""

    pair: Pair
    third: int | None


def plan_confirmations(
    ambiguous: Sequence[Pair], n: int, peer_offset: int, nodes: Sequence[str] | None = None
) -> list[Confirmation]:
    return [Confirmation(tuple(p), choose_third(p[0], p[1], n, peer_offset, nodes)) for p in ambiguous]


REPLAY = "replay"
RECOMPUTE = "recompute"


def confirmation_work(plans: Sequence[Confirmation], rank: int) -> list[tuple[str, int]]:
    """What ``rank`` computes for the confirmation round, in a fixed order all ranks agree on.

    ``("replay", t)``: replay target t's micro-batch (rank is the third);
    ``("recompute", t)``: recompute its own micro-batch (rank is the target t).
    """
    work: list[tuple[str, int]] = []
    for c in plans:
        if c.third is None:
            continue
        t = c.pair[0]
        if c.third == rank and (REPLAY, t) not in work:
            work.append((REPLAY, t))
        if t == rank and (RECOMPUTE, t) not in work:
            work.append((RECOMPUTE, t))
    return work


def verdicts(
    plans: Sequence[Confirmation],
    own: Sequence[Hashable],
    replays: Sequence[Hashable],
    results: dict[tuple[int, str, int], Hashable],
    n: int,
    peer_offset: int,
) -> list[dict]:
    """One ``{"pair", "third", "suspect", "kind"}`` per plan.

    ``results[(rank, kind, target)]`` holds the confirmation round's results, keyed like
    ``confirmation_work``'s entries.
    """
    out = []
    for c in plans:
        t, r = c.pair
        if c.third is None:
            out.append({"pair": c.pair, "third": None, "suspect": None, "kind": UNATTRIBUTABLE})
            continue
        third_res = results[(c.third, REPLAY, t)]
        recompute = results.get((t, RECOMPUTE, t))
        who, kind = classify(own[t], replays[r], third_res, recompute)
        suspect = {"target": t, "replayer": r, None: None}[who]
        out.append({"pair": c.pair, "third": c.third, "suspect": suspect, "kind": kind})
    return out


def software_problem(named: Sequence[int], n: int) -> bool:
    """True when more than half of the ranks would be named: blame the software, not the GPUs."""
    return len(set(named)) * 2 > n


def majority(values: Sequence[Hashable]) -> Hashable | None:
    """The value held by a strict majority (> n/2) of ``values``, or None."""
    if not values:
        return None
    value, count = Counter(values).most_common(1)[0]
    return value if count * 2 > len(values) else None


def divergent_ranks(
    per_rank: Sequence[Sequence[Hashable]],
) -> tuple[bool, list[int] | None, list[int]]:
    """Per-tensor strict-majority vote over ranks' per-tensor fingerprints.

    Returns (diverged, suspects, differing tensor indices). ``suspects`` is None when some
    differing tensor has no strict majority (e.g. 2 replicas, or a split): diverged, no suspect.
    """
    n = len(per_rank)
    if n == 0:
        return False, [], []
    width = len(per_rank[0])
    if any(len(row) != width for row in per_rank):
        raise ValueError("ranks hold different numbers of tensors")
    suspects: set[int] = set()
    differing = []
    no_majority = False
    for j in range(width):
        column = [per_rank[r][j] for r in range(n)]
        if all(v == column[0] for v in column):
            continue
        differing.append(j)
        winner = majority(column)
        if winner is None:
            no_majority = True
            continue
        suspects.update(r for r in range(n) if column[r] != winner)
    if not differing:
        return False, [], []
    return True, (None if no_majority else sorted(suspects)), differing
