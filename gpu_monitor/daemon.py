"""The long-running per-node process: follows the kernel log, polls passive checks, serves
``/metrics``.

Guarantees, in order:
1. **Nothing is lost, nothing double-counted.** At start the kernel ring buffer is replayed;
   records at or below the store's high-water mark for this boot id are skipped, so a restart
   neither re-counts nor misses an XID. A record's results are committed before its sequence
   number is marked, so a crash between the two replays the record instead of losing it.
2. **One slow source never starves another.** The kernel-log follower has its own thread; each
   polled check runs on a worker pool with at most one run in flight per check, under the
   runner's timeout. A check still running when it is due again is not started twice.
3. **Every outcome is stored before anything consumes it** (metrics read the store at scrape
   time; remediation reads results).
4. **Time is injected.** The scheduler reads the ``Clock`` it is given; tests drive ``tick()``
   with a fake clock and ten-minute windows pass in milliseconds.
5. **SIGTERM stops it cleanly** within one scheduler tick.

The daemon is handed what it runs: the CLI (cli.py) builds the node's pieces (``Env``: config,
host, profile, store, clock), selects the checks and checks the flags, and calls ``run_daemon``
or ``run_once``. This module never imports the CLI; what both need (check selection, report
output, ``UsageError``) lives below them (suite.py, report_output.py, model.py).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta

from prometheus_client import CollectorRegistry

from gpu_monitor.check import Check, Context
from gpu_monitor.cleaning.metrics import cleaning_collector
from gpu_monitor.cleaning.service import from_env, refuse_without_runtime
from gpu_monitor.daemon_kmsg import KV_FILE_POS, KmsgFollower
from gpu_monitor.exporter import Exporter
from gpu_monitor.failfast.metrics import failfast_collector
from gpu_monitor.metrics import StoreCollector
from gpu_monitor.model import Kind, Report, RunOutcome, UsageError
from gpu_monitor.remediate.bootstrap_gate import BootstrapGate
from gpu_monitor.remediate.metrics import remediation_collector
from gpu_monitor.remediate.slurm.delivery import SlurmDelivery
from gpu_monitor.runner import run_check, run_suite
from gpu_monitor.suite import bootstrap_suite, select_checks
from gpu_monitor.workloads.attribution import holder_note
from gpu_monitor.workloads.metrics import workload_collector
from gpu_monitor.workloads.sources import make_refresher

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 3600.0
PRUNE_HORIZON = timedelta(days=2)
# The follower marks each batch and each wait; silence this long means a check's on_kmsg hangs.
KMSG_STALL_S = 60.0


def _handles_kmsg(check: Check) -> bool:
    return type(check).on_kmsg is not Check.on_kmsg


def _polls(check: Check) -> bool:
    return type(check).poll is not Check.poll


class DaemonStats:
    """Process-local counters exported as metrics (they restart at 0 with the process, which
    Prometheus counters tolerate)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kmsg_records = 0
        self.kmsg_parse_errors = 0
        self.kmsg_gaps = 0
        self.kmsg_skipped_replay = 0
        self.kmsg_read = 0  # records and text lines read, candidates or not
        self.last_tick_monotonic = time.monotonic()
        self.last_kmsg_loop_monotonic = time.monotonic()

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return {"kmsg_records": self.kmsg_records,
                    "kmsg_parse_errors": self.kmsg_parse_errors,
                    "kmsg_gaps": self.kmsg_gaps,
                    "kmsg_skipped_replay": self.kmsg_skipped_replay,
                    "kmsg_read": self.kmsg_read}


class Daemon:
    def __init__(self, checks: Sequence[Check], ctx: Context, tick_s: float = 0.1,
                 kmsg_poll_s: float = 0.01, max_workers: int | None = None,
                 remediator=None, failfast=None):
        self.checks = list(checks)
        self.remediator = remediator
        self.failfast = failfast
        self.ctx = ctx
        self.tick_s = tick_s
        self.kmsg_poll_s = kmsg_poll_s
        self.stats = DaemonStats()
        self.stop_event = threading.Event()
        self.next_due: dict[str, float] = {}
        self.in_flight: dict[str, Future] = {}
        self.pool = ThreadPoolExecutor(max_workers=max_workers or max(2, len(self.checks)),
                                       thread_name_prefix="poll")
        self.kmsg_checks = [c for c in self.checks if _handles_kmsg(c)]
        self.poll_checks = [c for c in self.checks if _polls(c)]
        self.kmsg = KmsgFollower(self.kmsg_checks, ctx, self.stats, record=self._record,
                                 consume=self._consume)
        self.replayed = self.kmsg.replay_done
        self._kmsg_thread: threading.Thread | None = None
        self._last_prune = None
        self._store_lock = threading.Lock()
        self._intervals: dict[str, float] = {}
        self._due_lock = threading.Lock()
        self._wake = threading.Event()  # set when a poll asks for an earlier next poll

    def stats_snapshot(self) -> dict[str, float]:
        """Daemon counters plus the kernel-log checks' own parse failures (lines that look like
        an Xid/SXid but cannot be parsed)."""
        snap = self.stats.snapshot()
        snap["kmsg_parse_errors"] += sum(int(getattr(c, "parse_errors", 0) or 0)
                                         for c in self.kmsg_checks)
        return snap

    # --- results ---------------------------------------------------------------------------------

    def store_outcome(self, outcome: RunOutcome) -> None:
        """Store an outcome, then hand it to fail-fast and remediation (polls, and the
        cleaner's suite runs)."""
        if self._record(outcome):
            self._consume(outcome)

    def _record(self, outcome: RunOutcome) -> bool:
        """Store an outcome; False when it could not be (then nothing consumes it)."""
        if self.ctx.store is None:
            return False
        try:
            self.ctx.store.record_run(outcome)
        except Exception as exc:  # noqa: BLE001 - keep monitoring even if history fails
            log.error("cannot store results of %s: %s", outcome.check, exc)
            return False
        return True

    def _consume(self, outcome: RunOutcome) -> None:
        if self.failfast is not None:
            # First: a doomed job is told before remediation's slower steps (it only queues).
            try:
                self.failfast.on_results(outcome.results)
            except Exception as exc:  # noqa: BLE001
                log.error("fail-fast could not take results of %s: %s", outcome.check, exc)
        if self.remediator is not None:
            # Stored first (guarantee 3), then handed to the policy; never blocks on the API.
            try:
                self.remediator.on_results(outcome.results)
            except Exception as exc:  # noqa: BLE001
                log.error("remediation could not take results of %s: %s", outcome.check, exc)

    def interval(self, check: Check) -> float:
        cached = self._intervals.get(check.name)
        if cached is None:
            value = self.ctx.setting(check.name, "interval_s", check.interval)
            cached = self._intervals[check.name] = float(value or 0.0)
        return cached

    def seconds_to_next_due(self) -> float:
        """How long the scheduler may sleep: until the earliest due check, within
        [``tick_s``, 1 s] (wake-ups cost CPU on an idle node; 1 s bounds a missed deadline)."""
        now = self.ctx.clock.monotonic()
        with self._due_lock:
            dues = [self.next_due.get(c.name, now) for c in self.poll_checks
                    if self.interval(c) > 0]
        if not dues:
            return 1.0
        ahead = min(dues) - now
        # A due time still ahead is slept to exactly (a check's wake_at is an instant that
        # matters); one already past (its run still in flight) waits a tick.
        return min(1.0, ahead if ahead > 0 else self.tick_s)

    def _take_wake_request(self, check: Check) -> None:
        """Bring the check's next poll forward to the instant it asked for (``wake_at``) and
        wake the scheduler, which may be sleeping past it."""
        try:
            at = check.wake_at()
        except Exception as exc:  # noqa: BLE001 - a broken request costs precision, not polls
            log.warning("%s: wake_at failed: %s", check.name, exc)
            return
        if at is None:
            return
        delay = max(0.0, at - self.ctx.clock.now().timestamp())
        due = self.ctx.clock.monotonic() + delay
        with self._due_lock:
            if due < self.next_due.get(check.name, float("inf")):
                self.next_due[check.name] = due
        self._wake.set()

    # --- one-shot --------------------------------------------------------------------------------

    def run_once(self) -> list[RunOutcome]:
        """Every check once, one-shot semantics (``daemon --once``)."""
        outcomes = []
        for check in self.checks:
            outcome = run_check(check, self.ctx, method="run")
            self.store_outcome(outcome)
            outcomes.append(outcome)
        return outcomes

    # --- polling -----------------------------------------------------------------------------------

    def _poll(self, check: Check) -> RunOutcome:
        outcome = run_check(check, self.ctx, method="poll")
        self.store_outcome(outcome)
        self._take_wake_request(check)
        return outcome

    def tick(self, wait: bool = False) -> list[RunOutcome]:
        """Start every check that is due; with ``wait``, wait for them and return outcomes."""
        now = self.ctx.clock.monotonic()
        self.stats.last_tick_monotonic = time.monotonic()
        started: list[Future] = []
        for check in self.poll_checks:
            interval = self.interval(check)
            if interval <= 0:
                continue
            running = self.in_flight.get(check.name)
            if running is not None and not running.done():
                continue  # still running: never two runs of one check at once
            with self._due_lock:
                if now < self.next_due.get(check.name, now):
                    continue
                self.next_due[check.name] = now + interval
            fut = self.pool.submit(self._poll, check)
            self.in_flight[check.name] = fut
            started.append(fut)
        self._maybe_prune()
        if wait:
            return [f.result() for f in started]
        return []

    def _maybe_prune(self) -> None:
        store = self.ctx.store
        if store is None:
            return
        now = self.ctx.clock.monotonic()
        if self._last_prune is not None and now - self._last_prune < PRUNE_EVERY_S:
            return
        self._last_prune = now
        try:
            store.prune(PRUNE_HORIZON)
        except Exception as exc:  # noqa: BLE001
            log.warning("pruning the state store failed: %s", exc)

    # --- kernel log (the follower: daemon_kmsg.py) -------------------------------------------------

    _KV_FILE_POS = KV_FILE_POS

    @property
    def _kmsg_source(self):
        return self.kmsg.source

    @_kmsg_source.setter
    def _kmsg_source(self, source) -> None:
        self.kmsg.source = source

    def open_kmsg(self) -> None:
        """Open the kernel log and replay what it holds (skipping what the store has seen),
        all of it before returning (``--once``-like callers and tests; ``start`` replays in the
        follower thread instead, beside the scheduler)."""
        self.kmsg.open()
        self.kmsg.pump_all()
        self.kmsg.replay_done.set()

    def pump_kmsg(self) -> int:
        """Read and dispatch every record available now, batch by batch; how many were
        handed to a check."""
        return self.kmsg.pump_all()

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self.failfast is not None:
            self.failfast.start()
        if self.remediator is not None:
            self.remediator.start()
        self.kmsg.open()
        if self._kmsg_source is not None:
            # The replay runs here too, batch by batch, while the scheduler ticks (daemon_kmsg
            # guarantee 5): a long one is progress on /healthz, not a stalled scheduler.
            self.stats.last_kmsg_loop_monotonic = time.monotonic()
            self._kmsg_thread = threading.Thread(
                target=self.kmsg.loop, args=(self.stop_event, self.kmsg_poll_s), name="kmsg",
                daemon=True)
            self._kmsg_thread.start()

    def run(self) -> None:
        self.start()
        while not self.stop_event.is_set():
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - the scheduler must survive anything
                log.error("scheduler error: %s", exc, exc_info=True)
            self._wake.wait(self.seconds_to_next_due())
            self._wake.clear()
        self.shutdown()

    def health(self) -> tuple[bool, str]:
        """Liveness: the scheduler ticks and the follower makes progress (a batch, or a wait
        for more, within ``KMSG_STALL_S``: a hung ``on_kmsg`` shows here). A replay in
        progress is healthy and says how far it got."""
        now = time.monotonic()
        if now - self.stats.last_tick_monotonic > 30.0:
            return False, "scheduler stalled"
        if self._kmsg_thread is not None:
            if not self._kmsg_thread.is_alive():
                return False, "kernel-log follower died"
            if now - self.stats.last_kmsg_loop_monotonic > KMSG_STALL_S:
                return False, "kernel-log follower stalled"
        # Asked between the log's opening and the follower's start (or before its first batch),
        # the answer is still "replaying": an open log not yet caught up is never plain "ok".
        if self._kmsg_source is not None and not self.replayed.is_set():
            return True, f"ok; replaying the kernel log: {self.stats.kmsg_read} read"
        return True, "ok"

    def stop(self, *_args) -> None:
        self.stop_event.set()
        self._wake.set()

    def shutdown(self) -> None:
        self.stop_event.set()
        self._wake.set()
        if self.remediator is not None:
            try:
                self.remediator.stop()
            except Exception as exc:  # noqa: BLE001
                log.warning("remediation did not stop cleanly: %s", exc)
        if self._kmsg_thread is not None:
            self._kmsg_thread.join(timeout=2)
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.failfast is not None:
            self.failfast.stop()
        if self._kmsg_source is not None:
            try:
                self._kmsg_source.close()
            except Exception:  # noqa: BLE001
                pass


def _attribution(env):
    """The workload-attribution refresher of ``workloads.*`` (None when ``off``), not started."""
    w = env.config.workloads
    return make_refresher(w.source, w.socket, w.refresh_s, w.timeout_s, w.gpu_resources,
                          w.rdma_resources, env.host.nvml)


def _kube_maker(env, kube_factory=None) -> Callable[[], object]:
    """A ``gpu_monitor.kube.Kube`` made on first call (``kube_factory``, else in-cluster
    config or $KUBECONFIG), then the same one."""
    made: list[object] = []
    lock = threading.Lock()

    def make():
        from gpu_monitor.kube.client import Kube
        from gpu_monitor.kube.config import load_api_client

        with lock:
            if not made:
                client = kube_factory() if kube_factory else None
                if client is None:
                    client = load_api_client()
                made.append(client if isinstance(client, Kube) else Kube(client, env.clock))
            return made[0]

    return make


def make_failfast(env, attribution, kube_factory=None, observers=()):
    """The fail-fast notifier of ``failfast.*`` (None when disabled or without a store), not
    started: pairing from hw/topology, holders from the attribution refresher (none: every
    notice is unknown), pids from NVML and the pods' cgroups, the API through gpu_monitor.kube."""
    from gpu_monitor.failfast.notifier import FailFast, Wiring
    from gpu_monitor.hw.cgroup import pod_pids
    from gpu_monitor.hw.topology import read_pairing
    from gpu_monitor.workloads.attribution import UNKNOWN

    ff = env.config.failfast
    if not ff.enabled or env.store is None:
        return None
    dry_run = env.config.remediation.dry_run if ff.dry_run is None else ff.dry_run
    cgroups = env.host.paths.sys("fs", "cgroup")
    nvml = env.host.nvml

    def snapshot():
        if attribution is None:
            return replace(UNKNOWN, reason="workloads.source is off")
        return attribution.current()

    wiring = Wiring(
        node=env.node, store=env.store, snapshot=snapshot,
        pairing=lambda: read_pairing(nvml, env.host.sysfs),
        now=lambda: env.clock.now().timestamp(),
        gpu_pids=lambda gpus: [p.pid for g in gpus for p in nvml.processes(g)],
        pod_pids=lambda uid: pod_pids(cgroups, uid),
        kube=_kube_maker(env, kube_factory), observers=list(observers))
    return FailFast(ff, dry_run, wiring)


def build_registry(daemon: Daemon, store, check_classes, clock, extra=()):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, check_classes, stats=daemon.stats_snapshot,
                                     now=clock.now, extra=extra))
    return registry


def build_remediator(env, checks_for_retest, kube_factory=None, holders=None):
    """The node's remediator: the delivery of ``daemon.backend`` (``node_delivery``) and its
    actuator on this host, built here and injected. ``checks_for_retest``: the retest suite
    (None: no suite; a quarantine waits for the passive checks to report clean, as a
    ``slurm-hook healthcheck`` must within its budget)."""
    from gpu_monitor.host_actuator import HostActuator
    from gpu_monitor.hw.paths import DEFAULT_REPORT_DIR
    from gpu_monitor.remediate.recovery import suite_retest
    from gpu_monitor.remediate.remediator import Remediator

    report_dir = env.config.daemon.report_dir
    if report_dir is None and env.sim is None:
        report_dir = DEFAULT_REPORT_DIR
    delivery = node_delivery(env, kube_factory)
    actuator = HostActuator(env.host.paths, env.host.commands,
                            reboot_sentinel=env.config.remediation.reboot_sentinel)
    return Remediator.from_config(
        env.store, env.config, env.node, delivery, actuator, clock=env.clock,
        retest=(None if checks_for_retest is None
                else suite_retest(checks_for_retest, env.context(force=True))),
        report_dir=report_dir, watch_reports=True, workload_note=holders,
    )


def node_delivery(env, kube_factory=None, *, minimal: bool = False):
    """The node delivery of ``daemon.backend``: Slurm's tools (no kubernetes import on that
    path), else our Node on Kubernetes (``minimal``: without the remediation settings, for the
    bootstrap gate alone)."""
    if env.config.daemon.backend == "slurm":
        return SlurmDelivery.from_config(env.config, env.node, env.clock, store=env.store)
    from gpu_monitor.remediate.k8s.delivery import KubeDelivery

    if minimal:
        return KubeDelivery(kube_factory, env.node, env.clock)
    return KubeDelivery.from_config(env.config, env.node, env.clock, kube_factory,
                                    namespace=os.environ.get("POD_NAMESPACE", "gpu-monitor"))


def _node_delivery(env, remediator, kube_factory=None):
    """What the bootstrap gate publishes through: the remediator's node delivery, else one of
    its own, made once (its Event queue outlives a failed send)."""
    if remediator is not None:
        return lambda: remediator.delivery
    delivery = node_delivery(env, kube_factory, minimal=True)
    return lambda: delivery


def active_runtime_missing(env) -> str:
    """What this image lacks to run the active checks on this node ("" when nothing): the
    requirement gate's answer for torch (the passive image has none; a CPU-only torch on a GPU
    node has no CUDA). On a node whose profile expects no GPU nothing is lacking."""
    gap = env.host.requirement_gap({"torch"}, env.context())
    return gap.message if gap is not None and gap.missing else ""


def make_bootstrap_gate(env, delivery):
    """The provisioning gate over this node's bootstrap suite: every bootstrap check in suite
    order, run as a bootstrap (required checks cannot be skipped for a missing tool; checks the
    config disables are reported), and never lifting the taint from an image without the
    active runtime (bootstrap_gate.py, contract 5)."""
    checks, disabled = bootstrap_suite(env.config, kinds={Kind.BOOTSTRAP})

    def suite():
        _, report = run_suite(checks, env.context(force=False), bootstrap=True,
                              disabled=disabled)
        return report

    return BootstrapGate(env.store, suite, env.clock, delivery=delivery,
                         dry_run=env.config.remediation.dry_run,
                         retry_s=env.config.daemon.bootstrap_retry_s,
                         active_runtime=lambda: active_runtime_missing(env))


def _bootstrap_gate_thread(env, daemon: Daemon, remediator,
                           kube_factory=None) -> threading.Thread | None:
    """Runs the bootstrap suite in the background until the node has a recorded pass."""
    if not env.config.daemon.bootstrap_on_start:
        return None
    gate = make_bootstrap_gate(env, _node_delivery(env, remediator, kube_factory))

    def loop() -> None:
        while not daemon.stop_event.is_set():
            try:
                if gate.step() in ("passed", "blocked"):
                    return
            except Exception as exc:  # noqa: BLE001 - retried after the retry period
                log.error("bootstrap gate error: %s", exc, exc_info=True)
            daemon.stop_event.wait(min(30.0, env.config.daemon.bootstrap_retry_s))

    thread = threading.Thread(target=loop, name="bootstrap-gate", daemon=True)
    thread.start()
    return thread


def _without_log_scan(checks: Sequence[Check]) -> list[Check]:
    """The daemon's own suites (the retest after a reset, the cleaning between workloads)
    leave out the kernel-log scan: its one-shot run reports every Xid of this boot again, the
    one already acted on included; the passive xid check follows the log and holds those open."""
    return [c for c in checks if c.name != "xid"]


def make_cleaning(env, daemon: Daemon, kube_factory=None):
    """The check between workloads of ``cleaning.*`` (None when off), not started; its suite
    runs' outcomes are stored and handed on like a poll's (``Daemon.store_outcome``)."""
    if not env.config.cleaning.enabled:
        return None
    checks, disabled = bootstrap_suite(env.config, kinds={Kind.BOOTSTRAP})
    return from_env(env, (_without_log_scan(checks), disabled),
                    record=daemon.store_outcome, stop=daemon.stop_event,
                    kube=_kube_maker(env, kube_factory),
                    runtime_missing=lambda: active_runtime_missing(env))


def run_once(env, checks: Sequence[Check], force: bool = False) -> Report:
    """``daemon --once``: every check once, one-shot semantics, stored; the report."""
    ctx = env.context(force=force, one_shot=True)
    env.host.start(env.clock)
    daemon = Daemon(checks, ctx)
    started = env.clock.now()
    outcomes = daemon.run_once()
    daemon.shutdown()
    return Report(node=env.node, profile=env.profile.name, started_at=started,
                  finished_at=env.clock.now(),
                  results=tuple(r for o in outcomes for r in o.results))


def run_daemon(env, checks: Sequence[Check], *, listen: str, force: bool = False,
               kube_factory: Callable[[], object] | None = None) -> int:
    """Run ``checks`` until SIGTERM: ``/metrics`` on ``listen``, remediation when the config
    enables it (its retest is the bootstrap suite), the bootstrap gate in the background.

    ``kube_factory`` makes the API client (None: in-cluster config, else $KUBECONFIG); the
    CLI has checked its flags. A listen address that cannot be bound is a ``UsageError``.
    """
    refuse_without_runtime(env.config.cleaning, lambda: active_runtime_missing(env))
    ctx = env.context(force=force, one_shot=False)
    env.host.start(env.clock)
    remediator = None
    extra = []
    attribution = _attribution(env)
    holders = None
    if attribution is not None:
        attribution.start()
        extra.append(workload_collector(attribution))
        holders = lambda target: holder_note(attribution.current(), target)  # noqa: E731
    if env.config.remediation.enabled:
        retest_checks = _without_log_scan(select_checks(env.config, kinds={Kind.BOOTSTRAP}))
        remediator = build_remediator(env, retest_checks, kube_factory, holders)
        extra.append(remediation_collector(env.store))
    failfast = make_failfast(env, attribution, kube_factory)
    if failfast is not None:
        extra.append(failfast_collector(env.store, failfast.actions))
    daemon = Daemon(checks, ctx, remediator=remediator, failfast=failfast)
    cleaning = make_cleaning(env, daemon, kube_factory)
    if cleaning is not None:
        extra.append(cleaning_collector(cleaning.cleaner, cleaning.suite))
    registry = build_registry(daemon, env.store, [type(c) for c in checks], env.clock,
                              extra=extra)
    exporter = Exporter(registry, daemon.health, ready=daemon.replayed.is_set)
    try:
        exporter.start(listen)
    except (OSError, ValueError) as exc:
        daemon.shutdown()
        raise UsageError(f"cannot listen on {listen}: {exc}") from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, daemon.stop)
    log.info("gpu-monitor daemon started on %s (%s) with %d passive checks; remediation %s",
             env.node, env.host.description, len(checks),
             "off" if remediator is None else
             ("dry-run" if env.config.remediation.dry_run else "on"))
    _bootstrap_gate_thread(env, daemon, remediator, kube_factory)
    if cleaning is not None:
        cleaning.start()
    try:
        daemon.run()
    finally:
        exporter.stop()
        if attribution is not None:
            attribution.stop()
    log.info("gpu-monitor daemon stopped")
    return 0
