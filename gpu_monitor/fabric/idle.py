"""Idle nodes: when a GPU node counts as idle and due for a check, and the single-node
active-check Job that runs the bootstrap checks on it.

Why here and not in the daemon: "idle" is a cluster fact (no running pod requests the node's
GPUs), and the reservation must come from the Kubernetes scheduler, not from us. So an
idle-time check is a pod of a low PriorityClass (``gpu-monitor-idle-check``, preemptionPolicy
Never: it never displaces anything) that requests all of the node's GPUs: while it runs no
workload can land on those GPUs, and the moment a workload of higher priority needs them the
scheduler preempts the check. A preempted check is *abandoned*: its partial results are
recorded as such, never as a pass or a fail.

Pure parts (table-tested): ``node_facts`` / ``ineligible_reason`` (is the node a candidate at
all), ``IdleTracker`` (since when has it been idle), ``decide`` (idle long enough and not
checked recently), ``build_active_check_job`` (the Job). The runner ``run_active_checks`` is
what the Job's container executes (``gpu-monitor idle-check``): ``gpu-monitor bootstrap
--checks ... --output json`` in a subprocess, then the outcome fed back to the node's daemon —
a failure as a ``GPUHealthReport`` file in the host drop directory (default
/var/lib/gpu-monitor/reports) or as a ``GPUHealthReport`` object — and a compact summary in
the termination message for the scheduler.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpu_monitor.fabric import termination
from gpu_monitor.fabric.job_parts import (
    ACTIVE_CHECK_RESOURCES,
    ACTIVE_CHECK_SHM,
    ensure_shm,
    standard_labels,
    with_cpu_memory,
)
from gpu_monitor.fabric.pods import (  # the pure pod and node helpers, shared
    ANNOTATION_CHECKS,
    ANNOTATION_NODES,
    COMPONENT_IDLE_CHECK,
    DEFAULT_TAINT_KEY,
    GPU_RESOURCE,
    HEALTHY_STATES,
    HOSTNAME_LABEL,
    LABEL_EXCLUDE,
    LABEL_PROBE_ID,
    LABEL_PROBE_KIND,
    LABEL_STATE,
    MANAGER,
    PREFIX,
    is_ours,
    node_gpus,
    pod_holds_gpus,
)
from gpu_monitor.hw.paths import DEFAULT_REPORT_DIR
from gpu_monitor.kube.client import Kube
from gpu_monitor.kube.config import load_api_client
from gpu_monitor.model import ACTION_SEVERITY, EXIT_UNKNOWN, EXIT_USAGE, iso, utcnow
from gpu_monitor.remediate.reports import GROUP, PLURAL, VERSION, report_object

log = logging.getLogger(__name__)

PRIORITY_CLASS = "gpu-monitor-idle-check"
DEFAULT_CHECKS = ("dcgm_diag", "burn_in", "nccl_allreduce", "sdc_probe")
SUMMARY_KIND = "ActiveCheckSummary"
SUMMARY_SCHEMA = 1

# --- node facts (pure) -------------------------------------------------------------------------


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a pod that ``node_facts`` reads (a cache of every pod keeps only these)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}

    def res(containers: Any) -> list[dict[str, Any]]:
        return [{"resources": c.get("resources") or {}} for c in containers or []]

    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "resourceVersion")
                     if k in meta},
        "spec": {"nodeName": spec.get("nodeName"), "containers": res(spec.get("containers")),
                 "initContainers": res(spec.get("initContainers"))},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a node that ``node_facts`` reads (no image list, no addresses, ...)."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "labels", "resourceVersion") if k in meta},
        "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
        "status": {k: status[k] for k in ("allocatable", "capacity", "conditions")
                   if k in status},
    }


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' toleration match (key, operator Equal/Exists, value, effect)."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _ready(node: Mapping[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


@dataclass(frozen=True)
class NodeFacts:
    """What decides whether gpu-monitor may borrow a node's GPUs now."""

    name: str
    gpus: int
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False
    state: str = ""
    tainted_by_us: bool = False
    untolerated: tuple[str, ...] = ()
    gpu_pods: tuple[str, ...] = ()  # ns/name of workload pods holding GPUs
    our_pods: tuple[str, ...] = ()  # our own probe/check pods on it
    excluded: bool = False

    @property
    def busy(self) -> bool:
        return bool(self.gpu_pods or self.our_pods)


def node_facts(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], *,
               resource: str = GPU_RESOURCE, taint_key: str = DEFAULT_TAINT_KEY,
               tolerations: Sequence[Mapping[str, Any]] = ()) -> NodeFacts:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    labels = dict(meta.get("labels") or {})
    taints = spec.get("taints") or []
    ours, theirs = [], []
    for p in pods:
        if not pod_holds_gpus(p, resource):
            continue
        pm = p.get("metadata") or {}
        ref = f"{pm.get('namespace', '')}/{pm.get('name', '')}"
        (ours if is_ours(p) else theirs).append(ref)
    untolerated = tuple(
        f"{t.get('key')}:{t.get('effect')}" for t in taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") != taint_key
        and not tolerates(tolerations, t))
    return NodeFacts(
        name=str(meta.get("name") or ""),
        gpus=node_gpus(node, resource),
        labels=labels,
        ready=_ready(node),
        unschedulable=bool(spec.get("unschedulable")),
        state=labels.get(LABEL_STATE, ""),
        tainted_by_us=any(t.get("key") == taint_key for t in taints),
        untolerated=untolerated,
        gpu_pods=tuple(sorted(theirs)),
        our_pods=tuple(sorted(ours)),
        excluded=labels.get(LABEL_EXCLUDE, "").lower() in ("true", "1", "yes"),
    )


def ineligible_reason(f: NodeFacts) -> str | None:
    """Why gpu-monitor must not borrow this node now (None: it may, if idle long enough)."""
    if f.gpus <= 0:
        return "no allocatable GPUs"
    if f.excluded:
        return f"labelled {LABEL_EXCLUDE}"
    if not f.ready:
        return "not Ready"
    if f.state not in HEALTHY_STATES:
        return f"gpu-monitor state {f.state}"
    if f.tainted_by_us:
        return "tainted by gpu-monitor"
    if f.unschedulable:
        return "cordoned"
    if f.untolerated:
        return f"taint {f.untolerated[0]} not tolerated by the probe pods"
    if f.our_pods:
        return f"already being checked ({f.our_pods[0]})"
    if f.gpu_pods:
        return f"GPUs in use by {len(f.gpu_pods)} pod(s) ({f.gpu_pods[0]})"
    return None


# --- idle time and due checks (pure) -----------------------------------------------------------


class IdleTracker:
    """Since when each node has been idle, as this process saw it (monotonic seconds).

    Kept in memory on purpose: after a restart (or a leader change) idle time starts again
    from zero, which can only delay a check, never borrow a node that was just busy.
    """

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def observe(self, node: str, busy: bool, now: float) -> None:
        if busy:
            self._since.pop(node, None)
        else:
            self._since.setdefault(node, now)

    def forget(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        for name in [n for n in self._since if n not in keep]:
            del self._since[name]

    def idle_for(self, node: str, now: float) -> float | None:
        since = self._since.get(node)
        return None if since is None else max(0.0, now - since)


def due(last: datetime | None, now: datetime, interval_s: float) -> bool:
    """Never checked, or last checked at least ``interval_s`` ago."""
    return last is None or (now - last).total_seconds() >= interval_s


@dataclass(frozen=True)
class Decision:
    run: bool
    why: str


def decide(facts: NodeFacts, idle_s: float | None, last_checked: datetime | None,
           now: datetime, *, idle_for_s: float, interval_s: float) -> Decision:
    """Check this node now? Eligible, idle for ``idle_for_s``, not checked for ``interval_s``."""
    why = ineligible_reason(facts)
    if why:
        return Decision(False, why)
    if idle_s is None or idle_s < idle_for_s:
        return Decision(False, f"idle for {idle_s or 0:.0f} s of the {idle_for_s:.0f} s needed")
    if not due(last_checked, now, interval_s):
        return Decision(False, f"checked at {iso(last_checked)}")  # type: ignore[arg-type]
    return Decision(True, f"idle for {idle_s:.0f} s, "
                          + ("never checked" if last_checked is None
                             else f"last checked {iso(last_checked)}"))


# --- the single-node Job (pure) -----------------------------------------------------------------

_NAME_BAD = re.compile(r"[^a-z0-9-]+")


def short_name(node: str, limit: int = 30) -> str:
    """A DNS-label-safe, length-limited stand-in for a node name (with a hash suffix)."""
    base = _NAME_BAD.sub("-", node.lower()).strip("-")[:limit].strip("-") or "node"
    digest = hashlib.sha256(node.encode()).hexdigest()[:6]
    return f"{base}-{digest}"


def label_value(text: str) -> str:
    """A label-value-safe form of ``text`` (63 chars, alnum ends)."""
    v = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return v.strip("-._") or "x"


@dataclass(frozen=True)
class ActiveCheckSpec:
    """How the single-node active-check Job looks (the scheduler's settings fill it).

    ``namespace`` is where the Job runs (the scheduler's Job namespace, apart from the
    daemon's); ``report_namespace`` is where ``--deliver crd`` files its GPUHealthReport (the
    one the daemons watch)."""

    image: str = "ghcr.io/gpu-monitor/gpu-monitor:latest"
    namespace: str = "gpu-monitor-jobs"
    report_namespace: str = "gpu-monitor"
    checks: tuple[str, ...] = DEFAULT_CHECKS
    priority_class: str = PRIORITY_CLASS
    service_account: str = "gpu-monitor-idle-check"
    resource: str = GPU_RESOURCE
    deliver: str = "drop-dir"  # drop-dir | crd | none
    report_dir: str = DEFAULT_REPORT_DIR
    tolerations: tuple[Mapping[str, Any], ...] = (
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},)
    active_deadline_s: int = 3600
    ttl_after_finished_s: int = 3600
    profile: str | None = None
    resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: dict(ACTIVE_CHECK_RESOURCES))
    shm_size: str = ACTIVE_CHECK_SHM
    instance: str = "gpu-monitor"


def build_active_check_job(node: str, gpus: int, spec: ActiveCheckSpec, *, probe_id: str,
                           ) -> dict[str, Any]:
    """A batch/v1 Job that runs the active checks on ``node`` in one low-priority pod
    requesting all ``gpus`` of it; it goes through the scheduler (node affinity, not
    ``nodeName``), so taints, capacity and preemption apply as to any pod."""
    labels = {**standard_labels(COMPONENT_IDLE_CHECK, MANAGER, spec.instance),
              LABEL_PROBE_ID: probe_id, LABEL_PROBE_KIND: "active-check",
              PREFIX + "node": label_value(node)}
    command = ["gpu-monitor", "idle-check", "--checks", ",".join(spec.checks),
               "--deliver", spec.deliver, "--termination-log", "/dev/termination-log"]
    if spec.profile:
        command += ["--profile", spec.profile]
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if spec.deliver == "drop-dir":
        command += ["--drop-dir", spec.report_dir]
        volumes.append({"name": "reports", "hostPath": {"path": spec.report_dir,
                                                        "type": "DirectoryOrCreate"}})
        mounts.append({"name": "reports", "mountPath": spec.report_dir})
    elif spec.deliver == "crd":
        command += ["--namespace", spec.report_namespace]
    gpu = {spec.resource: str(gpus)}
    container: dict[str, Any] = {
        "name": "active-checks",
        "image": spec.image,
        "command": command,
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_NAME",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": with_cpu_memory({"requests": dict(gpu), "limits": dict(gpu)},
                                     spec.resources),
        "terminationMessagePolicy": "File",
        # No capability: the checks need none (IPC_LOCK would be inert for a non-root user
        # anyway). Root only to write the host's root-owned drop directory.
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                            **({"runAsUser": 0} if spec.deliver == "drop-dir" else {})},
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": spec.priority_class,
        "serviceAccountName": spec.service_account,
        # The API token only where the pod files a GPUHealthReport itself.
        "automountServiceAccountToken": spec.deliver == "crd",
        "terminationGracePeriodSeconds": 30,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                      {"nodeSelectorTerms": [{"matchExpressions": [
                                          {"key": HOSTNAME_LABEL, "operator": "In",
                                           "values": [node]}]}]}}},
        "tolerations": [dict(t) for t in spec.tolerations],
        "containers": [container],
        "volumes": volumes,
    }
    ensure_shm(pod_spec, container, spec.shm_size)  # nccl_allreduce runs NCCL
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"gpu-monitor-check-{short_name(node, 20)}-{probe_id[-8:]}",
                     "namespace": spec.namespace, "labels": dict(labels),
                     "annotations": {ANNOTATION_NODES: json.dumps([node]),
                                     ANNOTATION_CHECKS: ",".join(spec.checks)}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.active_deadline_s,
            "ttlSecondsAfterFinished": spec.ttl_after_finished_s,
            # Preempted or evicted: the check is abandoned, never retried on the same GPUs.
            # ``status`` is required by API servers before 1.35 (defaulted to True after).
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onPodConditions": [
                {"type": "DisruptionTarget", "status": "True"}]}]},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


# --- the runner (inside the Job's pod) -----------------------------------------------------------


def summarize_report(report: Mapping[str, Any], node: str,
                     limit: int = termination.TERMINATION_LOG_LIMIT) -> dict[str, Any]:
    """The compact termination-message form of a bootstrap report."""
    failed = [r for r in report.get("results") or []
              if r.get("status") in ("failed", "unknown")]
    s: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA, "kind": SUMMARY_KIND, "node": node,
        "verdict": report.get("verdict", "unknown"),
        "checks": sorted({r.get("check") for r in report.get("results") or []} - {None}),
        "not_ok": [{k: r.get(k) for k in ("check", "status", "target", "reason")}
                   for r in failed],
        "finished_at": report.get("finished_at"),
    }
    return termination.fit(s, "not_ok", "truncated", limit)


def parse_active_summary(text: str | None) -> dict[str, Any] | None:
    return termination.parse(text, SUMMARY_KIND)


def failure_report(report: Mapping[str, Any], node: str, now: datetime,
                   namespace: str) -> dict[str, Any] | None:
    """A GPUHealthReport body for an unhealthy bootstrap report (None unless unhealthy): the
    reason of the worst failed result, the failed results as evidence."""
    if report.get("verdict") != "unhealthy":
        return None
    order = {a.value: severity for a, severity in ACTION_SEVERITY.items()}
    failed = [r for r in report.get("results") or [] if r.get("status") == "failed"]
    if not failed:
        return None
    worst = max(failed, key=lambda r: order.get(str(r.get("action")), 0))
    evidence = {"kind": "idle-active-check", "checks": sorted({r.get("check") for r in failed}),
                "action": worst.get("action"), "failed": failed[:20],
                "report_started_at": report.get("started_at")}
    return report_object(node, str(worst.get("reason") or "ActiveCheckFailed"),
                         "gpu-monitor idle-check", evidence, now, namespace)


def write_drop_file(directory: str, body: Mapping[str, Any], name: str) -> str:
    """Atomically place a report file where the node's daemon reads them (a dot-prefixed
    temporary, then a rename: the daemon never reads half a file)."""
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(body, fh)
        final = os.path.join(directory, name)
        os.replace(tmp, final)
        return final
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def run_active_checks(checks: Sequence[str], node: str, *, deliver: str = "drop-dir",
                      drop_dir: str = DEFAULT_REPORT_DIR, namespace: str = "gpu-monitor",
                      profile: str | None = None, termination_log: str | None = None,
                      python: str | None = None, extra_args: Sequence[str] = (),
                      kube: Any = None) -> tuple[int, dict[str, Any] | None]:
    """Run ``gpu-monitor bootstrap --checks ... --output json`` and feed the outcome back.

    Returns (bootstrap's exit code, its report or None when it printed none)."""
    cmd = [python or sys.executable, "-m", "gpu_monitor", "bootstrap", "--checks",
           ",".join(checks), "--output", "json", "--node-name", node,
           "--state", ":memory:", *extra_args]
    if profile:
        cmd += ["--profile", profile]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    sys.stderr.write(proc.stderr[-20000:])
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = None
    if report is None:
        summary = {"schema": SUMMARY_SCHEMA, "kind": SUMMARY_KIND, "node": node,
                   "verdict": "unknown", "error": (proc.stderr.strip().splitlines() or
                                                   [f"exit {proc.returncode}"])[-1][:500],
                   "finished_at": iso(utcnow())}
    else:
        summary = summarize_report(report, node)
        body = failure_report(report, node, utcnow(), namespace)
        if body is not None and deliver == "drop-dir":
            stamp = utcnow().strftime("%Y%m%dT%H%M%S")
            path = write_drop_file(drop_dir, body, f"idle-check-{short_name(node)}-{stamp}.json")
            summary["delivered"] = path
        elif body is not None and deliver == "crd":
            if kube is None:
                kube = Kube(load_api_client())
            made = kube.create_custom(GROUP, VERSION, namespace, PLURAL, body)
            summary["delivered"] = (made or {}).get("metadata", {}).get("name")
    if termination_log:
        termination.write(termination_log, summary)
    print(json.dumps(report if report is not None else summary, indent=2))
    return proc.returncode, report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checks", default=",".join(DEFAULT_CHECKS), metavar="A,B",
                   help=f"active checks to run (default {','.join(DEFAULT_CHECKS)})")
    p.add_argument("--node-name", default=None, help="this node (default $NODE_NAME)")
    p.add_argument("--deliver", choices=("drop-dir", "crd", "none"), default="drop-dir",
                   help="how a failure reaches the node's daemon")
    p.add_argument("--drop-dir", default=DEFAULT_REPORT_DIR,
                   help=f"the daemon's report directory (default {DEFAULT_REPORT_DIR})")
    p.add_argument("--namespace", default="gpu-monitor", help="namespace of GPUHealthReports")
    p.add_argument("--profile", default=None, help="profile passed to bootstrap")
    p.add_argument("--termination-log", default=None, metavar="FILE",
                   help="write a compact summary here (e.g. /dev/termination-log)")


def cmd_idle_check(args: argparse.Namespace) -> int:
    node = args.node_name or os.environ.get("NODE_NAME")
    if not node:
        print("gpu-monitor idle-check: error: --node-name or $NODE_NAME is required",
              file=sys.stderr)
        return EXIT_USAGE
    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    rc, report = run_active_checks(checks, node, deliver=args.deliver, drop_dir=args.drop_dir,
                                   namespace=args.namespace, profile=args.profile,
                                   termination_log=args.termination_log)
    return rc if report is not None else (rc or EXIT_UNKNOWN)
