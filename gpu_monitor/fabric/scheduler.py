"""``gpu-monitor fabric-scheduler``: probe idle GPU nodes' fabric, bisect failures, report.

A Deployment (daemonset/fabric/) whose replicas elect one leader through a
coordination.k8s.io/v1 Lease; only the leader acts. Every ``interval_s`` (and whenever one of
its own Jobs or pods changes, through a watch) the leader

1. lists the GPU nodes and the pods holding GPUs, and decides which nodes may be borrowed
   (idle.py: Ready, not quarantined, not tainted by gpu-monitor, no pod requesting GPUs, idle
   for ``idle_for_s``, not probed within ``probe_interval_s``);
2. groups them by the first topology label present (``topology_labels``: rack, rail, block...)
   into groups of at most ``group_size`` nodes, and launches one Indexed Job per group from the
   template (daemonset/fabric/job-template.yaml: one pod per node, all its GPUs and the RDMA
   resources, a low PriorityClass that never preempts, torchrun + ``gpu-monitor fabric-probe``);
3. watches each Job: the probe's verdict comes back in the pods' termination messages. A Job
   whose pods were preempted (a workload needed the GPUs), deleted, or never scheduled is
   *abandoned*: recorded as such, never as a pass or a fail, and deleted to free the other
   nodes;
4. bisects a failed group (bisect.py: halves, then pairs, each with a known-good node) until
   the bad node is named, then files a ``GPUHealthReport`` for it (reason
   ``FabricProbeFailed``, the group's and the failing pair's numbers as evidence); the node's
   own daemon acts on it;
5. optionally runs the single-node active checks on nodes idle long enough (idle.py);
6. keeps a per-node record (last probe, outcome, last report) in a ConfigMap so a new leader
   does not re-probe everything, and serves metrics (per group and per node pair busbw and
   latency, last probe time per node, probe outcomes) on its own ``/metrics``.

Only the leader writes, and a leader that cannot renew within ``renew_deadline_s`` stops
acting before another can take over (``lease_duration_s`` later): client-go's rules.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import socket
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.fabric.api import FabricApi
from gpu_monitor.fabric.bisect import ABANDONED, FAIL, PASS, UNKNOWN, Bisection, PlannedProbe
from gpu_monitor.fabric.cache import ListWatchCache
from gpu_monitor.fabric.idle import (
    ANNOTATION_GROUP,
    ANNOTATION_NODES,
    DEFAULT_CHECKS,
    DEFAULT_TAINT_KEY,
    GPU_RESOURCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PROBE_ID,
    LABEL_PROBE_KIND,
    MANAGER,
    PRIORITY_CLASS,
    ActiveCheckSpec,
    IdleTracker,
    NodeFacts,
    build_active_check_job,
    decide,
    ineligible_reason,
    node_facts,
    slim_node,
    slim_pod,
)
from gpu_monitor.fabric.lease import LeaderElector
from gpu_monitor.fabric.metrics import serve_metrics
from gpu_monitor.fabric.plan import (
    KINDS,
    ProbeState,
    job_condition,
    load_template,
    plan_groups,
    probe_state,
    render_probe_job,
)
from gpu_monitor.model import iso, parse_iso

log = logging.getLogger(__name__)

DEFAULT_TOPOLOGY_LABELS = ("topology.kubernetes.io/rack", "nvidia.com/rail",
                           "network.topology.kubernetes.io/block")
DEFAULT_TEMPLATE = "/etc/gpu-monitor/fabric/job-template.yaml"
REPORT_REASON = "FabricProbeFailed"
REPORT_SOURCE = "gpu-monitor fabric-scheduler"
STATE_KEY = "nodes.json"

#: Every (apiGroup, resource, verbs) the scheduler uses; daemonset/fabric/rbac.yaml grants
#: exactly these (tests/fabric hold the manifests to it). Cluster-wide it only reads: nodes
#: (candidates, topology labels) and pods (which nodes run GPU workloads; its own probe pods
#: are watched with the same grant). In its namespace: its Jobs, Lease, record and reports.
RBAC_CLUSTER: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("get", "list", "watch")),
    ("", "pods", ("get", "list", "watch")),
)
RBAC_NAMESPACED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("batch", "jobs", ("get", "list", "watch", "create", "delete")),
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
    ("", "configmaps", ("get", "create", "update")),
    ("gpu-monitor.io", "gpuhealthreports", ("create",)),
)


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchedulerSettings:
    """Everything the scheduler is told (flags, or a YAML mapping with these keys)."""

    namespace: str = "gpu-monitor"
    identity: str = ""
    lease_name: str = "gpu-monitor-fabric-scheduler"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    interval_s: float = 30.0
    node_selector: str = "nvidia.com/gpu.present=true"
    gpu_resource: str = GPU_RESOURCE
    taint_key: str = DEFAULT_TAINT_KEY
    topology_labels: tuple[str, ...] = DEFAULT_TOPOLOGY_LABELS
    group_size: int = 8
    min_group_size: int = 2
    idle_for_s: float = 600.0
    probe_interval_s: float = 86400.0
    max_concurrent_probes: int = 2
    job_template: str = DEFAULT_TEMPLATE
    image: str | None = None
    rdma_resources: Mapping[str, str] = field(default_factory=dict)
    priority_class: str = PRIORITY_CLASS
    probe_args: tuple[str, ...] = ()
    schedule_timeout_s: float = 300.0
    probe_timeout_s: float = 1800.0
    bisect: bool = True
    bisect_timeout_s: float = 6 * 3600.0
    report_namespace: str = "gpu-monitor"
    report_cooldown_s: float = 86400.0
    state_configmap: str = "gpu-monitor-fabric-state"
    active_checks: bool = False
    active_check_interval_s: float = 7 * 86400.0
    active_check_list: tuple[str, ...] = DEFAULT_CHECKS
    active_check_deliver: str = "drop-dir"
    max_concurrent_active_checks: int = 4
    active_check_image: str | None = None

    def validate(self) -> SchedulerSettings:
        problems = []
        if self.min_group_size < 2:
            problems.append("min_group_size must be at least 2 (a probe must cross nodes)")
        if self.group_size < self.min_group_size:
            problems.append("group_size must be at least min_group_size")
        if not self.renew_deadline_s < self.lease_duration_s:
            problems.append("renew_deadline_s must be shorter than lease_duration_s")
        if self.retry_period_s <= 0 or self.interval_s <= 0:
            problems.append("retry_period_s and interval_s must be positive")
        if self.active_check_deliver not in ("drop-dir", "crd", "none"):
            problems.append("active_check_deliver must be drop-dir, crd or none")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def settings_from_mapping(data: Mapping[str, Any], base: SchedulerSettings | None = None
                          ) -> SchedulerSettings:
    """Settings from a YAML mapping; unknown keys are an error (a typo must not be ignored)."""
    known = {f.name: f for f in fields(SchedulerSettings)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown fabric-scheduler setting(s): {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("topology_labels", "probe_args", "active_check_list"):
            value = tuple(value or ())
        elif key == "rdma_resources":
            value = {str(k): str(v) for k, v in (value or {}).items()}
        values[key] = value
    return replace(base or SchedulerSettings(), **values).validate()


# --- the scheduler -----------------------------------------------------------------------------------


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


@dataclass
class ActiveBisection:
    group: str
    nodes: tuple[str, ...]
    plan: Bisection
    started: float
    group_summary: Mapping[str, Any] | None
    group_job: str
    evidence: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # node -> pair summary
    probes: list[dict[str, Any]] = field(default_factory=list)


def _ops_numbers(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    if not summary:
        return {}
    return {"verdict": summary.get("verdict"), "reasons": summary.get("reasons") or [],
            "ops": summary.get("ops") or {}, "transport": summary.get("transport"),
            "network": summary.get("network"), "limits": summary.get("limits"),
            "world_size": summary.get("world_size"),
            "suspect_nodes": summary.get("suspect_nodes") or []}


class FabricScheduler:
    """The leader's work (``tick``) and the candidate's loop (``run``)."""

    def __init__(self, api: FabricApi, settings: SchedulerSettings, *,
                 template: Mapping[str, Any] | None = None, clock: Clock | None = None,
                 elector: LeaderElector | None = None, always_lead: bool = False):
        self.api = api
        self.settings = settings.validate()
        self.clock = clock or Clock()
        self.identity = settings.identity or _default_identity()
        self.template = dict(template) if template is not None else \
            load_template(settings.job_template)
        self.elector = elector if elector is not None or always_lead else LeaderElector(
            api, settings.namespace, settings.lease_name, self.identity,
            lease_duration_s=settings.lease_duration_s,
            renew_deadline_s=settings.renew_deadline_s, clock=self.clock)
        self.idle = IdleTracker()
        self.in_flight: dict[str, InFlight] = {}
        self.bisections: dict[str, ActiveBisection] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self._records_rv: str | None = None
        self._loaded = False
        self._dirty = False
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._watch_threads: list[threading.Thread] = []
        # Nodes and active pods, listed once and watched (``run`` starts them; ``tick`` alone,
        # as the tests drive it, lists every round).
        self.caches: dict[str, ListWatchCache] = {}
        self._was_leader = False
        # metrics
        self.counts: Counter[tuple[str, str]] = Counter()
        self.reports_filed = 0
        self.group_metrics: dict[str, dict[str, Mapping[str, Any]]] = {}
        self.pair_metrics: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
        self.idle_nodes = 0
        self.last_tick_error: str | None = None
        self._facts: dict[str, NodeFacts] = {}
        self._release_on_stop = True

    # --- leadership and the loop ---------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def run(self) -> None:
        """Campaign for the lease and, while leading, tick; returns after ``stop()``."""
        stop = self._stop
        self._start_watches(stop)
        self.start_caches()
        s = self.settings
        min_gap = min(0.5, s.interval_s / 2)
        next_renew = next_tick = -math.inf
        last_tick = -math.inf
        try:
            while not stop.is_set():
                now = self.clock.monotonic()
                if self.elector is not None and now >= next_renew:
                    self.elector.try_acquire_or_renew()
                    next_renew = now + s.retry_period_s
                leading = self.is_leader
                if leading and not self._was_leader:
                    log.info("%s leads the fabric scheduler", self.identity)
                    self._loaded = False  # re-read the record and adopt running Jobs
                    next_tick = -math.inf
                if not leading and self._was_leader:
                    log.warning("%s lost the lease; stopping", self.identity)
                    self._forget_in_memory()
                self._was_leader = leading
                woken = self._wake.is_set() and now - last_tick >= min_gap
                if leading and (now >= next_tick or woken):
                    self._wake.clear()
                    self.safe_tick()
                    last_tick = self.clock.monotonic()
                    next_tick = last_tick + s.interval_s
                deadline = next_renew if self.elector is not None else math.inf
                if leading:
                    deadline = min(deadline, next_tick,
                                   last_tick + min_gap if self._wake.is_set() else math.inf)
                wait = min(s.retry_period_s, max(0.01, deadline - self.clock.monotonic()))
                if self._wake.is_set():
                    stop.wait(wait)  # a pending wake-up: sleep without spinning on it
                else:
                    self._wake.wait(wait)
        finally:
            self.stop_caches()
            if self.elector is not None and self._release_on_stop:
                self.elector.release()
            self._was_leader = False

    def stop(self, release: bool = True) -> None:
        """End ``run``; ``release=False`` keeps the lease (a crash, as the others see it)."""
        self._release_on_stop = release
        self._stop.set()
        self._wake.set()

    def _current(self, kind: str, lister: Callable[[], list[dict]]) -> list[dict]:
        """The cache's objects when it can be trusted, else a list now."""
        cache = self.caches.get(kind)
        items = cache.items() if cache is not None else None
        return items if items is not None else lister()

    def start_caches(self) -> None:
        """List nodes and active pods once and watch them from then on (see fabric/cache.py)."""
        if self.caches:
            return
        sel = self.settings.node_selector
        self.caches = {
            "nodes": ListWatchCache("nodes", lambda: self.api.list_nodes_rv(sel),
                                    lambda **kw: self.api.watch_nodes(sel, **kw),
                                    transform=slim_node),
            "pods": ListWatchCache("pods", self.api.list_active_pods_rv,
                                   self.api.watch_active_pods, transform=slim_pod),
        }
        for cache in self.caches.values():
            cache.start()

    def stop_caches(self) -> None:
        caches, self.caches = self.caches, {}
        for cache in caches.values():
            cache.stop()

    def _start_watches(self, stop: threading.Event) -> None:
        if self._watch_threads:
            return
        selector = f"{LABEL_MANAGED_BY}={MANAGER}"
        for kind in ("jobs", "pods"):
            t = threading.Thread(target=self.api.watch, name=f"fabric-watch-{kind}",
                                 args=(kind, self.settings.namespace, selector, stop,
                                       self._wake.set), daemon=True)
            t.start()
            self._watch_threads.append(t)

    def _forget_in_memory(self) -> None:
        with self._lock:
            self.in_flight.clear()
            self.bisections.clear()
            self._loaded = False

    def safe_tick(self) -> None:
        try:
            self.tick()
            self.last_tick_error = None
        except Exception as exc:  # noqa: BLE001 - the loop must survive an API outage
            self.last_tick_error = f"{type(exc).__name__}: {exc}"
            log.warning("fabric scheduler tick failed: %s", self.last_tick_error)

    # --- one round ---------------------------------------------------------------------------------

    def tick(self) -> None:
        """One round as the leader (tests call it directly)."""
        with self._lock:
            s = self.settings
            if not self._loaded:
                self._load_records()
                self._adopt_jobs()
                self._loaded = True
            now, mono = self.clock.now(), self.clock.monotonic()
            nodes = {n["metadata"]["name"]: n for n in self._current(
                "nodes", lambda: self.api.list_nodes(s.node_selector))}
            by_node: dict[str, list[dict]] = {}
            for p in self._current("pods", self.api.list_active_pods):
                node = (p.get("spec") or {}).get("nodeName")
                if node:
                    by_node.setdefault(node, []).append(p)
            tolerations = ((self.template.get("spec") or {}).get("template") or {}).get(
                "spec", {}).get("tolerations") or []
            facts = {name: node_facts(obj, by_node.get(name, ()), resource=s.gpu_resource,
                                      taint_key=s.taint_key, tolerations=tolerations)
                     for name, obj in nodes.items()}
            for name, f in facts.items():
                # Idle time counts only while the node could be borrowed; our own probe pods
                # do not reset it.
                blocked = ineligible_reason(replace(f, our_pods=())) is not None
                self.idle.observe(name, blocked, mono)
            self.idle.forget(facts)
            self._facts = facts

            for probe in list(self.in_flight.values()):
                self._reconcile(probe, now, mono)

            busy = {n for p in self.in_flight.values() for n in p.nodes}
            available = {n for n, f in facts.items()
                         if ineligible_reason(f) is None and n not in busy}
            self.idle_nodes = sum(1 for n in available
                                  if (self.idle.idle_for(n, mono) or 0) >= s.idle_for_s)
            self._advance_bisections(available, now, mono)

            busy = {n for p in self.in_flight.values() for n in p.nodes}
            held = {n for b in self.bisections.values() for n in b.nodes}
            free = available - busy - held
            self._launch_groups(facts, free, now, mono)
            if s.active_checks:
                busy = {n for p in self.in_flight.values() for n in p.nodes}
                self._launch_active_checks(facts, free - busy, now, mono)
            if self._dirty:
                self._save_records()

    # --- launching ---------------------------------------------------------------------------------

    def _fabric_in_flight(self) -> int:
        return sum(1 for p in self.in_flight.values() if p.kind in ("group", "bisect"))

    def _launch_groups(self, facts: Mapping[str, NodeFacts], free: set[str], now: datetime,
                       mono: float) -> None:
        s = self.settings
        if self._fabric_in_flight() >= s.max_concurrent_probes:
            return
        ready = []
        for name in sorted(free):
            d = decide(facts[name], self.idle.idle_for(name, mono), self._last(name, "probe"),
                       now, idle_for_s=s.idle_for_s, interval_s=s.probe_interval_s)
            if d.run:
                ready.append(facts[name])
        for g in plan_groups(ready, s.topology_labels, s.group_size, s.min_group_size):
            if self._fabric_in_flight() >= s.max_concurrent_probes:
                break
            if set(g.nodes) - free:
                continue
            gpus = min(facts[n].gpus for n in g.nodes)
            if self._launch("group", g.nodes, g.name, gpus, mono) is not None:
                free -= set(g.nodes)

    def _launch(self, kind: str, nodes: Sequence[str], group: str, gpus: int, mono: float, *,
                planned: PlannedProbe | None = None, bisection: str | None = None
                ) -> InFlight | None:
        from gpu_monitor.kube.errors import KubeError

        probe_id = uuid.uuid4().hex[:10]
        job = render_probe_job(self.template, probe_id=probe_id, kind=kind, nodes=nodes,
                               group=group, gpus_per_node=gpus, settings=self.settings)
        try:
            self.api.create_job(self.settings.namespace, job)
        except KubeError as err:
            log.warning("cannot create the probe Job for %s: %s", group, err)
            return None
        p = InFlight(probe_id, kind, job["metadata"]["name"], tuple(nodes), group, mono,
                     planned, bisection)
        self.in_flight[probe_id] = p
        log.info("launched %s probe %s on %s (%s)", kind, p.job_name, ", ".join(nodes), group)
        return p

    def _launch_active_checks(self, facts: Mapping[str, NodeFacts], free: set[str],
                              now: datetime, mono: float) -> None:
        from gpu_monitor.kube.errors import KubeError

        s = self.settings
        template_image = (((self.template.get("spec") or {}).get("template") or {}).get(
            "spec", {}).get("containers") or [{}])[0].get("image")
        spec = ActiveCheckSpec(image=s.active_check_image or s.image or template_image
                               or ActiveCheckSpec.image,
                               namespace=s.namespace, checks=tuple(s.active_check_list),
                               priority_class=s.priority_class, resource=s.gpu_resource,
                               deliver=s.active_check_deliver)
        for name in sorted(free):
            running = sum(1 for p in self.in_flight.values() if p.kind == "active-check")
            if running >= s.max_concurrent_active_checks:
                return
            d = decide(facts[name], self.idle.idle_for(name, mono), self._last(name, "check"),
                       now, idle_for_s=s.idle_for_s, interval_s=s.active_check_interval_s)
            if not d.run:
                continue
            probe_id = uuid.uuid4().hex[:10]
            job = build_active_check_job(name, facts[name].gpus, spec, probe_id=probe_id)
            try:
                self.api.create_job(s.namespace, job)
            except KubeError as err:
                log.warning("cannot create the active-check Job for %s: %s", name, err)
                continue
            self.in_flight[probe_id] = InFlight(probe_id, "active-check",
                                                job["metadata"]["name"], (name,), name, mono)
            log.info("launched active checks on %s (%s)", name, d.why)

    # --- watching ----------------------------------------------------------------------------------

    def _reconcile(self, p: InFlight, now: datetime, mono: float) -> None:
        s = self.settings
        jobs = self.api.list_jobs(s.namespace, f"{LABEL_PROBE_ID}={p.probe_id}")
        job = jobs[0] if jobs else None
        pods = self.api.list_pods(s.namespace, f"{LABEL_PROBE_ID}={p.probe_id}")
        state = probe_state(job, pods, len(p.nodes), mono - p.started,
                            schedule_timeout_s=s.schedule_timeout_s,
                            probe_timeout_s=s.probe_timeout_s, kind=p.kind,
                            max_pods_seen=p.max_pods)
        p.max_pods = max(p.max_pods, len(pods))
        if state.outcome is None:
            return
        del self.in_flight[p.probe_id]
        self.counts[(p.kind, state.outcome)] += 1
        log.info("%s probe %s on %s: %s (%s)", p.kind, p.job_name, ", ".join(p.nodes),
                 state.outcome, state.why)
        if state.outcome in (ABANDONED, UNKNOWN) and job is not None:
            self.api.delete_job(s.namespace, p.job_name)  # free the other nodes' GPUs now
        if p.kind == "active-check":
            self._finish_active_check(p, state, now)
            return
        self._record_numbers(p, state)
        if p.kind == "group":
            self._finish_group(p, state, now, mono)
        elif p.kind == "bisect" and p.bisection in self.bisections and p.planned is not None:
            b = self.bisections[p.bisection]
            b.probes.append({"nodes": list(p.nodes), "subject": list(p.planned.subject),
                             "partner": p.planned.partner, "outcome": state.outcome,
                             "job": p.job_name, "why": state.why,
                             **({"numbers": _ops_numbers(state.summary)} if state.summary
                                else {})})
            if state.outcome == FAIL and p.planned.is_pair and state.summary:
                b.evidence[p.planned.subject[0]] = {**_ops_numbers(state.summary),
                                                    "partner": p.planned.partner,
                                                    "job": p.job_name}
            b.plan.record(p.planned, state.outcome)
        elif p.kind == "bisect" and state.outcome == PASS:
            self._mark(p.nodes, "probe", PASS, now, p.group)  # adopted from another leader

    def _record_numbers(self, p: InFlight, state: ProbeState) -> None:
        if not state.summary:
            return
        ops = state.summary.get("ops") or {}
        if p.kind == "group":
            self.group_metrics[p.group] = {op: dict(v) for op, v in ops.items()}
        if len(p.nodes) == 2:
            a, b = sorted(p.nodes)
            self.pair_metrics[(a, b)] = {op: dict(v) for op, v in ops.items()}

    def _finish_group(self, p: InFlight, state: ProbeState, now: datetime, mono: float) -> None:
        if state.outcome == PASS:
            self._mark(p.nodes, "probe", PASS, now, p.group)
            return
        if state.outcome == ABANDONED:
            self._mark(p.nodes, "abandoned", ABANDONED, now, p.group, partial=state.partial)
            return
        if state.outcome == UNKNOWN:
            self._mark(p.nodes, "probe", UNKNOWN, now, p.group)
            return
        # Failed: find the node(s) to blame.
        if not self.settings.bisect:
            self._mark(p.nodes, "probe", FAIL, now, p.group)
            return
        suspects = [n for n in (state.summary or {}).get("suspect_nodes") or [] if n in p.nodes]
        plan = Bisection(p.nodes, known_good=self._known_good(exclude=p.nodes, now=now),
                         suspects=suspects)
        self.bisections[p.probe_id] = ActiveBisection(p.group, p.nodes, plan, mono,
                                                      state.summary, p.job_name)
        log.warning("group %s failed (%s); bisecting %d nodes", p.group, state.why,
                    len(p.nodes))

    def _advance_bisections(self, available: set[str], now: datetime, mono: float) -> None:
        s = self.settings
        for name, b in list(self.bisections.items()):
            if mono - b.started > s.bisect_timeout_s and not b.plan.done:
                log.warning("bisection of %s timed out", b.group)
                b.plan.abort()
            serving = any(p.bisection == name for p in self.in_flight.values())
            if not serving and not b.plan.done:
                if self._fabric_in_flight() >= s.max_concurrent_probes:
                    continue
                others = {n for o, ob in self.bisections.items() if o != name for n in ob.nodes}
                busy = {n for p in self.in_flight.values() for n in p.nodes}
                planned = b.plan.next_probe(available - others - busy)
                if planned is not None:
                    gpus = self._gpus_hint(planned.nodes)
                    if self._launch("bisect", planned.nodes, b.group, gpus, mono,
                                    planned=planned, bisection=name) is None:
                        b.plan.record(planned, ABANDONED)
                continue
            if b.plan.done and not serving:
                self._finish_bisection(b, now)
                del self.bisections[name]

    def _gpus_hint(self, nodes: Sequence[str]) -> int:
        gpus = [self._facts[n].gpus for n in nodes if n in self._facts]
        return max(1, min(gpus)) if gpus else 1

    def _finish_bisection(self, b: ActiveBisection, now: datetime) -> None:
        result = b.plan.result()
        self._mark(result.cleared, "probe", PASS, now, b.group)
        if result.inconclusive:
            self._mark(result.inconclusive, "probe", "inconclusive", now, b.group)
        log.warning("bisection of %s: bad %s, inconclusive %s, cleared %d in %d probes",
                    b.group, list(result.bad) or "none", list(result.inconclusive) or "none",
                    len(result.cleared), len(result.probes))
        for node in result.bad:
            self._mark((node,), "probe", FAIL, now, b.group)
            self._report(node, b, now)

    def _report(self, node: str, b: ActiveBisection, now: datetime) -> None:
        from gpu_monitor.kube.errors import KubeError
        from gpu_monitor.remediate.reports import report_object

        rec = self.records.setdefault(node, {})
        last = rec.get("reported_at")
        if last and (now - parse_iso(last)).total_seconds() < self.settings.report_cooldown_s:
            log.info("node %s was reported at %s; not again", node, last)
            return
        evidence = {
            "group": b.group, "group_nodes": list(b.nodes), "group_job": b.group_job,
            "group_probe": _ops_numbers(b.group_summary),
            "pair_probe": dict(b.evidence.get(node) or {}),
            "bisection": b.probes,
            "probes_used": len(b.probes),
        }
        body = report_object(node, REPORT_REASON, REPORT_SOURCE, evidence, now,
                             self.settings.report_namespace)
        try:
            self.api.create_report(self.settings.report_namespace, body)
        except KubeError as err:
            log.warning("cannot file a GPUHealthReport for %s: %s", node, err)
            return
        rec["reported_at"] = iso(now)
        self.reports_filed += 1
        self._dirty = True
        log.warning("filed a GPUHealthReport for %s (%s)", node, REPORT_REASON)

    def _finish_active_check(self, p: InFlight, state: ProbeState, now: datetime) -> None:
        node = p.nodes[0]
        if state.outcome == ABANDONED:
            self._mark((node,), "check-abandoned", ABANDONED, now, p.group,
                       partial=state.partial)
        else:
            self._mark((node,), "check", state.outcome or UNKNOWN, now, p.group)

    # --- the record ------------------------------------------------------------------------------

    def _last(self, node: str, what: str) -> datetime | None:
        raw = self.records.get(node, {}).get(f"last_{what}")
        return parse_iso(raw) if raw else None

    def _mark(self, nodes: Iterable[str], what: str, outcome: str, now: datetime, group: str,
              partial: Sequence[Mapping[str, Any]] = ()) -> None:
        for n in nodes:
            rec = self.records.setdefault(n, {})
            rec[f"last_{what}"] = iso(now)
            rec[f"{what}_outcome"] = outcome
            rec[f"{what}_group"] = group
            if partial:
                rec[f"{what}_partial"] = [dict(x) for x in partial][:4]
        self._dirty = True

    def _known_good(self, exclude: Iterable[str], now: datetime) -> list[str]:
        skip = set(exclude)
        good = []
        for n, rec in self.records.items():
            if n in skip or rec.get("probe_outcome") != PASS or not rec.get("last_probe"):
                continue
            age = (now - parse_iso(rec["last_probe"])).total_seconds()
            if age <= self.settings.probe_interval_s:
                good.append((age, n))
        return [n for _, n in sorted(good)]

    def _load_records(self) -> None:
        cm = self.api.get_configmap(self.settings.namespace, self.settings.state_configmap)
        if cm is None:
            self._records_rv = None
            return
        self._records_rv = (cm.get("metadata") or {}).get("resourceVersion")
        try:
            data = json.loads((cm.get("data") or {}).get(STATE_KEY) or "{}")
        except ValueError:
            log.warning("the fabric record %s is not JSON; starting afresh",
                        self.settings.state_configmap)
            data = {}
        if isinstance(data, dict):
            for node, rec in data.items():
                if isinstance(rec, dict):
                    self.records[node] = {**rec, **self.records.get(node, {})}

    def _save_records(self) -> None:
        from gpu_monitor.kube.errors import KubeError

        s = self.settings
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": s.state_configmap, "namespace": s.namespace,
                             "labels": {LABEL_NAME: "gpu-monitor", LABEL_MANAGED_BY: MANAGER}},
                "data": {STATE_KEY: json.dumps(self.records, sort_keys=True)}}
        for _ in range(3):
            try:
                if self._records_rv is None:
                    made = self.api.create_configmap(s.namespace, body)
                else:
                    body["metadata"]["resourceVersion"] = self._records_rv
                    made = self.api.replace_configmap(s.namespace, s.state_configmap, body)
                self._records_rv = (made or {}).get("metadata", {}).get("resourceVersion")
                self._dirty = False
                return
            except KubeError as err:
                if err.status not in (404, 409):
                    log.warning("cannot save the fabric record: %s", err)
                    return
                mine = copy.deepcopy(self.records)
                self._load_records()  # someone else wrote it: merge ours over theirs
                for node, rec in mine.items():
                    self.records[node] = {**self.records.get(node, {}), **rec}
                body["data"][STATE_KEY] = json.dumps(self.records, sort_keys=True)
                body["metadata"].pop("resourceVersion", None)

    def _adopt_jobs(self) -> None:
        """Jobs a previous leader launched: watch them to the end (their verdicts count)."""
        mono = self.clock.monotonic()
        for job in self.api.list_jobs(self.settings.namespace, f"{LABEL_MANAGED_BY}={MANAGER}"):
            meta = job.get("metadata") or {}
            labels = meta.get("labels") or {}
            pid = labels.get(LABEL_PROBE_ID)
            if not pid or pid in self.in_flight:
                continue
            if job_condition(job, "Complete") or job_condition(job, "Failed"):
                continue
            try:
                nodes = tuple(json.loads((meta.get("annotations") or {}).get(ANNOTATION_NODES)
                                         or "[]"))
            except ValueError:
                nodes = ()
            kind = labels.get(LABEL_PROBE_KIND, "group")
            if kind not in KINDS or not nodes:
                continue
            group = (meta.get("annotations") or {}).get(ANNOTATION_GROUP) or nodes[0]
            self.in_flight[pid] = InFlight(pid, kind, meta.get("name", ""), nodes, group, mono,
                                           adopted=True)
            log.info("adopted %s probe %s from a previous leader", kind, meta.get("name"))

    # --- metrics -------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "leader": self.is_leader,
                "counts": dict(self.counts),
                "reports": self.reports_filed,
                "groups": copy.deepcopy(self.group_metrics),
                "pairs": copy.deepcopy(self.pair_metrics),
                "records": copy.deepcopy(self.records),
                "in_flight": Counter(p.kind for p in self.in_flight.values()),
                "bisections": len(self.bisections),
                "idle_nodes": self.idle_nodes,
            }


def _default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:6]}"


# --- the command ----------------------------------------------------------------------------------------


ApiFactory = Callable[[argparse.Namespace], Any]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--settings", metavar="FILE",
                   help="YAML mapping of scheduler settings (docs/fabric.md); flags override")
    p.add_argument("--namespace", default=None, help="namespace of the Jobs, Lease, record "
                                                     "(default gpu-monitor)")
    p.add_argument("--identity", default=None, help="lease identity (default pod name + id)")
    p.add_argument("--job-template", default=None, metavar="FILE",
                   help=f"probe Job template (default {DEFAULT_TEMPLATE})")
    p.add_argument("--image", default=None, help="image for probe pods (overrides the template)")
    p.add_argument("--listen", default="0.0.0.0:9426", metavar="HOST:PORT",
                   help="/metrics endpoint (empty: none)")
    p.add_argument("--interval-s", type=float, default=None, help="seconds between rounds")
    p.add_argument("--idle-for-s", type=float, default=None,
                   help="how long a node must be idle before it is borrowed")
    p.add_argument("--probe-interval-s", type=float, default=None,
                   help="how often each node is probed at most")
    p.add_argument("--group-size", type=int, default=None, help="nodes per probe group")
    p.add_argument("--topology-label", action="append", default=None, metavar="LABEL",
                   help="group by this node label (repeatable, first present wins)")
    p.add_argument("--rdma-resource", action="append", default=None, metavar="NAME=COUNT",
                   help="extended resource each probe pod requests (repeatable), e.g. "
                        "rdma/ib=8")
    p.add_argument("--max-concurrent-probes", type=int, default=None)
    p.add_argument("--active-checks", action="store_true", default=None,
                   help="also run the single-node active checks on idle nodes")
    p.add_argument("--once", action="store_true",
                   help="one round without leader election (debugging), then exit")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def settings_from_args(args: argparse.Namespace) -> SchedulerSettings:
    import yaml

    base = SchedulerSettings()
    if args.settings:
        with open(args.settings, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{args.settings}: not a mapping")
        base = settings_from_mapping(data)
    flags: dict[str, Any] = {
        "namespace": args.namespace, "identity": args.identity,
        "job_template": args.job_template, "image": args.image,
        "interval_s": args.interval_s, "idle_for_s": args.idle_for_s,
        "probe_interval_s": args.probe_interval_s, "group_size": args.group_size,
        "max_concurrent_probes": args.max_concurrent_probes,
        "active_checks": args.active_checks,
    }
    if args.topology_label:
        flags["topology_labels"] = tuple(args.topology_label)
    if args.rdma_resource:
        res = {}
        for item in args.rdma_resource:
            k, sep, v = item.partition("=")
            if not sep or not k or not v:
                raise ValueError(f"--rdma-resource {item!r}: expected NAME=COUNT")
            res[k] = v
        flags["rdma_resources"] = res
    flags = {k: v for k, v in flags.items() if v is not None}
    if "namespace" in flags:
        flags.setdefault("report_namespace", flags["namespace"])
    return replace(base, **flags).validate()


PLACEHOLDER_IMAGE = "gpu-monitor"  # the image name kustomize's `images:` rewrites


def own_image(api: FabricApi, environ: Mapping[str, str] | None = None) -> str | None:
    """This pod's own image (POD_NAME / POD_NAMESPACE from the downward API), so probe pods run
    the very image the scheduler runs: kustomize rewrites the Deployment's image, but not the
    template inside a ConfigMap."""
    env = os.environ if environ is None else environ
    name, ns = env.get("POD_NAME"), env.get("POD_NAMESPACE")
    if not name or not ns:
        return None
    pod = api.kube.get_pod(ns, name)
    containers = ((pod or {}).get("spec") or {}).get("containers") or []
    return containers[0].get("image") if containers else None


def cmd_fabric_scheduler(args: argparse.Namespace, api_factory: ApiFactory | None = None) -> int:
    from gpu_monitor.kube.client import Kube
    from gpu_monitor.kube.config import load_api_client
    from gpu_monitor.model import EXIT_USAGE

    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_args(args)
        template = load_template(settings.job_template)
    except (OSError, ValueError) as exc:
        print(f"gpu-monitor fabric-scheduler: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    api_client = api_factory(args) if api_factory else load_api_client(args.kubeconfig,
                                                                       args.context)
    kube = api_client if isinstance(api_client, Kube) else Kube(api_client, qps=20.0, burst=40)
    api = FabricApi(kube)
    template_image = ((template.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "containers", [{}])[0].get("image")
    if not settings.image and template_image in (None, "", PLACEHOLDER_IMAGE):
        try:
            image = own_image(api)
        except Exception as exc:  # noqa: BLE001 - fall back to the template's image
            log.warning("cannot read this pod's image: %s", exc)
            image = None
        if image:
            settings = replace(settings, image=image)
    sched = FabricScheduler(api, settings, template=template, always_lead=bool(args.once))
    if args.once:
        sched.tick()
        print(json.dumps({k: v for k, v in sched.snapshot().items()
                          if k in ("records", "counts", "idle_nodes")}, default=str, indent=2))
        return 0
    if args.listen:
        serve_metrics(sched, args.listen)
    import signal

    def _stop(*_: Any) -> None:
        sched.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    sched.run()
    return 0
