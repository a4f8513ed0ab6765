"""What starts a fail-fast notice: a result saying the fabric or a GPU has already doomed the
job on it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpu_monitor.model import Result, Status

PORT_REASON = "PortDownExceededNcclTimeout"


@dataclass(frozen=True)
class Trigger:
    """One outage (or one fatal Xid) that notifies, keyed so that it notifies once.

    Times are epoch seconds. ``crossed_at`` is the instant the daemon's own accounting knew the
    job was lost: an outage's start plus NCCL's tolerance, a fatal Xid's event time.
    """

    key: str  # "ib:mlx5_0:1@1764000000.123456" | "gpu:3@<boot id>:<seq>"
    cause: str  # the result's reason
    target: str
    device: str | None  # the RDMA device of a port; None for a GPU
    gpus: tuple[int, ...] | None  # a GPU trigger's own GPU; None: the port's paired GPUs
    started_at: float
    crossed_at: float
    ended_at: float | None  # None while the outage lasts
    message: str


def _port_triggers(r: Result) -> list[Trigger]:
    """One trigger per outage of the window that outlasted NCCL's tolerance (a later outage
    notifies even while an earlier, longer one still fails the port)."""
    d = r.details
    tolerance = d.get("nccl_tolerance_s")
    if not isinstance(tolerance, (int, float)):
        return []
    _, device, _port = r.target.split(":")
    out = []
    for item in d.get("outages_over_tolerance") or ():
        start, end = (list(item) + [None, None])[:2]
        if not isinstance(start, (int, float)):
            continue
        out.append(Trigger(key=f"{r.target}@{float(start):.6f}", cause=r.reason,
                           target=r.target, device=device, gpus=None, started_at=float(start),
                           crossed_at=float(start) + float(tolerance),
                           ended_at=float(end) if isinstance(end, (int, float)) else None,
                           message=r.message))
    return out


def _xid_trigger(r: Result) -> Trigger | None:
    d = r.details
    index, seq, when = d.get("gpu_index"), d.get("seq"), d.get("event_time")
    if d.get("open") or d.get("history") or not isinstance(index, int) or seq is None:
        return None  # a re-report of an open problem, or a replayed old record
    try:
        at = datetime.fromisoformat(str(when)).timestamp()
    except ValueError:
        at = r.observed_at.timestamp()
    return Trigger(key=f"{r.target}@{d.get('boot_id')}:{seq}", cause=r.reason, target=r.target,
                   device=None, gpus=(index,), started_at=at, crossed_at=at, ended_at=at,
                   message=r.message)


def triggers_from(results: Iterable[Result], on_xid: bool) -> list[Trigger]:
    """The triggers among ``results``: every ``PortDownExceededNcclTimeout`` of a port, and
    with ``on_xid`` every fresh failed (fatal) Xid on a GPU."""
    out: list[Trigger] = []
    for r in results:
        if r.check == "rdma_ports" and r.reason == PORT_REASON and r.target.startswith("ib:"):
            out.extend(_port_triggers(r))
        elif (on_xid and r.check == "xid" and r.status is Status.FAILED
              and r.target.startswith("gpu:")):
            t = _xid_trigger(r)
            if t is not None:
                out.append(t)
    return out
