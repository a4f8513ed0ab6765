"""Weight fingerprint comparison across replicas, with a strict-majority vote.

Why: a corrupted weight (a bit flipped in memory after the update, a bad restore) makes one
replica silently drift; no gradient check sees it, and a checkpoint written from that replica
carries it forward. Comparing per-tensor fingerprints of all replicas is cheap and is the only
check that can block such a checkpoint.

Cost: one all-gather of 4 numbers per rank when all replicas agree; only when they differ, a
second all-gather of the per-tensor fingerprints (every rank sees the same first result, so
every rank takes part in the second).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpu_monitor.sdc import _dist
from gpu_monitor.sdc.fingerprint import fingerprints
from gpu_monitor.sdc.localize import divergent_ranks

__all__ = ["find_divergent_ranks"]


def find_divergent_ranks(params: Iterable[Any], dp_group: Any = None) -> dict:
    """Compare ``params`` (any tensors: parameters, buffers) across the replicas of ``dp_group``.

    Returns ``{"diverged": bool, "suspects": list | None, "tensors": [indices]}``: ``suspects``
    are global ranks holding a minority copy of some tensor, ``None`` when some differing tensor
    has no strict majority (e.g. 2 replicas); ``tensors`` the indices of the differing tensors.
    A collective: every rank of the group must call it with the same number of tensors.
    """
    import torch

    g = _dist.group_of(dp_group)
    fps = fingerprints(list(params)).to(g.device)
    head = torch.cat(
        [torch.tensor([fps.shape[0]], dtype=torch.int64, device=g.device), fingerprints([fps])[0]]
    )
    heads = _dist.all_gather(g, head).tolist()
    counts = {h[0] for h in heads}
    if len(counts) != 1:
        raise ValueError(
            f"find_divergent_ranks: ranks passed different numbers of tensors {sorted(counts)}"
        )
    if all(h == heads[0] for h in heads):
        return {"diverged": False, "suspects": [], "tensors": []}
    table = _dist.all_gather(g, fps).tolist()  # [n][P][3]
    per_rank = [[tuple(row) for row in rank_rows] for rank_rows in table]
    diverged, suspects, tensors = divergent_ranks(per_rank)
    return {
        "diverged": diverged,
        "suspects": None if suspects is None else g.to_global(suspects),
        "tensors": tensors,
    }
