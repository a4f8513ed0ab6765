"""An SDC alarm as a report the node daemons act on (docs/sdc.md documents the schema).

Why: an alarm in a training job names ranks; remediation acts on nodes and GPUs. The report
joins the two (via ``rank_map()``) and is delivered either as a JSON file in a directory the
node daemon watches, or as ``GPUHealthReport`` custom objects, one per named node, which the
daemon on that node watches for itself. The training job never writes to a Node object.

Schema version 1; fields are only ever added, a rename or removal bumps ``schema``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from collections.abc import Sequence
from typing import Any

__all__ = [
    "REPORT_SCHEMA",
    "build_report",
    "create_health_reports",
    "health_report_objects",
    "job_name",
    "write_report",
]

REPORT_SCHEMA = 1
CRD_GROUP = "gpu-monitor.io"
CRD_VERSION = "v1alpha1"
CRD_PLURAL = "gpuhealthreports"
CRD_KIND = "GPUHealthReport"
NODE_LABEL = "gpu-monitor.io/node"
REASON = "SdcAlarm"
SOURCE = "sdc-library"

_JOB_ENV = ("JOB_NAME", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


def job_name(environ=None) -> str | None:
    """The job's name: ``$JOB_NAME``, else the torchelastic run id, else the Slurm job id."""
    env = os.environ if environ is None else environ
    for key in _JOB_ENV:
        if env.get(key):
            return str(env[key])
    return None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _roles(alarm: dict) -> dict[int, list[str]]:
    roles: dict[int, list[str]] = {}

    def add(rank, role: str) -> None:
        if rank is not None and role not in roles.setdefault(int(rank), []):
            roles[int(rank)].append(role)

    for r in alarm.get("nonfinite") or []:
        add(r, "nonfinite")
    for r in alarm.get("culprits") or []:
        add(r, "culprit")
    for v in alarm.get("verdicts") or []:
        add(v.get("suspect"), f"suspect:{v.get('kind')}")
    for r in alarm.get("suspects") or []:
        add(r, "weights-minority")
    return roles


def build_report(
    alarm: dict, rank_map: Sequence[dict] | None, *, job: str | None = None, now: str | None = None
) -> dict:
    """The schema-1 report for ``alarm`` (pure: no I/O)."""
    where = {int(e["rank"]): e for e in (rank_map or [])}
    ranks = []
    for r, roles in sorted(_roles(alarm).items()):
        e = where.get(r, {})
        ranks.append(
            {"rank": r, "node": e.get("node"), "gpu_uuid": e.get("gpu_uuid"), "roles": roles}
        )
    nodes = sorted({x["node"] for x in ranks if x["node"]})
    window = alarm.get("suspect_window")
    return {
        "schema": REPORT_SCHEMA,
        "kind": REASON,
        "source": SOURCE,
        "job": job if job is not None else job_name(),
        "step": alarm.get("step"),
        "check": alarm.get("check"),
        "ranks": ranks,
        "nodes": nodes,
        "nonfinite": list(alarm.get("nonfinite") or []),
        "culprits": list(alarm.get("culprits") or []),
        "suspects": None if alarm.get("suspects") is None else list(alarm["suspects"]),
        "mismatched_pairs": [list(p) for p in alarm.get("mismatched_pairs") or []],
        "verdicts": [
            {
                "pair": list(v["pair"]),
                "third": v.get("third"),
                "suspect": v.get("suspect"),
                "kind": v.get("kind"),
            }
            for v in alarm.get("verdicts") or []
        ],
        "suspect_window": list(window) if window is not None else None,
        "last_audit_pass": alarm.get("last_audit_pass"),
        "last_weight_check_pass": alarm.get("last_weight_check_pass"),
        "applied": alarm.get("applied"),
        "note": alarm.get("note"),
        "single_node": bool(alarm.get("single_node", False)),
        "time": now or _now(),
    }


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:80] or "job"


def _write_json(report: dict, path: str) -> str:
    """Write atomically (temp file + rename) so a watching daemon never reads half a report."""
    if os.path.isdir(path):
        stamp = report["time"].replace(":", "").replace("-", "")
        name = f"sdc-{_safe(report.get('job') or 'job')}-step{report.get('step')}-{stamp}.json"
        path = os.path.join(path, name)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".sdc-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def health_report_objects(report: dict, namespace: str) -> list[dict]:
    """One ``GPUHealthReport`` body per named node (none when the alarm names no node)."""
    bodies = []
    for node in report["nodes"]:
        bodies.append(
            {
                "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
                "kind": CRD_KIND,
                "metadata": {
                    "generateName": f"sdc-{_safe(node).lower()[:40]}-",
                    "namespace": namespace,
                    "labels": {NODE_LABEL: node},
                },
                "spec": {
                    "node": node,
                    "reason": REASON,
                    "source": SOURCE,
                    "evidence": report,
                    "observedTime": report["time"],
                },
            }
        )
    return bodies


def create_health_reports(api: Any, report: dict, namespace: str) -> list[Any]:
    """Create the report's ``GPUHealthReport`` objects through ``api``.

    ``api`` is anything with ``create_namespaced_custom_object(group, version, namespace,
    plural, body)`` - the kubernetes ``CustomObjectsApi``, or a fake in tests.
    """
    return [
        api.create_namespaced_custom_object(
            group=CRD_GROUP, version=CRD_VERSION, namespace=namespace, plural=CRD_PLURAL, body=body
        )
        for body in health_report_objects(report, namespace)
    ]


class _ReportsApi:
    """``create_namespaced_custom_object`` through the shared client (gpu_monitor.kube): its
    retries, rate limit and ``KubeError``; the created objects come back as plain dicts."""

    def __init__(self, kube: Any):
        self.kube = kube

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, body: dict) -> dict:
        return self.kube.create_custom(group, version, namespace, plural, body)


def _in_cluster_api() -> tuple[Any, str] | None:
    """(an API for ``create_health_reports``, namespace) when running in a pod with the
    kubernetes package."""
    from gpu_monitor.kube.config import in_cluster_api_client

    api_client = in_cluster_api_client()
    if api_client is None:
        return None
    from gpu_monitor.kube.client import Kube

    # The daemons watch reports in gpu-monitor's own namespace, not the training job's
    # ($POD_NAMESPACE of the job would hide the report from them).
    namespace = os.environ.get("GPU_MONITOR_NAMESPACE")
    return _ReportsApi(Kube(api_client)), namespace or "gpu-monitor"


def write_report(alarm: dict, rank_map: Sequence[dict] | None, path: str | None = None) -> Any:
    """Deliver ``alarm`` as a schema-1 report; call it on one rank (e.g. rank 0).

    ``path``: a file, or a directory (the file is named after job and step) - returns the file
    written. Without ``path``: in a Kubernetes pod with the ``kubernetes`` package, create one
    ``GPUHealthReport`` per named node in ``$GPU_MONITOR_NAMESPACE`` (default ``gpu-monitor``,
    where the daemons watch; the job needs RBAC to create them there) and
    return the created objects; else write into ``$GPU_MONITOR_REPORT_DIR`` or the daemon's
    default report directory when it exists; else raise ``RuntimeError``.
    """
    report = build_report(alarm, rank_map)
    if path is not None:
        return _write_json(report, path)
    found = _in_cluster_api()
    if found is not None:
        api, namespace = found
        return create_health_reports(api, report, namespace)
    from gpu_monitor.hw.paths import DEFAULT_REPORT_DIR

    directory = os.environ.get("GPU_MONITOR_REPORT_DIR") or DEFAULT_REPORT_DIR
    if os.path.isdir(directory):
        return _write_json(report, directory)
    raise RuntimeError(
        "write_report: no path given, no in-cluster Kubernetes config, and no report directory "
        f"({directory!r}); pass path= or set GPU_MONITOR_REPORT_DIR"
    )
