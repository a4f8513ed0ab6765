"""``gpu-monitor fabric-probe``: one rank of a multi-node all-reduce / all-gather sweep.

Runs under any torch.distributed launcher (torchrun, or an Indexed Job: probe_env.py); NCCL
on GPUs, gloo on CPU (the tests): the same code. Every rank proves the data of each collective
exactly and times it (probe_rank.py); rank 0 judges the group (probe_result.py) against the
profile's floors (probe_settings.py) and the transport NCCL took (transport.py).

This module is the command: its flags, the start-up checks that make a bad start a usage
error, and the output. Rank 0 prints the group result (JSON, ``RESULT_SCHEMA``,
docs/fabric.md) and every node's local rank 0 writes a compact summary (< 4 KiB) to
``--termination-log``, which the fabric scheduler reads from the pod status. Exit codes: 0
healthy, 1 unhealthy, 3 unknown (or 0 whenever a result was produced, with ``--zero-exit``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from gpu_monitor.fabric import termination
from gpu_monitor.fabric.probe_env import (
    TEST_FAULT_ENV,
    ProbeError,
    launch_env,
    parse_test_faults,
)
from gpu_monitor.fabric.probe_rank import run
from gpu_monitor.fabric.probe_result import (
    RESULT_SCHEMA,
    SUMMARY_KIND,
    VERDICT_EXIT,
    render_table,
    summarize,
)
from gpu_monitor.fabric.probe_settings import OPS
from gpu_monitor.model import EXIT_HEALTHY, EXIT_UNKNOWN, EXIT_USAGE, iso, utcnow

log = logging.getLogger(__name__)


# --- the command -------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", metavar="NAME|FILE", default="auto",
                   help="expectations profile (fabric.* floors, nccl.* sweep); auto: by the GPU "
                        "name, cpu-only without GPUs")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda (NCCL) or cpu (gloo); auto: cuda when available")
    p.add_argument("--group", metavar="NAME", default=None,
                   help="group label in the result (default $GPU_MONITOR_FABRIC_GROUP)")
    p.add_argument("--min-bytes", type=int, default=None, help="smallest message (nccl."
                                                              "sweep_min_bytes)")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="largest message (nccl.sweep_max_bytes; capped at 16 MiB on CPU)")
    p.add_argument("--factor", type=int, default=None, help="size step (nccl.sweep_factor)")
    p.add_argument("--iterations", type=int, default=None, help="timed iterations per size")
    p.add_argument("--warmup", type=int, default=None, help="warm-up iterations per size")
    p.add_argument("--busbw-floor", type=float, default=None, metavar="GB/S",
                   help="large-message busbw floor (fabric.busbw_floor_gb_per_s)")
    p.add_argument("--latency-limit", type=float, default=None, metavar="SECONDS",
                   help="small-message p95 limit (fabric.small_p95_latency_limit_s)")
    p.add_argument("--ops", default=None, metavar="A,B",
                   help=f"operations to sweep (default {','.join(OPS)})")
    p.add_argument("--expect-transport", choices=("auto", "rdma", "any"), default="auto",
                   help="rdma: traffic over sockets makes the verdict unknown; auto: rdma when "
                        "the profile lists RDMA ports and the group spans nodes")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="collective / rendezvous timeout")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table")
    p.add_argument("--result-file", metavar="FILE", help="also write the group result here "
                                                        "(rank 0)")
    p.add_argument("--termination-log", metavar="FILE",
                   help="write a compact summary here (each node's local rank 0), e.g. "
                        "/dev/termination-log")
    p.add_argument("--zero-exit", action="store_true",
                   help="exit 0 whenever a result was produced (the verdict is in it): for Jobs")


def cmd_fabric_probe(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        env = launch_env(os.environ)
        fault_text = os.environ.get(TEST_FAULT_ENV) or None
        faults = parse_test_faults(fault_text)
    except ProbeError as exc:
        print(f"gpu-monitor fabric-probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if faults:
        log.warning("%s=%s is set: this run injects faults on purpose (test use only)",
                    TEST_FAULT_ENV, fault_text)
    overrides = {
        "sweep_min_bytes": args.min_bytes, "sweep_max_bytes": args.max_bytes,
        "sweep_factor": args.factor, "iterations": args.iterations,
        "warmup_iterations": args.warmup, "busbw_floor_gb_per_s": args.busbw_floor,
        "small_p95_latency_limit_s": args.latency_limit,
        "expect_transport": args.expect_transport,
        "ops": [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None,
    }
    group = args.group or os.environ.get("GPU_MONITOR_FABRIC_GROUP")
    try:
        result = run(env, device_kind=args.device, profile_ref=args.profile,
                     overrides=overrides, group=group, timeout_s=args.timeout_s, faults=faults,
                     fault_text=fault_text)
    except ProbeError as exc:
        print(f"gpu-monitor fabric-probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - a broken fabric surfaces as any error
        message = f"{type(exc).__name__}: {exc}"[:1000]
        print(f"gpu-monitor fabric-probe: rank {env.rank}: {message}", file=sys.stderr)
        if args.termination_log and env.local_rank == 0:
            termination.write(args.termination_log, {
                "schema": RESULT_SCHEMA, "kind": SUMMARY_KIND, "group": group,
                "verdict": "unknown", "reasons": ["FabricProbeError"], "node": env.node,
                "rank": env.rank, "error": message, "finished_at": iso(utcnow())})
        return EXIT_UNKNOWN
    if env.local_rank == 0 and args.termination_log:
        termination.write(args.termination_log, summarize(result, env.node))
    if env.rank == 0:
        if args.result_file:
            with open(args.result_file, "w", encoding="utf-8") as fh:
                json.dump(result, fh, indent=2)
        if args.output == "json":
            print(json.dumps(result, indent=2))
        else:
            print(render_table(result))
    return EXIT_HEALTHY if args.zero_exit else VERDICT_EXIT[result["verdict"]]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-monitor fabric-probe",
                                description="one rank of a multi-node all-reduce/all-gather "
                                            "sweep (run under torchrun or an Indexed Job)")
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return cmd_fabric_probe(build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
