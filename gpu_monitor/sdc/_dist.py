"""The few collectives the SDC checks use, over one data-parallel group.

Why: every check works in group ranks (the ring, the vote) but reports global ranks, and must
put its small tensors on the device the backend can move (CPU for gloo, the current CUDA device
for NCCL). Each helper is one collective that every rank of the group calls with a tensor of the
same shape, so no alarm path can leave a rank waiting alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Group:
    """A process group as the checks see it."""

    handle: Any  # the ProcessGroup, or None for the default group
    size: int
    rank: int  # this process's rank in the group
    global_ranks: tuple[int, ...]  # group rank -> global rank
    device: Any  # where collective tensors must live

    def to_global(self, ranks):
        return [self.global_ranks[r] for r in ranks]


def group_of(handle=None) -> Group:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "gpu_monitor.sdc needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group)"
        )
    size = dist.get_world_size(handle)
    rank = dist.get_rank(handle)
    if handle is None or handle is dist.group.WORLD:
        ranks = tuple(range(size))
    else:
        ranks = tuple(dist.get_process_group_ranks(handle))
    backend = str(dist.get_backend(handle)).lower()
    if "nccl" in backend and "gloo" not in backend:
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return Group(handle, size, rank, ranks, device)


def all_gather(g: Group, t) -> Any:
    """[size, *t.shape]: every rank's ``t`` (same shape and dtype on every rank)."""
    import torch
    import torch.distributed as dist

    t = t.to(g.device).contiguous()
    out = [torch.empty_like(t) for _ in range(g.size)]
    dist.all_gather(out, t, group=g.handle)
    return torch.stack(out)


def any_rank(g: Group, flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any (one 1-element all-reduce MAX)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=g.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g.handle)
    return bool(t.item())


def rendezvous(g: Group) -> Any:
    """Return only when every rank of the group got here (one synchronous 1-element all-reduce).

    Returns the tensor it reduced: the caller keeps it referenced, because gloo's worker thread
    may still hold the completed work for a moment after the wait returns, and the last
    reference to a Python-made tensor must not be the worker's at interpreter shutdown.
    """
    import torch
    import torch.distributed as dist

    t = torch.zeros(1, dtype=torch.int32, device=g.device)
    dist.all_reduce(t, group=g.handle)
    return t


def all_gather_strings(g: Group, *texts: str) -> list[tuple[str, ...]]:
    """Every rank's ``texts`` (group order), through tensor collectives only.

    Why not ``all_gather_object``: torch's object collectives pickle through numpy, which the CPU
    torch wheel does not bring, so a training environment without numpy would fail inside
    ``train``. Two all-gathers: the byte lengths, then the NUL-joined UTF-8 bytes padded to the
    longest. Every rank must pass the same number of texts, none containing NUL.
    """
    import torch

    data = "\0".join(texts).encode()
    length = torch.tensor([len(data)], dtype=torch.int64)
    lengths = all_gather(g, length).view(-1).tolist()
    buf = torch.zeros(max(1, *lengths), dtype=torch.uint8)
    if data:
        buf[: len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    table = all_gather(g, buf).cpu()
    return [
        tuple(bytes(table[r, : lengths[r]].tolist()).decode().split("\0"))
        for r in range(g.size)
    ]
