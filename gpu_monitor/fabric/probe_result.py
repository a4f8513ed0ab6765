"""A fabric probe's group result, from what every rank measured (pure).

Why apart: this is the probe's whole decision, and it needs no torch and no process group, so
it is tested with tables of rows and recorded nccl-tests numbers; probe_rank.py only measures
and hands the rows to ``assemble``.

Rank 0 gathers everything and reports, per operation and size, p50/p95 latency, algbw and
busbw (``gpu_monitor.nccl``: the slowest rank per iteration, the slowest rank's mean, busbw =
algbw x 2(n-1)/n for all-reduce or x (n-1)/n for all-gather, whose size is the gathered total,
as in nccl-tests). Small messages (<= ``nccl.small_message_max_bytes``) are judged by p95
latency against ``fabric.small_p95_latency_limit_s``; large ones (>=
``nccl.large_message_min_bytes``, else the largest size swept) by busbw against
``fabric.busbw_floor_gb_per_s``, with the profile's warning band. A rank that arrives late at
every collective (a straggler) spends the least time inside them: it is named as a suspect.

Out: the group result (JSON, ``RESULT_SCHEMA``, docs/fabric.md), its table for a person, and
the compact summary (< 4 KiB) each node leaves in its termination message for the scheduler.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_monitor import __version__
from gpu_monitor.fabric import termination
from gpu_monitor.fabric.probe_settings import ProbeSettings
from gpu_monitor.fabric.transport import Transport, merge_transports
from gpu_monitor.model import EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNKNOWN, Status, iso, utcnow
from gpu_monitor.nccl import (
    bus_factor,
    busbw_breach,
    latency_breach,
    rounded,
    significant,
    sweep_table,
)

RESULT_SCHEMA = 1
RESULT_KIND = "FabricProbeResult"
SUMMARY_KIND = "FabricProbeSummary"
REASONS = ("FabricWrongData", "FabricBusBwLow", "FabricLatencyHigh", "FabricTransportFallback",
           "FabricProbeError")


# --- judgement ------------------------------------------------------------------------------------


def stragglers(per_rank: Sequence[Sequence[Mapping[str, Any]]], min_gap_s: float) -> list[int]:
    """Ranks that arrive late at the collectives: the others wait for them inside the
    collective, so their own time inside it is much shorter than the group's median. A rank
    is named when it is the clear minimum (< half the median, and ``min_gap_s`` below it) at
    a majority of sizes."""
    n = len(per_rank)
    if n < 3 or not per_rank[0]:
        return []
    votes: Counter[int] = Counter()
    sizes = len(per_rank[0])
    for k in range(sizes):
        means = [statistics.fmean(r[k]["times_s"]) for r in per_rank]
        med = statistics.median(means)
        low = min(range(n), key=lambda i: means[i])
        others = sorted(means)[1]
        if means[low] < 0.5 * med and med - means[low] > min_gap_s and \
                means[low] < 0.5 * others:
            votes[low] += 1
    return sorted(r for r, v in votes.items() if v * 2 > sizes)


@dataclass(frozen=True)
class ProbeFinding:
    """One thing the probe found about the group (an operation, the ranks it blames)."""

    status: Status
    reason: str
    message: str
    op: str | None = None
    ranks: tuple[int, ...] = ()

    def to_dict(self, nodes_of: Mapping[int, str] | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"status": self.status.value, "reason": self.reason,
                             "message": self.message, "op": self.op, "ranks": list(self.ranks)}
        if nodes_of is not None:
            d["nodes"] = sorted({nodes_of[r] for r in self.ranks if r in nodes_of})
        return d


def group_findings(tables: Mapping[str, Sequence[Mapping[str, Any]]], world_size: int,
                   settings: ProbeSettings, *, wrong_sources: Sequence[int] = (),
                   slow_ranks: Sequence[int] = (), transport: Transport | None = None,
                   multi_node: bool = True) -> list[ProbeFinding]:
    """Findings for the group: wrong data, busbw below the floor (or within the warning band),
    small-message p95 above the limit, and a socket fallback where RDMA was expected."""
    out: list[ProbeFinding] = []
    for op, rows in tables.items():
        wrong = sum(r["wrong"] for r in rows)
        if wrong:
            first = next(r["bytes"] for r in rows if r["wrong"])
            who = (f"; the data of rank(s) {', '.join(map(str, wrong_sources))} arrives wrong"
                   if wrong_sources else "")
            out.append(ProbeFinding(Status.FAILED, "FabricWrongData",
                                    f"{op}: {wrong} wrong values (first at {first} B){who}", op,
                                    tuple(wrong_sources)))
        low = busbw_breach(rows, settings.limits) if world_size > 1 else None
        if low is not None:
            out.append(ProbeFinding(low.status, "FabricBusBwLow", f"{op}: {low.message}", op,
                                    tuple(slow_ranks)))
        slow = latency_breach(rows, settings.limits)
        if slow is not None:
            out.append(ProbeFinding(slow.status, "FabricLatencyHigh", f"{op}: {slow.message}",
                                    op, tuple(slow_ranks)))
    if (transport is not None and settings.expect_transport == "rdma" and multi_node
            and transport.kind == "socket"):
        out.append(ProbeFinding(Status.UNKNOWN, "FabricTransportFallback",
                                "NCCL carried the traffic over sockets (NET/Socket) on a fabric "
                                "that should be RDMA: the numbers measure the wrong path"))
    return out


def verdict_of(findings: Iterable[ProbeFinding]) -> str:
    statuses = {f.status for f in findings}
    if Status.FAILED in statuses:
        return "unhealthy"
    if Status.UNKNOWN in statuses:
        return "unknown"
    return "healthy"


VERDICT_EXIT = {"healthy": EXIT_HEALTHY, "unhealthy": EXIT_UNHEALTHY, "unknown": EXIT_UNKNOWN}


def largest(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return rows[-1] if rows else None


def summarize(result: Mapping[str, Any], node: str | None = None,
              limit: int = termination.TERMINATION_LOG_LIMIT) -> dict[str, Any]:
    """The compact summary for a termination message: verdict, reasons, suspects, the busbw
    at the largest size and the worst small-message p95 per op, the transport; the node
    list is shortened until the JSON fits in ``limit`` bytes."""
    ops: dict[str, Any] = {}
    small_max = (result.get("settings") or {}).get("small_message_max_bytes", 65536)
    for op, data in (result.get("operations") or {}).items():
        rows = data.get("rows") or []
        big = largest(rows)
        small = [r for r in rows if r["bytes"] <= small_max]
        ops[op] = {
            "bytes": big["bytes"] if big else None,
            "busbw_gb_per_s": significant(big["busbw_gb_per_s"]) if big else None,
            "small_p95_s": significant(max(r["p95_s"] for r in small)) if small else None,
            "wrong": sum(r["wrong"] for r in rows),
        }
    s: dict[str, Any] = {
        "schema": RESULT_SCHEMA,
        "kind": SUMMARY_KIND,
        "group": result.get("group"),
        "verdict": result.get("verdict"),
        "reasons": sorted({f["reason"] for f in result.get("findings") or []
                           if f["status"] in ("failed", "unknown", "degraded")}),
        "world_size": result.get("world_size"),
        "node": node,
        "suspect_nodes": result.get("suspect_nodes") or [],
        "ops": ops,
        "limits": {k: (result.get("settings") or {}).get(k)
                   for k in ("busbw_floor_gb_per_s", "small_p95_latency_limit_s")},
        "transport": (result.get("transport") or {}).get("kind"),
        "network": (result.get("transport") or {}).get("network"),
        "finished_at": result.get("finished_at"),
        "nodes": list(result.get("nodes") or []),
    }
    if result.get("error"):
        s["error"] = str(result["error"])[:500]
    if result.get("test_fault"):
        s["test_fault"] = result["test_fault"]
    return termination.fit(s, "nodes", "nodes_truncated", limit)


def parse_summary(text: str | None) -> dict[str, Any] | None:
    """A summary back from a termination message; None if it is not one."""
    return termination.parse(text, SUMMARY_KIND, RESULT_SCHEMA)


# --- the group result ----------------------------------------------------------------------------


def assemble(gathered: Sequence[Mapping[str, Any]], identities: Sequence[Mapping[str, Any]],
             settings: ProbeSettings, *, backend: str, device_type: str, group: str | None,
             started: Any, fault_text: str | None, multi_node: bool) -> dict[str, Any]:
    """The group result (pure: from what every rank measured)."""
    n = len(gathered)
    tables = {op: sweep_table(op, [g["rows"][op] for g in gathered]) for op in settings.ops}
    wrong_sources = sorted({int(r) for g in gathered for r in g.get("wrong_sources") or []})
    slow: set[int] = set()
    straggle_by_op = {}
    for op in settings.ops:
        found = stragglers([g["rows"][op] for g in gathered], settings.straggler_min_s)
        straggle_by_op[op] = found
        slow.update(found)
    transport = merge_transports([Transport(**{**t, "evidence": tuple(t.get("evidence") or ()),
                                               "paths": dict(t.get("paths") or {})})
                                  for t in (g["transport"] for g in gathered)])
    findings = group_findings(tables, n, settings, wrong_sources=wrong_sources,
                              slow_ranks=sorted(slow), transport=transport,
                              multi_node=multi_node)
    nodes_of = {int(i["rank"]): str(i["node"]) for i in identities}
    verdict = verdict_of(findings)
    suspects = sorted({nodes_of[r] for f in findings if f.status is Status.FAILED
                       for r in f.ranks if r in nodes_of})
    return {
        "schema": RESULT_SCHEMA,
        "kind": RESULT_KIND,
        "tool_version": __version__,
        "group": group,
        "started_at": iso(started),
        "finished_at": iso(utcnow()),
        "backend": backend,
        "device_type": device_type,
        "world_size": n,
        "nodes": list(dict.fromkeys(nodes_of[r] for r in sorted(nodes_of))),
        "ranks": [dict(i) for i in sorted(identities, key=lambda i: i["rank"])],
        "settings": settings.to_dict(),
        "transport": {**transport.to_dict(), "expected": settings.expect_transport},
        "operations": {op: {"bus_factor": bus_factor(op, n), "rows": rounded(rows),
                            "stragglers": straggle_by_op.get(op, [])}
                       for op, rows in tables.items()},
        "wrong_sources": wrong_sources,
        "stragglers": sorted(slow),
        "findings": [f.to_dict(nodes_of) for f in findings],
        "suspect_nodes": suspects,
        "verdict": verdict,
        "test_fault": fault_text or None,
    }


# --- output ----------------------------------------------------------------------------------------


def render_table(result: Mapping[str, Any]) -> str:
    lines = [f"fabric probe {result.get('group') or ''}: {result['world_size']} ranks on "
             f"{len(result['nodes'])} node(s), {result['backend']}, transport "
             f"{result['transport']['kind']} ({result['transport'].get('network') or '-'})"]
    for op, data in result["operations"].items():
        lines.append(f"{op} (busbw = algbw x {data['bus_factor']:.3g})")
        lines.append(f"  {'bytes':>12} {'p50 us':>10} {'p95 us':>10} {'algbw GB/s':>11} "
                     f"{'busbw GB/s':>11} {'wrong':>6}")
        for r in data["rows"]:
            lines.append(f"  {r['bytes']:>12} {r['p50_s'] * 1e6:>10.1f} {r['p95_s'] * 1e6:>10.1f} "
                         f"{r['algbw_gb_per_s']:>11.4g} {r['busbw_gb_per_s']:>11.4g} "
                         f"{r['wrong']:>6}")
    for f in result["findings"]:
        lines.append(f"{f['status'].upper():<9} {f['reason']:<24} {f['message']}")
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


