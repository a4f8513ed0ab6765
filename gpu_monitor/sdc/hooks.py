"""The DDP communication hook: look at each rank's own gradients before they are averaged away.

Why: after the all-reduce every rank holds the same averaged gradient, so a NaN or a wrong value
produced by one GPU can no longer be traced to it. The hook records, per gradient bucket, the
local squared norm (every step) and, on deterministic audit steps, a fingerprint of every
parameter's local gradient, then hands the bucket to the standard all-reduce (which divides in
place, so the fingerprints must be taken first).

Cost (see ``bench/bench_ddp_overhead.py``): a Python hook loses DDP's fused copy-and-divide, so
inside ``train`` the division moves into the clipping multiply that runs anyway, and the one
collective check 1 needs before the step is started from the hook behind the last bucket.
"""

from __future__ import annotations

import os
from typing import Any

from gpu_monitor.sdc import _dist
from gpu_monitor.sdc.fingerprint import fingerprints

__all__ = ["GradStats", "attach", "cublas_config_problem"]

_DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")
_ATTACHED = "_gpu_monitor_sdc_stats"  # set on a DDP model by attach()


def cublas_config_problem(environ=None) -> str | None:
    """Why deterministic cuBLAS cannot be promised (None when ``CUBLAS_WORKSPACE_CONFIG`` is set)."""
    env = os.environ if environ is None else environ
    value = env.get("CUBLAS_WORKSPACE_CONFIG")
    if value in _DETERMINISTIC_CUBLAS:
        return None
    return (
        f"CUBLAS_WORKSPACE_CONFIG={value!r}: deterministic audits on CUDA need "
        "CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) in the environment before the first cuBLAS "
        "call - export it in the launcher, not from the training script after CUDA work began"
    )


class GradStats:
    """What the hook saw during the current step (mutable: the hook fills it during backward).

    ``params``: the parameters DDP reduces (requires_grad, module order); the index of a
    parameter in it is its row in ``grad_fps``.

    Outside a ``train`` step the hook is the stock all-reduce plus the recording: it divides each
    bucket by the group size before summing, so a training loop of the caller's own gets the
    usual averaged gradients. Inside a ``train`` step (``begin_step(..., in_train=True)``) it
    also starts, right after the last bucket's all-reduce, the all-gather of every rank's local
    norm (so it needs no synchronisation point of its own), and for fp32/fp64 gradients it leaves
    the division out: the buckets are all-reduced as sums and ``train`` folds ``1/size`` into the
    multiply that clips them (``summed`` says so), saving a read and a write of every gradient.

    Progress of ``train`` (readable while training, e.g. from ``on_step``, and after it
    returned; cumulative over every ``train`` call on this object): ``steps`` completed without
    an alarm, ``audits`` (ring audits run on audit steps) and ``weight_checks`` (weight
    comparisons run, the one before the first step included), ``last_step`` (the last step
    completed), ``last_audit_pass`` and ``last_weight_check_pass`` (None until one passed).
    """

    def __init__(self, ddp_model: Any, group: _dist.Group) -> None:
        import torch

        self.ddp_model = ddp_model
        self.group = group
        self.params = [p for p in ddp_model.module.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.divisor = ddp_model.process_group.size()
        # fp16/bf16 buckets are divided before the sum, as DDP does, so that it cannot overflow.
        self.can_fold = all(p.dtype in (torch.float32, torch.float64) for p in self.params)
        self.record_fingerprints = False
        self.in_train = False
        self._sq: list[Any] = []
        self._norms: Any = None  # (work, [tensor per rank], mine) of the in-flight norm all-gather
        self._held: Any = None  # the last completed one, kept referenced until the next step
        self._kept: Any = None  # the tensor of train's last collective, likewise
        self.grad_fps: Any = None
        self.seen: set[int] = set()
        self.buckets = 0
        self.steps = 0
        self.audits = 0
        self.weight_checks = 0
        self.last_step: int | None = None
        self.last_audit_pass: int | None = None
        self.last_weight_check_pass: int | None = None

    def begin_step(self, record_fingerprints: bool, in_train: bool = False) -> None:
        self.record_fingerprints = record_fingerprints
        self.in_train = in_train
        self._sq = []
        self._norms = None
        self._held = None
        self.buckets = 0
        self.grad_fps = None

    def end_step(self) -> None:
        """Back to the stock behaviour (the caller's own loop gets averaged gradients).

        A norm all-gather still in flight (only after an exception inside a step: ``train``
        calls ``settle`` on its other paths) is not waited for - the other ranks may never have
        started theirs - but stays referenced, so that its tensors are not left to gloo's
        worker thread alone.
        """
        self.in_train = False
        if self._norms is not None:
            self._held, self._norms = self._norms, None

    def keep(self, tensor: Any) -> None:
        """Hold a collective's tensor until the next step (see ``settle``)."""
        self._kept = tensor

    def settle(self) -> None:
        """Wait for every collective the hook started (``train`` calls it before returning).

        Why: a work handle left in flight when ``train`` returns is still being run by gloo's
        worker thread when a training script exits right after an alarm; a worker thread that
        releases Python-owned tensors during interpreter shutdown aborts the process
        (``terminate called without an active exception``), hiding the alarm. The completed
        work and its tensors stay referenced here until the next step, so that the last
        reference is dropped by Python, not by the worker thread.
        """
        if self._norms is not None:
            work = self._norms[0]
            self._held, self._norms = self._norms, None
            work.wait()

    @property
    def summed(self) -> bool:
        """Whether this step's buckets are all-reduced as sums (``train`` divides them)."""
        return self.in_train and self.can_fold

    def local_sq_norm(self):
        """This rank's local (pre-all-reduce) squared gradient norm, as a float64 0-d tensor."""
        import torch

        if not self._sq:
            return torch.zeros((), dtype=torch.float64)
        return torch.stack([s.to(torch.float64) for s in self._sq]).sum()

    def gathered_sq_norms(self) -> list[float]:
        """Every rank's local squared norm (group order), as floats; a collective.

        Waits for the all-gather the hook started after the last bucket; when no bucket was
        reduced this step (no gradient at all: the same on every rank) it runs one now.
        """
        import torch

        if self._norms is None:
            return _dist.all_gather(self.group, self.local_sq_norm().reshape(1)).view(-1).tolist()
        work, out, _ = self._norms
        self._held, self._norms = self._norms, None
        work.wait()
        return torch.cat(out).tolist()

    def own_grad_fingerprints(self):
        """[len(params), 3]: fingerprints of this rank's own local gradients (zero rows: unseen)."""
        return self.grad_fps

    def _record(self, bucket: Any) -> None:
        import torch

        buf = bucket.buffer()
        if buf.dtype in (torch.float16, torch.bfloat16):
            f = buf.float()
            self._sq.append(torch.dot(f, f))
        elif buf.is_floating_point():
            self._sq.append(torch.dot(buf, buf))
        else:
            self._sq.append(buf.to(torch.float64).square().sum())
        self.buckets += 1
        if not self.record_fingerprints:
            return
        grads = bucket.gradients()
        params = bucket.parameters()
        rows = fingerprints(grads)
        if self.grad_fps is None:
            self.grad_fps = torch.zeros(len(self.params), 3, dtype=torch.int64, device=rows.device)
        idx = [self._index[id(p)] for p in params]
        self.grad_fps[idx] = rows.to(self.grad_fps.device)
        self.seen.update(idx)

    def _start_norm_gather(self) -> None:
        import torch
        import torch.distributed as dist

        g = self.group
        mine = self.local_sq_norm().reshape(1).to(g.device)
        out = [torch.empty_like(mine) for _ in range(g.size)]
        self._norms = (dist.all_gather(out, mine, group=g.handle, async_op=True), out, mine)


def _first(fut):
    value = fut.value()
    return value[0] if isinstance(value, list) else value


def _hook(stats, bucket):  # no annotations: DDP rejects any but the real GradBucket/Future
    import torch.distributed as dist

    stats._record(bucket)
    buf = bucket.buffer()
    if not stats.summed:
        buf.div_(stats.divisor)
    # Looked up at call time (not bound at import), like the stock hook's own all-reduce.
    fut = dist.all_reduce(buf, group=stats.ddp_model.process_group, async_op=True).get_future()
    if stats.in_train and bucket.is_last():
        # Queued behind this bucket on the same group, when every rank is already here.
        stats._start_norm_gather()
    return fut.then(_first)


def attach(ddp_model: Any, dp_group: Any = None) -> GradStats:
    """Register the recording communication hook on a DDP model; returns its ``GradStats``.

    ``dp_group`` is the group the SDC checks compare over (default: the DDP model's own group).
    Raises ``TypeError`` for a model that is not ``DistributedDataParallel``; ``RuntimeError``
    on CUDA unless ``CUBLAS_WORKSPACE_CONFIG`` is set for deterministic cuBLAS, and for a model
    that is already attached or has another communication hook (DDP takes one).
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(
            "gpu_monitor.sdc.attach needs a torch.nn.parallel.DistributedDataParallel model, got "
            f"{type(ddp_model).__name__}; the checks compare full replicas, so FSDP/ZeRO-sharded "
            "models are not supported (use find_divergent_ranks on the replica dimension instead)"
        )
    if any(p.is_cuda for p in ddp_model.module.parameters()):
        problem = cublas_config_problem()
        if problem:
            raise RuntimeError(problem)
    if getattr(ddp_model, _ATTACHED, None) is not None:
        raise RuntimeError(
            "gpu_monitor.sdc.attach: this DDP model is already attached (DDP takes one "
            "communication hook per model): call attach once and keep the GradStats it returned"
        )
    group = _dist.group_of(dp_group if dp_group is not None else ddp_model.process_group)
    stats = GradStats(ddp_model, group)
    try:
        ddp_model.register_comm_hook(stats, _hook)
    except RuntimeError as e:  # DDP's own words: "... can only be called once."
        raise RuntimeError(
            "gpu_monitor.sdc.attach: DDP refused the SDC communication hook - this model already "
            "has one (register_comm_hook or a built-in hook was called before); the SDC checks "
            f"need their own hook, so remove the other one ({e})"
        ) from e
    setattr(ddp_model, _ATTACHED, stats)
    return stats
