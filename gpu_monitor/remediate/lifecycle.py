"""The quarantine lifecycle of this node, and the ``Remediator`` that drives it.

Why: detection produces results continuously; remediation must turn them into a small number
of deliberate, resumable steps on a real cluster. The lifecycle is a state machine, persisted in
the state store (``Store.node_state``, plus a context record) and mirrored in the node label
``gpu-monitor.io/state``::

    healthy -> suspect -> quarantined (cordoned, tainted, drained)
                               |-> retesting (GPU reset + the bootstrap suite) -> healthy
                               |-> reboot-required (Kured's sentinel) -> retesting -> ...
                               '-> replace (labelled; permanent until an operator releases it)
    a retest that fails retest_max_failures times -> replace; a blocked/failed reset -> reboot

Guarantees:

1. **Every step is idempotent and resumable.** The state and the context (what op, which
   reason, the drain's start, the boot id a reboot was asked in) are committed before the
   step's writes; each step re-reads the node and writes only what is missing. A daemon killed
   at any point (``kill -9``) resumes on restart and ends in the same state.
2. **No slot, no quarantine**: the fleet breaker (breaker.py) must grant a slot before the
   first cordon; a denied node stays ``suspect``, with an Event, a log line and a counted
   action, and the claim is retried later.
3. **Only our own changes are undone**: a pre-existing cordon is never undone; a human's
   uncordon or untaint during a quarantine is recorded and respected (never re-applied).
4. **Dry-run changes nothing**: decisions are logged, evented and counted (result
   ``dry_run``); no node write, no slot, no reset, no sentinel. States only move between
   healthy and suspect.
5. ``on_results`` never blocks on the API server; the work happens in ``tick`` (or in the
   background thread ``start`` runs).
6. **An Event never holds up a step**: Events wait in the node's bounded queue (events.py)
   and are delivered as they happen when the Events API answers, else after every tick once
   the queue's backoff allows; a dropped or refused one is counted (action ``event``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.hw.paths import HostPaths
from gpu_monitor.model import Result, Status, iso, parse_iso
from gpu_monitor.remediate.breaker import Breaker, BreakerSettings, Claim
from gpu_monitor.remediate.drain import DrainPolicy, drain_node
from gpu_monitor.remediate.policy import (
    PROBLEM_CLASSES,
    REPORT_CHECK,
    Decision,
    Op,
    PolicySettings,
    PolicyState,
    decide,
    gpu_indices,
    observe,
)
from gpu_monitor.remediate.reports import ReportSource

log = logging.getLogger(__name__)

#: What ``_run_retest`` answers when nothing failed but something could not be decided.
UNDECIDED = "undecided"

__all__ = [
    "KNOWN_HOLDERS",
    "KV_NAMESPACE",
    "Remediator",
    "ResetOutcome",
    "gpu_holders",
    "nvidia_smi_reset",
    "suite_retest",
]

KV_NAMESPACE = "remediation"
KV_POLICY = "policy"
KV_CONTEXT = "quarantine"
KV_BREAKER = "breaker"
KV_DRY_RUN = "dry_run_decision"

#: Processes that commonly hold the GPU device nodes open and block a reset (named in Events).
KNOWN_HOLDERS = {
    "nvidia-device-plugin": "NVIDIA device plugin",
    "nvidia-device-p": "NVIDIA device plugin",
    "dcgm-exporter": "dcgm-exporter",
    "nv-hostengine": "DCGM host engine",
    "nvidia-persistenced": "nvidia-persistenced",
    "nvidia-persiste": "nvidia-persistenced",
    "nvidia-fabricmanager": "Fabric Manager",
    "nv-fabricmanager": "Fabric Manager",
}


# --- the GPU reset -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResetOutcome:
    ok: bool
    detail: str = ""
    gpus: tuple[int, ...] = ()  # the GPUs that were reset
    blocked_by: tuple[str, ...] = ()


def nvidia_smi_reset(runner: Any, gpus: Sequence[int] | None, timeout_s: float = 300.0
                     ) -> ResetOutcome:
    """Reset GPUs with ``nvidia-smi -r`` (``gpus`` None: every GPU at once, as NVSwitch
    systems require; else one ``-i N`` call per GPU)."""
    if gpus is None:
        listing = runner.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             timeout=60.0)
        indices = tuple(int(x) for x in listing.stdout.split() if x.strip().isdigit()) \
            if listing.ok else ()
        res = runner.run(["nvidia-smi", "-r"], timeout=timeout_s)
        if not res.ok:
            return ResetOutcome(False, _why(res))
        return ResetOutcome(True, "all GPUs reset", indices)
    done: list[int] = []
    for i in gpus:
        res = runner.run(["nvidia-smi", "-r", "-i", str(i)], timeout=timeout_s)
        if not res.ok:
            return ResetOutcome(False, f"GPU {i}: {_why(res)}", tuple(done))
        done.append(i)
    return ResetOutcome(True, f"GPU(s) {', '.join(map(str, done))} reset", tuple(done))


def _why(res: Any) -> str:
    text = (res.stderr or res.stdout or res.error or "").strip().splitlines()
    return (text[-1] if text else f"exit status {res.returncode}")[:300]


def gpu_holders(paths: HostPaths, exclude_pids: Iterable[int] = ()) -> list[str]:
    """Processes that hold an NVIDIA device node open, by name ("nvidia-persistenced (pid
    812)"); processes whose open files could not be read count too (they might)."""
    from gpu_monitor.hw.procfs import ProcfsReader

    proc = ProcfsReader(paths)
    scan = proc.scan_open("nvidia", exclude_pids=exclude_pids)
    if not scan.available:
        return ["unknown processes (the process table could not be read)"]
    out = []
    for h in scan.holders:
        argv = proc.cmdline(h.pid) or []
        name = os.path.basename(argv[0]) if argv else (h.comm or "?")
        label = KNOWN_HOLDERS.get(name) or KNOWN_HOLDERS.get(h.comm or "")
        out.append(f"{name} (pid {h.pid}{', ' + label if label and label != name else ''})")
    if scan.denied_pids:
        out.append(f"{len(scan.denied_pids)} process(es) whose open files could not be read")
    return out


def suite_retest(checks: Sequence[Any], ctx: Any) -> Callable[[], list[Result]]:
    """A ``retest`` for the Remediator: run ``checks`` (the bootstrap suite) once through the
    runner (results stored as any run's) and return their results. Leave out checks that judge
    history rather than the GPUs as they are now (e.g. a kernel-log scan that would report the
    Xid that caused the quarantine)."""

    def retest() -> list[Result]:
        from gpu_monitor.runner import run_suite

        # As a bootstrap: a required check that cannot run for a missing tool or runtime is
        # ``unknown`` (the retest is undecided), never a skipped pass.
        _, report = run_suite(list(checks), ctx, bootstrap=True)
        return list(report.results)

    return retest


# --- the remediator ------------------------------------------------------------------------------


@dataclass
class _Memo:
    """Process-local bookkeeping (not persisted: losing it costs at most a repeated Event)."""

    evented: set[str] = field(default_factory=set)
    last_claim_at: float | None = None
    last_sync_at: float | None = None
    last_renew_at: float | None = None
    last_breaker_read: float | None = None
    last_report_poll: float | None = None
    clear_since: datetime | None = None
    started: bool = False
    recoveries_announced: bool = False


class Remediator:
    """Turns stored results into remediation on this node.

    Construct once per daemon; call ``on_results(results)`` after each stored outcome and
    ``tick()`` regularly (or ``start()`` a background thread that does, and ``stop()`` it).

    ``kube_factory``: returns a ``kubernetes.client.ApiClient`` (or a ready ``Kube``); called
    lazily on the first tick, so building a Remediator never imports kubernetes.
    ``runner``: a CommandRunner for ``nvidia-smi -r``. ``retest``: runs the bootstrap suite and
    returns its results (None: wait for the passive checks to report clean instead).
    ``reset``/``holders``/``nvswitch`` override the GPU reset, the holder scan and NVSwitch
    detection (tests inject them).
    """

    def __init__(self, store: Any, config: Any, node_name: str, clock: Clock | None = None,
                 kube_factory: Callable[[], Any] | None = None, runner: Any = None, *,
                 paths: HostPaths | None = None,
                 retest: Callable[[], Sequence[Result]] | None = None,
                 reset: Callable[[Sequence[int] | None], ResetOutcome] | None = None,
                 holders: Callable[[], list[str]] | None = None,
                 nvswitch: bool | None = None, namespace: str = "gpu-monitor",
                 report_dir: str | None = None, drain_policy: DrainPolicy | None = None,
                 tick_s: float = 2.0, node_sync_s: float = 60.0, breaker_retry_s: float = 60.0,
                 breaker_refresh_s: float = 300.0, report_poll_s: float = 300.0,
                 watch_reports: bool = False):
        self.store = store
        self.config = config
        self.node_name = node_name
        self.clock = clock or Clock()
        self.kube_factory = kube_factory
        self.runner = runner
        self.paths = paths or HostPaths()
        self.rem = config.remediation
        self.settings = PolicySettings.from_config(config)
        self.enabled = bool(self.rem.enabled)
        self.dry_run = bool(self.rem.dry_run)
        self.namespace = namespace
        self.report_dir = report_dir
        self.drain_policy = drain_policy or DrainPolicy.from_config(self.rem.drain)
        self.tick_s = tick_s
        self.node_sync_s = node_sync_s
        self.breaker_retry_s = breaker_retry_s
        self.breaker_refresh_s = breaker_refresh_s
        self.report_poll_s = report_poll_s
        self.watch_reports = watch_reports
        self._retest = retest
        self._undecided = ""  # what the last undecided retest could not decide
        self._reset = reset
        self._holders = holders
        self._nvswitch = nvswitch
        self._lock = threading.RLock()
        self._tick_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._kube: Any = None
        self._node: Any = None
        self._breaker: Breaker | None = None
        self._reports: ReportSource | None = None
        self._fresh = False
        self._memo = _Memo()
        self._policy = PolicyState.from_json(store.get_kv(KV_NAMESPACE, KV_POLICY))
        self._saved_policy = self._policy.to_json()
        self.last_error: str | None = None

    # --- wiring --------------------------------------------------------------------------------

    @property
    def kube(self) -> Any:
        if self._kube is None:
            from gpu_monitor.remediate.kube import Kube

            made = self.kube_factory() if self.kube_factory else None
            if made is None:
                from gpu_monitor.remediate.kube import load_api_client

                made = load_api_client()
            self._kube = made if isinstance(made, Kube) else Kube(made, self.clock)
        return self._kube

    @property
    def node(self) -> Any:
        if self._node is None:
            from gpu_monitor.remediate.kube import NodeClient

            self._node = NodeClient(self.kube, self.node_name, taint_key=self.rem.taint_key,
                                    on_event_dropped=self._event_dropped)
        return self._node

    def _event_dropped(self, body: Any, why: str) -> None:
        self._record("event", why, self.clock.now(), reason=str(body.get("reason", "")))

    @property
    def _view(self) -> Any:
        return self._node.view if self._node is not None else None

    @property
    def breaker(self) -> Breaker:
        if self._breaker is None:
            self._breaker = Breaker(self.kube, BreakerSettings.from_config(
                self.rem.breaker, self.namespace), self.clock)
        return self._breaker

    @property
    def reports(self) -> ReportSource:
        if self._reports is None:
            self._reports = ReportSource(self.node_name, self.store, self.clock, kube=self.kube,
                                         namespace=self.namespace, drop_dir=self.report_dir)
        return self._reports

    def start(self) -> None:
        """Run ``tick`` in a background thread: on each ``on_results`` and every ``tick_s``."""
        if not self.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="remediator", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout)
        if self._reports is not None:
            self._reports.stop()

    MAX_BACKOFF_S = 300.0

    def _loop(self) -> None:
        """Tick on wake-ups and every ``tick_s``; after a failure (no API server, no
        kubeconfig) back off exponentially up to ``MAX_BACKOFF_S``, whatever wakes us, and log
        the traceback only when the error changes, so an unreachable API server neither spins
        the loop nor floods the log."""
        failures = 0
        last_error = ""
        last_logged = float("-inf")
        while not self._stop.is_set():
            if failures:
                delay = min(self.tick_s * (2 ** min(failures, 16)), self.MAX_BACKOFF_S)
                if self._stop.wait(delay):
                    return
                self._wake.clear()
            else:
                self._wake.wait(self.tick_s)
                self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - the remediator must survive anything
                failures += 1
                text = f"{type(exc).__name__}: {exc}"
                self.last_error = text
                now = self.clock.monotonic()
                if text != last_error:
                    log.error("remediation tick failed (retrying with backoff): %s", text,
                              exc_info=True)
                    last_logged = now
                elif now - last_logged >= self.MAX_BACKOFF_S:
                    log.warning("remediation still failing after %d attempts: %s",
                                failures, text)
                    last_logged = now
                last_error = text
            else:
                if failures:
                    log.info("remediation recovered after %d failed attempts", failures)
                failures = 0
                last_error = ""

    # --- input ---------------------------------------------------------------------------------

    def on_results(self, results: Iterable[Result]) -> None:
        """Fold stored results into the policy state (fast; never touches the API)."""
        if not self.enabled:
            return
        batch = [r for r in results if isinstance(r, Result)]
        if not batch:
            return
        with self._lock:
            self._policy = observe(self._policy, batch)
            self._save_policy()
        self._wake.set()

    def _save_policy(self) -> None:
        text = self._policy.to_json()
        if text != self._saved_policy:
            self.store.set_kv(KV_NAMESPACE, KV_POLICY, text)
            self._saved_policy = text

    def decision(self, now: datetime | None = None) -> Decision:
        labels = self._view.labels if self._view is not None else None
        with self._lock:
            return decide(self._policy, self.settings, now or self.clock.now(),
                          node_labels=labels)

    # --- context -------------------------------------------------------------------------------

    def context(self) -> dict[str, Any]:
        raw = self.store.get_kv(KV_NAMESPACE, KV_CONTEXT)
        return dict(raw) if isinstance(raw, dict) else {}

    def _save_ctx(self, ctx: dict[str, Any]) -> None:
        self.store.set_kv(KV_NAMESPACE, KV_CONTEXT, ctx)

    def _set_state(self, state: str, reason: str, now: datetime, *, mirror: bool = True,
                   **kw: Any) -> None:
        if self.store.set_node_state(state, reason, now, **kw):
            log.warning("node %s: %s (%s)", self.node_name, state, reason)
        if mirror and not self.dry_run:
            self._mirror_state(state)

    def _mirror_state(self, state: str) -> None:
        from gpu_monitor.remediate.kube import LABEL_STATE

        current = self._view.labels.get(LABEL_STATE) if self._view is not None else None
        if current == state or (state == "healthy" and current is None and self._view is not None):
            return  # no label means healthy: a fleet restart writes nothing to healthy nodes
        self.node.set_state_label(state)

    def _record(self, action: str, result: str, now: datetime, **details: Any) -> None:
        self.store.record_action(action, result, now, details)

    def _event(self, reason: str, message: str, *, warning: bool = False) -> None:
        try:
            prefix = "[dry-run] " if self.dry_run and not message.startswith("[") else ""
            self.node.event(reason, prefix + message, type="Warning" if warning else "Normal")
        except Exception as exc:  # noqa: BLE001 - an Event is never worth failing a step
            log.warning("cannot send Event %s: %s", reason, exc)

    # --- the tick ------------------------------------------------------------------------------

    def tick(self) -> None:
        """Do what is due now: publish conditions and Events, advance the lifecycle. May block
        on the API server (a drain runs to its deadline); errors are logged and retried."""
        if not self.enabled:
            return
        from gpu_monitor.remediate.kube import KubeError

        with self._tick_lock:
            try:
                self._tick()
                self.last_error = None
            except KubeError as err:
                self.last_error = str(err)
                log.warning("remediation step on %s did not complete: %s; retrying later",
                            self.node_name, err)
            finally:
                self._flush_events()

    def _flush_events(self) -> None:
        """Events still waiting (the Events API failed earlier): one more try, never waiting."""
        if self._node is None:
            return
        try:
            self._node.flush_events()
        except Exception as exc:  # noqa: BLE001 - an Event is never worth failing a tick
            log.debug("flushing Events failed: %s", exc)

    def _tick(self) -> None:
        now = self.clock.now()
        mono = self.clock.monotonic()
        self._fresh = False
        if not self._memo.started:
            self.node.read()
            self._fresh = True
            self.node.load_conditions(set(PROBLEM_CLASSES.values()) | {"GPUProblem"}, self._view)
            self._memo.last_sync_at = mono
            self._memo.started = True
            if self.watch_reports:
                self.reports.start_watch(self.on_results)
            if not self.dry_run:
                self._mirror_state(self.store.node_state().state)
        elif self._memo.last_sync_at is None or mono - self._memo.last_sync_at >= self.node_sync_s:
            self.node.read()
            self._memo.last_sync_at = mono
            self._fresh = True
        if not self._memo.recoveries_announced:
            self._announce_state_recoveries()
        self._collect_reports(mono)
        if self._operator_requests(now):
            return
        decision = self.decision(now)
        if not self.dry_run:
            self.node.sync_conditions(decision.conditions, now)
        state = self.store.node_state().state
        {"healthy": self._healthy, "suspect": self._healthy, "quarantined": self._quarantined,
         "retesting": self._retesting, "reboot-required": self._reboot_required,
         "replace": self._replace_state}[state](decision, now)
        self._finding_events(decision)  # after the node writes: they matter more
        self._maintain_breaker(now)

    # --- state recovery ---------------------------------------------------------------------------

    def _announce_state_recoveries(self) -> None:
        """One ``StateRecovered`` Event per recovery of the state file (state/recovery.py keeps
        the record in the fresh store; the mark that it was sent persists, so a restart does
        not repeat it). The recovery really happened, so no ``[dry-run]`` prefix."""
        from gpu_monitor.state.recovery import mark_announced, recoveries

        for rec in recoveries(self.store):
            if rec.announced:
                continue
            try:
                sent = self.node.event(
                    "StateRecovered",
                    f"the state file {rec.path} was damaged ({rec.detail}) and was moved aside "
                    f"to {rec.moved_to} at {iso(rec.at)} (by the {rec.by}); gpu-monitor started "
                    f"an empty store: counters restart at 0, history windows start empty, the "
                    f"bootstrap suite runs again, quarantine state comes from the node's labels",
                    type="Warning")
            except Exception as exc:  # noqa: BLE001 - retried on the next tick
                log.warning("cannot send Event StateRecovered: %s", exc)
                return
            if not sent:
                return  # held back as a repeat of a failed attempt: sent after the repeat window
            mark_announced(self.store, rec.moved_to)
        self._memo.recoveries_announced = True

    # --- reports and operator requests ---------------------------------------------------------

    def _collect_reports(self, mono: float) -> None:
        due = self._memo.last_report_poll is None or mono - self._memo.last_report_poll >= (
            self.report_poll_s)
        if not due and not self.report_dir:
            return
        src = self.reports
        got: list[Result] = []
        if due:
            self._memo.last_report_poll = mono
            got = src.poll()
        elif self.report_dir:
            got = src.poll(crd=False)
        if got:
            self.on_results(_as_distinct_targets(got))

    def _operator_requests(self, now: datetime) -> bool:
        """``quarantine release|retest`` leave annotations on the node; act on them."""
        from gpu_monitor.remediate.kube import ANNOTATIONS

        ann = self._view.annotations if self._view is not None else {}
        state = self.store.node_state().state
        if ANNOTATIONS.RELEASE_REQUESTED in ann:
            if self.dry_run:
                self._event("ReleaseIgnored", "release requested, but remediation is in dry-run")
                return False
            if state == "healthy":
                self.node.clear_request(ANNOTATIONS.RELEASE_REQUESTED)
                self.node.read()
                return False
            log.warning("node %s: released by an operator (from %s)", self.node_name, state)
            self._record("release", "operator", now, from_state=state)
            self._release(now, "released by an operator", operator=True)
            return True
        if ANNOTATIONS.RETEST_REQUESTED in ann:
            if self.dry_run:
                self._event("RetestIgnored", "retest requested, but remediation is in dry-run")
                return False
            self.node.clear_request(ANNOTATIONS.RETEST_REQUESTED)
            self.node.read()
            if state in ("quarantined", "reboot-required"):
                ctx = self.context()
                ctx["retest"] = {"phase": "reset", "needs_reset": state == "quarantined",
                                 "started": iso(now)}
                self._save_ctx(ctx)
                self._record("retest", "operator", now, from_state=state)
                self._set_state("retesting", "retest requested by an operator", now,
                                retest_failures=self.store.node_state().retest_failures)
                self._event("RetestRequested", f"retest requested by an operator (from {state})")
                return True
            self._event("RetestIgnored", f"retest requested, but the node is {state}: only a "
                                         "quarantined or reboot-required node is retested")
        return False

    # --- events about findings -----------------------------------------------------------------

    def _finding_events(self, decision: Decision) -> None:
        keys = set()
        for f in decision.findings:
            r = f.result
            key = f"{r.check}|{r.target}|{r.reason}|{f.op.value}"
            keys.add(key)
            if key in self._memo.evented:
                continue
            self._memo.evented.add(key)
            what = f"{r.check} {r.target}: {r.reason}"
            if r.message:
                what += f": {r.message}"
            if f.pending:
                what += (f" (degraded; {f.wanted.value} once it persists "
                         f"{self.settings.hysteresis_polls} polls and "
                         f"{self.settings.hysteresis_s:g} s)")
            else:
                what += f" -> {f.op.value}"
            if decision.excluded and f.wanted.quarantines:
                what += " (node excluded from remediation by label)"
            self._event(r.reason, what, warning=r.status is Status.FAILED)
        self._memo.evented &= keys  # a finding that went away is evented again if it returns

    # --- healthy / suspect ---------------------------------------------------------------------

    def _healthy(self, decision: Decision, now: datetime) -> None:
        state = self.store.node_state().state
        if self.store.get_kv(KV_NAMESPACE, KV_CONTEXT) is not None:
            self.store.delete_kv(KV_NAMESPACE, KV_CONTEXT)  # a release that crashed at its end
        if decision.quarantine:
            if self.dry_run:
                self._dry_run_quarantine(decision, now)
                if state != "suspect":
                    self._set_state("suspect", f"{decision.reason} (dry-run)", now)
                return
            mono = self.clock.monotonic()
            last = self._memo.last_claim_at
            if state == "suspect" and last is not None and mono - last < self.breaker_retry_s:
                return
            self._memo.last_claim_at = mono
            claim = self.breaker.claim(self.node_name, decision.reason)
            self._save_breaker()
            self._memo.last_renew_at = mono
            if not claim.granted:
                self._denied(claim, decision, now)
                if state != "suspect":
                    self._set_state("suspect", f"{decision.reason}: {claim.why}", now)
                return
            op = decision.op or Op.CORDON
            ctx = {"op": op.value, "reason": decision.reason, "since": iso(now), "slot": True,
                   "applied": False, "drain": "none",
                   "gpus": gpu_indices(decision.triggers(Op.CORDON))}
            self._save_ctx(ctx)
            # the label is written with the quarantine record, in one request
            self._set_state("quarantined", decision.reason, now, mirror=False)
            self._quarantined(decision, now)
            return
        if decision.findings:
            if state != "suspect":
                self._set_state("suspect", decision.reason, now)
        elif state == "suspect":
            self.store.delete_kv(KV_NAMESPACE, KV_DRY_RUN)
            self._set_state("healthy", "findings cleared", now)

    def _dry_run_quarantine(self, decision: Decision, now: datetime) -> None:
        key = f"{decision.op}:{decision.reason}"
        if self.store.get_kv(KV_NAMESPACE, KV_DRY_RUN) == key:
            return
        op = decision.op or Op.CORDON
        steps = ["cordon", "taint"] + (["drain"] if op.drains else [])
        steps += {Op.RESET_GPU: ["reset the GPUs and retest"], Op.REBOOT: ["request a reboot"],
                  Op.REPLACE: ["label for replacement"]}.get(op, [])
        try:
            claim = self.breaker.would_allow(self.node_name)
            self._save_breaker()
            verdict = ("the breaker would grant a slot" if claim.granted
                       else f"the breaker would refuse: {claim.message}")
        except Exception as exc:  # noqa: BLE001 - dry-run reporting only
            verdict = f"the breaker could not be read: {exc}"
        self._event("DryRunQuarantine", f"would quarantine for {decision.reason} "
                                        f"({op.value}: {', '.join(steps)}); {verdict}")
        log.warning("dry-run: node %s would be quarantined for %s (%s); %s", self.node_name,
                    decision.reason, op.value, verdict)
        self._record(op.value, "dry_run", now, reason=decision.reason)
        self.store.set_kv(KV_NAMESPACE, KV_DRY_RUN, key)

    def _denied(self, claim: Claim, decision: Decision, now: datetime) -> None:
        msg = f"not quarantining for {decision.reason}: {claim.message}"
        log.error("node %s: %s", self.node_name, msg)
        self._record("quarantine", "breaker_" + claim.why, now, reason=decision.reason)
        self._event("BreakerTripped" if claim.tripped_now else "RemediationSkipped", msg,
                    warning=True)

    # --- quarantined ---------------------------------------------------------------------------

    def _quarantined(self, decision: Decision, now: datetime) -> None:
        ctx = self.context()
        if not ctx and not decision.quarantine:  # a state without context or cause: release
            self._release(now, "quarantined without a recorded cause")
            return
        if not ctx:  # resumed from a store without context (e.g. set by hand): rebuild it
            ctx = {"op": (decision.op or Op.CORDON).value, "reason": decision.reason or "Unknown",
                   "since": iso(now), "slot": False, "applied": False, "drain": "none",
                   "gpus": None}
        if ctx.get("releasing"):
            self._release(now, ctx.get("release_reason", "returning to service"))
            return
        op = Op(ctx["op"])
        if decision.quarantine and decision.op is not None and decision.op.severity > op.severity:
            self._event("QuarantineEscalated", f"{op.value} -> {decision.op.value} for "
                                               f"{decision.reason}", warning=True)
            op = decision.op
            ctx.update(op=op.value, reason=decision.reason,
                       gpus=gpu_indices(decision.triggers(Op.CORDON)))
            ctx["applied"] = False
        if decision.quarantine and decision.reason and decision.reason != ctx["reason"] \
                and decision.op is not None and decision.op.severity >= op.severity:
            ctx["reason"] = decision.reason
            ctx["applied"] = False
        self._apply_quarantine(ctx, now)
        if self._human_took_over():
            # A human uncordoned the node: no drain, reset or reboot against that decision;
            # our taint goes once the problem has cleared (or on `quarantine release`).
            self._release_when_clear(decision, now, ctx)
            return
        if op.drains and ctx.get("drain") != "succeeded" and not self._drain(ctx, now):
            return
        if op is Op.RESET_GPU:
            ctx["retest"] = {"phase": "reset", "needs_reset": True, "started": iso(now)}
            self._save_ctx(ctx)
            self._set_state("retesting", ctx["reason"], now)
            self._retesting(decision, now)
        elif op is Op.REBOOT:
            self._request_reboot(ctx, now, ctx["reason"])
        elif op is Op.REPLACE:
            self._to_replace(ctx, now, ctx["reason"])
        else:  # cordon/drain only: back in service once clean for the healthy delay
            self._release_when_clear(decision, now, ctx)

    def _apply_quarantine(self, ctx: dict[str, Any], now: datetime, state: str = "quarantined",
                          *, force: bool = False) -> None:
        if ctx.get("applied") and not self._fresh and not force:
            return  # re-checked whenever the node is re-read (human overrides, lost writes)
        first = not ctx.get("applied") and not ctx.get("announced")
        out = self.node.ensure_quarantined(ctx["reason"], state, now, view=self._view)
        if out.cordoned:
            self._record("cordon", "ok", now, reason=ctx["reason"])
        if out.tainted:
            self._record("taint", "ok", now, reason=ctx["reason"])
        if out.human_uncordoned:
            self._record("uncordon", "human", now)
            self._event("ManualUncordonRespected", "a human uncordoned the node during the "
                                                   "quarantine; gpu-monitor will not cordon it "
                                                   "again (the taint stays)", warning=True)
        if out.human_untainted:
            self._record("untaint", "human", now)
            self._event("ManualUntaintRespected", "a human removed the gpu-monitor taint during "
                                                  "the quarantine; it will not be re-applied",
                        warning=True)
        ctx["applied"] = True
        if first:
            ctx["announced"] = True
            pre = " (it was already cordoned: that cordon stays)" if out.cordon_pre_existing \
                else ""
            self._record("quarantine", "ok", now, reason=ctx["reason"], op=ctx["op"],
                         cordon_pre_existing=out.cordon_pre_existing)
            self._event("Quarantined", f"quarantined for {ctx['reason']} ({ctx['op']}): "
                                       f"cordoned and tainted {self.node.taint_text(ctx['reason'])}"
                                       f"{pre}", warning=True)
        self._save_ctx(ctx)

    def _drain(self, ctx: dict[str, Any], now: datetime) -> bool:
        """Drain (or resume the drain); True once it succeeded."""
        if ctx.get("drain") == "failed":
            nxt = ctx.get("drain_next")
            if nxt and now < parse_iso(nxt):
                return False
            ctx.pop("drain_started", None)
        if not ctx.get("drain_started"):
            ctx["drain_started"] = iso(now)
            ctx["drain_attempts"] = int(ctx.get("drain_attempts", 0)) + 1
        ctx["drain"] = "pending"
        self._save_ctx(ctx)
        elapsed = (now - parse_iso(ctx["drain_started"])).total_seconds()
        remaining = max(0.0, self.drain_policy.timeout_s - elapsed)
        report = drain_node(self.kube, self.node_name, self.drain_policy, self.clock,
                            remaining_s=remaining, cancel=self._stop,
                            on_outcome=lambda r: self._record("eviction", r, self.clock.now()))
        if report.cancelled:
            return False
        now = self.clock.now()
        if report.ok:
            self._set_drain_annotation("succeeded")  # before the context: a crash re-drains
            ctx["drain"] = "succeeded"
            ctx.pop("drain_next", None)
            self._save_ctx(ctx)
            self._record("drain", "ok", now, summary=report.summary())
            self._event("DrainSucceeded", f"drained: {report.summary()}")
            return True
        self._set_drain_annotation("failed: " + report.summary()[:200])
        ctx["drain"] = "failed"
        ctx["drain_detail"] = report.summary()
        ctx["drain_next"] = iso(now + _seconds(self.drain_policy.timeout_s))
        self._save_ctx(ctx)
        self._record("drain", "failed", now, summary=report.summary())
        self._event("DrainFailed", f"drain failed: {report.summary()}; the node stays cordoned "
                                   "and tainted; retrying after the drain timeout", warning=True)
        return False

    def _human_took_over(self) -> bool:
        from gpu_monitor.remediate.kube import ANNOTATIONS

        return self._view is not None and ANNOTATIONS.UNCORDONED_MANUALLY in self._view.annotations

    def _set_drain_annotation(self, value: str) -> None:
        from gpu_monitor.remediate.kube import ANNOTATIONS, LABEL_STATE

        state = self._view.labels.get(LABEL_STATE, "quarantined") if self._view else "quarantined"
        self.node.set_state_label(state, annotations={ANNOTATIONS.DRAIN: value})

    def _release_when_clear(self, decision: Decision, now: datetime, ctx: dict[str, Any]) -> None:
        if not decision.clear:
            self._memo.clear_since = None
            return
        if self._memo.clear_since is None:
            self._memo.clear_since = now
        if (now - self._memo.clear_since).total_seconds() >= self.settings.hysteresis_s:
            self._release(now, f"no problem for {self.settings.hysteresis_s:g} s")

    # --- retesting -----------------------------------------------------------------------------

    def _retesting(self, decision: Decision, now: datetime) -> None:
        ctx = self.context()
        rt = dict(ctx.get("retest") or {"phase": "reset", "needs_reset": True,
                                         "started": iso(now)})
        if ctx.get("releasing"):
            self._release(now, ctx.get("release_reason", "retest passed"))
            return
        if rt.get("phase") == "reset":
            if rt.get("needs_reset", True):
                outcome = self._do_reset(ctx)
                if not outcome.ok:
                    kind = "blocked" if outcome.blocked_by else "failed"
                    self._record("reset_gpu", kind, now, detail=outcome.detail,
                                 holders=list(outcome.blocked_by))
                    self._event("GpuResetBlocked" if outcome.blocked_by else "GpuResetFailed",
                                f"GPU reset {kind}: {outcome.detail}; escalating to a reboot",
                                warning=True)
                    self._request_reboot(ctx, now, f"GPU reset {kind}", keep_failures=True)
                    return
                for i in outcome.gpus:
                    self._record("reset_gpu", "ok", now, gpu_index=i, target=f"gpu:{i}")
                self._event("GpuReset", outcome.detail)
            rt.update(phase="suite", started=iso(now))
            ctx["retest"] = rt
            self._save_ctx(ctx)
            with self._lock:  # a report is one event, handled by this reset and retest
                self._policy = self._policy.without([REPORT_CHECK])
                self._save_policy()
        retry_at = rt.get("retry_at")
        if retry_at and now < parse_iso(retry_at):
            return  # an undecided retest waits before the suite runs again
        passed = self._run_retest(rt, decision, now)
        if passed is None:
            return  # still waiting for the passive checks to settle
        if passed == UNDECIDED:
            # Nothing failed, but something could not be decided (a required check without its
            # tool, a busy GPU, a timeout): not a pass, and no evidence to escalate on either.
            # The node stays quarantined and the suite runs again later.
            retry_s = float(self.config.daemon.bootstrap_retry_s)
            rt["retry_at"] = iso(now + timedelta(seconds=retry_s))
            ctx["retest"] = rt
            self._save_ctx(ctx)
            self._record("retest", "undecided", now)
            self._event("RetestUndecided",
                        f"the retest could not decide ({self._undecided}); the node stays "
                        f"quarantined and is retested in {retry_s:g} s", warning=True)
            return
        if passed:
            self._record("retest", "passed", now)
            self._event("RetestPassed", "the retest passed; returning the node to service")
            self._release(now, "retest passed")
            return
        failures = self.store.node_state().retest_failures + 1
        self._record("retest", "failed", now, failures=failures)
        limit = int(self.rem.retest_max_failures)
        if failures >= limit:
            self._event("RetestFailed", f"retest failed ({failures}/{limit}): replacing the node",
                        warning=True)
            self._to_replace(ctx, now, f"retest failed {failures} times")
        else:
            self._event("RetestFailed", f"retest failed ({failures}/{limit}): rebooting",
                        warning=True)
            self._request_reboot(ctx, now, f"retest failed ({failures}/{limit})")

    def _run_retest(self, rt: dict[str, Any], decision: Decision,
                    now: datetime) -> bool | str | None:
        if self._retest is not None:
            try:
                results = list(self._retest())
            except Exception as exc:  # noqa: BLE001 - a crashed suite is a failed retest
                log.error("retest on %s crashed: %s", self.node_name, exc, exc_info=True)
                return False
            with self._lock:
                self._policy = observe(self._policy.without(), results)
                self._save_policy()
            bad = [r for r in results if r.status in (Status.FAILED, Status.UNKNOWN)]
            for r in bad[:5]:
                log.warning("retest on %s: %s %s %s %s", self.node_name, r.check, r.target,
                            r.status.value, r.reason)
            if bad and not any(r.status is Status.FAILED for r in bad):
                self._undecided = ", ".join(sorted({f"{r.check} {r.target} {r.reason}"
                                                    for r in bad})[:5])
                return UNDECIDED
            return not bad
        # No suite available: the passive checks must report clean for the settle time.
        started = parse_iso(rt.get("started") or iso(now))
        fresh_bad = [f for f in decision.findings
                     if f.wanted.quarantines and f.result.observed_at > started]
        if fresh_bad:
            return False
        if decision.clear and (now - started).total_seconds() >= self.settings.hysteresis_s:
            return True
        return None

    def _do_reset(self, ctx: dict[str, Any]) -> ResetOutcome:
        holders = self._holders() if self._holders is not None else gpu_holders(
            self.paths, exclude_pids={os.getpid()})
        if holders:
            return ResetOutcome(False, "the GPUs are in use by " + ", ".join(holders),
                                blocked_by=tuple(holders))
        gpus = None if self._is_nvswitch() else ctx.get("gpus")
        if self._reset is not None:
            return self._reset(gpus)
        if self.runner is None:
            return ResetOutcome(False, "no command runner to run nvidia-smi -r")
        return nvidia_smi_reset(self.runner, gpus)

    def _is_nvswitch(self) -> bool:
        if self._nvswitch is not None:
            return self._nvswitch
        try:
            from gpu_monitor.hw.sysfs import SysfsReader

            self._nvswitch = bool(SysfsReader(self.paths).nvidia_switches())
        except Exception:  # noqa: BLE001
            self._nvswitch = False
        return self._nvswitch

    # --- reboot --------------------------------------------------------------------------------

    def _sentinel(self) -> str | None:
        path = self.rem.reboot_sentinel
        return self.paths.root(path) if path else None

    def _boot_id(self) -> str | None:
        from gpu_monitor.hw.procfs import ProcfsReader

        return ProcfsReader(self.paths).boot_id()

    def _request_reboot(self, ctx: dict[str, Any], now: datetime, why: str, *,
                        keep_failures: bool = False) -> None:
        sentinel = self._sentinel()
        ctx["boot_id"] = self._boot_id()
        ctx["sentinel"] = sentinel
        ctx.pop("retest", None)
        self._save_ctx(ctx)
        kw = {}
        if keep_failures:
            kw["retest_failures"] = self.store.node_state().retest_failures
        self._set_state("reboot-required", why, now, mirror=False, **kw)
        self._apply_quarantine(ctx, now, "reboot-required", force=True)
        self._write_sentinel(sentinel, why)
        self._record("reboot", "requested", now, reason=why, sentinel=sentinel)
        self._event("RebootRequested", f"reboot requested ({why}): "
                    + (f"wrote {self.rem.reboot_sentinel} for Kured" if sentinel
                       else "no reboot sentinel configured: reboot the node by hand"),
                    warning=True)

    def _write_sentinel(self, sentinel: str | None, why: str) -> None:
        if not sentinel or os.path.exists(sentinel):
            return
        try:
            os.makedirs(os.path.dirname(sentinel) or ".", exist_ok=True)
            with open(sentinel, "w", encoding="utf-8") as fh:
                fh.write(f"gpu-monitor: {why}\n")
        except OSError as exc:
            log.error("cannot write the reboot sentinel %s: %s", sentinel, exc)

    def _reboot_required(self, decision: Decision, now: datetime) -> None:
        ctx = self.context()
        if ctx.get("releasing"):
            self._release(now, ctx.get("release_reason", "returning to service"))
            return
        self._apply_quarantine(ctx, now, "reboot-required")
        boot = self._boot_id()
        sentinel = ctx.get("sentinel")
        before = ctx.get("boot_id")
        rebooted = (before and boot and boot != before) or (
            not before and sentinel and not os.path.exists(sentinel))
        if not rebooted:
            self._write_sentinel(sentinel, ctx.get("reason", "reboot"))
            return
        self._record("reboot", "ok", now, boot_id=boot)
        self._event("Rebooted", "the node rebooted; retesting")
        ctx["retest"] = {"phase": "suite", "needs_reset": False, "started": iso(now)}
        self._save_ctx(ctx)
        self._set_state("retesting", "rebooted", now,
                        retest_failures=self.store.node_state().retest_failures)
        with self._lock:  # results from before the reboot describe another boot
            self._policy = self._policy.without()
            self._save_policy()
        self._retesting(self.decision(now), now)

    # --- replace -------------------------------------------------------------------------------

    def _to_replace(self, ctx: dict[str, Any], now: datetime, why: str) -> None:
        ctx["replace_reason"] = why
        ctx["replaced"] = False
        self._save_ctx(ctx)
        self._set_state("replace", why, now, mirror=False)
        self._finish_replace(ctx, now)

    def _finish_replace(self, ctx: dict[str, Any], now: datetime) -> None:
        """Label for replacement and give the slot back; resumable after a crash."""
        from gpu_monitor.remediate.kube import LABEL_REPLACE

        if self._view is None or self._view.labels.get(LABEL_REPLACE) != "true":
            self.node.set_state_label("replace", extra={LABEL_REPLACE: "true"})
        if ctx.get("slot"):
            self.breaker.release(self.node_name, replaced=True)
            self._save_breaker()
            ctx["slot"] = False
            self._save_ctx(ctx)
        if not ctx.get("replaced"):
            why = ctx.get("replace_reason", "")
            ctx["replaced"] = True
            self._save_ctx(ctx)
            self._record("replace", "labelled", now, reason=why)
            self._event("ReplacementRequested", f"node labelled for replacement ({why}); it "
                        "stays cordoned until `gpu-monitor quarantine release`", warning=True)

    def _replace_state(self, decision: Decision, now: datetime) -> None:
        ctx = self.context()
        if ctx.get("releasing"):
            self._release(now, ctx.get("release_reason", "released"))
            return
        self._apply_quarantine(ctx, now, "replace")
        self._finish_replace(ctx, now)

    # --- release -------------------------------------------------------------------------------

    def _release(self, now: datetime, why: str, operator: bool = False) -> None:
        ctx = self.context()
        ctx["releasing"] = True
        ctx["release_reason"] = why
        self._save_ctx(ctx)
        view, uncordoned = self.node.release(now)
        if uncordoned:
            self._record("uncordon", "ok", now)
        self.breaker.release(self.node_name)
        self._save_breaker()
        with self._lock:
            self._policy = self._policy.without()
            self._save_policy()
        self.node.sync_conditions(self.decision(now).conditions, now, force=True)
        self._memo.clear_since = None
        self._memo.evented.clear()
        self._record("release", "ok", now, reason=why)
        note = "" if uncordoned else " (not uncordoned: the cordon was not ours)"
        self._event("ReturnedToService", f"returned to service: {why}{note}")
        self.store.set_node_state("healthy", why, now)  # then the context: see _healthy
        self.store.delete_kv(KV_NAMESPACE, KV_CONTEXT)
        self.store.delete_kv(KV_NAMESPACE, KV_DRY_RUN)

    # --- the breaker ---------------------------------------------------------------------------

    def _save_breaker(self) -> None:
        if self._breaker is not None and self._breaker.last is not None:
            self.store.set_kv(KV_NAMESPACE, KV_BREAKER, self._breaker.last.to_dict())

    def _maintain_breaker(self, now: datetime) -> None:
        mono = self.clock.monotonic()
        state = self.store.node_state().state
        ctx = self.context() if state in ("quarantined", "retesting", "reboot-required") else {}
        if ctx.get("slot") and not self.dry_run:
            every = float(self.rem.breaker.ttl_s) / 3.0
            if self._memo.last_renew_at is None or mono - self._memo.last_renew_at >= every:
                self._memo.last_renew_at = mono
                if not self.breaker.renew(self.node_name):
                    claim = self.breaker.claim(self.node_name, ctx.get("reason", ""))
                    if not claim.granted:
                        log.error("node %s lost its breaker slot and cannot claim it back: %s",
                                  self.node_name, claim.message)
                self._save_breaker()
                self._memo.last_breaker_read = mono
        if self._memo.last_breaker_read is None or (
                mono - self._memo.last_breaker_read >= self.breaker_refresh_s):
            self._memo.last_breaker_read = mono
            try:
                st = self.breaker.status()
                self._save_breaker()
                if (not self.dry_run and state in ("healthy", "suspect")
                        and self.node_name in st.slots):
                    # claimed just before a crash, and the cause went away meanwhile
                    log.warning("node %s holds a breaker slot while %s: releasing it",
                                self.node_name, state)
                    self.breaker.release(self.node_name)
                    self._save_breaker()
            except Exception as exc:  # noqa: BLE001 - hygiene and metrics only
                log.debug("cannot read the breaker: %s", exc)

    def breaker_snapshot(self) -> dict[str, Any] | None:
        raw = self.store.get_kv(KV_NAMESPACE, KV_BREAKER)
        return raw if isinstance(raw, dict) else None


def _seconds(s: float):
    from datetime import timedelta

    return timedelta(seconds=s)


def _as_distinct_targets(results: list[Result]) -> list[Result]:
    """Give each report its own target so one report does not replace another's finding."""
    from dataclasses import replace

    out = []
    for r in results:
        name = str(r.details.get("name") or r.details.get("uid") or "")
        out.append(replace(r, target=f"report:{name}" if name else r.target))
    return out

