"""The fabric scheduler's pure parts: grouping nodes, rendering probe Jobs, reading a probe's
state from its Job and pods.

Why apart: no API calls, no clock, no threads; tested with tables of objects.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_monitor.fabric.bisect import ABANDONED, FAIL, PASS, UNKNOWN
from gpu_monitor.fabric.idle import NodeFacts, parse_active_summary
from gpu_monitor.fabric.job_parts import ensure_shm, standard_labels, with_cpu_memory
from gpu_monitor.fabric.pods import (
    ANNOTATION_GROUP,
    ANNOTATION_NODES,
    COMPONENT_PROBE,
    HOSTNAME_LABEL,
    LABEL_PROBE_ID,
    LABEL_PROBE_KIND,
    MANAGER,
)
from gpu_monitor.fabric.probe_result import parse_summary
from gpu_monitor.fabric.scheduler_settings import SchedulerSettings

KINDS = ("group", "bisect", "active-check")
OUTCOMES = (PASS, FAIL, UNKNOWN, ABANDONED)
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


# --- grouping (pure) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    name: str
    nodes: tuple[str, ...]
    topology: str = ""  # "label=value", or "" when no topology label applied


def _chunks(items: Sequence[str], size: int) -> list[tuple[str, ...]]:
    """``items`` in ceil(n/size) nearly equal consecutive chunks."""
    if not items:
        return []
    k = math.ceil(len(items) / size)
    base, extra = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        n = base + (1 if i < extra else 0)
        out.append(tuple(items[start:start + n]))
        start += n
    return out


def plan_groups(nodes: Iterable[NodeFacts], topology_labels: Sequence[str], group_size: int,
                min_group_size: int = 2) -> list[Group]:
    """Groups of at most ``group_size`` nodes sharing the first topology label present;
    topology domains with fewer than ``min_group_size`` candidates are pooled together (a
    cross-domain group) rather than left out."""
    domains: dict[tuple[str, str], list[str]] = {}
    for f in nodes:
        key = next(((k, f.labels[k]) for k in topology_labels if f.labels.get(k)), ("", ""))
        domains.setdefault(key, []).append(f.name)
    groups: list[Group] = []
    leftovers: list[str] = []
    for (key, value), names in sorted(domains.items()):
        names = sorted(names)
        if len(names) < min_group_size:
            leftovers += names
            continue
        short = key.rsplit("/", 1)[-1]
        for i, chunk in enumerate(_chunks(names, group_size)):
            label = f"{short}={value}" if key else "all"
            groups.append(Group(f"{label}.{i}", chunk, f"{key}={value}" if key else ""))
    if len(leftovers) >= min_group_size:
        for i, chunk in enumerate(_chunks(sorted(leftovers), group_size)):
            groups.append(Group(f"mixed.{i}", chunk, "mixed"))
    return groups


# --- Jobs (pure) ------------------------------------------------------------------------------------


def load_template(path: str) -> dict[str, Any]:
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    if not isinstance(data, dict) or data.get("kind") != "Job":
        raise ValueError(f"{path}: not a batch/v1 Job template")
    return data


def _set_env(container: dict[str, Any], values: Mapping[str, str]) -> None:
    env = [e for e in container.get("env") or [] if e.get("name") not in values]
    container["env"] = [{"name": k, "value": str(v)} for k, v in values.items()] + env


def render_probe_job(template: Mapping[str, Any], *, probe_id: str, kind: str,
                     nodes: Sequence[str], group: str, gpus_per_node: int,
                     settings: SchedulerSettings) -> dict[str, Any]:
    """The Indexed Job for one probe: ``len(nodes)`` pods, one per node (node affinity to the
    set, anti-affinity between the pods), each requesting ``gpus_per_node`` GPUs and the RDMA
    resources, at the idle-check priority; rank 0's pod is the torchrun master. It runs in the
    Job namespace (``settings.job_namespace``), never the daemon's; the cpu/memory requests
    the template leaves out come from ``settings.probe_resources``, and a memory-backed
    ``/dev/shm`` is added where the template has none."""
    job = copy.deepcopy(dict(template))
    name = f"gpu-monitor-fabric-{probe_id}"
    ns = settings.job_namespace
    labels = {**standard_labels(COMPONENT_PROBE, MANAGER, settings.instance),
              LABEL_PROBE_ID: probe_id, LABEL_PROBE_KIND: kind}
    meta = job.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta["name"], meta["namespace"] = name, ns
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["annotations"] = {**(meta.get("annotations") or {}),
                           ANNOTATION_NODES: json.dumps(list(nodes)), ANNOTATION_GROUP: group}
    spec = job.setdefault("spec", {})
    spec["completionMode"] = "Indexed"
    spec["completions"] = spec["parallelism"] = len(nodes)
    spec.setdefault("backoffLimit", 0)
    pod = spec.setdefault("template", {})
    pmeta = pod.setdefault("metadata", {})
    pmeta["labels"] = {**(pmeta.get("labels") or {}), **labels}
    pspec = pod.setdefault("spec", {})
    pspec["priorityClassName"] = settings.priority_class
    pspec.setdefault("restartPolicy", "Never")
    affinity = pspec.setdefault("affinity", {})
    affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}]}]}}
    affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {LABEL_PROBE_ID: probe_id}},
         "topologyKey": HOSTNAME_LABEL}]}
    subdomain = pspec.get("subdomain")
    master = f"{name}-0.{subdomain}.{ns}.svc" if subdomain else f"{name}-0"
    containers = pspec.get("containers") or []
    if not containers:
        raise ValueError("the Job template has no container")
    main = containers[0]
    if settings.image:
        main["image"] = settings.image
    _set_env(main, {"NNODES": str(len(nodes)), "GPUS_PER_NODE": str(gpus_per_node),
                    "MASTER_ADDR": master, "GPU_MONITOR_FABRIC_GROUP": group})
    if settings.probe_args:
        main["args"] = list(main.get("args") or []) + list(settings.probe_args)
    res = with_cpu_memory(main.get("resources"), settings.probe_resources)
    want = {settings.gpu_resource: str(gpus_per_node), **dict(settings.rdma_resources)}
    res["requests"] = {**(res.get("requests") or {}), **want}
    res["limits"] = {**(res.get("limits") or {}), **want}
    main["resources"] = res
    ensure_shm(pspec, main)
    return job


# --- probe state (pure) ------------------------------------------------------------------------------


def _terminated_message(pod: Mapping[str, Any]) -> str | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or \
            (cs.get("lastState") or {}).get("terminated") or {}
        if term.get("message"):
            return str(term["message"])
    return None


def _pod_index(pod: Mapping[str, Any]) -> int | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(INDEX_LABEL) or \
        (meta.get("annotations") or {}).get(INDEX_ANNOTATION)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _disrupted(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp") and \
            (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        return True
    return any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return c
    return None


@dataclass(frozen=True)
class ProbeState:
    """Where a launched Job stands. ``outcome`` is None while it runs."""

    outcome: str | None
    why: str = ""
    summary: Mapping[str, Any] | None = None
    partial: tuple[Mapping[str, Any], ...] = ()


def probe_state(job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]], expected: int,
                age_s: float, *, schedule_timeout_s: float, probe_timeout_s: float,
                kind: str = "group", max_pods_seen: int = 0) -> ProbeState:
    """Classify a probe from its Job and pods (pure; table-tested).

    A verdict from rank 0 (or any rank's copy of it) decides pass / fail / unknown even if
    something happened afterwards. Without one: pods preempted or deleted, the Job gone, or
    never scheduled within ``schedule_timeout_s`` -> abandoned; the Job failed or overran
    ``probe_timeout_s`` without a verdict -> unknown.
    """
    parse = parse_active_summary if kind == "active-check" else parse_summary
    summaries = []
    for p in sorted(pods, key=lambda p: (_pod_index(p) is None, _pod_index(p) or 0)):
        s = parse(_terminated_message(p))
        if s is not None:
            summaries.append(s)
    decided = [s for s in summaries if s.get("verdict") in ("healthy", "unhealthy", "unknown")
               and not s.get("error")]
    if decided:
        s = decided[0]
        outcome = {"healthy": PASS, "unhealthy": FAIL}.get(s["verdict"], UNKNOWN)
        return ProbeState(outcome, f"verdict {s['verdict']}", s, tuple(summaries))
    disrupted = [p for p in pods if _disrupted(p)]
    if job is None:
        return ProbeState(ABANDONED, "the Job was deleted", None, tuple(summaries))
    if disrupted:
        names = ", ".join(sorted((p.get("metadata") or {}).get("name", "?") for p in disrupted))
        return ProbeState(ABANDONED, f"preempted or deleted: {names}", None, tuple(summaries))
    failed = job_condition(job, "Failed")
    if failed is not None:
        reason = str(failed.get("reason") or "")
        if reason == "PodFailurePolicy" or len(pods) < max_pods_seen:
            return ProbeState(ABANDONED, f"the Job failed ({reason}): a pod was disrupted",
                              None, tuple(summaries))
        if reason == "DeadlineExceeded":
            return ProbeState(UNKNOWN, "the Job overran its deadline", None, tuple(summaries))
        errors = [s.get("error") for s in summaries if s.get("error")]
        why = f"the Job failed ({reason or 'no reason'})" + (f": {errors[0]}" if errors else "")
        return ProbeState(UNKNOWN, why, None, tuple(summaries))
    if job_condition(job, "Complete") is not None:
        return ProbeState(UNKNOWN, "the Job completed without a verdict", None,
                          tuple(summaries))
    if len(pods) < max_pods_seen:
        return ProbeState(ABANDONED, f"{max_pods_seen - len(pods)} pod(s) disappeared", None,
                          tuple(summaries))
    running = [p for p in pods if (p.get("status") or {}).get("phase") in
               ("Running", "Succeeded", "Failed")]
    if len(running) < expected and age_s >= schedule_timeout_s:
        return ProbeState(ABANDONED, f"only {len(running)} of {expected} pods started within "
                                     f"{schedule_timeout_s:.0f} s", None, tuple(summaries))
    if age_s >= probe_timeout_s:
        return ProbeState(UNKNOWN, f"no verdict within {probe_timeout_s:.0f} s", None,
                          tuple(summaries))
    return ProbeState(None, "running")
