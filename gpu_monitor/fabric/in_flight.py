"""What the fabric scheduler's leader is in the middle of: launched Jobs and bisections.

Why apart: this is the leader's in-memory work, lost with the leadership and rebuilt by the
next leader (``adopted_probe`` reads a running Job back from its labels and annotations), and
the evidence a bisection gathers for the ``GPUHealthReport`` it may file. Pure values and
bookkeeping, no API calls: scheduler.py owns the loop that launches, watches and reports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_monitor.fabric.bisect import FAIL, Bisection, PlannedProbe
from gpu_monitor.fabric.plan import KINDS, ProbeState, job_condition
from gpu_monitor.fabric.pods import (
    ANNOTATION_GROUP,
    ANNOTATION_NODES,
    LABEL_PROBE_ID,
    LABEL_PROBE_KIND,
)


@dataclass
class InFlight:
    """A launched Job the leader watches."""

    probe_id: str
    kind: str
    job_name: str
    nodes: tuple[str, ...]
    group: str
    started: float
    planned: PlannedProbe | None = None
    bisection: str | None = None  # the bisection (by the failed probe's id) this serves
    max_pods: int = 0  # the most pods seen at once (fewer later: some disappeared)
    adopted: bool = False


def adopted_probe(job: Mapping[str, Any], mono: float) -> InFlight | None:
    """A running Job a previous leader launched, to watch to the end (its verdict counts);
    None for a finished Job or one that is not a probe of ours."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    pid = labels.get(LABEL_PROBE_ID)
    if not pid:
        return None
    if job_condition(job, "Complete") or job_condition(job, "Failed"):
        return None
    try:
        nodes = tuple(json.loads((meta.get("annotations") or {}).get(ANNOTATION_NODES)
                                 or "[]"))
    except ValueError:
        nodes = ()
    kind = labels.get(LABEL_PROBE_KIND, "group")
    if kind not in KINDS or not nodes:
        return None
    group = (meta.get("annotations") or {}).get(ANNOTATION_GROUP) or nodes[0]
    return InFlight(pid, kind, meta.get("name", ""), nodes, group, mono, adopted=True)


def ops_numbers(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The numbers of a probe's summary that a report carries as evidence."""
    if not summary:
        return {}
    return {"verdict": summary.get("verdict"), "reasons": summary.get("reasons") or [],
            "ops": summary.get("ops") or {}, "transport": summary.get("transport"),
            "network": summary.get("network"), "limits": summary.get("limits"),
            "world_size": summary.get("world_size"),
            "suspect_nodes": summary.get("suspect_nodes") or []}


@dataclass
class ActiveBisection:
    """A failed group being bisected: the plan, and every probe it ran, for the report."""

    group: str
    nodes: tuple[str, ...]
    plan: Bisection
    started: float
    group_summary: Mapping[str, Any] | None
    group_job: str
    evidence: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # node -> pair summary
    probes: list[dict[str, Any]] = field(default_factory=list)

    def finished(self, p: InFlight, planned: PlannedProbe, state: ProbeState) -> None:
        """One of its probes ended: keep it (and a failed pair's numbers), tell the plan."""
        self.probes.append({"nodes": list(p.nodes), "subject": list(planned.subject),
                            "partner": planned.partner, "outcome": state.outcome,
                            "job": p.job_name, "why": state.why,
                            **({"numbers": ops_numbers(state.summary)} if state.summary
                               else {})})
        if state.outcome == FAIL and planned.is_pair and state.summary:
            self.evidence[planned.subject[0]] = {**ops_numbers(state.summary),
                                                 "partner": planned.partner,
                                                 "job": p.job_name}
        self.plan.record(planned, state.outcome)

    def report_evidence(self, node: str) -> dict[str, Any]:
        """What the GPUHealthReport for ``node`` carries: the group's numbers, the failing
        pair's, and every probe of the bisection."""
        return {
            "group": self.group, "group_nodes": list(self.nodes), "group_job": self.group_job,
            "group_probe": ops_numbers(self.group_summary),
            "pair_probe": dict(self.evidence.get(node) or {}),
            "bisection": self.probes,
            "probes_used": len(self.probes),
        }
