"""The fabric scheduler: probe idle GPU nodes' fabric, bisect failures, report.

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
3. watches each Job (in_flight.py): the probe's verdict comes back in the pods' termination
   messages (plan.py reads them). A Job whose pods were preempted (a workload needed the
   GPUs), deleted, or never scheduled is *abandoned*: recorded as such, never as a pass or a
   fail, and deleted to free the other nodes;
4. bisects a failed group (bisect.py: halves, then pairs, each with a known-good node) until
   the bad node is named, then files a ``GPUHealthReport`` for it (reason
   ``FabricProbeFailed``, the group's and the failing pair's numbers as evidence); the node's
   own daemon acts on it;
5. optionally runs the single-node active checks on nodes idle long enough (idle.py);
6. keeps a per-node record (last probe, outcome, last report) in a ConfigMap so a new leader
   does not re-probe everything (records.py), and serves metrics (per group and per node pair
   busbw and latency, last probe time per node, probe outcomes) on its own ``/metrics``
   (metrics.py).

Only the leader writes, and a leader that cannot renew within ``renew_deadline_s`` stops
acting before another can take over (``lease_duration_s`` later): client-go's rules
(lease.py). This module is the loop and its rounds; ``gpu-monitor fabric-scheduler``, the
command that builds it from flags, is scheduler_command.py.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.fabric.api import FabricApi
from gpu_monitor.fabric.bisect import ABANDONED, FAIL, PASS, UNKNOWN, Bisection, PlannedProbe
from gpu_monitor.fabric.cache import ListWatchCache
from gpu_monitor.fabric.idle import (
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
from gpu_monitor.fabric.in_flight import ActiveBisection, InFlight, adopted_probe
from gpu_monitor.fabric.lease import LeaderElector
from gpu_monitor.fabric.plan import (
    ProbeState,
    load_template,
    plan_groups,
    probe_state,
    render_probe_job,
)
from gpu_monitor.fabric.pods import LABEL_MANAGED_BY, LABEL_PROBE_ID, MANAGER
from gpu_monitor.fabric.records import NodeRecords
from gpu_monitor.fabric.scheduler_settings import SchedulerSettings
from gpu_monitor.kube.errors import KubeError
from gpu_monitor.model import parse_iso
from gpu_monitor.remediate.reports import report_object

log = logging.getLogger(__name__)

REPORT_REASON = "FabricProbeFailed"
REPORT_SOURCE = "gpu-monitor fabric-scheduler"

#: Every (apiGroup, resource, verbs, resourceNames) the scheduler uses;
#: daemonset/fabric/rbac.yaml grants exactly these (tests/fabric hold the manifests to it).
#: Cluster-wide it only reads: nodes (candidates, topology labels) and pods (which nodes run
#: GPU workloads; its own probe pods are watched with the same grant).
RBAC_CLUSTER: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("", "nodes", ("get", "list", "watch"), ()),
    ("", "pods", ("get", "list", "watch"), ()),
)


def rbac_namespaced(settings: SchedulerSettings) -> tuple[
        tuple[str, str, tuple[str, ...], tuple[str, ...]], ...]:
    """In its own namespace: its Lease and its record ConfigMap by name (never the breaker or
    the daemon's configuration), the GPUHealthReports it files. ``create`` cannot be limited to
    a name by Kubernetes RBAC (the name is not known at authorization time), so it is granted
    apart; creating an object of another name gives no power over the existing ones."""
    return (
        ("coordination.k8s.io", "leases", ("get", "update"), (settings.lease_name,)),
        ("coordination.k8s.io", "leases", ("create",), ()),
        ("", "configmaps", ("get", "update"), (settings.state_configmap,)),
        ("", "configmaps", ("create",), ()),
        ("gpu-monitor.io", "gpuhealthreports", ("create",), ()),
    )


#: In the Job namespace (``job_namespace``), which holds nothing but the probe and idle-check
#: Jobs and their two token-less ServiceAccounts: the Jobs.
RBAC_JOBS: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("batch", "jobs", ("get", "list", "watch", "create", "delete"), ()),
)


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
        self.records = NodeRecords(api, settings.namespace, settings.state_configmap)
        self._loaded = False
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
        self.heartbeat: float | None = None  # monotonic time the loop last turned

    def health(self) -> tuple[bool, str]:
        """Liveness: the loop has turned within ``stall_after_s`` (or has not started yet)."""
        if self.heartbeat is None:
            return True, "starting"
        stalled = self.clock.monotonic() - self.heartbeat
        if stalled > self.settings.stall_after_s:
            return False, f"the scheduler loop has not turned for {stalled:.0f} s"
        return True, "leader" if self.is_leader else "standby"

    def readiness(self) -> tuple[bool, str]:
        """Readiness: the loop runs (a standby is ready too: it is the failover) and, on the
        leader, the first round is done."""
        if self.heartbeat is None:
            return False, "the scheduler loop has not started"
        alive, why = self.health()
        if alive and self.is_leader and not self._loaded:
            return False, "leading, the first round not done yet"
        return alive, why

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
                now = self.heartbeat = self.clock.monotonic()
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
                                 args=(kind, self.settings.job_namespace, selector, stop,
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
                self.records.load()
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
            if self.records.dirty:
                self.records.save()

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
            d = decide(facts[name], self.idle.idle_for(name, mono), self.records.last(name, "probe"),
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
        probe_id = uuid.uuid4().hex[:10]
        job = render_probe_job(self.template, probe_id=probe_id, kind=kind, nodes=nodes,
                               group=group, gpus_per_node=gpus, settings=self.settings)
        try:
            self.api.create_job(self.settings.job_namespace, job)
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
        s = self.settings
        template_image = (((self.template.get("spec") or {}).get("template") or {}).get(
            "spec", {}).get("containers") or [{}])[0].get("image")
        spec = ActiveCheckSpec(image=s.active_check_image or s.image or template_image
                               or ActiveCheckSpec.image,
                               namespace=s.job_namespace,
                               report_namespace=s.report_namespace,
                               checks=tuple(s.active_check_list),
                               priority_class=s.priority_class, resource=s.gpu_resource,
                               deliver=s.active_check_deliver,
                               resources=s.active_check_resources,
                               shm_size=s.active_check_shm_size, instance=s.instance)
        for name in sorted(free):
            running = sum(1 for p in self.in_flight.values() if p.kind == "active-check")
            if running >= s.max_concurrent_active_checks:
                return
            d = decide(facts[name], self.idle.idle_for(name, mono), self.records.last(name, "check"),
                       now, idle_for_s=s.idle_for_s, interval_s=s.active_check_interval_s)
            if not d.run:
                continue
            probe_id = uuid.uuid4().hex[:10]
            job = build_active_check_job(name, facts[name].gpus, spec, probe_id=probe_id)
            try:
                self.api.create_job(s.job_namespace, job)
            except KubeError as err:
                log.warning("cannot create the active-check Job for %s: %s", name, err)
                continue
            self.in_flight[probe_id] = InFlight(probe_id, "active-check",
                                                job["metadata"]["name"], (name,), name, mono)
            log.info("launched active checks on %s (%s)", name, d.why)

    # --- watching ----------------------------------------------------------------------------------

    def _reconcile(self, p: InFlight, now: datetime, mono: float) -> None:
        s = self.settings
        jobs = self.api.list_jobs(s.job_namespace, f"{LABEL_PROBE_ID}={p.probe_id}")
        job = jobs[0] if jobs else None
        pods = self.api.list_pods(s.job_namespace, f"{LABEL_PROBE_ID}={p.probe_id}")
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
            self.api.delete_job(s.job_namespace, p.job_name)  # free the other nodes' GPUs now
        if p.kind == "active-check":
            self._finish_active_check(p, state, now)
            return
        self._record_numbers(p, state)
        if p.kind == "group":
            self._finish_group(p, state, now, mono)
        elif p.kind == "bisect" and p.bisection in self.bisections and p.planned is not None:
            self.bisections[p.bisection].finished(p, p.planned, state)
        elif p.kind == "bisect" and state.outcome == PASS:
            # adopted from another leader
            self.records.mark(p.nodes, "probe", PASS, now, p.group)

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
            self.records.mark(p.nodes, "probe", PASS, now, p.group)
            return
        if state.outcome == ABANDONED:
            self.records.mark(p.nodes, "abandoned", ABANDONED, now, p.group,
                              partial=state.partial)
            return
        if state.outcome == UNKNOWN:
            self.records.mark(p.nodes, "probe", UNKNOWN, now, p.group)
            return
        # Failed: find the node(s) to blame.
        if not self.settings.bisect:
            self.records.mark(p.nodes, "probe", FAIL, now, p.group)
            return
        suspects = [n for n in (state.summary or {}).get("suspect_nodes") or [] if n in p.nodes]
        known_good = self.records.known_good(p.nodes, now, self.settings.probe_interval_s)
        plan = Bisection(p.nodes, known_good=known_good, suspects=suspects)
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
        self.records.mark(result.cleared, "probe", PASS, now, b.group)
        if result.inconclusive:
            self.records.mark(result.inconclusive, "probe", "inconclusive", now, b.group)
        log.warning("bisection of %s: bad %s, inconclusive %s, cleared %d in %d probes",
                    b.group, list(result.bad) or "none", list(result.inconclusive) or "none",
                    len(result.cleared), len(result.probes))
        for node in result.bad:
            self.records.mark((node,), "probe", FAIL, now, b.group)
            self._report(node, b, now)

    def _report(self, node: str, b: ActiveBisection, now: datetime) -> None:
        last = self.records.reported_at(node)
        if last and (now - parse_iso(last)).total_seconds() < self.settings.report_cooldown_s:
            log.info("node %s was reported at %s; not again", node, last)
            return
        body = report_object(node, REPORT_REASON, REPORT_SOURCE, b.report_evidence(node), now,
                             self.settings.report_namespace)
        try:
            self.api.create_report(self.settings.report_namespace, body)
        except KubeError as err:
            log.warning("cannot file a GPUHealthReport for %s: %s", node, err)
            return
        self.records.mark_reported(node, now)
        self.reports_filed += 1
        log.warning("filed a GPUHealthReport for %s (%s)", node, REPORT_REASON)

    def _finish_active_check(self, p: InFlight, state: ProbeState, now: datetime) -> None:
        node = p.nodes[0]
        if state.outcome == ABANDONED:
            self.records.mark((node,), "check-abandoned", ABANDONED, now, p.group,
                              partial=state.partial)
        else:
            self.records.mark((node,), "check", state.outcome or UNKNOWN, now, p.group)

    def _adopt_jobs(self) -> None:
        """Jobs a previous leader launched: watch them to the end (their verdicts count)."""
        mono = self.clock.monotonic()
        for job in self.api.list_jobs(self.settings.job_namespace,
                                      f"{LABEL_MANAGED_BY}={MANAGER}"):
            p = adopted_probe(job, mono)
            if p is None or p.probe_id in self.in_flight:
                continue
            self.in_flight[p.probe_id] = p
            log.info("adopted %s probe %s from a previous leader", p.kind, p.job_name)

    # --- metrics -------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "leader": self.is_leader,
                "counts": dict(self.counts),
                "reports": self.reports_filed,
                "groups": copy.deepcopy(self.group_metrics),
                "pairs": copy.deepcopy(self.pair_metrics),
                "records": self.records.snapshot(),
                "in_flight": Counter(p.kind for p in self.in_flight.values()),
                "bisections": len(self.bisections),
                "idle_nodes": self.idle_nodes,
            }


def _default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:6]}"

