"""The fabric commands for the ``gpu-monitor`` command line: ``register`` functions only.

The main parser (gpu_monitor/cli.py) calls ``register(subparsers)`` (or the per-command
functions) to add:

- ``fabric-probe``: one rank of the multi-node sweep (under torchrun or an Indexed Job);
- ``fabric-scheduler``: the Lease-led Deployment that probes idle nodes and bisects failures;
- ``idle-check``: the single-node active checks in an idle-time pod, with the outcome fed back
  to the node's daemon.

Nothing here imports torch or kubernetes; each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["register", "register_fabric_probe", "register_fabric_scheduler",
           "register_idle_check"]

ApiFactory = Callable[[argparse.Namespace], Any]


def register_fabric_probe(subparsers: Any) -> argparse.ArgumentParser:
    from gpu_monitor.fabric import probe

    p = subparsers.add_parser(
        "fabric-probe", help="one rank of a multi-node all-reduce/all-gather sweep (torchrun "
                             "or an Indexed Job)",
        description=(probe.__doc__ or "").split("\n\n")[0])
    probe.add_arguments(p)
    p.set_defaults(func=probe.cmd_fabric_probe)
    return p


def register_fabric_scheduler(subparsers: Any,
                              api_factory: ApiFactory | None = None) -> argparse.ArgumentParser:
    """``api_factory(args)`` returns a ``kubernetes.client.ApiClient`` (or a ``Kube``);
    default: in-cluster config, then ``--kubeconfig``. Tests pass one for the fake server."""
    from gpu_monitor.fabric import scheduler_command

    p = subparsers.add_parser(
        "fabric-scheduler", help="probe idle GPU nodes' fabric from Indexed Jobs, bisect "
                                 "failures, file GPUHealthReports (Lease-led)")
    scheduler_command.add_arguments(p)
    p.set_defaults(func=lambda a, f=api_factory: scheduler_command.cmd_fabric_scheduler(a, f))
    return p


def register_idle_check(subparsers: Any) -> argparse.ArgumentParser:
    from gpu_monitor.fabric import idle

    p = subparsers.add_parser(
        "idle-check", help="run the active checks in an idle-time pod and feed a failure to "
                           "the node's daemon (drop directory or GPUHealthReport)")
    idle.add_arguments(p)
    p.set_defaults(func=idle.cmd_idle_check)
    return p


def register(subparsers: Any, api_factory: ApiFactory | None = None) -> None:
    """Add ``fabric-probe``, ``fabric-scheduler`` and ``idle-check``."""
    register_fabric_probe(subparsers)
    register_fabric_scheduler(subparsers, api_factory)
    register_idle_check(subparsers)
