"""The DDP communication hook: look at each rank's own gradients before they are averaged away.

Why: after the all-reduce every rank holds the same averaged gradient, so a NaN or a wrong value
produced by one GPU can no longer be traced to it. The hook records, per gradient bucket, the
local squared norm (every step) and, on deterministic audit steps, a fingerprint of every
parameter's local gradient, then hands the bucket to the standard all-reduce (which divides in
place, so the fingerprints must be taken first).
"""

from __future__ import annotations

import os
from typing import Any

from gpu_monitor.sdc import _dist
from gpu_monitor.sdc.fingerprint import fingerprints

__all__ = ["GradStats", "attach", "cublas_config_problem"]

_DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")


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
    """

    def __init__(self, ddp_model: Any, group: _dist.Group) -> None:
        self.ddp_model = ddp_model
        self.group = group
        self.params = [p for p in ddp_model.module.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.record_fingerprints = False
        self._sq: list[Any] = []
        self.grad_fps: Any = None
        self.seen: set[int] = set()
        self.buckets = 0

    def begin_step(self, record_fingerprints: bool) -> None:
        self.record_fingerprints = record_fingerprints
        self._sq = []
        self.buckets = 0
        self.grad_fps = None

    def local_sq_norm(self):
        """This rank's local (pre-all-reduce) squared gradient norm, as a float64 0-d tensor."""
        import torch

        if not self._sq:
            return torch.zeros((), dtype=torch.float64)
        return torch.stack([s.to(torch.float64) for s in self._sq]).sum()

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


def _hook(stats, bucket):  # no annotations: DDP rejects any but the real GradBucket/Future
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    stats._record(bucket)
    return default_hooks.allreduce_hook(stats.ddp_model.process_group, bucket)


def attach(ddp_model: Any, dp_group: Any = None) -> GradStats:
    """Register the recording communication hook on a DDP model; returns its ``GradStats``.

    ``dp_group`` is the group the SDC checks compare over (default: the DDP model's own group).
    Raises ``TypeError`` for a model that is not ``DistributedDataParallel`` and, on CUDA,
    ``RuntimeError`` unless ``CUBLAS_WORKSPACE_CONFIG`` is set for deterministic cuBLAS.
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
    group = _dist.group_of(dp_group if dp_group is not None else ddp_model.process_group)
    stats = GradStats(ddp_model, group)
    ddp_model.register_comm_hook(stats, _hook)
    return stats
