"""Health reports about this node from other detectors: GPUHealthReport objects and dropped files.

Why: a detector that runs elsewhere (an SDC alarm in a training job, the fabric prober) may
blame a node it does not run on. It never writes to that node; it creates a namespaced
``GPUHealthReport`` (group ``gpu-monitor.io``, version ``v1alpha1``) labelled
``gpu-monitor.io/node=<node>``, and the daemon on the named node - only it - turns the report
into a result for its own policy. A job on the same node may instead drop the report as a JSON
file into the host directory the daemon watches (``daemon.report_dir``).

Guarantees:

1. Only reports naming this node count: the watch/list uses the label selector, and a report
   whose ``spec.node`` is another node is ignored even if mislabelled.
2. Each report acts once: it is remembered by uid in the state store (``add_health_report``),
   so a restart, a re-list or a re-read directory does not act again.
3. A malformed report is logged and skipped, never fatal; reports older than ``max_age_s``
   (by ``observedTime``) are recorded but not acted on.
4. A missing GPUHealthReport CRD (404) is said once (a warning), looked for again with
   exponential backoff (5 s doubling to 10 min, on the injected clock), and picked up when it
   appears (an info line, then the watch starts). Other watch failures back off the same way
   (to 5 min), logged when the error changes, not on every retry.

Report spec (docs/remediation.md): ``node``, ``reason`` (CamelCase token), ``source``,
``evidence`` (free-form object), ``observedTime`` (RFC 3339). Files may hold that spec, a whole
GPUHealthReport object, or the SDC library's schema-1 report (``nodes`` list, ``time``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpu_monitor.clock import Clock
from gpu_monitor.kube.errors import KubeError
from gpu_monitor.model import NODE, Action, Result, Status, is_reason, parse_iso
from gpu_monitor.remediate.policy import REPORT_CHECK

log = logging.getLogger(__name__)

__all__ = [
    "GROUP",
    "KIND",
    "NODE_LABEL",
    "PLURAL",
    "REPORT_ACTIONS",
    "VERSION",
    "IncomingReport",
    "ReportError",
    "ReportSource",
    "parse_report_file",
    "parse_report_object",
    "report_object",
]

GROUP = "gpu-monitor.io"
VERSION = "v1alpha1"
PLURAL = "gpuhealthreports"
KIND = "GPUHealthReport"
NODE_LABEL = "gpu-monitor.io/node"

#: A report's reason -> the action its result carries (the policy maps actions to operations;
#: ``checks.health_report.remediation`` style overrides by reason still apply). An SDC alarm
#: quarantines and retests the node: a bad GPU then fails the retest and is replaced.
REPORT_ACTIONS: Mapping[str, Action] = {
    "SdcAlarm": Action.RESET_GPU,
    "FabricProbeFailed": Action.RESET_GPU,
    "NvlinkProbeFailed": Action.RESET_GPU,
    "RdmaProbeFailed": Action.WATCH,
}
DEFAULT_REPORT_ACTION = Action.RESET_GPU
_TOKEN = re.compile(r"[^A-Za-z0-9]+")
WATCH_RETRY_BASE_S = 5.0
CRD_RETRY_MAX_S = 600.0  # a missing CRD is an install choice: look again rarely
WATCH_RETRY_MAX_S = 300.0


class ReportError(ValueError):
    """A report that cannot be understood."""


@dataclass(frozen=True)
class IncomingReport:
    uid: str
    node: str
    reason: str
    source: str
    observed_at: datetime
    evidence: Mapping[str, Any] = field(default_factory=dict)
    origin: str = "crd"  # crd | file
    name: str = ""

    def result(self) -> Result:
        """The report as a failed result of the pseudo-check ``health_report``."""
        action = REPORT_ACTIONS.get(self.reason, DEFAULT_REPORT_ACTION)
        msg = f"{self.reason} reported by {self.source or 'an unnamed source'}"
        if self.name:
            msg += f" ({self.origin} {self.name})"
        return Result(check=REPORT_CHECK, status=Status.FAILED, target=NODE, reason=self.reason,
                      message=msg, details={"uid": self.uid, "source": self.source,
                                            "origin": self.origin, "name": self.name},
                      action=action, observed_at=self.observed_at)


def _reason_token(text: Any) -> str:
    raw = str(text or "").strip()
    if is_reason(raw):
        return raw
    token = "".join(p[:1].upper() + p[1:] for p in _TOKEN.split(raw) if p)
    return token if is_reason(token) else "HealthReport"


def _time(text: Any, fallback: datetime) -> datetime:
    if not text:
        return fallback
    try:
        return parse_iso(str(text))
    except ValueError as exc:
        raise ReportError(f"observedTime {text!r} is not RFC 3339") from exc


def _from_spec(spec: Mapping[str, Any], uid: str, origin: str, name: str,
               now: datetime) -> IncomingReport:
    node = spec.get("node")
    if not isinstance(node, str) or not node:
        raise ReportError("spec.node is missing")
    evidence = spec.get("evidence")
    return IncomingReport(uid=uid, node=node, reason=_reason_token(spec.get("reason")),
                          source=str(spec.get("source") or ""),
                          observed_at=_time(spec.get("observedTime"), now),
                          evidence=evidence if isinstance(evidence, Mapping) else {},
                          origin=origin, name=name)


def parse_report_object(obj: Mapping[str, Any], now: datetime) -> IncomingReport:
    """A GPUHealthReport object (as the API serves it)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ReportError("no spec")
    uid = str(meta.get("uid") or "")
    if not uid:
        raise ReportError("no metadata.uid")
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return _from_spec(spec, f"crd:{uid}", "crd", name, now)


def parse_report_file(text: str, node: str, name: str, now: datetime) -> list[IncomingReport]:
    """The reports in a dropped file that name ``node`` (several for an SDC report naming
    several nodes; none when it names only others)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ReportError(f"not JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ReportError("not a JSON object")
    uid = "file:" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32]
    if data.get("kind") == KIND and isinstance(data.get("spec"), Mapping):
        rep = _from_spec(data["spec"], uid, "file", name, now)
        return [rep] if rep.node == node else []
    if "nodes" in data and "schema" in data:  # the SDC library's report (gpu_monitor.sdc.report)
        nodes = data.get("nodes") or []
        if not isinstance(nodes, list):
            raise ReportError("nodes is not a list")
        if node not in nodes:
            return []
        return [IncomingReport(uid=uid, node=node, reason=_reason_token(data.get("kind", "SdcAlarm")),
                               source=str(data.get("source") or ""),
                               observed_at=_time(data.get("time"), now), evidence=data,
                               origin="file", name=name)]
    rep = _from_spec(data, uid, "file", name, now)
    return [rep] if rep.node == node else []


def report_object(node: str, reason: str, source: str, evidence: Mapping[str, Any],
                  observed_at: datetime, namespace: str) -> dict[str, Any]:
    """A GPUHealthReport body naming ``node`` (for detectors that blame another node)."""
    from gpu_monitor.model import iso

    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
        "metadata": {"generateName": f"{_TOKEN.sub('-', node.lower())[:40].strip('-')}-",
                     "namespace": namespace, "labels": {NODE_LABEL: node}},
        "spec": {"node": node, "reason": _reason_token(reason), "source": source,
                 "evidence": dict(evidence), "observedTime": iso(observed_at)},
    }


class ReportSource:
    """This node's incoming reports: GPUHealthReports (list + optional watch) and a drop dir."""

    def __init__(self, node: str, store: Any, clock: Clock, *, kube: Any = None,
                 namespace: str = "gpu-monitor", drop_dir: str | None = None,
                 max_age_s: float = 86400.0):
        self.node = node
        self.store = store
        self.clock = clock
        self.kube = kube
        self.namespace = namespace
        self.drop_dir = drop_dir
        self.max_age_s = max_age_s
        self._bad_files: set[tuple[str, float]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self.ignored = 0  # reports seen that name another node
        self.crd_missing = False  # the last list answered 404: the CRD is not installed
        self._crd_lock = threading.Lock()

    @property
    def selector(self) -> str:
        return f"{NODE_LABEL}={self.node}"

    def _accept(self, reports: Iterable[IncomingReport]) -> list[Result]:
        out: list[Result] = []
        now = self.clock.now()
        for rep in reports:
            if rep.node != self.node:
                self.ignored += 1
                log.debug("report %s names node %s, not this one: ignored", rep.uid, rep.node)
                continue
            payload = {"origin": rep.origin, "name": rep.name, "evidence": dict(rep.evidence)}
            if not self.store.add_health_report(rep.uid, rep.node, rep.reason, rep.source,
                                                rep.observed_at, payload):
                continue  # acted on before
            age = (now - rep.observed_at).total_seconds()
            if age > self.max_age_s:
                log.warning("health report %s (%s) is %.0f s old: recorded, not acted on",
                            rep.name or rep.uid, rep.reason, age)
                continue
            log.warning("health report about this node: %s from %s (%s %s)", rep.reason,
                        rep.source or "?", rep.origin, rep.name)
            out.append(rep.result())
        return out

    def poll(self, *, crd: bool = True, files: bool = True) -> list[Result]:
        """List the reports naming this node and read the drop directory; the new ones."""
        out: list[Result] = []
        if crd and self.kube is not None:
            out += self._accept(self._list())
        if files and self.drop_dir:
            out += self._accept(self._scan())
        return out

    def _list(self) -> list[IncomingReport]:
        page = self._list_page()
        return self._parse_objects(page.get("items") or []) if page is not None else []

    def _list_page(self) -> dict | None:
        """This node's GPUHealthReports, or None when the CRD is not installed (said once, and
        once more when it appears)."""
        try:
            page = self.kube.list_custom(GROUP, VERSION, self.namespace, PLURAL,
                                         label_selector=self.selector)
        except KubeError as err:
            if err.status != 404:
                raise
            with self._crd_lock:
                first, self.crd_missing = not self.crd_missing, True
            if first:
                log.warning("the GPUHealthReport CRD is not served (404 listing %s.%s/%s in "
                            "%s): reports from other detectors are not received; looking "
                            "again with backoff (install daemonset/crd-gpuhealthreports.yaml)",
                            PLURAL, GROUP, VERSION, self.namespace)
            return None
        with self._crd_lock:
            found, self.crd_missing = self.crd_missing, False
        if found:
            log.info("the GPUHealthReport CRD is served now: receiving reports")
        return page

    def _parse_objects(self, items: Iterable[Mapping[str, Any]]) -> list[IncomingReport]:
        now = self.clock.now()
        reps = []
        for obj in items:
            try:
                reps.append(parse_report_object(obj, now))
            except ReportError as exc:
                meta = obj.get("metadata") or {}
                log.warning("GPUHealthReport %s/%s skipped: %s", meta.get("namespace"),
                            meta.get("name"), exc)
        return reps

    def _scan(self) -> list[IncomingReport]:
        try:
            names = sorted(os.listdir(self.drop_dir))  # type: ignore[arg-type]
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read the report directory %s: %s", self.drop_dir, exc)
            return []
        now = self.clock.now()
        reps: list[IncomingReport] = []
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue  # temp files of an atomic write, or not a report
            path = os.path.join(self.drop_dir, name)  # type: ignore[arg-type]
            try:
                mtime = os.stat(path).st_mtime
                if (name, mtime) in self._bad_files:
                    continue
                with open(path, encoding="utf-8") as fh:
                    text = fh.read(4 * 1024 * 1024)
            except OSError:
                continue
            try:
                reps += parse_report_file(text, self.node, name, now)
            except ReportError as exc:
                self._bad_files.add((name, mtime))
                log.warning("report file %s skipped: %s", path, exc)
        return reps

    # --- watch ---------------------------------------------------------------------------------

    def start_watch(self, deliver: Callable[[list[Result]], None]) -> None:
        """Watch this node's GPUHealthReports in a thread; ``deliver`` gets the new results."""
        if self.kube is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch_loop, args=(deliver,),
                                        name="health-reports", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=2)

    def _started(self, handle: Any) -> None:
        self._watch = handle

    def _backoff(self, failures: int, cap: float) -> bool:
        """Wait (on the injected clock) before retry ``failures``; True when stopped."""
        delay = min(cap, WATCH_RETRY_BASE_S * 2 ** min(failures - 1, 16))
        return self.clock.wait(self._stop, delay * random.uniform(0.8, 1.2))

    def _watch_loop(self, deliver: Callable[[list[Result]], None]) -> None:
        rv: str | None = None
        failures = 0
        last_error = ""
        while not self._stop.is_set():
            try:
                if rv is None:
                    page = self._list_page()
                    if page is None:  # no CRD: said once by _list_page
                        failures += 1
                        if self._backoff(failures, CRD_RETRY_MAX_S):
                            return
                        continue
                    failures, last_error = 0, ""
                    rv = (page.get("metadata") or {}).get("resourceVersion") or ""
                    got = self._accept(self._parse_objects(page.get("items") or []))
                    if got:
                        deliver(got)
                for typ, obj in self.kube.watch_custom(GROUP, VERSION, self.namespace, PLURAL,
                                                       label_selector=self.selector,
                                                       resource_version=rv or None,
                                                       timeout_s=300, stop=self._stop,
                                                       started=self._started):
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if typ in ("ADDED", "MODIFIED"):
                        got = self._accept(self._parse_objects([obj]))
                        if got:
                            deliver(got)
                failures, last_error = 0, ""  # the watch ran to the server's timeout
            except KubeError as err:
                if err.status == 410:
                    rv = None
                    continue
                if err.status == 404:  # the CRD went away: list (and say so) again
                    rv = None
                    failures += 1
                    if self._backoff(failures, CRD_RETRY_MAX_S):
                        return
                    continue
                failures += 1
                last_error = self._watch_failed(str(err), last_error, failures)
                if self._backoff(failures, WATCH_RETRY_MAX_S):
                    return
            except Exception as exc:  # noqa: BLE001 - the watch thread must survive
                if self._stop.is_set():
                    return
                rv = None
                failures += 1
                last_error = self._watch_failed(f"{type(exc).__name__}: {exc}", last_error,
                                                failures)
                if self._backoff(failures, WATCH_RETRY_MAX_S):
                    return

    @staticmethod
    def _watch_failed(text: str, last: str, failures: int) -> str:
        if text != last:
            log.warning("watching GPUHealthReports failed: %s; retrying with backoff", text)
        else:
            log.debug("watching GPUHealthReports still failing (%d attempts): %s", failures,
                      text)
        return text
