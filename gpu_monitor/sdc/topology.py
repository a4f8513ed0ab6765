"""Where each rank runs: node names for the ring layout check and GPU UUIDs for the report.

Why: a replay on the same node as the original shares the node's failure modes (a bad NVSwitch,
a bad driver, the same power event) and would confirm a wrong result, so a layout that spans
nodes but puts a replayer (or a confirming third) on its target's node is refused before
training. A group that lives on one node (the common 8-GPU job) has no other node to replay on:
it is accepted, the ring runs across the node's GPUs, and alarms say that the confirmation is not
independent across nodes. An alarm must name hardware, not rank numbers: the report joins ranks
to nodes and GPU UUIDs gathered here.

Node names come from ``$NODE_NAME`` (the Kubernetes downward API), else ``$SLURMD_NODENAME``
(set by slurmd in every task), else the host name; the refusal names which one each rank used.
Only tensor collectives are used (``_dist.all_gather_strings``), so no numpy is needed.
"""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_monitor.sdc import _dist
from gpu_monitor.sdc.localize import ranks_per_node, ring_offset, single_node, topology_problems

__all__ = [
    "Layout",
    "check_topology",
    "gpu_uuid",
    "node_identity",
    "node_name",
    "rank_map",
    "refusal_message",
    "ring_layout",
]

NODE_ENV = ("NODE_NAME", "SLURMD_NODENAME")
HOSTNAME_SOURCE = "the host name ($NODE_NAME and $SLURMD_NODENAME unset)"


def node_identity(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(node name, where it came from): ``$NODE_NAME``, ``$SLURMD_NODENAME``, else the host name."""
    env = os.environ if environ is None else environ
    for key in NODE_ENV:
        if env.get(key):
            return str(env[key]), f"${key}"
    return socket.gethostname(), HOSTNAME_SOURCE


def node_name() -> str:
    """This rank's node name (see ``node_identity``)."""
    return node_identity()[0]


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


@dataclass(frozen=True)
class Layout:
    """How the ring runs over a group: node per group rank, the offset used, one node or many."""

    nodes: tuple[str, ...]
    offset: int
    single_node: bool
    sources: tuple[str, ...]  # where each rank's node name came from


def refusal_message(problems: Sequence[str], sources: Sequence[str], size: int,
                    peer_offset: int) -> str:
    """The ``ValueError`` text for a refused layout (pure, so its wording is tested alone)."""
    shown = "; ".join(problems[:4]) + (f"; ... ({len(problems)} in all)" if len(problems) > 4 else "")
    used = sorted(set(sources))
    advice = (
        "Set peer_offset to the number of ranks per node and launch ranks node by node."
    )
    if HOSTNAME_SOURCE in used:
        advice += (
            " Where the host name is not the node's (a pod's host name is the pod's), set "
            "NODE_NAME from the downward API (spec.nodeName)."
        )
    return (
        f"SDC ring layout refused (world {size}, peer_offset {peer_offset}; node names from "
        f"{' and '.join(used)}): {shown}. {advice}"
    )


def ring_layout(dp_group=None, peer_offset: int = 8) -> Layout:
    """The ring's layout over ``dp_group``; raises ``ValueError`` on every rank when refused.

    A collective. Warns (on group rank 0) when the layout spans nodes with equal ranks per node
    and ``peer_offset`` is not that number: the layout is still valid, but the usual rule
    (rank r replays r + ranks-per-node) was probably meant.
    """
    g = _dist.group_of(dp_group)
    name, source = node_identity()
    rows = _dist.all_gather_strings(g, name, source)
    nodes = tuple(r[0] for r in rows)
    sources = tuple(r[1] for r in rows)
    problems = topology_problems(nodes, peer_offset)
    if problems:
        raise ValueError(refusal_message(problems, sources, g.size, peer_offset))
    one = single_node(nodes)
    per_node = ranks_per_node(nodes)
    if not one and per_node is not None and per_node != peer_offset and g.rank == 0:
        warnings.warn(
            f"gpu_monitor.sdc: Schedule.peer_offset={peer_offset} but the group has {per_node} "
            f"ranks per node: rank r replays rank r + {peer_offset}; set peer_offset={per_node} "
            "unless that is what you meant",
            stacklevel=3,
        )
    return Layout(nodes, ring_offset(nodes, peer_offset), one, sources)


def check_topology(dp_group=None, peer_offset: int = 8) -> list[str]:
    """Refuse a layout that spans nodes and puts a replayer or confirming third on its target's
    node (a group on one node is accepted).

    A collective over ``dp_group``: every rank raises the same ``ValueError`` or none does.
    Returns the node name of every group rank (group order).
    """
    return list(ring_layout(dp_group, peer_offset).nodes)


def rank_map(group=None) -> list[dict]:
    """All-gather ``{"rank", "node", "gpu_uuid"}`` from every rank of ``group`` (a collective).

    ``rank`` is the global rank. Call it once on every rank before training; pass the result
    to ``write_report`` on the rank that writes reports.
    """
    g = _dist.group_of(group)
    rows = _dist.all_gather_strings(g, node_name(), gpu_uuid() or "")
    return [
        {"rank": g.global_ranks[r], "node": node, "gpu_uuid": uuid or None}
        for r, (node, uuid) in enumerate(rows)
    ]
