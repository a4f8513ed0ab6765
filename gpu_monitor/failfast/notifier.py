"""The notifier: triggers in, one notice per outage out, off the poll threads.

Guarantees, in order:
1. **Off the hot path.** ``on_results`` (called by the daemon with every stored outcome) only
   filters and queues; the actions run on the notifier's own thread, so a slow API server
   never delays a poll.
2. **One notice per outage.** A trigger whose key the store already holds does nothing; the
   record is committed before the first action, so a restart never notifies twice.
3. **Nobody unaffected.** The GPUs a port serves come from the GPU↔NIC pairing
   (gpu_monitor/hw/topology.py); the affected workloads are the holders of those GPUs (and
   of the port's RDMA device) in the attribution snapshot; a port serving none notifies
   nobody. An attribution that has never been read, or a pairing that cannot be read, is
   ``unknown`` (counted, not recorded: the next result retries), never "nobody".
4. **Dry-run honoured.** Each action is recorded as ``dry_run`` and nothing is done.
5. **One failure stops nothing.** An action that raises is recorded as ``error`` with its
   reason; the other actions and workloads still run; the thread survives anything.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gpu_monitor.failfast.affected import Affected, PodRef, affected
from gpu_monitor.failfast.local import notice_path, send_signal, signal_number, write_notice
from gpu_monitor.failfast.pods import CONDITION_TYPE, PodWriter, iso
from gpu_monitor.failfast.records import NoticeBook
from gpu_monitor.failfast.sweep import process_alive, remove_gone
from gpu_monitor.failfast.trigger import Trigger, triggers_from
from gpu_monitor.model import Result
from gpu_monitor.workloads.attribution import Snapshot

log = logging.getLogger(__name__)

#: Actions run in this order: the ones on this host first (they take microseconds), the API
#: writes after.
ORDER = ("file", "signal", "event", "delete")
EVENT_REASON = "GPUMonitorFailFast"
#: How often, when idle, the notifier removes the notice files of workloads that are gone.
SWEEP_S = 60.0


@dataclass
class Wiring:
    """What the notifier reads and acts through (built by the daemon, fakes in tests)."""

    node: str
    store: Any
    snapshot: Callable[[], Snapshot]  # the attribution refresher's current()
    pairing: Callable[[], dict[str, list[int]]]  # RDMA device -> paired GPU indices
    now: Callable[[], float]  # epoch seconds
    gpu_pids: Callable[[Sequence[int]], list[int]] = lambda gpus: []  # NVML's processes
    pod_pids: Callable[[str], list[int]] = lambda uid: []  # a pod's cgroup, by UID
    kube: Callable[[], Any] | None = None  # a gpu_monitor.kube.Kube, made on first use
    kill: Callable[[int, int], None] | None = None  # os.kill
    pid_alive: Callable[[int], bool] = process_alive  # a notice's process still exists
    observers: list[Callable[[str, dict], None]] = field(default_factory=list)


def _utc(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="milliseconds")


class FailFast:
    def __init__(self, settings: Any, dry_run: bool, wiring: Wiring):
        self.settings = settings  # config.FailfastConfig
        self.dry_run = dry_run
        self.w = wiring
        self.book = NoticeBook(wiring.store)
        self.actions = tuple(a for a in ORDER if a in settings.actions)
        self._queue: queue.Queue[Trigger | None] = queue.Queue()
        self._queued: set[str] = set()
        self._unknown_counted: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pods: PodWriter | None = None

    # --- in: results ------------------------------------------------------------------------

    def on_results(self, results: Iterable[Result]) -> None:
        """Queue the triggers among ``results`` (cheap: no I/O but a dict lookup)."""
        for t in triggers_from(results, self.settings.on_xid):
            with self._lock:
                if t.key in self._queued:
                    continue
                self._queued.add(t.key)
            self._queue.put(t)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="failfast", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _warm(self) -> None:
        """Make the API client now, not at the first notice (loading ``kubernetes`` takes about
        a second): only when an action needs it and the holders are pods (the kubelet is the
        attribution source); otherwise it is made, if ever, at the first pod's notice."""
        if self.w.kube is None or not {"event", "delete", "signal"} & set(self.actions):
            return
        try:
            if self.w.snapshot().source != "kubelet":
                return
        except Exception:  # noqa: BLE001
            return
        try:
            self._pod_writer()
        except Exception as exc:  # noqa: BLE001 - the notice says so when it needs the client
            log.info("fail-fast: no Kubernetes client yet: %s", exc)

    def sweep(self) -> int:
        """Remove the notice files of workloads that are gone (failfast/sweep.py); how many.
        Runs on the notifier's thread every ``SWEEP_S`` when no notice is waiting."""
        if "file" not in self.actions or self.dry_run:
            return 0
        return remove_gone(self.settings.notice_dir, self.book.notices(), self.w.snapshot(),
                           self.w.pid_alive)

    def _run(self) -> None:
        self._warm()
        while True:
            try:
                t = self._queue.get(timeout=SWEEP_S)
            except queue.Empty:
                try:
                    self.sweep()
                except Exception as exc:  # noqa: BLE001 - the thread must survive anything
                    log.warning("fail-fast: the notice sweep failed: %s", exc)
                continue
            if t is None:
                return
            try:
                self.handle(t)
            except Exception as exc:  # noqa: BLE001 - the thread must survive anything
                log.error("fail-fast notice for %s failed: %s", t.key, exc, exc_info=True)
            finally:
                with self._lock:
                    self._queued.discard(t.key)

    # --- one trigger ------------------------------------------------------------------------

    def handle(self, t: Trigger) -> dict | None:
        """Notify the workloads ``t`` affects, once; the notice's record (None: already
        notified, or unknown and left for the next result to retry)."""
        if self.book.seen(t.key) is not None:
            return None
        now = self.w.now()
        record: dict[str, Any] = {
            "key": t.key, "cause": t.cause, "target": t.target, "node": self.w.node,
            "outage_start": _utc(t.started_at), "crossed_at": _utc(t.crossed_at),
            "outage_end": _utc(t.ended_at), "noticed_at": _utc(now), "dry_run": self.dry_run,
        }
        if t.ended_at is not None and now - t.ended_at > self.settings.max_age_s:
            return self._close(t, record, "stale", f"ended {now - t.ended_at:.0f} s ago, more "
                               f"than failfast.max_age_s ({self.settings.max_age_s:g})")
        try:
            gpus = list(t.gpus) if t.gpus is not None else list(
                self.w.pairing().get(t.device or "", []))
        except Exception as exc:  # noqa: BLE001 - unknown, never "nobody"
            return self._unknown(t, f"cannot read the GPU↔NIC pairing: {exc}")
        snap = self.w.snapshot()
        if snap.state == "unknown":
            return self._unknown(t, f"attribution unknown: {snap.reason}")
        who = affected(snap, gpus, [t.device] if t.device else [])
        record.update(gpus=gpus, workloads=who.names(), attribution=snap.state,
                      attribution_source=snap.source)
        if not who:
            why = ("the port serves no GPU" if not gpus
                   else f"nobody holds gpu {', '.join(map(str, gpus))}")
            return self._close(t, record, "nobody", why)
        record["result"] = "notifying"
        self.book.write(t.key, record)  # committed before the first action (guarantee 2)
        outcomes: dict[str, dict[str, str]] = {}
        for action in self.actions:
            outcomes[action] = self._act(action, t, record, who)
        record["actions"] = outcomes
        reached = any(v == "ok" for per in outcomes.values() for v in per.values())
        result = "would_notify" if self.dry_run else ("notified" if reached else "error")
        return self._close(t, record, result, "")

    def _close(self, t: Trigger, record: dict, result: str, why: str) -> dict:
        record["result"] = result
        if why:
            record["why"] = why
        self.book.write(t.key, record)
        self.book.count("notice", result)
        log.warning("fail-fast %s: %s %s on %s%s", t.key, result, t.cause, t.target,
                    f" ({why})" if why else f": {', '.join(record.get('workloads', []))}")
        for observe in self.w.observers:
            observe(result, record)
        return record

    def _unknown(self, t: Trigger, why: str) -> None:
        if t.key not in self._unknown_counted:
            self._unknown_counted.add(t.key)
            self.book.count("notice", "unknown")
            log.warning("fail-fast %s: unknown: %s", t.key, why)
        return None

    # --- actions ----------------------------------------------------------------------------

    def _act(self, action: str, t: Trigger, record: dict, who: Affected) -> dict[str, str]:
        """Run one action for every affected workload: {workload: "ok" | "dry_run" | why}."""
        targets: list[Any] = list(who.pods) + list(who.pids)
        out: dict[str, str] = {}
        if action == "signal" and not self.dry_run:
            return self._signal(t, record, who)
        for target in targets:
            name = target.name if isinstance(target, PodRef) else f"pid {target}"
            if self.dry_run:
                out[name], result = "dry_run", "dry_run"
            else:
                try:
                    self._one(action, t, record, target)
                    out[name], result = "ok", "ok"
                except Exception as exc:  # noqa: BLE001 - recorded; the others still run
                    out[name], result = f"error: {type(exc).__name__}: {exc}"[:300], "error"
            self.book.count(action, result)
        return out

    def _one(self, action: str, t: Trigger, record: dict, target: Any) -> None:
        if action == "file":
            payload = {**record, "reason": t.cause, "port": t.target if t.device else None,
                       "message": t.message}
            if isinstance(target, PodRef):
                payload.update(namespace=target.namespace, pod=target.pod,
                               containers=list(target.containers))
                path = notice_path(self.settings.notice_dir, target.namespace, target.pod)
            else:
                payload.update(pid=target)
                path = notice_path(self.settings.notice_dir, pid=target)
            payload.pop("workloads", None)
            write_notice(path, payload)
            return
        if not isinstance(target, PodRef):
            raise RuntimeError(f"{action} needs a pod; pid {target} is a process off Kubernetes")
        pods = self._pod_writer()
        pod = pods.read(target.namespace, target.pod)
        message = self._message(t, record)
        now = self.w.now()
        if action == "event":
            pods.condition(pod, t.cause, message, now)
            pods.event(pod, EVENT_REASON, message, now)
        elif action == "delete":
            pods.delete(pod, math.ceil(self.settings.delete_grace_s))

    def _signal(self, t: Trigger, record: dict, who: Affected) -> dict[str, str]:
        """One signal to every holder process: NVML's processes on the affected GPUs, the
        processes of each affected pod's cgroup, and off Kubernetes the holders' pids."""
        pids: list[int] = list(who.pids)
        errors: list[str] = []
        try:
            pids += self.w.gpu_pids(record.get("gpus") or [])
        except Exception as exc:  # noqa: BLE001
            errors.append(f"NVML processes: {exc}")
        for pod in who.pods:
            try:
                uid = (self._pod_writer().read(pod.namespace, pod.pod)["metadata"]
                       .get("uid")) if self.w.kube is not None else None
                if uid:
                    pids += self.w.pod_pids(uid)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{pod.name}'s cgroup: {exc}")
        kill = self.w.kill
        done, failed = (send_signal(pids, signal_number(self.settings.signal))
                        if kill is None else
                        send_signal(pids, signal_number(self.settings.signal), kill))
        out = {f"pid {p}": "ok" for p in done}
        out.update({f"pid {p}": why for p, why in failed.items()})
        for e in errors:
            out[e.split(":")[0]] = f"error: {e}"
        if not pids:
            out["-"] = "error: no holder process found" + (f" ({'; '.join(errors)})"
                                                          if errors else "")
        self.book.count("signal", "ok", len(done))
        if failed or errors or not pids:
            self.book.count("signal", "error", len(failed) + len(errors) + (0 if pids else 1))
        return out

    def _pod_writer(self) -> PodWriter:
        if self.w.kube is None:
            raise RuntimeError("no Kubernetes client (not on a cluster)")
        with self._lock:
            if self._pods is None:
                self._pods = PodWriter(self.w.kube(), self.w.node)
            return self._pods

    def _message(self, t: Trigger, record: dict) -> str:
        gpus = ", ".join(f"gpu:{g}" for g in record.get("gpus") or [])
        return (f"{t.cause} on {t.target} (serving {gpus or 'no GPU'}) since "
                f"{record['outage_start']}: the job on this pod's GPUs cannot recover; "
                f"gpu-monitor notified it at {iso(self.w.now())} "
                f"(condition {CONDITION_TYPE}). {t.message}")[:1024]
