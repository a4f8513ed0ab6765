"""A test-side controller for the fake apiserver: the Job controller, kube-scheduler's
preemption and the probe itself, as far as the fabric scheduler can see them.

- Every Job gpu-monitor creates gets one Running pod per node named in its node affinity
  (index i on the i-th node), with the labels the real Job controller sets.
- After ``run_s`` the pods finish: ``verdict(nodes)`` (True healthy, False unhealthy, None:
  keep running) decides the summary each pod leaves in its termination message, built with
  the probe's own ``summarize`` so the format is the real one.
- A workload pod (not ours, requesting GPUs, higher priority than the idle-check class) on a
  node where a probe pod runs preempts it: the probe pod is marked ``DisruptionTarget``
  (``PreemptionByScheduler``) and deleted through the API, and the Job fails by its pod
  failure policy.
- Pods of a deleted Job are deleted (the garbage collector).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from gpu_monitor.fabric.pods import ANNOTATION_NODES, LABEL_PROBE_KIND, is_ours, pod_gpu_request
from gpu_monitor.fabric.probe_result import summarize

PROBE_PRIORITY = -1000
FLOOR = 250.0


def probe_summary(nodes: list[str], healthy: bool, *, group: str = "g",
                  suspects: list[str] | None = None, good_bw: float = 310.0,
                  bad_bw: float = 40.0) -> dict[str, Any]:
    """A group result as the probe would report it (the fields the summary reads)."""
    bw = good_bw if healthy else bad_bw
    rows = [{"bytes": 8, "p95_s": 4e-5, "busbw_gb_per_s": 0.0, "wrong": 0},
            {"bytes": 1 << 31, "p95_s": 9e-3, "busbw_gb_per_s": bw, "wrong": 0}]
    findings = [] if healthy else [{"status": "failed", "reason": "FabricBusBwLow",
                                    "message": f"busbw {bw} below {FLOOR}"}]
    result = {"group": group, "verdict": "healthy" if healthy else "unhealthy",
              "findings": findings, "world_size": 8 * len(nodes), "nodes": list(nodes),
              "suspect_nodes": list(suspects or []),
              "operations": {"all_reduce": {"rows": rows}, "all_gather": {"rows": rows}},
              "settings": {"small_message_max_bytes": 65536, "busbw_floor_gb_per_s": FLOOR,
                           "small_p95_latency_limit_s": 0.001},
              "transport": {"kind": "rdma", "network": "IB"},
              "finished_at": "2026-01-01T00:00:00Z"}
    return summarize(result)


class ProbeController:
    def __init__(self, server: Any, *, namespace: str = "gpu-monitor-jobs", run_s: float = 0.05,
                 tick_s: float = 0.01):
        self.server = server
        self.namespace = namespace
        self.run_s = run_s
        self.tick_s = tick_s
        self.verdict: Callable[[list[str]], bool | None] = lambda nodes: True
        self.suspects: Callable[[list[str]], list[str]] = lambda nodes: []
        self.active_verdict: Callable[[str], str | None] = lambda node: "healthy"
        self.jobs: list[dict] = []  # every Job seen, in creation order
        self._started: dict[str, float] = {}
        self._done: set[str] = set()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.core = client.CoreV1Api(client.ApiClient(client.Configuration(host=server.url)))
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._halt.wait(self.tick_s):
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - surfaced through .errors
                self.errors.append(repr(exc))

    # --- the controllers -------------------------------------------------------------------------

    def step(self) -> None:
        jobs = {j["metadata"]["name"]: j for j in self.server.list("batch", "jobs",
                                                                  self.namespace)}
        pods = self.server.list("", "pods")
        for name, job in jobs.items():
            if is_ours(job) and name not in self._started:
                self.jobs.append(copy.deepcopy(job))
                self._create_pods(job)
                self._started[name] = time.monotonic()
        ours = [p for p in pods if p["metadata"].get("namespace") == self.namespace
                and is_ours(p)]
        for p in ours:  # the garbage collector
            owner = (p["metadata"].get("labels") or {}).get("job-name")
            if owner and owner not in jobs and owner in self._started:
                self._delete(p)
        self._preempt(pods, ours, jobs)
        for name, job in jobs.items():
            if name in self._done or name not in self._started:
                continue
            if time.monotonic() - self._started[name] < self.run_s:
                continue
            self._finish(job, [p for p in ours if (p["metadata"].get("labels") or {})
                               .get("job-name") == name])

    def _create_pods(self, job: dict) -> None:
        nodes = json.loads(job["metadata"]["annotations"][ANNOTATION_NODES])
        tmpl = job["spec"]["template"]
        for i, node in enumerate(nodes):
            labels = {**(tmpl["metadata"].get("labels") or {}), "job-name":
                      job["metadata"]["name"], "batch.kubernetes.io/job-completion-index": str(i)}
            spec = copy.deepcopy(tmpl["spec"])
            spec["nodeName"] = node
            spec["priority"] = PROBE_PRIORITY
            self.server.add_object({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{job['metadata']['name']}-{i}-x", "namespace":
                             self.namespace, "labels": labels,
                             "annotations": {"batch.kubernetes.io/job-completion-index": str(i)}},
                "spec": spec,
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True"}]},
            })

    def _finish(self, job: dict, pods: list[dict]) -> None:
        nodes = json.loads(job["metadata"]["annotations"][ANNOTATION_NODES])
        if job["metadata"]["labels"].get(LABEL_PROBE_KIND) == "active-check":
            verdict = self.active_verdict(nodes[0])
            if verdict is None:
                return
            summary = {"schema": 1, "kind": "ActiveCheckSummary", "node": nodes[0],
                       "verdict": verdict, "checks": ["burn_in"], "not_ok": []}
        else:
            ok = self.verdict(nodes)
            if ok is None:
                return
            summary = probe_summary(nodes, ok, suspects=self.suspects(nodes))
        if len(pods) < len(nodes):
            return  # preempted meanwhile
        self._done.add(job["metadata"]["name"])
        for p in pods:
            p = copy.deepcopy(p)
            i = int(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"])
            msg = json.dumps({**summary, "node": nodes[i]})
            p["status"] = {"phase": "Succeeded", "containerStatuses": [{
                "name": p["spec"]["containers"][0]["name"], "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                         "message": msg}}}]}
            self.server.add_object(p)
        j = copy.deepcopy(job)
        j["status"] = {"succeeded": len(nodes), "completedIndexes": f"0-{len(nodes) - 1}",
                       "conditions": [{"type": "Complete", "status": "True"}]}
        self._write_status(j)

    def _preempt(self, pods: list[dict], ours: list[dict], jobs: dict[str, dict]) -> None:
        wanted = {}
        for p in pods:
            if is_ours(p) or pod_gpu_request(p) <= 0:
                continue
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if int((p.get("spec") or {}).get("priority") or 0) <= PROBE_PRIORITY:
                continue
            node = (p.get("spec") or {}).get("nodeName")
            if node:
                wanted[node] = p["metadata"]["name"]
        for p in ours:
            node = p["spec"].get("nodeName")
            if node not in wanted or p["status"].get("phase") != "Running":
                continue
            marked = copy.deepcopy(p)
            marked["status"].setdefault("conditions", []).append({
                "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                "message": f"preempted by {wanted[node]}"})
            self.server.add_object(marked)
            self._delete(p)
            owner = p["metadata"]["labels"].get("job-name")
            if owner in jobs:
                j = copy.deepcopy(jobs[owner])
                j["status"] = {"failed": 1, "conditions": [
                    {"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}
                self._write_status(j)
                self._done.add(owner)

    def _write_status(self, job: dict) -> None:
        """The Job's status, unless it was deleted meanwhile (a stale copy must not
        resurrect it)."""
        with self.server._lock:
            meta = job["metadata"]
            if self.server.get("batch", "jobs", meta["name"], meta["namespace"]) is not None:
                self.server.add_object(job)

    def _delete(self, pod: dict) -> None:
        try:
            self.core.delete_namespaced_pod(pod["metadata"]["name"],
                                            pod["metadata"]["namespace"],
                                            grace_period_seconds=0)
        except client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise
