"""Where each rank runs: node names for the ring layout check and GPU UUIDs for the report.

Why: a replay on the same node as the original shares the node's failure modes (a bad NVSwitch,
a bad driver, the same power event) and would confirm a wrong result, so the layout is refused
before training. And an alarm must name hardware, not rank numbers: the report joins ranks to
nodes and GPU UUIDs gathered here.
"""

from __future__ import annotations

import os
import socket

from gpu_monitor.sdc import _dist
from gpu_monitor.sdc.localize import topology_problems

__all__ = ["check_topology", "gpu_uuid", "node_name", "rank_map"]


def node_name() -> str:
    """``$NODE_NAME`` (set from the downward API in Kubernetes), else the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def gpu_uuid() -> str | None:
    """The UUID of this process's current CUDA device (``GPU-...``), None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        uuid = getattr(props, "uuid", None)
        if uuid is None:
            return None
        text = str(uuid)
        return text if text.startswith("GPU-") else f"GPU-{text}"
    except Exception:  # a broken driver must not stop the report
        return None


def check_topology(dp_group=None, peer_offset: int = 8) -> list[str]:
    """Refuse a layout where a replayer or a confirming third shares a node with its target.

    A collective over ``dp_group``: every rank raises the same ``ValueError`` or none does.
    Returns the node name of every group rank (group order).
    """
    g = _dist.group_of(dp_group)
    nodes = [str(x) for x in _dist.all_gather_objects(g, node_name())]
    problems = topology_problems(nodes, peer_offset)
    if problems:
        shown = "; ".join(problems[:4]) + (f"; ... ({len(problems)} in all)" if len(problems) > 4 else "")
        raise ValueError(
            f"SDC ring layout refused (world {g.size}, peer_offset {peer_offset}; node names from "
            f"$NODE_NAME): {shown}. Set peer_offset to the number of ranks per node and launch "
            "ranks node by node."
        )
    return nodes


def rank_map(group=None) -> list[dict]:
    """All-gather ``{"rank", "node", "gpu_uuid"}`` from every rank of ``group`` (a collective).

    ``rank`` is the global rank. Call it once on every rank before training; pass the result
    to ``write_report`` on the rank that writes reports.
    """
    g = _dist.group_of(group)
    import torch.distributed as dist

    me = {"rank": dist.get_rank(), "node": node_name(), "gpu_uuid": gpu_uuid()}
    return list(_dist.all_gather_objects(g, me))
