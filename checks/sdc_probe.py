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

The judgement is pure and lives in ``gpu_monitor.sdc.probe_judge``, the reference file in
``gpu_monitor.sdc.probe_reference``; this module runs the workers and words the results.

Why: docs/checks-notes/sdc_probe.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from checks._device import DEVICE_REASONS, DeviceCheck
from checks._gpus import active_gpus, worker_budget
from gpu_monitor.check import Context, Finding, Setting
from gpu_monitor.hw.nvml import NvmlError
from gpu_monitor.model import NODE, Kind, Result, Status, iso
from gpu_monitor.profiles.schema import COUNT, POSITIVE_INT, Nullable, Str
from gpu_monitor.sdc.probe_judge import (
    PEER_OFFSET,
    Judgement,
    Row,
    device,
    device_names,
    judge,
    worst,
)
from gpu_monitor.sdc.probe_reference import (
    ReferenceUnreadable,
    find_reference,
    read_reference,
    reference_key,
    write_reference,
)
from gpu_monitor.workers.pool import DeviceRef, Outcome, Task, WorkerPool

log = logging.getLogger(__name__)

WORKER_FUNCTION = "gpu_monitor.sdc.probe_worker:probe_worker"


# --- the check ---------------------------------------------------------------------------------


class SdcProbe(DeviceCheck):
    kinds = frozenset({Kind.BOOTSTRAP, Kind.PERIODIC})
    summary = ("each device computes and replays seeded micro-batches of a small model "
               "(deterministic forward + backward); ring replay, confirmation and a "
               "per-micro-batch vote name a device that computes wrong; optional stored "
               "reference per GPU model, driver and torch")
    timeout = 300.0
    reasons = ("SdcDetected", "SdcReferenceMismatch", "SdcUnattributable",
               "SdcProbeNondeterministic", "SdcReferenceUnreadable", *DEVICE_REASONS)
    settings = {
        "seed": Setting(COUNT, 1234, "seed of the deterministic micro-batches", "project"),
        "batch_size": Setting(POSITIVE_INT, 32, "samples per micro-batch", "project"),
        "hidden_size": Setting(POSITIVE_INT, 1024, "features", "project"),
        "layers": Setting(POSITIVE_INT, 4, "layers", "project"),
        "reference_path": Setting(Nullable(Str(what="a file path")), None,
                                  "file path of a stored reference (unset: none)",
                                  "SPEC-SDC (reference per GPU model, driver, torch)"),
    }

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
        budget = worker_budget(self, ctx)
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
            "ring": {device(ring[p]): device(ring[(p + PEER_OFFSET) % len(ring)])
                     for p in range(len(ring))} if len(ring) > 1 else {},
            "model": {k: s[k] for k in ("seed", "batch_size", "hidden_size", "layers")},
            "dtype": first.get("dtype"), "torch": first.get("torch"),
            "evidence": {k: v for k, v in j.evidence.items() if k != "compared"},
            "wall_s": round(wall, 3),
            "compute_s": {device(i): round(float(v.get("compute_s", 0.0)), 4)
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
            details["agrees_with"] = [device(p) for p in peers]
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
        tail = f"; findings on {device_names(flagged)}" if flagged else "; no findings"
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
    def get(key: str, default: Any = None) -> Any:
        return ctx.setting("sdc_probe", key, default)

    return {
        "seed": int(get("seed")),
        "batch_size": int(get("batch_size")),
        "hidden_size": int(get("hidden_size")),
        "layers": int(get("layers")),
        "reference_path": get("reference_path") or None,
    }
