"""xid: NVIDIA Xid errors from the kernel log, classified by the versioned XID catalog.

Event-driven: ``on_kmsg`` gets every kernel-log record; an Xid line (or the "GPU has fallen off
the bus" message that comes without one) becomes one result for ``gpu:<index>`` (the PCI address
mapped through NVML; ``pcie:<addr>`` when NVML does not know it) with reason ``Xid<code>`` and
the catalog's action. Every event is stored (``Store.add_xid_event``, idempotent on boot id +
sequence), and the repeat rules read that history:

- application XIDs (13, 31, 43, 45) are ``ok`` until one code repeats on one GPU
  ``app_xid_repeat_count`` times within ``app_xid_window_s`` (repeats closer than
  ``app_xid_dedup_s`` are one burst; an Xid 45 "caused by previous Xid N" never counts), then
  ``failed`` with ``reset_gpu``;
- a hardware XID that recurs on the same GPU after a reboot (another boot id) or a recorded GPU
  reset escalates reset_gpu -> reboot -> replace (``replace_after_resets``).

``poll`` reports each GPU's standing state from that history (open hardware problems last until
a reboot or a recorded reset; watch-class ones for ``app_xid_window_s``). ``run`` (bootstrap,
``gpu-monitor check xid --kmsg FILE``) scans the whole log and reports every event; a GPU with
no event is ``ok`` only when the log was read to its end and held something, else ``unknown``
``KmsgReadError`` naming the path and the error (missing, a directory, no permission, empty, a
FIFO nobody wrote to).

``parse_errors`` (and ``parse_error_kinds``: garbage, no_pci, fragment, unknown_code) counts
lines about XIDs that could not be fully used; the metrics layer reads it from the instance.
Parsing lives in gpu_monitor/rules/xid.py; docs/xid.md explains the classification.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from checks._kernel_log import KernelLogCheck
from checks._kmsg_events import (
    READ_ERROR,
    boot_id,
    event_time,
    follower_unread,
    record_seq,
    reset_times,
    worse_than,
)
from checks._xid_history import XidRecall, counts_as_repeat
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw.kmsg.record import KmsgGap, KmsgRecord
from gpu_monitor.metric_families import CheckMetric, LatestResult, MetricsHistory, Sample
from gpu_monitor.model import (
    NODE,
    Action,
    Result,
    Status,
    gpu_target,
    iso,
    parse_iso,
    pcie_target,
)
from gpu_monitor.profiles.schema import POSITIVE_INT, SECONDS, SECONDS0
from gpu_monitor.rules import xid_catalog
from gpu_monitor.rules.xid import (
    ESCALATION_LADDER,
    FALLEN_OFF_BUS_REASON,
    Classification,
    GpuHeader,
    ParsedXid,
    XidParseError,
    burst_count,
    classify,
    count_recoveries,
    escalate,
    join_fallen_off,
    parse_xid,
)
from gpu_monitor.state.kernel_log import XidEvent

log = logging.getLogger(__name__)

# An Xid 79 and the "fallen off the bus" message about the same GPU this close are one event.
SAME_BUS_EVENT_S = 300.0
MAP_REFRESH_S = 60.0
PENDING_HEADER_RECORDS = 4
# Without a store, the history kept in memory (a one-shot scan resets it).
MEMORY_EVENTS = 100_000


# --- the check ---------------------------------------------------------------------------------


def xid_event_samples(results: Sequence[LatestResult], history: MetricsHistory
                      ) -> Iterable[Sample]:
    """Every XID seen, per GPU and code, counted over the store's whole history (a counter
    that continues across restarts, so it cannot come from one result)."""
    counts = history.xid_counts("xid")
    for (idx, uuid, code), n in sorted(counts.items(), key=lambda kv: (
            str(kv[0][0]), str(kv[0][1]), kv[0][2])):
        yield ("" if idx is None else str(idx), uuid or "", str(code)), float(n)


class Xid(KernelLogCheck):
    summary = "NVIDIA Xid errors in the kernel log, classified by the versioned XID catalog"
    interval = 30.0
    reasons = (*(f"Xid{c}" for c in xid_catalog().codes()), FALLEN_OFF_BUS_REASON,
               READ_ERROR)
    settings = {
        "app_xid_repeat_count": Setting(
            POSITIVE_INT, 5,
            "occurrences of one application XID (13, 31, 43, 45) on one GPU",
            "NVSentinel health-events-analyzer (5 in 24 h)"),
        "app_xid_window_s": Setting(SECONDS, 86400, "s",
                                    "NVSentinel health-events-analyzer (5 in 24 h)"),
        "app_xid_dedup_s": Setting(
            SECONDS0, 180,
            "s; repeats closer than this count once (an XID 13 storm is one event)",
            "NVSentinel `suppressionWindow: 3m`"),
        "replace_after_resets": Setting(
            POSITIVE_INT, 1,
            "resets/reboots after which a repeating hardware XID suggests `replace`",
            "SPEC-CHECKS (\"repeats after a reset/reboot escalate\"); GPUd uses 2"),
        "replay_max_age_s": Setting(
            SECONDS, 7200, "s; older replayed kernel-log XIDs are history, not findings",
            "Azure NHC `check_gpu_xid` (2 h)"),
    }
    condition = "GPUXidError"
    kmsg_literals = ("NVRM",)  # every line the parser reads holds it
    metrics = (CheckMetric("gpu_monitor_xid_events_total", "counter", ("gpu", "uuid", "code"),
                           "NVIDIA Xid events seen in the kernel log, per GPU and code.",
                           samples=xid_event_samples),)

    def __init__(self, *, recount: bool = False) -> None:
        """``recount``: judge every event by reading its history back from the store, never
        from the state in memory (the reference tests hold that state to)."""
        super().__init__()
        self._gpus: dict[str, tuple[int, str | None]] = {}
        self._map_at: float | None = None
        self._memory: list[XidEvent] = []  # history when there is no store
        self._pending: tuple[GpuHeader, int] | None = None
        self._recent_bus: dict[str, tuple[datetime, str, bool]] = {}
        self._recall = None if recount else XidRecall()

    # --- GPU map ------------------------------------------------------------------------------

    def _gpu_map(self, ctx: Context, refresh: bool = False) -> dict[str, tuple[int, str | None]]:
        """canonical PCI -> (index, uuid); GPUs NVML lost keep their last known entry."""
        mono = ctx.clock.monotonic()
        if not refresh and self._map_at is not None and mono - self._map_at < MAP_REFRESH_S:
            return self._gpus
        if refresh and self._map_at is not None and mono - self._map_at < 1.0 and self._gpus:
            return self._gpus
        self._map_at = mono
        try:
            if ctx.host.nvml.available():
                for g in ctx.host.nvml.gpus():
                    if g.pci_bus_id:
                        self._gpus[g.pci_bus_id] = (g.index, g.uuid)
        except Exception as exc:  # noqa: BLE001 - XIDs must be reported without NVML too
            log.info("xid: cannot map PCI addresses to GPUs: %s", exc)
        return self._gpus

    def _gpu_for(self, pci: str | None, ctx: Context) -> tuple[int, str | None] | None:
        if pci is None:
            return None
        hit = self._gpu_map(ctx).get(pci)
        return hit if hit is not None else self._gpu_map(ctx, refresh=True).get(pci)

    # --- history ------------------------------------------------------------------------------

    def _history(self, ctx: Context, code: int, uuid: str | None, pci: str | None,
                 since: datetime | None = None) -> list[XidEvent]:
        """This GPU's earlier events of ``code`` (those at or after ``since`` when given)."""
        if ctx.store is not None:
            try:
                events = ctx.store.xid_events(since=since, uuid=uuid, code=code, kind="xid")
            except Exception as exc:  # noqa: BLE001
                log.warning("xid: cannot read history: %s", exc)
                events = []
        else:
            events = [e for e in self._memory
                      if e.code == code and (since is None or e.observed_at >= since)]
        if uuid:
            return [e for e in events if e.gpu_uuid == uuid]
        return [e for e in events if e.pci_bus_id == pci]

    def _remember(self, ctx: Context, event: XidEvent) -> None:
        if ctx.store is not None:
            try:
                added = ctx.store.add_xid_event(event)
            except Exception as exc:  # noqa: BLE001 - keep detecting even if history fails
                log.error("xid: cannot store event: %s", exc)
                return
            if added and self._recall is not None:
                self._recall.added(ctx.store, event)
            return
        key = (event.boot_id, event.seq, event.code, event.pci_bus_id)
        if not any((e.boot_id, e.seq, e.code, e.pci_bus_id) == key for e in self._memory[-64:]):
            self._memory.append(event)
            if len(self._memory) > MEMORY_EVENTS:
                del self._memory[: len(self._memory) - MEMORY_EVENTS]

    # --- records ------------------------------------------------------------------------------

    def _on_record(self, record: KmsgRecord, ctx: Context) -> list[Result]:
        text = record.text
        if self._pending is not None:
            header, age = self._pending
            self._pending = (header, age + 1) if age + 1 < PENDING_HEADER_RECORDS else None
        if "NVRM" not in text:
            return []
        try:
            parsed = parse_xid(text)
        except Exception:  # noqa: BLE001 - a parser bug must not stop monitoring
            log.exception("xid: parser failed on %r", text[:200])
            self._count("garbage")
            return []
        if parsed is None:
            return []
        if isinstance(parsed, GpuHeader):
            self._pending = (parsed, 0)
            return []
        if isinstance(parsed, XidParseError):
            if parsed.kind == "fragment" and self._pending is not None:
                parsed = join_fallen_off(self._pending[0], parsed)
                self._pending = None
            else:
                self._count(parsed.kind)
                return []
        try:
            return self._event(parsed, record, ctx)
        except Exception:  # noqa: BLE001
            log.exception("xid: cannot evaluate %r", parsed.raw[:200])
            self._count("garbage")
            return []

    def _event(self, x: ParsedXid, record: KmsgRecord, ctx: Context) -> list[Result]:
        cls = classify(x)
        if not cls.entry.known:
            self._count("unknown_code")
        if x.pci is None:
            self._count("no_pci")
        gpu = self._gpu_for(x.pci, ctx)
        index, uuid = gpu if gpu else (None, None)
        target = gpu_target(index) if index is not None else (
            pcie_target(x.pci) if x.pci else NODE)
        boot = boot_id(ctx)
        seq = record_seq(record)
        at, timed = event_time(record, ctx)
        if x.code == 79 and self._same_bus_event(uuid or x.pci or target, at, boot,
                                                 x.fallen_off_bus):
            return []
        status, action, details = self._judge(cls, x, at, boot, seq, index, uuid, ctx)
        fatal = status is Status.FAILED
        replay_max = float(ctx.setting(self.name, "replay_max_age_s"))
        age_s = (ctx.clock.now() - at).total_seconds()
        if timed and ctx.host.paths.kmsg_is_device and age_s > replay_max:
            details.update(history=True, age_s=round(age_s, 1), replay_max_age_s=replay_max,
                           suggested_action=action.value)
            status, action = Status.OK, Action.NONE
        details.update(self._describe(cls, x, record, boot, seq, at, uuid, index))
        self._remember(ctx, XidEvent(
            boot_id=boot, seq=seq, observed_at=at, code=x.code, pci_bus_id=x.pci,
            gpu_uuid=uuid, gpu_index=index, kind="xid", message=x.raw[:2000],
            fatal=fatal))
        if status in (Status.DEGRADED, Status.FAILED) and not details.get("repeated"):
            self._open.note(ctx, target, {
                "status": status.value, "action": action.value, "reason": cls.reason,
                "code": x.code, "boot_id": boot, "at": iso(at), "gpu_index": index,
                "uuid": uuid, "message": x.raw[:300]})
        where = f"{target}" + (f" ({x.pci})" if x.pci and target.startswith("gpu:") else "")
        msg = (f"{cls.reason} on {where}: {cls.entry.name} [{cls.entry.category}], "
               f"suggested action {action.value}" + (f": {x.message[:160]}" if x.message else ""))
        return [Result(check=self.name, status=status, target=target, reason=cls.reason,
                       message=msg, details=details, action=action, observed_at=ctx.clock.now())]

    def _same_bus_event(self, key: str, at: datetime, boot: str, fallen: bool) -> bool:
        """An Xid 79 and a "fallen off the bus" message close together are one event."""
        prev = self._recent_bus.get(key)
        self._recent_bus[key] = (at, boot, fallen)
        return bool(prev and prev[1] == boot and prev[2] != fallen
                    and abs((at - prev[0]).total_seconds()) <= SAME_BUS_EVENT_S)

    def _judge(self, cls: Classification, x: ParsedXid, at: datetime, boot: str, seq: int,
               index: int | None, uuid: str | None, ctx: Context
               ) -> tuple[Status, Action, dict[str, Any]]:
        status, action = cls.status, cls.action
        details: dict[str, Any] = {}
        setting = ctx.setting
        if cls.entry.category == "application":
            if cls.sympathetic:
                return Status.OK, Action.NONE, {"caused_by": x.caused_by, "sympathetic": True}
            window = float(setting(self.name, "app_xid_window_s"))
            dedup = float(setting(self.name, "app_xid_dedup_s"))
            limit = int(setting(self.name, "app_xid_repeat_count"))
            n = self._occurrences(ctx, x, uuid, at, boot, seq, window, dedup)
            details.update(occurrences_in_window=n, app_xid_repeat_count=limit,
                           app_xid_window_s=window, app_xid_dedup_s=dedup)
            if n >= limit:
                details["repeated"] = True
                return Status.FAILED, Action.RESET_GPU, details
            return Status.OK, Action.NONE, details
        if action in ESCALATION_LADDER:
            previous, recoveries = self._recoveries(ctx, x, uuid, at, boot, seq,
                                                    reset_times(ctx, index, uuid))
            limit = int(setting(self.name, "replace_after_resets"))
            escalated = escalate(action, recoveries, limit)
            details.update(previous_occurrences=previous, recoveries=recoveries,
                           replace_after_resets=limit)
            if escalated is not action:
                details["escalated_from"] = action.value
            action = escalated
        return status, action, details

    def _quick(self, ctx: Context, boot: str, seq: int, code: int) -> XidRecall | None:
        """The history in memory, when it may answer for this event (checks/_xid_history.py)."""
        recall = self._recall
        if recall is None or ctx.store is None or not recall.usable(ctx.store, boot, seq, code):
            return None
        return recall

    def _prior(self, ctx: Context, x: ParsedXid, uuid: str | None, at: datetime, boot: str,
               seq: int, since: datetime | None) -> list[XidEvent]:
        """The recount's history: this GPU's stored events of the code up to ``at`` (from
        ``since``), the event's own record left out (a replay of it)."""
        return [e for e in self._history(ctx, x.code, uuid, x.pci, since)
                if not (e.boot_id == boot and e.seq == seq) and e.observed_at <= at]

    def _occurrences(self, ctx: Context, x: ParsedXid, uuid: str | None, at: datetime,
                     boot: str, seq: int, window: float, dedup: float) -> int:
        """Bursts of the application Xid on this GPU in the window ending at ``at``, this one
        included (repeats closer than ``dedup`` count once; sympathetic ones never)."""
        recall = self._quick(ctx, boot, seq, x.code)
        if recall is not None:
            n = recall.bursts(ctx.store, x.code, uuid, x.pci, at, window, dedup)
            if n is not None:
                return n
        # An application Xid is judged on its window alone: older history is not read.
        start = at - timedelta(seconds=window)
        times = [e.observed_at for e in self._prior(ctx, x, uuid, at, boot, seq, start)
                 if e.observed_at >= start and counts_as_repeat(e.message)]
        return burst_count([*times, at], dedup)

    def _recoveries(self, ctx: Context, x: ParsedXid, uuid: str | None, at: datetime,
                    boot: str, seq: int, resets: Sequence[datetime]) -> tuple[int, int]:
        """(earlier fatal occurrences of the code on this GPU, recoveries between them and this
        one): milder payloads of the code do not count."""
        recall = self._quick(ctx, boot, seq, x.code)
        if recall is not None:
            quick = recall.ladder(ctx.store, x.code, uuid, x.pci, at, boot, resets)
            if quick is not None:
                return quick
        failed_before = [e for e in self._prior(ctx, x, uuid, at, boot, seq, None) if e.fatal]
        occurrences = [(e.observed_at, e.boot_id) for e in failed_before] + [(at, boot)]
        return len(failed_before), count_recoveries(occurrences, resets)

    def _describe(self, cls: Classification, x: ParsedXid, record: KmsgRecord, boot: str,
                  seq: int, at: datetime, uuid: str | None, index: int | None
                  ) -> dict[str, Any]:
        d: dict[str, Any] = {
            "code": x.code, "mnemonic": cls.entry.name, "category": cls.entry.category,
            "catalog_version": xid_catalog().version, "known_code": cls.entry.known,
            "nvidia_immediate": cls.entry.nvidia_immediate,
            "nvidia_investigatory": cls.entry.nvidia_investigatory, "basis": cls.basis,
            "pci_bus_id": x.pci, "uuid": uuid, "gpu_index": index, "pid": x.pid,
            "process": x.process, "event_time": iso(at), "boot_id": boot, "seq": seq,
            "line_no": record.line_no, "text": x.raw[:500],
        }
        if x.gpu_instance is not None:
            d.update(gpu_instance=x.gpu_instance, compute_instance=x.compute_instance)
        d.update(x.extra)
        if x.nvlink5 is not None:
            p = x.nvlink5
            d["nvlink5"] = {"unit": p.unit, "severity": p.severity, "link": p.link,
                            "cross_contain": p.cross_contain, "injected": p.injected,
                            "registers": [f"0x{v:08x}" for v in p.registers]}
        if cls.decode is not None:
            dec = cls.decode
            d["nvlink5_decode"] = {"unit": dec.unit, "intrinfo_version": dec.version,
                                   "resolution": dec.resolution, "severity": dec.severity,
                                   "investigatory": dec.investigatory, "hw_sw": dec.hw_sw,
                                   "promoted": dec.promoted}
        if x.recovery is not None:
            r = x.recovery
            d["recovery_action"] = {"from": r.from_name, "from_code": r.from_code,
                                    "to": r.to_name, "to_code": r.to_code}
        if x.caused_by is not None:
            d["caused_by"] = x.caused_by
        return d

    # --- standing state ------------------------------------------------------------------------

    def _state(self, ctx: Context) -> list[Result]:
        gpus = {gpu_target(i): (i, uuid, pci)
                for pci, (i, uuid) in self._gpu_map(ctx, refresh=True).items()}
        boot = boot_id(ctx)
        now = ctx.clock.now()
        watch_s = float(ctx.setting(self.name, "app_xid_window_s"))
        problems = self._open.current(
            ctx, lambda p: self._still_open(p, boot, now, watch_s, ctx))
        unread = follower_unread(ctx)
        results: list[Result] = []
        for target in sorted(set(gpus) | set(problems), key=_target_order):
            index, uuid, pci = gpus.get(target, (None, None, None))
            prob = problems.get(target)
            repeat = self._app_repeat(ctx, target, uuid, pci, now) if uuid or pci else None
            if prob is not None and (repeat is None or not worse_than(
                    {"status": repeat.status.value, "action": repeat.action.value}, prob)):
                details = {"uuid": prob.get("uuid") or uuid, "pci_bus_id": pci,
                           "code": prob.get("code"), "since": prob.get("at"),
                           "text": prob.get("message", ""), "open": True}
                results.append(Result(
                    check=self.name, status=Status(prob["status"]), target=target,
                    reason=prob["reason"], details=details, action=Action(prob["action"]),
                    message=f"{prob['reason']} on {target} since {prob.get('at')} "
                            f"(until a reboot or GPU reset): {prob.get('message', '')[:160]}",
                    observed_at=now))
                continue
            if repeat is not None:
                results.append(repeat)
                continue
            if index is not None:
                results.append(self.quiet(ctx, target, unread, "no open XID problem",
                                          {"uuid": uuid, "pci_bus_id": pci}))
        return results

    def _still_open(self, prob: Mapping[str, Any], boot: str, now: datetime, watch_s: float,
                    ctx: Context) -> bool:
        if prob.get("boot_id") != boot:
            return False  # rebooted since
        at = parse_iso(prob["at"])
        if any(t > at for t in reset_times(ctx, prob.get("gpu_index"), prob.get("uuid"))):
            return False
        return not (prob["status"] == Status.DEGRADED.value
                    and (now - at).total_seconds() > watch_s)

    def _app_repeat(self, ctx: Context, target: str, uuid: str | None, pci: str | None,
                    now: datetime) -> Result | None:
        """``failed`` when an application XID repeats beyond the limit in the window now."""
        window = float(ctx.setting(self.name, "app_xid_window_s"))
        dedup = float(ctx.setting(self.name, "app_xid_dedup_s"))
        limit = int(ctx.setting(self.name, "app_xid_repeat_count"))
        since = now - timedelta(seconds=window)
        if ctx.store is not None:
            try:
                events = ctx.store.xid_events(since=since, uuid=uuid, kind="xid")
            except Exception:  # noqa: BLE001
                events = []
        else:
            events = [e for e in self._memory if e.observed_at >= since]
        catalog = xid_catalog()
        times: dict[int, list[datetime]] = {}
        for e in events:
            if (e.gpu_uuid != uuid if uuid else e.pci_bus_id != pci):
                continue
            if catalog.get(e.code).category != "application":
                continue
            if not counts_as_repeat(e.message):
                continue
            times.setdefault(e.code, []).append(e.observed_at)
        for code, ts in sorted(times.items()):
            n = burst_count(ts, dedup)
            if n >= limit:
                return Result(
                    check=self.name, status=Status.FAILED, target=target, reason=f"Xid{code}",
                    message=f"application Xid {code} repeated {n} times on {target} within "
                            f"{window:.0f} s (limit {limit}): a possible hardware fault",
                    details={"uuid": uuid, "pci_bus_id": pci, "code": code,
                             "occurrences_in_window": n, "app_xid_repeat_count": limit,
                             "app_xid_window_s": window, "app_xid_dedup_s": dedup,
                             "repeated": True},
                    action=Action.RESET_GPU, observed_at=now)
        return None

    # --- one-shot scan -------------------------------------------------------------------------

    def _scan(self, ctx: Context) -> list[Result]:
        """The whole kernel log: one result per event through the event path, then one per
        quiet GPU: ``ok`` when the whole log was read, ``unknown`` naming the path and error
        when it was not."""
        self._memory, self._pending, self._recent_bus = [], None, {}
        errors_before = self.parse_errors
        results: list[Result] = []
        gaps = malformed = 0
        log_scan = self.log_scan(ctx)
        for item in log_scan:
            if isinstance(item, KmsgGap):
                gaps += 1
                continue
            malformed += item.malformed
            results.extend(self._on_record(item, ctx))
        scan, unread = log_scan.stats, log_scan.unread
        stats = {"lines_scanned": scan.lines, "xid_events": len(results),
                 "parse_errors": self.parse_errors - errors_before, "kmsg_gaps": gaps,
                 "malformed_records": malformed, "catalog_version": xid_catalog().version}
        seen = {r.target for r in results}
        for pci, (index, uuid) in sorted(self._gpu_map(ctx).items(), key=lambda kv: kv[1][0]):
            target = gpu_target(index)
            if target in seen:
                continue
            results.append(self.quiet(ctx, target, unread, "no XID in the kernel log",
                                      {"uuid": uuid, "pci_bus_id": pci, **stats}))
        self.unread_at_node(ctx, unread, results, stats)  # when no GPU carries it
        if not results:
            results.append(self.ok(ctx, NODE, f"no XID in {scan.lines} kernel-log lines",
                                   stats))
        return results


def _target_order(target: str) -> tuple[int, str]:
    kind, _, rest = target.partition(":")
    return (0, f"{int(rest):08d}") if kind == "gpu" and rest.isdigit() else (1, target)
