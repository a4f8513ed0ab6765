"""``gpu-monitor fabric-scheduler``: the command that runs the fabric scheduler.

Why apart from the scheduler: flags, the YAML settings file, the Kubernetes client, the probe
image and the signals are the process's business; scheduler.py's loop takes them built (an
API, settings, a template) so tests drive it on a fake API server without a command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import yaml

from gpu_monitor import logs
from gpu_monitor.fabric.api import FabricApi
from gpu_monitor.fabric.metrics import serve_metrics
from gpu_monitor.fabric.plan import load_template
from gpu_monitor.fabric.scheduler import FabricScheduler
from gpu_monitor.fabric.scheduler_settings import (
    DEFAULT_TEMPLATE,
    SchedulerSettings,
    settings_from_mapping,
)
from gpu_monitor.kube.client import Kube
from gpu_monitor.kube.config import load_api_client
from gpu_monitor.model import EXIT_USAGE

log = logging.getLogger(__name__)

ApiFactory = Callable[[argparse.Namespace], Any]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--settings", metavar="FILE",
                   help="YAML mapping of scheduler settings (docs/fabric.md); flags override")
    p.add_argument("--namespace", default=None, help="the scheduler's namespace: its Lease, "
                                                     "record (default gpu-monitor)")
    p.add_argument("--job-namespace", default=None,
                   help="namespace of the probe and idle-check Jobs, not the daemon's "
                        "(default gpu-monitor-jobs)")
    p.add_argument("--identity", default=None, help="lease identity (default pod name + id)")
    p.add_argument("--job-template", default=None, metavar="FILE",
                   help=f"probe Job template (default {DEFAULT_TEMPLATE})")
    p.add_argument("--image", default=None, help="image for probe pods (overrides the template)")
    p.add_argument("--listen", default="0.0.0.0:9426", metavar="HOST:PORT",
                   help="/metrics, /healthz and /readyz endpoint (empty: none)")
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
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="json: one JSON object a line, as the daemon's --log-format json")


def settings_from_args(args: argparse.Namespace) -> SchedulerSettings:
    base = SchedulerSettings()
    if args.settings:
        with open(args.settings, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{args.settings}: not a mapping")
        base = settings_from_mapping(data)
    flags: dict[str, Any] = {
        "namespace": args.namespace, "job_namespace": args.job_namespace,
        "identity": args.identity,
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
    logs.setup(args.log_format, args.log_level)
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

    def _stop(*_: Any) -> None:
        sched.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    sched.run()
    return 0
