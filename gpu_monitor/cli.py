"""The ``gpu-monitor`` command line: argument parsing and wiring, nothing else.

Every subcommand builds the same pieces (config, host, profile, store) through ``build_env``
and hands them, with the checks it selected (suite.py), to the runner, the daemon or the
remediation layer. This module is the composition root: it alone decides between this host
and the simulated node (``--simulate``), and nothing imports it but the entry points. Exit
codes of one-shot commands are a contract: 0 healthy (degraded results are listed), 1
unhealthy, 2 usage or configuration error, 3 could not decide; 130 after Ctrl-C and 143 after
SIGTERM, each once every ``finally`` has run (a simulated node's temporary tree is always
removed).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_monitor import __version__, logs, slurm_hooks
from gpu_monitor.check import Context
from gpu_monitor.clock import Clock
from gpu_monitor.config import BACKENDS, ConfigError, load_config
from gpu_monitor.daemon import build_remediator, run_daemon, run_once
from gpu_monitor.fabric.cli import register as register_fabric
from gpu_monitor.host import Host
from gpu_monitor.hw.paths import DEFAULT_STATE_DB, HostPaths
from gpu_monitor.kube.config import kubeconfig_factory
from gpu_monitor.kube.errors import KubeConfigError
from gpu_monitor.model import EXIT_USAGE, Kind, UsageError
from gpu_monitor.nodeview.cli import register as register_nodeview
from gpu_monitor.profiles import ProfileError, load_profile, match_profile
from gpu_monitor.progress import Progress, expected_durations
from gpu_monitor.registry import all_check_classes
from gpu_monitor.remediate.cli import register as register_remediation
from gpu_monitor.remediate.slurm.tools import SlurmError, SlurmTools
from gpu_monitor.report_output import emit
from gpu_monitor.runner import RunnerHooks, run_suite
from gpu_monitor.sim.faults.base import InjectError
from gpu_monitor.sim.inject import KINDS, help_text, parse
from gpu_monitor.sim.node import SimulatedNode
from gpu_monitor.state import Store
from gpu_monitor.state.cli import register as register_state
from gpu_monitor.state.errors import StoreError
from gpu_monitor.state.recovery import AUTO_RECOVER_MAX_COPIES
from gpu_monitor.state.recovery import recover as open_or_recover
from gpu_monitor.suite import bootstrap_suite, select_checks

log = logging.getLogger("gpu_monitor")


# --- argument parsing -----------------------------------------------------------------------------


STATE_HELP_ONE_SHOT = (
    "state database file to read and add to (default: none, a one-shot run keeps its state in "
    "memory and writes no file; the config's state_path is the daemon's and is not used here; "
    "pass /var/lib/gpu-monitor/state.db to read and add to the daemon's history)")
STATE_HELP_DAEMON = (
    "state database (default: state_path from --config, else /var/lib/gpu-monitor/state.db; "
    "in memory with --simulate)")


def _common(p: argparse.ArgumentParser, state_help: str = STATE_HELP_ONE_SHOT) -> None:
    g = p.add_argument_group("host and configuration")
    g.add_argument("--config", metavar="FILE", help="YAML configuration file")
    g.add_argument("--profile", metavar="NAME|FILE",
                   help="expectations profile: auto (by NVML product name), a shipped name "
                        "(h100-sxm-8, h200-sxm-8, a100-sxm-8, cpu-only) or a YAML file")
    g.add_argument("--state", metavar="PATH", help=state_help)
    g.add_argument("--path.sysfs", dest="path_sysfs", default=None, metavar="DIR",
                   help="sysfs mount point (default /sys)")
    g.add_argument("--path.procfs", dest="path_procfs", default=None, metavar="DIR",
                   help="procfs mount point (default /proc)")
    g.add_argument("--path.dev", dest="path_dev", default=None, metavar="DIR",
                   help="devfs mount point (default /dev)")
    g.add_argument("--path.rootfs", dest="path_rootfs", default=None, metavar="DIR",
                   help="host root filesystem (default /)")
    g.add_argument("--kmsg", metavar="FILE",
                   help="read the kernel log from FILE (a dmesg/journal text file, raw kmsg "
                        "records or a FIFO) instead of <path.dev>/kmsg")
    g.add_argument("--simulate", metavar="PROFILE",
                   help="examine a simulated node built from PROFILE instead of this host")
    g.add_argument("--inject", metavar="SPEC", action="append", default=[],
                   help="with --simulate: add a fault KIND@TARGET[,key=value...] "
                        "(repeatable; see `gpu-monitor list-faults`)")
    g.add_argument("--node-name", help="node name in reports (default: $NODE_NAME, hostname)")
    g.add_argument("--log-format", choices=("text", "json"), default=None)
    g.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=None)


def _run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=("table", "json"), default="table")
    p.add_argument("--force", action="store_true",
                   help="run invasive checks even while other processes use the GPUs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-monitor",
        description="GPU node-health checks, daemon and remediation.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=("exit codes: 0 healthy (degraded results listed), 1 unhealthy, "
                "2 usage/configuration error, 3 could not decide\n\n" + help_text()),
    )
    parser.add_argument("--version", action="version", version=f"gpu-monitor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    b = sub.add_parser("bootstrap", help="run the bootstrap suite once and print a report",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=help_text())
    _common(b)
    _run_flags(b)
    b.add_argument("--checks", metavar="A,B", help="run only these checks")
    b.add_argument("--skip", metavar="C,D", action="append", default=[],
                   help="skip these checks")
    b.add_argument("--fail-fast", action="store_true", help="stop after the first failed check")
    b.set_defaults(func=cmd_bootstrap)

    c = sub.add_parser("check", help="run one check once",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=help_text())
    c.add_argument("name", help="check name (see list-checks)")
    _common(c)
    _run_flags(c)
    c.set_defaults(func=cmd_check)

    lc = sub.add_parser("list-checks", help="list the available checks")
    _common(lc)
    lc.add_argument("--output", "-o", choices=("table", "json"), default="table")
    lc.set_defaults(func=cmd_list_checks)

    lf = sub.add_parser("list-faults", help="list the --inject fault kinds")
    lf.add_argument("--output", "-o", choices=("table", "json"), default="table")
    lf.set_defaults(func=cmd_list_faults)

    d = sub.add_parser("daemon", help="run the passive checks continuously and serve /metrics",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=help_text())
    _common(d, state_help=STATE_HELP_DAEMON)
    d.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help="metrics and health endpoint (default 0.0.0.0:9425)")
    d.add_argument("--once", action="store_true",
                   help="run every enabled passive check once, print the report and exit")
    d.add_argument("--output", "-o", choices=("table", "json"), default="table")
    d.add_argument("--force", action="store_true")
    d.add_argument("--dry-run", action="store_true",
                   help="remediation decides, logs, events and counts, but changes nothing "
                        "(config remediation.dry_run)")
    d.add_argument("--backend", choices=BACKENDS, default=None,
                   help="where remediation delivers: kubernetes (our Node) or slurm "
                        "(scontrol drain/resume; docs/slurm.md) (config daemon.backend)")
    d.add_argument("--kubeconfig", metavar="FILE",
                   help="reach the API server through this kubeconfig (a daemon outside a "
                        "cluster; default: in-cluster config, else $KUBECONFIG, else "
                        "~/.kube/config)")
    d.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")
    d.set_defaults(func=cmd_daemon)

    sh = sub.add_parser("slurm-hook", help="run as Slurm's HealthCheckProgram, Prolog or "
                                           "Epilog (docs/slurm.md)",
                        description=slurm_hooks.__doc__.split("\n\n")[0] if slurm_hooks.__doc__
                        else None)
    sh.add_argument("hook", choices=slurm_hooks.HOOKS)
    _common(sh)
    sh.add_argument("--budget", type=float, metavar="SECONDS", default=None,
                    help="the hook's time budget (default: healthcheck "
                         f"{slurm_hooks.BUDGET_S['healthcheck']:g}, prolog "
                         f"{slurm_hooks.BUDGET_S['prolog']:g}, epilog "
                         f"{slurm_hooks.BUDGET_S['epilog']:g})")
    sh.add_argument("--output", "-o", choices=("table", "json", "none"), default="none",
                    help="print the report (default: none; the log says the verdict)")
    sh.set_defaults(func=cmd_slurm_hook)

    register_remediation(sub)
    register_fabric(sub)
    register_state(sub)
    register_nodeview(sub)
    return parser


# --- wiring ----------------------------------------------------------------------------------------


@dataclass
class Env:
    config: Any
    profile: Any
    host: Any
    store: Any
    node: str
    clock: Any
    sim: Any = None
    extras: dict = field(default_factory=dict)

    def context(self, force: bool = False, one_shot: bool = True) -> Context:
        return Context(host=self.host, profile=self.profile, config=self.config, node=self.node,
                       clock=self.clock, store=self.store, force=force, one_shot=one_shot,
                       log=logging.getLogger("gpu_monitor.check"))

    def close(self) -> None:
        try:
            self.host.close()
        finally:
            if self.store is not None:
                self.store.close()


def _split(values: Sequence[str] | str | None) -> list[str]:
    if not values:
        return []
    if isinstance(values, str):
        values = [values]
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def build_env(args: argparse.Namespace, clock=None) -> Env:
    """The pieces every command runs on, built in order: config (and logging), node name,
    host and profile (this host, or the simulated node with its faults), state store. Any step
    that fails closes what the earlier ones opened; a bad flag or file is a ``UsageError``."""
    clock = clock or Clock()
    config = _load_config(args)
    node = getattr(args, "node_name", None) or config.node_name or os.environ.get(
        "NODE_NAME") or socket.gethostname()
    faults = _faults(args)
    host, profile, sim = _open_host(args, config, faults, node)
    store = _open_store(args, config, clock, host, simulated=sim is not None)
    return Env(config=config, profile=profile, host=host, store=store, node=node, clock=clock,
               sim=sim)


def _load_config(args: argparse.Namespace):
    """``--config`` (validated), and logging set up as it and the flags say."""
    try:
        config = load_config(getattr(args, "config", None))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    logs.setup(getattr(args, "log_format", None) or config.log_format,
               getattr(args, "log_level", None) or config.log_level)
    return config


def _faults(args: argparse.Namespace) -> list:
    """The ``--inject`` faults, parsed; they need ``--simulate`` (never this host)."""
    injects = getattr(args, "inject", []) or []
    if injects and not getattr(args, "simulate", None):
        raise UsageError("--inject needs --simulate PROFILE (faults are injected into a "
                         "simulated node, never into this host)")
    try:
        return [parse(s) for s in injects]
    except InjectError as exc:
        raise UsageError(f"--inject {exc}") from None


def _open_host(args: argparse.Namespace, config, faults: list, node: str):
    """(host, profile, simulated node or None): the simulated node for ``--simulate``, else
    this host under the ``--path.*`` roots; the profile with the config applied."""
    sim = host = None
    simulate = getattr(args, "simulate", None)
    profile_arg = getattr(args, "profile", None) or config.profile or "auto"
    try:
        if simulate:
            sim, profile = _simulated_node(args, simulate, profile_arg, config, faults, node)
            host = sim.host()
            if args.kmsg:
                # A given log replaces the simulated node's own (replaying a saved log against
                # a profile's topology); faults that write kernel-log lines then go unread.
                host.paths = dataclasses.replace(host.paths, kmsg=args.kmsg)
            profile = profile.for_simulation()
        else:
            host = Host.real(_host_paths(args))
            profile = config.apply_to(
                _auto_profile(host) if profile_arg == "auto" else load_profile(profile_arg))
    except (ProfileError, ConfigError) as exc:
        if sim is not None:
            sim.close()
        elif host is not None:
            host.close()
        raise UsageError(str(exc)) from None
    except BaseException:
        # A usage error, Ctrl-C, anything: the simulated node's temporary tree goes with it.
        if sim is not None:
            sim.close()
        raise
    return host, profile, sim


def _simulated_node(args: argparse.Namespace, simulate: str, profile_arg: str, config,
                    faults: list, node: str):
    """(the simulated node, the profile its checks hold it to)."""
    sim_profile = load_profile(simulate)
    # Every file is validated before the simulated node is built (a bad one costs nothing and
    # leaves nothing behind).
    profile = config.apply_to(sim_profile if profile_arg == "auto" else load_profile(profile_arg))
    try:
        sim = SimulatedNode(sim_profile, faults, hostname=node)
    except InjectError as exc:
        raise UsageError(f"--inject {exc}") from None
    return sim, profile


def _host_paths(args: argparse.Namespace) -> HostPaths:
    """This host's roots: ``--path.sysfs`` etc. and ``--kmsg``, else the defaults."""
    if not (args.path_sysfs or args.path_procfs or args.path_dev or args.path_rootfs
            or args.kmsg):
        return HostPaths()
    return HostPaths(
        sysfs=args.path_sysfs or "/sys",
        procfs=args.path_procfs or "/proc",
        dev=args.path_dev or "/dev",
        rootfs=args.path_rootfs or "/",
        kmsg=args.kmsg,
    )


def _state_path(args: argparse.Namespace, config, simulated: bool) -> str:
    if getattr(args, "command", None) == "daemon":
        return (getattr(args, "state", None) or config.state_path
                or (":memory:" if simulated else DEFAULT_STATE_DB))
    # A one-shot run keeps its state in memory unless --state names a file: the config's
    # state_path is the daemon's history, which an ad-hoc run must not add to (nor need root to
    # open).
    return getattr(args, "state", None) or ":memory:"


def _open_store(args: argparse.Namespace, config, clock, host, simulated: bool):
    """The state store (``_state_path``); on any failure the host is closed first."""
    state_path = _state_path(args, config, simulated)
    try:
        # The long-running daemon may move a damaged file aside at start (state/recovery.py)
        # rather than crash-loop; one-shot runs only report it.
        if (getattr(args, "command", None) == "daemon" and not getattr(args, "once", False)
                and config.daemon.recover_corrupt_state):
            store, _ = open_or_recover(state_path, clock, by="daemon",
                                       max_copies=AUTO_RECOVER_MAX_COPIES)
        else:
            store = Store.open(state_path, clock=clock)
    except PermissionError as exc:
        host.close()
        raise UsageError(f"cannot open state database {state_path}: {exc}; pass --state PATH "
                         "(or run as root)") from None
    except StoreError as exc:
        host.close()
        raise UsageError(str(exc)) from None
    except BaseException:
        host.close()
        raise
    return store


def _auto_profile(host):
    """``--profile auto``: pick by NVML product names; no GPU visible -> cpu-only."""
    names: list[str] = []
    if host.nvml.available():
        try:
            names = [g.name for g in host.nvml.gpus() if not getattr(g, "lost", False)]
        except Exception as exc:  # noqa: BLE001 - inventory will report it
            log.warning("cannot read GPU names for --profile auto: %s", exc)
    if not names:
        # No GPU visible. If the bus shows NVIDIA GPUs, inventory fails with NvmlUnavailable
        # against any profile; cpu-only keeps every other expectation quiet.
        return load_profile("cpu-only")
    found = match_profile(names)
    if found is not None:
        return found
    log.warning("no shipped profile matches %s; using a generic profile expecting %d GPUs "
                "(pass --profile to set real expectations)", sorted(set(names)), len(names))
    return load_profile("cpu-only").with_overrides(
        {"name": "generic", "gpu": {"count": len(names)}})


def _kube_factory(args: argparse.Namespace):
    """``--kubeconfig``/``--context``, checked at start (a bad one exits 2 naming the flag);
    None: in-cluster config, else $KUBECONFIG / ~/.kube/config, when first needed."""
    path, context = getattr(args, "kubeconfig", None), getattr(args, "context", None)
    if not path and not context:
        return None
    try:
        return kubeconfig_factory(path, context)
    except KubeConfigError as exc:
        flag = "--kubeconfig" if path else f"--context {context}"
        raise UsageError(f"{flag} {exc}") from None


# --- commands --------------------------------------------------------------------------------------


def _run(env: Env, checks, args, fail_fast: bool = False, bootstrap: bool = False,
         disabled: dict[str, str] | None = None) -> int:
    ctx = env.context(force=getattr(args, "force", False))
    progress = Progress(expected=expected_durations(checks, ctx))
    hooks = RunnerHooks(on_start=progress.start, on_done=progress.done)
    env.host.start(env.clock)
    _, report = run_suite(checks, ctx, fail_fast=fail_fast, hooks=hooks, bootstrap=bootstrap,
                          disabled=disabled)
    emit(report, args.output)
    return report.exit_code


def cmd_bootstrap(args) -> int:
    env = build_env(args)
    try:
        checks, disabled = bootstrap_suite(env.config, kinds={Kind.BOOTSTRAP, Kind.PASSIVE},
                                           only=_split(args.checks), skip=_split(args.skip))
        return _run(env, checks, args, fail_fast=args.fail_fast, bootstrap=True,
                    disabled=disabled)
    finally:
        env.close()


def cmd_check(args) -> int:
    env = build_env(args)
    try:
        checks = select_checks(env.config, kinds=None, only=[args.name])
        return _run(env, checks, args)
    finally:
        env.close()


def cmd_list_checks(args) -> int:
    classes = all_check_classes()
    try:
        config = load_config(getattr(args, "config", None))
        config.validate_checks([c.name for c in classes])
        named = getattr(args, "profile", None)
        if named and named != "auto":  # a bad --profile is an error here too, not ignored
            config.apply_to(load_profile(named))
    except (ConfigError, ProfileError) as exc:
        raise UsageError(str(exc)) from None
    rows = []
    for cls in classes:
        d = cls.describe()
        d["enabled"] = bool(config.check_enabled(cls.name))
        rows.append(d)
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'NAME':<16} {'KINDS':<28} {'ENABLED':<8} {'REQUIRED':<9} {'REQUIRES':<22} "
          "SUMMARY")
    for d in rows:
        print(f"{d['name']:<16} {','.join(d['kinds']):<28} {'yes' if d['enabled'] else 'no':<8} "
              f"{'yes' if d['required'] else 'no':<9} {','.join(d['requires']) or '-':<22} "
              f"{d['summary']}")
    return 0


def cmd_list_faults(args) -> int:
    """The ``--inject`` fault kinds, as the help text or as JSON (one object per kind)."""
    if args.output != "json":
        print(help_text())
        return 0
    rows = [{"name": k.name, "target": k.target, "params": list(k.params),
             "timed": bool(k.timed), "example": k.example, "summary": k.summary}
            for k in KINDS.values()]
    print(json.dumps(rows, indent=2))
    return 0


def cmd_daemon(args) -> int:
    """The daemon, built here and handed its pieces: the passive checks, the listen address,
    the Kubernetes client factory; ``--once`` runs the checks once and prints the report."""
    env = build_env(args)
    try:
        kube_factory = _kube_factory(args)
        if getattr(args, "dry_run", False):
            env.config = dataclasses.replace(
                env.config,
                remediation=dataclasses.replace(env.config.remediation, dry_run=True))
        if getattr(args, "backend", None):
            env.config = dataclasses.replace(
                env.config, daemon=dataclasses.replace(env.config.daemon, backend=args.backend))
        if env.config.daemon.backend == "slurm" and env.sim is None:
            env.node = _slurm_node_name(args, env)
        checks = select_checks(env.config, kinds={Kind.PASSIVE})
        if args.once:
            report = run_once(env, checks, force=getattr(args, "force", False))
            emit(report, args.output)
            return report.exit_code
        return run_daemon(env, checks, listen=args.listen or env.config.daemon.listen,
                          force=getattr(args, "force", False), kube_factory=kube_factory)
    finally:
        env.close()


def _slurm_node_name(args, env) -> str:
    """On Slurm the node is named as slurmctld knows it (the name jobs see in
    $SLURMD_NODENAME): --node-name, node_name in the config or $NODE_NAME when given, else
    asked of slurmctld for this host name (an error naming the fix when it cannot tell)."""
    host = socket.gethostname()
    if getattr(args, "node_name", None) or os.environ.get("NODE_NAME") or env.node != host:
        return env.node
    try:
        return SlurmTools(env.config.remediation.slurm.command_timeout_s).node_name_of_host(host)
    except SlurmError as exc:
        raise UsageError(f"the slurm backend: {exc}") from None


def cmd_slurm_hook(args) -> int:
    """``slurm-hook``: the node is the one slurmd names ($SLURMD_NODENAME) unless told; the
    healthcheck drains through the remediator when remediation is on with the slurm backend."""
    if not getattr(args, "node_name", None) and os.environ.get("SLURMD_NODENAME"):
        args.node_name = os.environ["SLURMD_NODENAME"]
    if args.budget is not None and args.budget <= 0:
        raise UsageError(f"--budget must be a positive number of seconds, got {args.budget:g}")
    env = build_env(args)
    try:
        if env.config.daemon.backend == "slurm" and env.sim is None:
            env.node = _slurm_node_name(args, env)
        disabled = None
        if args.hook == "healthcheck":
            checks = select_checks(env.config, kinds={Kind.PASSIVE})
        else:
            checks, disabled = bootstrap_suite(env.config, kinds={Kind.BOOTSTRAP, Kind.PASSIVE})
        rem = env.config.remediation
        make = None
        if rem.enabled and env.config.daemon.backend == "slurm":
            def make():
                return build_remediator(env, None)
        env.host.start(env.clock)
        out = slurm_hooks.run_hook(args.hook, checks, env.context(force=args.hook != "healthcheck"),
                                   budget_s=args.budget, disabled=disabled, remediator=make)
        if out.report is not None and args.output != "none":
            emit(out.report, args.output)
        print(f"gpu-monitor slurm-hook {args.hook}: {out.note}", file=sys.stderr)
        return out.exit_code
    finally:
        env.close()


class Terminated(KeyboardInterrupt):
    """SIGTERM during a command: unwinds like Ctrl-C, so every ``finally`` runs (the
    simulated node's temporary tree, worker processes) before the process exits 143."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_unwinds():
    """While a command runs, SIGTERM raises ``Terminated`` instead of killing the process
    outright; only in the main thread, only over the default disposition (the daemon installs
    its own handler; an embedding program keeps its own), restored afterwards."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                previous = signal.signal(signal.SIGTERM, _raise_terminated)
        except (ValueError, OSError):
            previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors already
        return int(exc.code or 0)
    try:
        with _sigterm_unwinds():
            return int(args.func(args))
    except UsageError as exc:
        print(f"gpu-monitor: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Terminated:
        return 143
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
