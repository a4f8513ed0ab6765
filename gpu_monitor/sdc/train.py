"""The checked training loop: SPEC-SDC.md's checks 0-4, in that order, around each DDP step.

Why one function owns the loop: the checks only mean something in a fixed order (audit decided
before the forward; local gradients seen before the all-reduce; the ring audit after backward
and before ``optimizer.step()`` while replicas still hold identical weights; the weight vote
after the update; checkpoints only from steps with no alarm). A training script hands over its
pieces (model, optimizer, batches, loss, batch rebuilder, checkpoint writer) and gets back either
None (the batches ran out) or the first alarm.

Guarantees:

1. Every decision that leads to a collective is taken from data every rank has (gathered
   tables, the step number), so every rank reaches every collective of an alarm path; an error
   inside a replay on one rank is shared through the same gather and raised on all ranks.
2. A step that raises a compute or reduced-gradient alarm is not applied: gradients are zeroed
   and ``optimizer.step()`` is not called. A weights alarm blocks the checkpoint.
3. ``save_checkpoint`` is called only on checkpoint steps with no alarm, with the last passing
   audit and weight-check steps as tags.
4. When ``train`` returns (no alarm, or an alarm), every collective it started has completed
   on every rank: the hook's norm all-gather is waited for (``GradStats.settle``) and one last
   synchronous 1-element all-reduce lets no rank return while another is still inside one of
   ``train``'s collectives. A script that exits right after an alarm leaves nothing in flight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from gpu_monitor.sdc import _dist
from gpu_monitor.sdc.hooks import GradStats
from gpu_monitor.sdc.localize import (
    RECOMPUTE,
    SOFTWARE_NOTE,
    UNATTRIBUTABLE,
    confirmation_work,
    localize,
    mismatched_pairs,
    plan_confirmations,
    software_problem,
    target_of,
    verdicts,
)
from gpu_monitor.sdc.replay import ROW, accumulate, deterministic_mode, replay, result_row
from gpu_monitor.sdc.schedule import Schedule
from gpu_monitor.sdc.topology import ring_layout
from gpu_monitor.sdc.weights import find_divergent_ranks

__all__ = ["clip_averaged", "train"]

COMPUTE = "compute"
REDUCED = "reduced gradient"
WEIGHTS = "weights"

_REPRODUCED_NOTE = (
    "the replays reproduce the non-finite result: the data or the model produce it, "
    "not a faulty GPU"
)


_NO_THIRD_NOTE = (
    "no rank outside a mismatched pair can confirm it (a world of 2, or every other rank on the "
    "target's node): those pairs are unattributable"
)


_SINGLE_NODE_NOTE = (
    "the group is on one node: replays and confirmations ran on other GPUs of the same node, "
    "so the confirmation is not independent across nodes (a node-wide fault would agree with "
    "itself)"
)


class ReplayFailed(RuntimeError):
    """A replay raised on some rank; raised on every rank so none waits in a collective."""


class _Loop:
    def __init__(self, ddp_model, stats, optimizer, compute_loss, rebuild_batch, save_checkpoint,
                 sched, start_step, scaler, micro_steps=1, on_step=None) -> None:
        self.ddp = ddp_model
        self.module = ddp_model.module
        self.stats = stats
        self.opt = optimizer
        self.compute_loss = compute_loss
        self.rebuild_batch = rebuild_batch
        self.save_checkpoint = save_checkpoint
        self.sched = sched
        self.start_step = start_step
        self.scaler = scaler
        self.micro_steps = micro_steps
        self.on_step = on_step
        self.g: _dist.Group = stats.group
        self.nodes: list[str] = []
        self.off = sched.peer_offset  # the ring offset (ring_layout may change it on one node)
        self.single_node = False
        self.last_audit_pass: int | None = None
        self.last_weight_check_pass: int | None = None

    # -- helpers ---------------------------------------------------------------------------

    def _scale(self):
        return self.scaler.scale if self.scaler is not None else None

    def _replay(self, batch, det: bool):
        return replay(
            self.module,
            self.compute_loss,
            batch,
            params=self.stats.params,
            with_grads=det,
            grad_rows=self.stats.seen,
            scale=self._scale(),
            micro_steps=self.micro_steps,
        )

    def _gather_rows(self, rows, error: BaseException | None):
        """All-gather [k, ROW] result rows plus an error flag; raise everywhere if any failed."""
        import torch

        flag = torch.full((rows.shape[0], 1), 1 if error else 0, dtype=torch.int64)
        table = _dist.all_gather(self.g, torch.cat([rows.to(flag.device), flag], 1))
        failed = sorted({r for r in range(self.g.size) if bool(table[r, :, ROW].any())})
        if failed:
            who = self.g.to_global(failed)
            if error is not None:
                raise ReplayFailed(f"SDC replay failed on ranks {who}: {error!r}") from error
            raise ReplayFailed(f"SDC replay failed on ranks {who} (see their logs)")
        return table[:, :, :ROW].cpu()

    def _rows(self, table, i):
        return [tuple(table[r, i].tolist()) for r in range(self.g.size)]

    def _alarm(self, step: int, check: str, first: int, *, applied: bool, nonfinite=(),
               pairs=(), culprits=(), verdict_rows=(), suspects=None, note=None, audit=None,
               tensors=None) -> dict:
        glob = self.g.to_global
        gr = self.g.global_ranks
        vs = [
            {
                "pair": (gr[v["pair"][0]], gr[v["pair"][1]]),
                "third": None if v["third"] is None else gr[v["third"]],
                "suspect": None if v["suspect"] is None else gr[v["suspect"]],
                "kind": v["kind"],
            }
            for v in verdict_rows
        ]
        named = set(glob(nonfinite)) | set(glob(culprits)) | {v["suspect"] for v in vs}
        named |= set(suspects or [])
        named.discard(None)
        if self.single_node and check == COMPUTE and (pairs or verdict_rows):
            note = f"{note}; {_SINGLE_NODE_NOTE}" if note else _SINGLE_NODE_NOTE
        alarm = {
            "step": step,
            "check": check,
            "nonfinite": glob(nonfinite),
            "mismatched_pairs": [(gr[t], gr[r]) for t, r in pairs],
            "culprits": glob(culprits),
            "verdicts": vs,
            "suspects": suspects,
            "suspect_window": [first, step],
            "last_audit_pass": self.last_audit_pass,
            "last_weight_check_pass": self.last_weight_check_pass,
            "named": sorted(named),
            "note": note,
            "applied": applied,
            "audit": audit,
            "single_node": self.single_node,
        }
        if tensors is not None:
            alarm["tensors"] = tensors
        return alarm

    # -- check 2: ring replay, localize, confirm -------------------------------------------

    def _ring(self, step: int, batch, loss, det: bool) -> dict:
        import torch

        g, off = self.g, self.off
        own_fps = None
        if det:
            own_fps = self.stats.grad_fps
            if own_fps is None:
                own_fps = torch.zeros(len(self.stats.params), 3, dtype=torch.int64)
        own = result_row(loss, own_fps).cpu()
        error = None
        try:
            target = target_of(g.rank, g.size, off)
            rep = self._replay(self.rebuild_batch(step, target), det).cpu()
        except Exception as e:  # shared below so that no rank waits alone
            error, rep = e, torch.zeros(ROW, dtype=torch.int64)
        table = self._gather_rows(torch.stack([own, rep]), error)
        own_all, rep_all = self._rows(table, 0), self._rows(table, 1)
        pairs = mismatched_pairs(own_all, rep_all, off)
        loc = localize(pairs, g.size, off)
        # On one node every GPU counts as its own "node" for the choice of a third.
        nodes = None if self.single_node else self.nodes
        plans = plan_confirmations(loc.ambiguous, g.size, off, nodes)
        vs = self._confirm(plans, step, batch, det, own_all, rep_all)
        culprits = list(loc.culprits)
        note = loc.note
        named = culprits + [v["suspect"] for v in vs if v["suspect"] is not None]
        if note is None and software_problem(named, g.size):
            note, culprits = SOFTWARE_NOTE, []
            vs = [dict(v, suspect=None, kind=UNATTRIBUTABLE) for v in vs]
        elif note is None and any(p.third is None for p in plans):
            note = _NO_THIRD_NOTE
        return {"pairs": list(loc.pairs), "culprits": culprits, "verdicts": vs, "note": note}

    def _confirm(self, plans, step: int, batch, det: bool, own_all, rep_all) -> list[dict]:
        import torch

        g = self.g
        work_all = [confirmation_work(plans, r) for r in range(g.size)]
        width = max((len(w) for w in work_all), default=0)
        results: dict = {}
        if width:
            rows = torch.zeros(width, ROW, dtype=torch.int64)
            error = None
            try:
                for i, (kind, t) in enumerate(work_all[g.rank]):
                    b = batch if kind == RECOMPUTE else self.rebuild_batch(step, t)
                    rows[i] = self._replay(b, det).cpu()
            except Exception as e:
                error = e
            table = self._gather_rows(rows, error)
            for r, work in enumerate(work_all):
                for i, key in enumerate(work):
                    results[(r, *key)] = tuple(table[r, i].tolist())
        return verdicts(plans, own_all, rep_all, results, g.size, self.off)

    # -- check 3 -----------------------------------------------------------------------------

    def _weights(self, step: int, *, preflight: bool) -> dict | None:
        res = find_divergent_ranks(list(self.module.parameters()), self.g.handle)
        self.stats.weight_checks += 1
        if not res["diverged"]:
            if not preflight:
                self.last_weight_check_pass = self.stats.last_weight_check_pass = step
            return None
        if preflight:
            first = step
        elif self.last_weight_check_pass is None:
            first = self.start_step
        else:
            first = self.last_weight_check_pass + 1
        note = "weight check before the first step" if preflight else None
        if res["suspects"] is None:
            extra = "replicas diverged with no strict majority: no suspect"
            note = f"{note}; {extra}" if note else extra
        return self._alarm(step, WEIGHTS, first, applied=not preflight,
                           suspects=res["suspects"], note=note, tensors=res["tensors"])

    # -- one step ----------------------------------------------------------------------------

    def step(self, step: int, batch) -> dict | None:
        """One step in SPEC-SDC's order; the alarm, or None (then ``on_step`` has run)."""
        loss, bad, alarm = self._compute(step, batch)
        if alarm is not None:
            return alarm
        return self._apply(step, loss, bad)

    def _compute(self, step: int, batch):
        """Checks 0-2: forward and backward, check 1, the ring. (loss, reduced bad, alarm)."""
        import torch

        sched, g = self.sched, self.g
        audit = sched.is_audit(step)
        det = sched.is_deterministic_audit(step)
        self.stats.begin_step(record_fingerprints=det, in_train=True)
        self.opt.zero_grad(set_to_none=True)
        with deterministic_mode(det):
            # One loss, or the vector of micro-step losses; the hook sees the accumulated local
            # gradient (DDP reduces only at the last micro-step).
            loss = accumulate(self.ddp, self.compute_loss, batch, self.micro_steps, backward=True,
                              scale=self._scale(), no_sync=self.ddp.no_sync)
            # Clip now (replicas' gradients are reduced; weights untouched): the multiply that
            # clips also divides gradients the hook all-reduced as sums.
            if self.scaler is not None:
                self.scaler.unscale_(self.opt)
            total = clip_averaged(self.stats, sched.max_grad_norm)
            sq = self.stats.gathered_sq_norms()  # started by the hook behind the last bucket
            nonfinite = [r for r in range(g.size) if not math.isfinite(sq[r])]
            # One 1-element all-reduce MAX, so that every rank takes the same branch even when
            # the all-reduce handed ranks different results.
            bad = _dist.any_rank(g, not bool(torch.isfinite(total)))
            fire_nonfinite = bool(nonfinite) and self.scaler is None
            ring = self._ring(step, batch, loss, det) if (audit or fire_nonfinite) else None
            self.stats.audits += int(audit)
        if fire_nonfinite or (ring and ring["pairs"]):
            self.opt.zero_grad(set_to_none=True)
            # The window starts after the last passing audit, for a NaN too: a finite
            # corruption before it passes check 1 and only an audit would have excluded it.
            first = self.start_step if self.last_audit_pass is None else self.last_audit_pass + 1
            note = ring["note"]
            if fire_nonfinite and not ring["pairs"]:
                note = _REPRODUCED_NOTE
            return loss, bad, self._alarm(
                step, COMPUTE, first, applied=False,
                nonfinite=nonfinite if fire_nonfinite else [],
                pairs=ring["pairs"], culprits=ring["culprits"], verdict_rows=ring["verdicts"],
                note=note, audit="deterministic" if det else "loss",
            )
        if audit:
            self.last_audit_pass = self.stats.last_audit_pass = step
        return loss, bad, None

    def _apply(self, step: int, loss, bad: bool) -> dict | None:
        """Check 3 (reduced gradient), the update, check 4 (weights), checkpoint, ``on_step``."""
        sched = self.sched
        if bad and self.scaler is None:
            self.opt.zero_grad(set_to_none=True)
            return self._alarm(step, REDUCED, step, applied=False,
                               note="the all-reduced gradient is not finite; no rank is named")
        if self.scaler is not None:
            if bad:
                self.scaler.update()  # the scaler saw the inf too: a skipped step, not an alarm
            else:
                self.scaler.step(self.opt)
                self.scaler.update()
        else:
            self.opt.step()

        if sched.is_weight_check(step):
            alarm = self._weights(step, preflight=False)
            if alarm:
                return alarm
        if sched.is_checkpoint(step) and self.save_checkpoint is not None:
            self.save_checkpoint(
                step,
                {
                    "last_audit_pass": self.last_audit_pass,
                    "last_weight_check_pass": self.last_weight_check_pass,
                },
            )
        self.stats.steps += 1
        self.stats.last_step = step
        if self.on_step is not None:
            self.on_step(step, loss.detach().mean() if self.micro_steps > 1 else loss.detach())
        return None


def train(
    ddp_model: Any,
    stats: GradStats,
    optimizer: Any,
    batches: Iterable[Any],
    compute_loss: Callable[[Any, Any], Any],
    rebuild_batch: Callable[[int, int], Any],
    save_checkpoint: Callable[[int, dict], Any] | None,
    sched: Schedule,
    start_step: int = 0,
    *,
    scaler: Any = None,
    micro_steps: int = 1,
    on_step: Callable[[int, Any], Any] | None = None,
) -> dict | None:
    """Run the steps of ``batches`` (numbered from ``start_step``) with the SDC checks.

    Returns None when ``batches`` runs out, else the first alarm (see docs/sdc.md for its
    fields). ``compute_loss(model, batch)`` must serve training (called with the DDP model) and
    replay (called with the unwrapped module); ``rebuild_batch(step, rank)`` must return exactly
    the micro-batch that data-parallel rank ``rank`` (rank within the DP group) trained on at
    ``step``. ``scaler``: an fp16 ``GradScaler``; steps it skips are not alarms.
    ``micro_steps > 1``: gradient accumulation - every item of ``batches`` and every
    ``rebuild_batch`` result is the sequence of the step's ``micro_steps`` micro-batches; each
    micro-step's loss is divided by ``micro_steps``, all but the last run under ``no_sync``,
    and replays recompute every micro-step.
    ``on_step(step, loss)``: called on every rank after each step that raised no alarm, last in
    the step (after the update, the weight check and the checkpoint), with the detached loss
    (the mean of the micro-step losses); the place for ``scheduler.step()``, logging and
    evaluation. Progress counters are on ``stats`` (see ``GradStats``).
    A collective from start to end: every rank of the DP group must call it.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(
            f"gpu_monitor.sdc.train needs a DistributedDataParallel model, got {type(ddp_model).__name__}"
        )
    if not isinstance(stats, GradStats) or stats.ddp_model is not ddp_model:
        raise ValueError("stats must be the value attach(ddp_model) returned for this model")
    if not isinstance(sched, Schedule):
        raise TypeError(f"sched must be a gpu_monitor.sdc.Schedule, got {type(sched).__name__}")
    if not isinstance(micro_steps, int) or isinstance(micro_steps, bool) or micro_steps < 1:
        raise ValueError(f"micro_steps must be an int >= 1, got {micro_steps!r}")
    loop = _Loop(ddp_model, stats, optimizer, compute_loss, rebuild_batch, save_checkpoint,
                 sched, int(start_step), scaler, micro_steps, on_step)
    layout = ring_layout(stats.group.handle, sched.peer_offset)
    loop.nodes, loop.off, loop.single_node = list(layout.nodes), layout.offset, layout.single_node
    together = False  # True on the paths every rank takes together (guarantee 1)
    try:
        if sched.check_every or sched.check_on_checkpoint:
            alarm = loop._weights(int(start_step), preflight=True)
            if alarm:
                together = True
                return alarm
        for i, batch in enumerate(batches):
            alarm = loop.step(int(start_step) + i, batch)
            if alarm:
                together = True
                return alarm
        together = True
        return None
    finally:
        if together:
            # Guarantee 4: nothing of train's is in flight when it returns, on any rank.
            stats.settle()
            stats.keep(_dist.rendezvous(stats.group))
        stats.end_step()


def clip_averaged(stats: GradStats, max_norm: float | None):
    """Clip the reduced gradients to ``max_norm`` (None: no clipping); returns their total norm.

    The same norm and coefficient as ``torch.nn.utils.clip_grad_norm_`` (L2, ``1e-6`` guard,
    coefficient clamped to 1). When the hook all-reduced sums (``stats.summed``), ``1/size`` is
    folded into the same multiply, so the gradients end up exactly where DDP's averaged-then-
    clipped ones would (bit for bit when the group size is a power of two).
    """
    import torch

    grads = [p.grad for p in stats.params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    groups: dict = {}
    for t in grads:
        groups.setdefault((t.device, t.dtype), []).append(t)
    first = grads[0].device
    norms = [n.to(first) for gs in groups.values() for n in torch._foreach_norm(gs)]
    total = torch.linalg.vector_norm(torch.stack(norms))
    scale = 1.0 / stats.divisor if stats.summed else 1.0
    total = total * scale
    if max_norm is None:
        if scale != 1.0:
            for gs in groups.values():
                torch._foreach_mul_(gs, scale)
        return total
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0) * scale
    for (device, _), gs in groups.items():
        torch._foreach_mul_(gs, coef.to(device))
    return total
