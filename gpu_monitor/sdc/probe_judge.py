"""The node SDC probe's judgement: from every device's result rows to named devices (pure).

Why apart from the check: it is the probe's whole decision (determinism, ring replay with the
library's localize/confirm, the per-micro-batch vote, the stored reference comparison) and
needs neither torch nor NVML, so it is tested with tables of rows; ``checks/sdc_probe.py``
only runs the workers and turns a ``Judgement`` into results. The order and the rules are
described there and in docs/checks-notes/sdc_probe.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.check import Finding
from gpu_monitor.check import worst as worst_of
from gpu_monitor.model import Action, Status, gpu_target
from gpu_monitor.sdc import localize as loc

PEER_OFFSET = 1  # one device per "node" of the ring: the next device replays
OUTVOTED = "outvoted"
CULPRIT = "culprit"

Row = tuple[int, ...]

_PRIORITY = ("SdcDetected", "SdcReferenceMismatch", "WorkerDeviceMismatch", "WorkerCrashed",
             "WorkerTimeout", "SdcUnattributable", "SdcProbeNondeterministic",
             "SdcReferenceUnreadable")


def worst(findings: Sequence[Finding]) -> Finding | None:
    """The finding a target's one result shows (most serious, then the probe's priority)."""
    return worst_of(findings, _PRIORITY)


@dataclass
class Judgement:
    """Findings per device index and for the node, the evidence, and (when every device
    agreed on everything) the rows a reference may be recorded from."""

    devices: dict[int, list[Finding]]
    node: list[Finding]
    evidence: dict[str, Any]
    agreed: dict[int, Row] | None = None
    peers: dict[int, list[int]] = field(default_factory=dict)  # devices with identical tables


def device(i: int) -> str:
    return gpu_target(i)


def device_names(indices: Sequence[int]) -> str:
    return ", ".join(device(i) for i in indices)


def judge(ring: Sequence[int], runs: Mapping[int, Mapping[str, Any]],
          reference: Mapping[int, Row] | None = None) -> Judgement:
    """Judge the devices' result tables (``runs[i]``: ``rows`` owner -> row, ``again``).

    ``ring`` is every device that was asked to run (index order); ``runs`` holds those that
    returned a result. ``reference`` maps an owner's index to its stored row. The steps, in
    order: determinism, the ring, the per-micro-batch vote, the stored reference, then the
    findings they add up to.
    """
    devs = [i for i in ring if i in runs]  # the devices compared, in ring order
    m = len(devs)
    rows = {d: {int(b): tuple(r) for b, r in runs[d]["rows"].items()} for d in devs}
    again = {d: tuple(runs[d]["again"]) for d in devs}
    j = Judgement({d: [] for d in devs}, [], {"compared": [device(d) for d in devs]})
    if m == 0:
        return j

    # 1. Determinism.
    nondet = [d for d in devs if rows[d][d] != again[d]]
    j.evidence["nondeterministic"] = [device(d) for d in nondet]
    if nondet and 2 * len(nondet) >= m:
        _not_reproducible(j, devs, nondet)
        return j

    # 2. The ring; 3. the vote; 4. the stored reference: independent evidence, and it can
    # attribute what the ring cannot.
    named: dict[int, list[dict[str, Any]]] = {}
    software, unattributable = _ring(j, devs, rows, again, named)
    split = _vote(j, devs, rows, named)
    ref_wrong: list[int] = []
    if reference:
        ref_wrong = _compare_reference(j, devs, rows, reference, m)
    attributed = set(named) | (set(ref_wrong) if len(ref_wrong) < m else set())

    if software or loc.software_problem(list(named), m):
        _inconsistent_platform(j, devs)
        named, unattributable, split = {}, [], []
    for d, items in named.items():
        j.devices[d].append(Finding(Status.FAILED, "SdcDetected", _sdc_message(items),
                                    Action.REPLACE, {"sdc": items}))
    _unattributed(j, unattributable, split, attributed, m)

    # Minority non-determinism that nothing else explains.
    for d in nondet:
        if not any(f.status is Status.FAILED for f in j.devices[d]):
            j.devices[d].append(Finding(
                Status.UNKNOWN, "SdcProbeNondeterministic",
                f"computed its own micro-batch twice and got different bits, while the other "
                f"{m - len(nondet)} devices reproduced theirs: possibly an intermittent "
                "fault; rerun the probe"))

    j.peers = {d: [e for e in devs if e != d and rows[e] == rows[d]] for d in devs}
    if not j.node and not any(j.devices.values()):
        j.agreed = _agreed_rows(devs, rows)
    return j


def _not_reproducible(j: Judgement, devs: Sequence[int], nondet: Sequence[int]) -> None:
    """At least half the devices did not reproduce their own micro-batch: nothing compared."""
    text = (f"{len(nondet)} of {len(devs)} devices computed the same micro-batch twice and got "
            "different bits: the platform is not bit-reproducible (non-deterministic "
            "kernels?), so no comparison can be trusted and none was made")

    def own(d: int) -> str:
        did = ("did not reproduce its own micro-batch" if d in nondet
               else "reproduced its own micro-batch")
        return f"{did}; not compared: {text}"

    _not_comparable(j, devs, text, own)


def _inconsistent_platform(j: Judgement, devs: Sequence[int]) -> None:
    """Each device reproduces itself but they disagree almost everywhere: nobody is named."""
    text = (f"the {len(devs)} devices reproduce their own results but disagree with each other "
            "almost everywhere: the platform is not bit-reproducible across devices "
            "(mixed GPU models, drivers or settings?); no device is named")
    _not_comparable(j, devs, text, lambda d: text)


def _not_comparable(j: Judgement, devs: Sequence[int], text: str,
                    per_device: Callable[[int], str]) -> None:
    """The platform's results cannot be compared: unknown on the node and on every device."""
    j.node.append(Finding(Status.UNKNOWN, "SdcProbeNondeterministic", text))
    for d in devs:
        j.devices[d].append(Finding(Status.UNKNOWN, "SdcProbeNondeterministic", per_device(d)))


def _name(named: dict[int, list[dict[str, Any]]], d: int, evidence: dict[str, Any]) -> None:
    named.setdefault(d, []).append(evidence)


def _ring(j: Judgement, devs: Sequence[int], rows: Mapping[int, Mapping[int, Row]],
          again: Mapping[int, Row], named: dict[int, list[dict[str, Any]]]
          ) -> tuple[bool, list[tuple[int, int]]]:
    """The ring, with the library's decisions (positions 0..m-1 stand for ``devs``): names
    culprits and confirmed suspects in ``named``; returns whether the library saw a software
    problem, and the mismatched (target, replayer) pairs no third device could attribute."""
    m = len(devs)
    software = False
    unattributable: list[tuple[int, int]] = []
    if m < 2:
        return software, unattributable
    own = [rows[d][d] for d in devs]
    replays = [rows[devs[p]][devs[(p + PEER_OFFSET) % m]] for p in range(m)]
    pairs = loc.mismatched_pairs(own, replays, PEER_OFFSET)
    where = loc.localize(pairs, m, PEER_OFFSET)
    plans = loc.plan_confirmations(where.ambiguous, m, PEER_OFFSET)
    results: dict[tuple[int, str, int], Row] = {}
    for p in range(m):
        for kind, t in loc.confirmation_work(plans, p):
            mine = again[devs[t]] if kind == loc.RECOMPUTE else rows[devs[p]][devs[t]]
            results[(p, kind, t)] = mine
    verdicts = loc.verdicts(plans, own, replays, results, m, PEER_OFFSET)
    pair_names = [[device(devs[t]), device(devs[r])] for t, r in where.pairs]
    j.evidence.update({
        "mismatched_pairs": pair_names,
        "culprits": [device(devs[c]) for c in where.culprits],
        "verdicts": [{"pair": [device(devs[v["pair"][0]]), device(devs[v["pair"][1]])],
                      "third": None if v["third"] is None else device(devs[v["third"]]),
                      "suspect": None if v["suspect"] is None else device(devs[v["suspect"]]),
                      "kind": v["kind"]} for v in verdicts],
    })
    if where.note:
        software = True
    for c in where.culprits:
        mine = [[device(devs[t]), device(devs[r])] for t, r in where.pairs if c in (t, r)]
        _name(named, devs[c], {"kind": CULPRIT, "pairs": mine})
    for v in verdicts:
        t, r = v["pair"]
        third = None if v["third"] is None else device(devs[v["third"]])
        if v["suspect"] is not None:
            _name(named, devs[v["suspect"]], {"kind": v["kind"],
                                              "pairs": [[device(devs[t]), device(devs[r])]],
                                              "third": third})
        else:
            unattributable.append((devs[t], devs[r]))
    if unattributable:
        j.evidence["unattributable"] = [[device(t), device(r)] for t, r in unattributable]
    return software, unattributable


def _vote(j: Judgement, devs: Sequence[int], rows: Mapping[int, Mapping[int, Row]],
          named: dict[int, list[dict[str, Any]]]) -> list[int]:
    """The per-micro-batch vote (every device computed every micro-batch): names the devices
    outvoted, clears those the vote shows right; returns the micro-batches without a strict
    majority."""
    m = len(devs)
    outvoted: dict[int, list[int]] = {}
    split: list[int] = []
    if m >= 3:
        for b in devs:
            column = [rows[d].get(b) for d in devs]
            winner = loc.majority(column)
            if winner is None:
                if len(set(column)) > 1:
                    split.append(b)
                continue
            for d, value in zip(devs, column, strict=True):
                if value != winner:
                    outvoted.setdefault(d, []).append(b)
        j.evidence["outvoted"] = {device(d): [device(b) for b in bs] for d, bs in outvoted.items()}
        if split:
            j.evidence["no_majority"] = [device(b) for b in split]
    for d, bs in outvoted.items():
        if d not in named:
            _name(named, d, {"kind": OUTVOTED, "micro_batches": [device(b) for b in bs]})
    if m >= 3 and not split:
        # Every micro-batch has a strict-majority result: a device whose every result agrees
        # with it computed right, whatever the ring said (two faulty devices at ring distance 2
        # make the healthy one between them look like a culprit).
        cleared = sorted(d for d in named if d not in outvoted)
        for d in cleared:
            del named[d]
        if cleared:
            j.evidence["cleared_by_vote"] = [device(d) for d in cleared]
    return split


def _unattributed(j: Judgement, unattributable: Sequence[tuple[int, int]], split: Sequence[int],
                  attributed: set[int], m: int) -> None:
    """Disagreements no evidence attributes: a node finding per pair (unknown on both of its
    devices), and one for micro-batches without a majority; none where other evidence already
    names a device."""
    groups: dict[tuple[int, int], list[int]] = {}
    for t, r in unattributable:
        groups.setdefault((min(t, r), max(t, r)), []).append(t)
    for (a, b), targets in groups.items():
        if a in attributed or b in attributed:
            continue  # other evidence says which one is wrong
        third_text = ("there is no third device to say which is right" if m == 2
                      else "the third device agrees with neither")
        batches = _batches(sorted(set(targets)))
        j.node.append(Finding(
            Status.FAILED, "SdcDetected",
            f"{device(a)} and {device(b)} compute different results for {batches} and {third_text}: "
            "silent data corruption on one of them, unattributable",
            Action.NONE, {"pair": [device(a), device(b)]}))
        for p, other in ((a, b), (b, a)):
            j.devices[p].append(Finding(
                Status.UNKNOWN, "SdcUnattributable",
                f"disagrees with {device(other)} on {batches} and {third_text}"))
    split = [b for b in split if b not in {t for t, _ in unattributable}]
    if split and not attributed:
        j.node.append(Finding(
            Status.FAILED, "SdcDetected",
            f"the devices disagree on {_batches(split)} and no result is held by a strict "
            "majority: silent data corruption, unattributable", Action.NONE,
            {"no_majority": [device(b) for b in split]}))


def _agreed_rows(devs: Sequence[int], rows: Mapping[int, Mapping[int, Row]]
                 ) -> dict[int, Row] | None:
    """Every owner's row, when every device computed the same one for every owner."""
    agreed: dict[int, Row] = {}
    for b in devs:
        values = {rows[d].get(b) for d in devs}
        if len(values) != 1 or None in values:
            return None
        agreed[b] = values.pop()
    return agreed


def _compare_reference(j: Judgement, devs: Sequence[int], rows: Mapping[int, Mapping[int, Row]],
                       reference: Mapping[int, Row], m: int) -> list[int]:
    """Each device's rows against the stored ones; the devices that differ (findings added)."""
    bad = {d: [b for b in sorted(rows[d]) if b in reference and rows[d][b] != reference[b]]
           for d in devs}
    compared = [d for d in devs if any(b in reference for b in rows[d])]
    wrong = [d for d in compared if bad[d]]
    right = [d for d in compared if d not in wrong]
    j.evidence["reference_mismatch"] = {device(d): [device(b) for b in bad[d]] for d in wrong}
    for d in wrong:
        n_ref = sum(b in reference for b in rows[d])
        if right:
            text = (f"differs from the stored reference on {len(bad[d])} of {n_ref} "
                    f"micro-batches, which {device_names(right)} reproduce: wrong results")
            action = Action.REPLACE
        else:
            text = (f"differs from the stored reference on {len(bad[d])} of {n_ref} "
                    "micro-batches, as does every device of this node: either the node is "
                    "wrong everywhere or the reference does not fit this software stack")
            action = Action.NONE
        j.devices[d].append(Finding(Status.FAILED, "SdcReferenceMismatch", text, action,
                                    {"reference_mismatch": [device(b) for b in bad[d]]}))
    if wrong and not right and m >= 2:
        j.node.append(Finding(
            Status.FAILED, "SdcReferenceMismatch",
            f"every device ({len(wrong)}) differs from the stored reference: a fault common "
            "to the whole node, or a reference that does not fit this software stack (delete "
            "its entry to record a new one)"))
    return wrong


def _batches(owners: Sequence[int]) -> str:
    if len(owners) == 1:
        return f"{device(owners[0])}'s micro-batch"
    return f"the micro-batches of {device_names(owners)}"


def _sdc_message(items: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for e in items:
        kind = e["kind"]
        if kind == CULPRIT:
            pairs = "; ".join(f"{t}'s own result differs from {r}'s replay of it"
                              for t, r in e["pairs"])
            parts.append(f"in two mismatched pairs ({pairs})")
        elif kind == OUTVOTED:
            owners = e["micro_batches"]
            what = (f"{owners[0]}'s micro-batch" if len(owners) == 1
                    else f"the micro-batches of {', '.join(owners)}")
            parts.append(f"outvoted by the other devices on {what}")
        elif kind == loc.REPLAYER_WRONG:
            t, r = e["pairs"][0]
            parts.append(f"its replay of {t}'s micro-batch was wrong ({e['third']} confirms "
                         f"{t}'s own result)")
        else:
            t, r = e["pairs"][0]
            parts.append(f"{kind}: its own micro-batch disagreed with {r}'s replay and "
                         f"{e['third']} sides with {r}")
    return "silent data corruption: " + "; ".join(parts)


