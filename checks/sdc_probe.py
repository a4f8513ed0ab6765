"""sdc_probe: the node's small silent-data-corruption probe (SPEC-SDC.md "The node probe").

A faulty GPU can return a wrong, finite number and report nothing; only comparing computations
catches it. Every local device runs the same small fixed model (forward + backward,
deterministic kernels) on seeded micro-batches in its own worker subprocess
(``gpu_monitor.sdc.probe_worker``; CPU processes on the simulated node). Device ``gpu:i`` owns
micro-batch ``i``; each device computes its own micro-batch, every other device's (in ring
order, starting with the next one) and its own again, and reports the library's result row
(loss bits and gradient fingerprints) for each. The parent then judges, in this order:

1. **Determinism.** A device's two computations of its own micro-batch must be bit-identical.
   When at least half of the devices fail that, the platform is not bit-reproducible and
   nothing is compared: every device is ``unknown`` (``SdcProbeNondeterministic``). A minority
   that fails it is judged by the comparisons below and, if nothing names it, is ``unknown``
   with the same reason (possibly an intermittent fault; rerun).
2. **Ring replay** with the library's own decisions (``gpu_monitor.sdc.localize``, peer offset 1
   over the devices that returned a result, in index order): ``gpu:i`` replays the micro-batch
   of the next device; a device in two mismatched pairs is a culprit; every other mismatched
   pair is confirmed by the third device (the target's next) and the target's recomputation,
   giving the verdict kinds ``persistent`` / ``transient`` / ``unclear`` (the target is named),
   ``replayer computed wrong`` (the replayer is named) or ``unattributable`` (nobody is named).
   The confirmation's computations are already in every worker's table, so no second round of
   processes is needed.
3. **Per-micro-batch vote.** Every device computed every micro-batch, so a device that differs
   from a strict majority on any micro-batch (``localize.majority``) is named too (kind
   ``outvoted``): a data-dependent fault that the ring's pairs do not look at. When every
   micro-batch has a strict majority, a device the ring named whose every result agrees with
   it is cleared (two faulty devices at ring distance 2 make the one between them look bad).
4. **Stored reference** (``reference_path``, optional): the node's unanimous results per (GPU
   model, driver, torch/CUDA version, probe settings) are written to a JSON file the first time
   the probe passes, and compared on every later run: a device that is wrong in the same way
   on every run is caught even on a single-device node, and a node whose devices are all wrong
   the same way is caught too.

Results: a named device is ``failed`` ``SdcDetected`` (action ``replace``) with the verdict and
the pair evidence in details; a device that differs from the reference is ``failed``
``SdcReferenceMismatch`` (``replace`` when another device of the node matches the reference,
else ``none``: the node is cordoned and a person decides whether the node or the reference is
wrong). Two devices that disagree with no third device to decide (a node of 2) make the node
``failed`` ``SdcDetected`` (action ``none``: cordon, nobody is blamed) and both devices
``unknown`` ``SdcUnattributable``. A worker that hangs or crashes is ``unknown``
(``WorkerTimeout`` / ``WorkerCrashed``); the others are compared among themselves. A single
device can only be checked for determinism and against the reference; the node result says so.

Why: docs/checks-notes/sdc_probe.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from checks._gpus import active_gpus
from gpu_monitor.check import Check, Context
from gpu_monitor.hw.nvml import NvmlError
from gpu_monitor.model import NODE, Action, Kind, Result, Status, gpu_target, iso
from gpu_monitor.sdc import localize as loc
from gpu_monitor.workers.pool import WORKER_REASONS, DeviceRef, Outcome, Task, WorkerPool

log = logging.getLogger(__name__)

WORKER_FUNCTION = "gpu_monitor.sdc.probe_worker:probe_worker"
PEER_OFFSET = 1  # one device per "node" of the ring: the next device replays
#: Bump when the probe model, its inputs or the result row change: stored references of an
#: older version are then not compared (their key differs), and a new one is recorded.
PROBE_VERSION = 1
REFERENCE_SCHEMA = 1
REFERENCE_KIND = "SdcProbeReference"
OUTVOTED = "outvoted"
CULPRIT = "culprit"

Row = tuple[int, ...]

_PRIORITY = ("SdcDetected", "SdcReferenceMismatch", "WorkerDeviceMismatch", "WorkerCrashed",
             "WorkerTimeout", "SdcUnattributable", "SdcProbeNondeterministic",
             "SdcReferenceUnreadable")
_SEVERITY = {Status.FAILED: 3, Status.UNKNOWN: 2, Status.DEGRADED: 1, Status.OK: 0}


# --- judgement (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    status: Status
    reason: str
    message: str
    action: Action = Action.NONE
    evidence: Mapping[str, Any] = field(default_factory=dict)


def worst(findings: Sequence[Finding]) -> Finding | None:
    """The finding a target's one result shows (most serious, then most actionable)."""
    if not findings:
        return None
    return max(findings, key=lambda f: (_SEVERITY[f.status],
                                        -_PRIORITY.index(f.reason) if f.reason in _PRIORITY
                                        else -99))


@dataclass
class Judgement:
    """Findings per device index and for the node, the evidence, and (when every device
    agreed on everything) the rows a reference may be recorded from."""

    devices: dict[int, list[Finding]]
    node: list[Finding]
    evidence: dict[str, Any]
    agreed: dict[int, Row] | None = None
    peers: dict[int, list[int]] = field(default_factory=dict)  # devices with identical tables


def _t(i: int) -> str:
    return gpu_target(i)


def _names(indices: Sequence[int]) -> str:
    return ", ".join(_t(i) for i in indices)


def judge(ring: Sequence[int], runs: Mapping[int, Mapping[str, Any]],
          reference: Mapping[int, Row] | None = None) -> Judgement:
    """Judge the devices' result tables (``runs[i]``: ``rows`` owner -> row, ``again``).

    ``ring`` is every device that was asked to run (index order); ``runs`` holds those that
    returned a result. ``reference`` maps an owner's index to its stored row.
    """
    devs = [i for i in ring if i in runs]  # the devices compared, in ring order
    m = len(devs)
    rows = {d: {int(b): tuple(r) for b, r in runs[d]["rows"].items()} for d in devs}
    again = {d: tuple(runs[d]["again"]) for d in devs}
    j = Judgement({d: [] for d in devs}, [], {"compared": [_t(d) for d in devs]})
    if m == 0:
        return j

    # 1. Determinism.
    nondet = [d for d in devs if rows[d][d] != again[d]]
    j.evidence["nondeterministic"] = [_t(d) for d in nondet]
    if nondet and 2 * len(nondet) >= m:
        text = (f"{len(nondet)} of {m} devices computed the same micro-batch twice and got "
                "different bits: the platform is not bit-reproducible (non-deterministic "
                "kernels?), so no comparison can be trusted and none was made")
        j.node.append(Finding(Status.UNKNOWN, "SdcProbeNondeterministic", text))
        for d in devs:
            own = ("did not reproduce its own micro-batch" if d in nondet
                   else "reproduced its own micro-batch")
            j.devices[d].append(Finding(Status.UNKNOWN, "SdcProbeNondeterministic",
                                        f"{own}; not compared: {text}"))
        return j

    named: dict[int, list[dict[str, Any]]] = {}

    def name(d: int, evidence: dict[str, Any]) -> None:
        named.setdefault(d, []).append(evidence)

    # 2. The ring, with the library's decisions; positions 0..m-1 stand for devs.
    software = False
    unattributable: list[tuple[int, int]] = []
    if m >= 2:
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
        pair_names = [[_t(devs[t]), _t(devs[r])] for t, r in where.pairs]
        j.evidence.update({
            "mismatched_pairs": pair_names,
            "culprits": [_t(devs[c]) for c in where.culprits],
            "verdicts": [{"pair": [_t(devs[v["pair"][0]]), _t(devs[v["pair"][1]])],
                          "third": None if v["third"] is None else _t(devs[v["third"]]),
                          "suspect": None if v["suspect"] is None else _t(devs[v["suspect"]]),
                          "kind": v["kind"]} for v in verdicts],
        })
        if where.note:
            software = True
        for c in where.culprits:
            mine = [[_t(devs[t]), _t(devs[r])] for t, r in where.pairs if c in (t, r)]
            name(devs[c], {"kind": CULPRIT, "pairs": mine})
        for v in verdicts:
            t, r = v["pair"]
            third = None if v["third"] is None else _t(devs[v["third"]])
            if v["suspect"] is not None:
                name(devs[v["suspect"]], {"kind": v["kind"],
                                          "pairs": [[_t(devs[t]), _t(devs[r])]],
                                          "third": third})
            else:
                unattributable.append((devs[t], devs[r]))
        if unattributable:
            j.evidence["unattributable"] = [[_t(t), _t(r)] for t, r in unattributable]

    # 3. The per-micro-batch vote (every device computed every micro-batch).
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
        j.evidence["outvoted"] = {_t(d): [_t(b) for b in bs] for d, bs in outvoted.items()}
        if split:
            j.evidence["no_majority"] = [_t(b) for b in split]
    for d, bs in outvoted.items():
        if d not in named:
            name(d, {"kind": OUTVOTED, "micro_batches": [_t(b) for b in bs]})
    if m >= 3 and not split:
        # Every micro-batch has a strict-majority result: a device whose every result agrees
        # with it computed right, whatever the ring said (two faulty devices at ring distance 2
        # make the healthy one between them look like a culprit).
        cleared = sorted(d for d in named if d not in outvoted)
        for d in cleared:
            del named[d]
        if cleared:
            j.evidence["cleared_by_vote"] = [_t(d) for d in cleared]

    # 4. The stored reference: independent evidence, and it can attribute what the ring cannot.
    ref_wrong: list[int] = []
    if reference:
        ref_wrong = _compare_reference(j, devs, rows, reference, m)
    attributed = set(named) | (set(ref_wrong) if len(ref_wrong) < m else set())

    if software or loc.software_problem(list(named), m):
        text = (f"the {m} devices reproduce their own results but disagree with each other "
                "almost everywhere: the platform is not bit-reproducible across devices "
                "(mixed GPU models, drivers or settings?); no device is named")
        j.node.append(Finding(Status.UNKNOWN, "SdcProbeNondeterministic", text))
        for d in devs:
            j.devices[d].append(Finding(Status.UNKNOWN, "SdcProbeNondeterministic", text))
        named, unattributable, split = {}, [], []
    for d, items in named.items():
        j.devices[d].append(Finding(Status.FAILED, "SdcDetected", _sdc_message(items),
                                    Action.REPLACE, {"sdc": items}))
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
            f"{_t(a)} and {_t(b)} compute different results for {batches} and {third_text}: "
            "silent data corruption on one of them, unattributable",
            Action.NONE, {"pair": [_t(a), _t(b)]}))
        for p, other in ((a, b), (b, a)):
            j.devices[p].append(Finding(
                Status.UNKNOWN, "SdcUnattributable",
                f"disagrees with {_t(other)} on {batches} and {third_text}"))
    split = [b for b in split if b not in {t for t, _ in unattributable}]
    if split and not attributed:
        j.node.append(Finding(
            Status.FAILED, "SdcDetected",
            f"the devices disagree on {_batches(split)} and no result is held by a strict "
            "majority: silent data corruption, unattributable", Action.NONE,
            {"no_majority": [_t(b) for b in split]}))

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
        agreed: dict[int, Row] = {}
        for b in devs:
            values = {rows[d].get(b) for d in devs}
            if len(values) != 1 or None in values:
                break
            agreed[b] = values.pop()
        else:
            j.agreed = agreed
    return j


def _compare_reference(j: Judgement, devs: Sequence[int], rows: Mapping[int, Mapping[int, Row]],
                       reference: Mapping[int, Row], m: int) -> list[int]:
    """Each device's rows against the stored ones; the devices that differ (findings added)."""
    bad = {d: [b for b in sorted(rows[d]) if b in reference and rows[d][b] != reference[b]]
           for d in devs}
    compared = [d for d in devs if any(b in reference for b in rows[d])]
    wrong = [d for d in compared if bad[d]]
    right = [d for d in compared if d not in wrong]
    j.evidence["reference_mismatch"] = {_t(d): [_t(b) for b in bad[d]] for d in wrong}
    for d in wrong:
        n_ref = sum(b in reference for b in rows[d])
        if right:
            text = (f"differs from the stored reference on {len(bad[d])} of {n_ref} "
                    f"micro-batches, which {_names(right)} reproduce: wrong results")
            action = Action.REPLACE
        else:
            text = (f"differs from the stored reference on {len(bad[d])} of {n_ref} "
                    "micro-batches, as does every device of this node: either the node is "
                    "wrong everywhere or the reference does not fit this software stack")
            action = Action.NONE
        j.devices[d].append(Finding(Status.FAILED, "SdcReferenceMismatch", text, action,
                                    {"reference_mismatch": [_t(b) for b in bad[d]]}))
    if wrong and not right and m >= 2:
        j.node.append(Finding(
            Status.FAILED, "SdcReferenceMismatch",
            f"every device ({len(wrong)}) differs from the stored reference: a fault common "
            "to the whole node, or a reference that does not fit this software stack (delete "
            "its entry to record a new one)"))
    return wrong


def _batches(owners: Sequence[int]) -> str:
    if len(owners) == 1:
        return f"{_t(owners[0])}'s micro-batch"
    return f"the micro-batches of {_names(owners)}"


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


# --- the stored reference ------------------------------------------------------------------------


class ReferenceUnreadable(Exception):
    pass


def reference_key(gpu_name: str, driver: str, torch_version: str, cuda: str | None,
                  dtype: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a stored reference is valid for: GPU model, driver, software and probe settings."""
    return {"gpu_name": gpu_name, "driver_version": driver, "torch": torch_version,
            "cuda": cuda, "dtype": dtype, "probe_version": PROBE_VERSION,
            "seed": int(settings["seed"]), "batch_size": int(settings["batch_size"]),
            "hidden_size": int(settings["hidden_size"]), "layers": int(settings["layers"])}


def read_reference(path: str) -> dict[str, Any]:
    """The reference document at ``path``; an empty one when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return {"schema": REFERENCE_SCHEMA, "kind": REFERENCE_KIND, "entries": []}
    except (OSError, ValueError) as exc:
        raise ReferenceUnreadable(f"{path}: {exc}") from exc
    if (not isinstance(doc, dict) or doc.get("kind") != REFERENCE_KIND
            or not isinstance(doc.get("entries"), list)):
        raise ReferenceUnreadable(f"{path}: not an {REFERENCE_KIND} document")
    if doc.get("schema") != REFERENCE_SCHEMA:
        raise ReferenceUnreadable(f"{path}: schema {doc.get('schema')!r}, this version reads "
                                  f"{REFERENCE_SCHEMA}")
    return doc


def find_reference(doc: Mapping[str, Any], key: Mapping[str, Any]) -> dict[int, Row] | None:
    for entry in doc.get("entries", []):
        if isinstance(entry, dict) and entry.get("key") == dict(key):
            try:
                return {int(b): tuple(int(v) for v in row) for b, row in entry["rows"].items()}
            except (KeyError, TypeError, ValueError, AttributeError):
                return None
    return None


def write_reference(path: str, doc: Mapping[str, Any], key: Mapping[str, Any],
                    rows: Mapping[int, Row], recorded_at: str, node: str) -> None:
    """Add an entry for ``key`` to ``doc`` and write the file atomically (temp + rename)."""
    entries = [e for e in doc.get("entries", []) if not (isinstance(e, dict)
                                                          and e.get("key") == dict(key))]
    entries.append({"key": dict(key), "rows": {str(b): list(r) for b, r in sorted(rows.items())},
                    "recorded_at": recorded_at, "node": node, "devices": len(rows)})
    out = {"schema": REFERENCE_SCHEMA, "kind": REFERENCE_KIND, "entries": entries}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".sdc-reference-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- the check ---------------------------------------------------------------------------------


class SdcProbe(Check):
    name = "sdc_probe"
    kinds = frozenset({Kind.BOOTSTRAP, Kind.PERIODIC})
    summary = ("each device computes and replays seeded micro-batches of a small model "
               "(deterministic forward + backward); ring replay, confirmation and a "
               "per-micro-batch vote name a device that computes wrong; optional stored "
               "reference per GPU model, driver and torch")
    requires = frozenset({"gpu", "torch"})
    invasive = True
    timeout = 300.0
    reasons = ("SdcDetected", "SdcReferenceMismatch", "SdcUnattributable",
               "SdcProbeNondeterministic", "SdcReferenceUnreadable", "DeviceUnavailable",
               "NvmlReadError", *WORKER_REASONS)

    def run(self, ctx: Context) -> Sequence[Result]:
        results, usable = active_gpus(self, ctx, "left out of the SDC probe")
        if usable is None:
            return results
        if not usable:
            return results
        s = _settings(ctx)
        refs = [DeviceRef(g.index, g.uuid) for g in usable]
        ring = [r.index for r in refs]
        args = {"batches": ring, "seed": s["seed"], "batch_size": s["batch_size"],
                "hidden_size": s["hidden_size"], "layers": s["layers"]}
        pool = WorkerPool(ctx.host.worker)
        budget = float(s["timeout_s"]) - min(5.0, 0.05 * float(s["timeout_s"]))
        started = time.monotonic()
        outcomes = pool.run([Task(WORKER_FUNCTION, (r,), {**args, "own": r.index})
                             for r in refs], timeout_s=120.0, budget_s=budget, rounds=1)
        wall = time.monotonic() - started
        outcomes = [_validated(o, ring) for o in outcomes]
        runs = {o.task.devices[0].index: o.value for o in outcomes if o.ok and o.value}

        reference, ref_state, doc, key = self._reference(ctx, s, usable, runs)
        j = judge(ring, runs, reference)
        first = next(iter(runs.values()), {})
        node_details: dict[str, Any] = {
            "devices": len(ring), "compared": j.evidence.get("compared", []),
            "ring": {_t(ring[p]): _t(ring[(p + PEER_OFFSET) % len(ring)])
                     for p in range(len(ring))} if len(ring) > 1 else {},
            "model": {k: s[k] for k in ("seed", "batch_size", "hidden_size", "layers")},
            "dtype": first.get("dtype"), "torch": first.get("torch"),
            "evidence": {k: v for k, v in j.evidence.items() if k != "compared"},
            "wall_s": round(wall, 3),
            "compute_s": {_t(i): round(float(v.get("compute_s", 0.0)), 4)
                          for i, v in sorted(runs.items())},
        }
        if ref_state.get("state") == "unreadable":
            j.node.append(Finding(Status.UNKNOWN, "SdcReferenceUnreadable",
                                  f"cannot read the stored reference: {ref_state['error']}"))
        if key is not None and reference is None and doc is not None:
            if j.agreed is not None and len(j.agreed) == len(ring):
                try:
                    write_reference(s["reference_path"], doc, key, j.agreed,
                                    iso(ctx.clock.now()), ctx.node)
                    ref_state["state"] = "recorded"
                except OSError as exc:
                    log.warning("sdc_probe: cannot write the reference %s: %s",
                                s["reference_path"], exc)
                    ref_state.update(state="not recorded", error=str(exc))
            else:
                ref_state["state"] = "not recorded: the devices did not all agree"
        elif reference is not None:
            ref_state["state"] = ("mismatched" if j.evidence.get("reference_mismatch")
                                  else "matched")
        node_details["reference"] = ref_state

        for o in outcomes:
            ref = o.task.devices[0]
            results.append(self._device_result(ctx, ref, o, j, len(runs), ref_state))
        results.append(self._node_result(ctx, j, node_details, len(runs), len(ring)))
        return results

    # -- reference ---------------------------------------------------------------------------

    def _reference(self, ctx: Context, s: Mapping[str, Any], usable: Sequence[Any],
                   runs: Mapping[int, Mapping[str, Any]]
                   ) -> tuple[dict[int, Row] | None, dict[str, Any], dict | None, dict | None]:
        """(stored rows for this key or None, state for details, the document, the key)."""
        path = s["reference_path"]
        if not path:
            return None, {"state": "not configured"}, None, None
        state: dict[str, Any] = {"path": path}
        names = {g.name for g in usable}
        first = next(iter(runs.values()), None)
        if len(names) != 1 or None in names:
            state["state"] = ("not used: the devices report different models "
                              f"{sorted(map(str, names))}")
            return None, state, None, None
        if first is None:
            state["state"] = "not used: no device returned a result"
            return None, state, None, None
        try:
            driver = ctx.host.nvml.system().driver_version
        except NvmlError as err:
            state["state"] = f"not used: cannot read the driver version ({err})"
            return None, state, None, None
        key = reference_key(next(iter(names)), driver, str(first.get("torch")),
                            first.get("cuda"), str(first.get("dtype")), s)
        state["key"] = key
        try:
            doc = read_reference(path)
        except ReferenceUnreadable as exc:
            state.update(state="unreadable", error=str(exc))
            return None, state, None, None
        rows = find_reference(doc, key)
        if rows is None:
            state["state"] = "no entry for this key"
        return rows, state, doc, key

    # -- results ------------------------------------------------------------------------------

    def _device_result(self, ctx: Context, ref: DeviceRef, outcome: Outcome, j: Judgement,
                       compared: int, ref_state: Mapping[str, Any]) -> Result:
        target = ref.target
        details: dict[str, Any] = {"uuid": ref.uuid}
        if not outcome.ok:
            details.update(outcome.details)
            return self.result(ctx, Status.UNKNOWN, target, outcome.reason,
                               f"{target}: {outcome.message}", details)
        value = outcome.value or {}
        details["own_result"] = value["rows"][str(ref.index)]
        details["reproduced"] = value["again"] == value["rows"][str(ref.index)]
        findings = j.devices.get(ref.index, [])
        top = worst(findings)
        if top is None:
            peers = j.peers.get(ref.index, [])
            details["agrees_with"] = [_t(p) for p in peers]
            text = f"{target}: reproduces its own micro-batch bit for bit"
            if compared >= 2:
                text += (f"; agrees with {len(peers)} of the other {compared - 1} devices on "
                         f"all {compared} micro-batches")
            else:
                text += "; no other device to compare with"
            if ref_state.get("state") == "matched":
                text += "; matches the stored reference"
            elif compared < 2:
                text += " and no stored reference"
            return self.ok(ctx, target, text, details)
        details.update(top.evidence)
        if len(findings) > 1:
            details["findings"] = [{"status": f.status.value, "reason": f.reason,
                                    "message": f.message} for f in findings]
        return self.result(ctx, top.status, target, top.reason, f"{target}: {top.message}",
                           details, top.action)

    def _node_result(self, ctx: Context, j: Judgement, details: dict[str, Any], compared: int,
                     total: int) -> Result:
        if compared < 2:
            details["note"] = ("a single device can only be checked for determinism and "
                               "against the stored reference; there is no device to replay "
                               "its work")
        top = worst(j.node)
        if top is not None:
            if len(j.node) > 1:
                details["findings"] = [{"status": f.status.value, "reason": f.reason,
                                        "message": f.message} for f in j.node]
            return self.result(ctx, top.status, NODE, top.reason, top.message,
                               {**details, **top.evidence}, top.action)
        flagged = sorted(i for i, fs in j.devices.items() if fs)
        tail = f"; findings on {_names(flagged)}" if flagged else "; no findings"
        return self.ok(ctx, NODE, f"{compared}/{total} devices probed, reference "
                                  f"{details['reference'].get('state')}{tail}", details)


def _validated(o: Outcome, ring: Sequence[int]) -> Outcome:
    """An outcome whose value lacks a row the judgement needs counts as a crashed worker."""
    if not o.ok:
        return o
    value = o.value or {}
    rows = value.get("rows")
    want = {str(b) for b in ring}
    if (isinstance(rows, dict) and want <= set(rows) and isinstance(value.get("again"), list)
            and all(isinstance(rows[b], list) and len(rows[b]) == 6 for b in want)):
        return o
    return dataclasses.replace(o, value=None, cause="bad-result",
                               message=f"worker for {o.task.name} returned an incomplete result")


def _settings(ctx: Context) -> dict[str, Any]:
    def get(key: str, default: Any) -> Any:
        return ctx.setting("sdc_probe", key, default)

    return {
        "seed": int(get("seed", 1234)),
        "batch_size": int(get("batch_size", 32)),
        "hidden_size": int(get("hidden_size", 1024)),
        "layers": int(get("layers", 4)),
        "reference_path": get("reference_path", None) or None,
        "timeout_s": float(get("timeout_s", SdcProbe.timeout) or SdcProbe.timeout),
    }
