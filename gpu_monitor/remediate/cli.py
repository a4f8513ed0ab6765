"""Operator commands: ``gpu-monitor breaker status|pause|resume|reset`` and
``gpu-monitor quarantine status|release|retest --node N``.

Why through the API server: an operator runs these from a workstation, not on the node, and
the node's state store lives on the node. The breaker is the shared ConfigMap, changed by
compare-and-swap like the daemons do. ``quarantine release|retest`` leave a request annotation
on the Node (``gpu-monitor.io/release-requested`` / ``retest-requested``) that the node's own
daemon acts on at its next node sync (within ``node_sync_s``), so the daemon stays the only
writer of its node's quarantine; ``quarantine status`` reads the mirror (label, annotations,
taint, conditions) that every daemon keeps on its Node.

Exit codes: 0 done, 1 refused (e.g. the node is not quarantined), 2 usage/configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.model import iso

__all__ = ["cmd_breaker", "cmd_quarantine", "register"]

ApiFactory = Callable[[argparse.Namespace], Any]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML configuration (breaker budget, taint "
                                                    "key)")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, "
                                                        "then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--namespace", default="gpu-monitor",
                   help="namespace of the breaker ConfigMap and GPUHealthReports "
                        "(default gpu-monitor)")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table")


def register(subparsers: Any, api_factory: ApiFactory | None = None) -> None:
    """Add ``breaker`` and ``quarantine`` to the gpu-monitor command line.

    ``api_factory(args)`` returns a ``kubernetes.client.ApiClient`` (default: in-cluster, then
    ``--kubeconfig``); tests pass one pointed at the fake API server.
    """
    b = subparsers.add_parser("breaker", help="show or operate the fleet circuit breaker")
    bsub = b.add_subparsers(dest="breaker_command", metavar="ACTION")
    bsub.required = True
    for name, text in (("status", "show the breaker: state, slots, budget"),
                       ("pause", "refuse new quarantines until `resume` (does not trip)"),
                       ("resume", "undo `pause`"),
                       ("reset", "close a tripped breaker; the storm cooldown starts now")):
        p = bsub.add_parser(name, help=text)
        _add_common(p)
        p.set_defaults(func=lambda a, f=api_factory: cmd_breaker(a, f), breaker_command=name)

    q = subparsers.add_parser("quarantine", help="show, release or retest quarantined nodes")
    qsub = q.add_subparsers(dest="quarantine_command", metavar="ACTION")
    qsub.required = True
    for name, text, need in (
            ("status", "quarantine state of one node, or of every node gpu-monitor touched",
             False),
            ("release", "approve returning a node to service (the only way out of `replace`)",
             True),
            ("retest", "ask the node's daemon to reset and retest a quarantined node", True)):
        p = qsub.add_parser(name, help=text)
        _add_common(p)
        p.add_argument("--node", required=need, metavar="N", help="node name")
        p.set_defaults(func=lambda a, f=api_factory: cmd_quarantine(a, f),
                       quarantine_command=name)


# --- plumbing -------------------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> Any:
    from gpu_monitor.config import load_config

    return load_config(getattr(args, "config", None))


def _kube(args: argparse.Namespace, api_factory: ApiFactory | None) -> Any:
    from gpu_monitor.kube.client import Kube
    from gpu_monitor.kube.config import load_api_client

    api = api_factory(args) if api_factory else load_api_client(
        getattr(args, "kubeconfig", None), getattr(args, "context", None))
    return api if isinstance(api, Kube) else Kube(api, Clock(), retry_deadline_s=15.0)


def _setup(args: argparse.Namespace, api_factory: ApiFactory | None) -> tuple[Any, Any] | int:
    """(config, Kube), or the exit code after saying why not (2: bad config or no cluster)."""
    from gpu_monitor.config import ConfigError

    try:
        config = _config(args)
    except ConfigError as exc:
        return _fail(str(exc), 2)
    try:
        kube = _kube(args, api_factory)
    except Exception as exc:  # noqa: BLE001 - no kubeconfig, no in-cluster config
        return _fail(f"cannot configure a Kubernetes client: {exc}", 2)
    return config, kube


def _print(args: argparse.Namespace, data: Any, table: str) -> None:
    if getattr(args, "output", "table") == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(table)


def _fail(message: str, code: int = 1) -> int:
    print(f"gpu-monitor: {message}", file=sys.stderr)
    return code


# --- breaker --------------------------------------------------------------------------------------


def cmd_breaker(args: argparse.Namespace, api_factory: ApiFactory | None = None) -> int:
    from gpu_monitor.kube.errors import KubeError
    from gpu_monitor.remediate.breaker import budget_for
    from gpu_monitor.remediate.k8s.breaker import BreakerSettings, ConfigMapBreaker

    ready = _setup(args, api_factory)
    if isinstance(ready, int):
        return ready
    config, kube = ready
    settings = BreakerSettings.from_config(config.remediation.breaker, args.namespace)
    breaker = ConfigMapBreaker(kube, settings)
    action = args.breaker_command
    try:
        if action == "pause":
            st = breaker.pause(True)
        elif action == "resume":
            st = breaker.pause(False)
        elif action == "reset":
            st = breaker.reset()
        else:
            st = breaker.status()
        if not st.exists:
            return _fail(f"the breaker ConfigMap {args.namespace}/{settings.name} does not exist "
                         "(it is created by the daemonset manifests)")
        gpu_nodes = kube.count_gpu_nodes()
    except KubeError as err:
        return _fail(f"breaker {action}: {err}")
    budget = budget_for(gpu_nodes, settings.budget_fraction, settings.max_nodes)
    now = Clock().now()
    live = st.live_slots(now, settings.ttl_s)
    data = {**st.to_dict(), "budget": budget, "gpuNodes": gpu_nodes,
            "expired": sorted(set(st.slots) - set(live))}
    lines = [f"breaker {args.namespace}/{settings.name}: {st.state}"
             + (" (paused)" if st.paused else ""),
             f"slots: {len(live)}/{budget} used ({gpu_nodes} GPU nodes x "
             f"{settings.budget_fraction:g}, cap {settings.max_nodes})"]
    for node, s in sorted(st.slots.items()):
        mark = "" if node in live else "  (expired)"
        lines.append(f"  {node:<30} since {s.since}  {s.reason}{mark}")
    if st.state == "tripped":
        lines.append(f"tripped at {st.tripped_at} by {st.tripped_by}: {st.tripped_reason}")
    until = st.cooling_until(settings.cooldown_s)
    if until is not None and now < until:
        lines.append(f"storm cooldown until {iso(until)} (reset at {st.reset_at})")
    lines.append(f"replacements: {st.replacements}")
    _print(args, data, "\n".join(lines))
    return 0


# --- quarantine -----------------------------------------------------------------------------------


def _node_summary(obj: dict, taint_key: str) -> dict[str, Any]:
    from gpu_monitor.remediate.conditions import PROBLEM_CLASSES
    from gpu_monitor.remediate.k8s.node import ANNOTATIONS, LABEL_REPLACE, LABEL_STATE, NodeView

    view = NodeView.of(obj)
    ours = set(PROBLEM_CLASSES.values()) | {"GPUProblem"}
    taint = view.taint(taint_key)
    return {
        "node": view.name,
        "state": view.labels.get(LABEL_STATE, "healthy"),  # no label: never touched
        "replace": view.labels.get(LABEL_REPLACE) == "true",
        "unschedulable": view.unschedulable,
        "taint": f"{taint_key}={taint.get('value', '')}:NoSchedule" if taint else None,
        "annotations": {k: v for k, v in sorted(view.annotations.items())
                        if k.startswith("gpu-monitor.io/")},
        "conditions": [{"type": c.get("type"), "status": c.get("status"),
                        "reason": c.get("reason"), "message": c.get("message")}
                       for c in view.conditions if c.get("type") in ours],
        "cordon_pre_existing": view.annotations.get(ANNOTATIONS.PRE_EXISTING) == "true",
    }


def _render_node(s: dict[str, Any]) -> str:
    lines = [f"{s['node']}: {s['state']}" + ("  (labelled for replacement)" if s["replace"]
                                              else ""),
             f"  schedulable: {'no' if s['unschedulable'] else 'yes'}"
             + ("  (cordoned before gpu-monitor acted)" if s["cordon_pre_existing"] else ""),
             f"  taint: {s['taint'] or '-'}"]
    for k, v in s["annotations"].items():
        lines.append(f"  {k}: {v}")
    for c in s["conditions"]:
        lines.append(f"  condition {c['type']}={c['status']} {c['reason']}: {c['message']}")
    return "\n".join(lines)


def cmd_quarantine(args: argparse.Namespace, api_factory: ApiFactory | None = None) -> int:
    from gpu_monitor.kube.errors import KubeError
    from gpu_monitor.remediate.k8s.node import ANNOTATIONS, LABEL_STATE

    ready = _setup(args, api_factory)
    if isinstance(ready, int):
        return ready
    config, kube = ready
    taint_key = config.remediation.taint_key
    action = args.quarantine_command
    try:
        if action == "status":
            if args.node:
                obj = kube.get_node(args.node)
                summary = _node_summary(obj, taint_key)
                _print(args, summary, _render_node(summary))
                return 0
            page = kube.call(kube.core.list_node, label_selector=LABEL_STATE) or {}
            rows = [_node_summary(o, taint_key) for o in page.get("items") or []]
            rows = [r for r in rows if r["state"] != "healthy"]
            table = "\n".join(_render_node(r) for r in rows) or "no node is out of service"
            _print(args, rows, table)
            return 0
        obj = kube.get_node(args.node)
        summary = _node_summary(obj, taint_key)
        state = summary["state"]
        if action == "release":
            if state == "healthy":
                return _fail(f"node {args.node} is healthy: nothing to release")
            key = ANNOTATIONS.RELEASE_REQUESTED
        else:
            if state not in ("quarantined", "reboot-required"):
                return _fail(f"node {args.node} is {state}: only a quarantined or "
                             "reboot-required node can be retested")
            key = ANNOTATIONS.RETEST_REQUESTED
        body = {"metadata": {"annotations": {key: iso(Clock().now())}}}
        kube.patch_node(args.node, body)
    except KubeError as err:
        return _fail(f"quarantine {action}: {err}")
    print(f"node {args.node}: {action} requested (the node's gpu-monitor daemon acts on it at "
          "its next sync)")
    return 0
