"""``gpu-monitor status``, ``history`` and ``explain``: the node on the command line.

Why here and not in gpu_monitor/cli.py: the wiring module is at its size limit, and these
commands need none of its wiring (no host, no checks run): they read the daemon's store
through the read-only door (state/readonly.py), so they work beside a running daemon (through
``kubectl exec`` in its pod: ``--state`` and ``--config`` default to the daemon's paths) and
on a copied file. ``register`` adds them to the command line, as state/cli.py does.

Exit codes: 0 shown; 1 the state file is missing, damaged or unusable (``status``/``history``:
the message names the file), or the runbook does not know the reason (``explain``); 2 bad flags
or configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gpu_monitor import logs
from gpu_monitor.clock import Clock
from gpu_monitor.config import ConfigError, load_config
from gpu_monitor.hw.paths import DEFAULT_CONFIG_FILE, DEFAULT_STATE_DB
from gpu_monitor.model import UsageError
from gpu_monitor.nodeview import render, runbook
from gpu_monitor.nodeview.explain import explain
from gpu_monitor.nodeview.history import node_history, parse_since
from gpu_monitor.nodeview.status import node_status
from gpu_monitor.state.errors import StoreError
from gpu_monitor.state.readonly import open_read_only

__all__ = ["register"]

EXIT_UNUSABLE = 1


def _add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", metavar="PATH",
                   help="state database to read (default: state_path from the config, else "
                        f"{DEFAULT_STATE_DB}, the daemon's); a copy works too")
    p.add_argument("--config", metavar="FILE",
                   help=f"the daemon's YAML configuration (default: {DEFAULT_CONFIG_FILE} "
                        "when it exists, as in the DaemonSet pod, else the defaults)")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table")


#: The exit codes every command that reads the store shares (the module docstring's).
_STORE_EXITS = "Exit 0 shown, 1 state file missing or unusable, 2 bad flags or config."


def _store_command(sub: Any, name: str, func: Any, help_text: str,
                   description: str) -> argparse.ArgumentParser:
    """A command that reads the daemon's store: its parser, with the store flags
    (``_add_store_args``) and the exit codes such commands share after ``description``."""
    p = sub.add_parser(name, help=help_text, description=f"{description} {_STORE_EXITS}")
    _add_store_args(p)
    p.set_defaults(func=func)
    return p


def register(sub: Any) -> None:
    st = _store_command(
        sub, "status", cmd_status,
        "the node now, from the daemon's store: results, lifecycle, breaker, bootstrap gate, "
        "next remediation step (read-only)",
        "Read the daemon's state store (read-only, beside a running daemon) and show the node "
        "now.")
    st.add_argument("--all", action="store_true", dest="every",
                    help="list every target's result in the table, not only the problems")

    hi = _store_command(
        sub, "history", cmd_history,
        "the results the daemon's store remembers, and their changes (read-only)",
        "Read the daemon's state store (read-only) and list what changed: the first result of "
        "each check and target in the window, then every change of status or reason, with the "
        "lifecycle changes and remediation steps.")
    hi.add_argument("--check", metavar="C", help="only this check's results")
    hi.add_argument("--target", metavar="T", help="only this target's results (gpu:3, ...)")
    hi.add_argument("--since", metavar="WHEN", default="1h",
                    help="a duration before now (30s, 15m, 1h, 2d) or an RFC 3339 time "
                         "(default 1h)")
    hi.add_argument("--all", action="store_true", dest="every",
                    help="every stored result, not only the changes")
    hi.add_argument("--limit", type=int, default=500, metavar="N",
                    help="show at most the newest N results (default 500)")

    ex = sub.add_parser(
        "explain", help="what a reason means, how sure it is and what to do (the runbook's "
                        "words)",
        description="Explain a reason token (NvLinkDown, Xid79, rdma_ports/PortDown) from "
                    "the runbook (docs/runbook.md, packaged with gpu-monitor). Exit 0 "
                    "explained, 1 unknown reason.")
    ex.add_argument("reason", metavar="REASON", help="a reason, or check/Reason")
    ex.add_argument("--output", "-o", choices=("table", "json"), default="table")
    ex.set_defaults(func=cmd_explain)


def _config(args: argparse.Namespace) -> Any:
    path = args.config
    if path is None and os.path.isfile(DEFAULT_CONFIG_FILE):
        path = DEFAULT_CONFIG_FILE
    try:
        config = load_config(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    logs.setup(config.log_format, config.log_level)
    return config


def _print(args: argparse.Namespace, doc: Any, table: str) -> None:
    try:
        print(json.dumps(doc, indent=2) if args.output == "json" else table, flush=True)
    except BrokenPipeError:
        # `gpu-monitor history | head`: the reader has what it wanted. Point stdout at
        # /dev/null so that the interpreter's own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _unusable(args: argparse.Namespace, path: str, exc: StoreError) -> int:
    if args.output == "json":
        print(json.dumps({"state_file": path, "error": str(exc)}, indent=2))
    print(f"gpu-monitor: {exc}", file=sys.stderr)
    return EXIT_UNUSABLE


def _read(args: argparse.Namespace, build: Any) -> int:
    config = _config(args)
    path = args.state or config.state_path or DEFAULT_STATE_DB
    clock = Clock()
    try:
        with open_read_only(path, clock) as store:
            doc, table = build(store, config, clock)
    except StoreError as exc:
        return _unusable(args, path, exc)
    _print(args, doc, table)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    def build(store: Any, config: Any, clock: Clock) -> tuple[Any, str]:
        doc = node_status(store, config, clock.now())
        return doc, render.status_table(doc, every=args.every)

    return _read(args, build)


def cmd_history(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError(f"--limit {args.limit}: must be at least 1")
    since = parse_since(args.since, Clock().now())

    def build(store: Any, config: Any, clock: Clock) -> tuple[Any, str]:
        doc = node_history(store, since=since, check=args.check, target=args.target,
                           every=args.every, limit=args.limit)
        return doc, render.history_table(doc)

    return _read(args, build)


def cmd_explain(args: argparse.Namespace) -> int:
    doc = explain(runbook.load(), args.reason)
    _print(args, doc, render.explain_table(doc))
    return 0 if doc["found"] else EXIT_UNUSABLE
