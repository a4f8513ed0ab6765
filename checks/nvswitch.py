"""nvswitch: NVSwitch SXid errors, NVML GPU fabric state, and Fabric Manager liveness.

Three signals about the NVLink fabric of an HGX-style node:

- ``SXid`` kernel-log lines (``on_kmsg``): a fatal one fails ``nvswitch:<N>`` (N from the
  ``nvidia-nvswitchN:`` prefix, else the switch's place in the sysfs list of NVSwitch
  functions) until the next reboot; a non-fatal one degrades it for ``nonfatal_window_s``
  (default 3600). The lines of one error (header, ``Severity``, ``Data``) are grouped into one
  event (gpu_monitor/rules/sxid.py). Events are stored with kind ``sxid``. A one-shot scan
  (``run``) says ``ok`` for a switch without an SXid only when the log was read to its end and
  held something, else ``unknown`` ``KmsgReadError`` naming the path and the error.
- NVML GPU fabric registration per GPU (H100+ with NVSwitch; GB200): state not ``completed`` ->
  ``failed`` ``FabricNotReady``, a completed registration with an error status -> ``failed``
  ``FabricError``; ``NotSupported`` -> ``skipped``; a GPU list NVML cannot give, a GPU it
  cannot identify or a fabric state it cannot read -> ``unknown`` ``NvmlReadError`` naming the
  call (checks/_gpus.py).
- Fabric Manager: when the profile says ``nvlink.nvswitch: true`` a process named
  ``nv-fabricmanager`` must exist in procfs, else ``degraded`` ``FabricManagerDown``.

During the boot grace period (``nvlink.boot_grace_s``) fabric and Fabric Manager problems are
``unknown`` ``BootGrace``: registration takes a while after boot. ``parse_errors`` counts SXid
lines that could not be used.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from checks._gpus import enumeration_error, error_details, unidentified
from checks._kernel_log import KernelLogCheck
from checks._kmsg_events import (
    READ_ERROR,
    UnreadLog,
    boot_id,
    event_time,
    follower_unread,
    record_seq,
    uptime_s,
)
from gpu_monitor.check import Context, Setting
from gpu_monitor.hw.kmsg.record import KmsgGap, KmsgRecord
from gpu_monitor.hw.nvml import (
    NVML_GPU_FABRIC_STATE_COMPLETED,
    NVML_SUCCESS,
    NvmlError,
    NvmlErrorKind,
)
from gpu_monitor.metric_families import CheckMetric, LatestResult, MetricsHistory, Sample
from gpu_monitor.model import (
    NODE,
    Action,
    Result,
    Status,
    gpu_target,
    iso,
    nvswitch_target,
    parse_iso,
    pcie_target,
)
from gpu_monitor.profiles.schema import SECONDS
from gpu_monitor.rules import sxid_catalog
from gpu_monitor.rules.sxid import SxidEvent, SxidGrouper, parse_sxid, status_of
from gpu_monitor.rules.xid import XidParseError
from gpu_monitor.state.kernel_log import XidEvent

log = logging.getLogger(__name__)

FABRIC_MANAGER = "nv-fabricmanager"
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
NONFATAL_WINDOW_S = 3600.0
BOOT_GRACE_S = 300.0


def _switch_addresses(ctx: Context) -> list[str]:
    """The NVSwitches' PCI addresses, sorted: ``nvswitch:<i>`` is the i-th (none when sysfs
    cannot list them)."""
    try:
        return sorted(d.address for d in ctx.host.sysfs.nvidia_switches())
    except Exception:  # noqa: BLE001
        return []


def sxid_event_samples(results: Sequence[LatestResult], history: MetricsHistory
                       ) -> Iterable[Sample]:
    """Every SXid seen, per code, over the store's whole history."""
    per_code: dict[int, int] = {}
    for (_idx, _uuid, code), n in history.xid_counts("sxid").items():
        per_code[code] = per_code.get(code, 0) + n
    for code, n in sorted(per_code.items()):
        yield (str(code),), float(n)


class NvSwitch(KernelLogCheck):
    summary = "NVSwitch SXid errors, NVML GPU fabric state and Fabric Manager liveness"
    interval = 60.0
    reasons = (*(f"SXid{c}" for c in sxid_catalog().codes()), "FabricNotReady", "FabricError",
               "FabricManagerDown", "NvmlReadError", "NotSupported", "BootGrace",
               READ_ERROR)
    sections = ("nvlink",)
    settings = {
        "nonfatal_window_s": Setting(SECONDS, NONFATAL_WINDOW_S,
                                     "how long a non-fatal SXid keeps its switch `degraded`",
                                     "project"),
    }
    condition = "GPUFabricError"
    kmsg_literals = ("SXid",)  # every line the parser reads holds it
    metrics = (CheckMetric("gpu_monitor_sxid_events_total", "counter", ("code",),
                           "NVSwitch SXid events seen in the kernel log, per code.",
                           samples=sxid_event_samples),)

    def __init__(self) -> None:
        super().__init__()
        self._grouper = SxidGrouper()

    # --- kernel log ---------------------------------------------------------------------------

    def _on_record(self, record: KmsgRecord, ctx: Context) -> list[Result]:
        return [self._result(ctx, ev, record) for _eid, ev, new in self._ingest(record, ctx)
                if new]

    def _ingest(self, record: KmsgRecord, ctx: Context) -> list[tuple[int, SxidEvent, bool]]:
        """Parse and group one record: [(event id, event so far, opened now)] or []."""
        text = record.text
        if "SXid" not in text:
            return []
        try:
            parsed = parse_sxid(text)
        except Exception:  # noqa: BLE001 - a parser bug must not stop monitoring
            log.exception("nvswitch: parser failed on %r", text[:200])
            parsed = XidParseError("garbage", text[:200])
        if parsed is None:
            return []
        if isinstance(parsed, XidParseError):
            self._count(parsed.kind)
            return []
        eid, ev, new = self._grouper.feed(parsed)
        if new:
            if not sxid_catalog().get(ev.code).known:
                self._count("unknown_code")
            self._record_event(ev, record, ctx)
        return [(eid, ev, new)]

    def _record_event(self, ev: SxidEvent, record: KmsgRecord, ctx: Context) -> None:
        target = self._target(ev, ctx)
        boot = boot_id(ctx)
        at, _timed = event_time(record, ctx)
        event = XidEvent(boot_id=boot, seq=record_seq(record), observed_at=at, code=ev.code,
                         pci_bus_id=ev.pci, kind="sxid", message=ev.lines[0][:2000],
                         fatal=ev.fatal)
        if ctx.store is not None:  # without a store nothing reads SXid history back
            try:
                ctx.store.add_xid_event(event)
            except Exception as exc:  # noqa: BLE001 - keep detecting even if history fails
                log.error("nvswitch: cannot store event: %s", exc)
        status, action = status_of(ev)
        self._open.note(ctx, target, {"status": status.value, "action": action.value,
                                      "reason": ev.reason, "code": ev.code, "boot_id": boot,
                                      "at": iso(at), "pci": ev.pci, "message": ev.lines[0][:300]})

    def _target(self, ev: SxidEvent, ctx: Context) -> str:
        if ev.switch_index is not None:
            return nvswitch_target(ev.switch_index)
        switches = _switch_addresses(ctx)
        if ev.pci in switches:
            return nvswitch_target(switches.index(ev.pci))
        return pcie_target(ev.pci)

    def _result(self, ctx: Context, ev: SxidEvent, record: KmsgRecord) -> Result:
        status, action = status_of(ev)
        info = sxid_catalog().get(ev.code)
        target = self._target(ev, ctx)
        at, _ = event_time(record, ctx)
        kind = "fatal" if ev.fatal else "non-fatal"
        details: dict[str, Any] = {
            "code": ev.code, "name": info.name, "fatal": ev.fatal, "fatal_basis": ev.fatal_basis,
            "fatal_class": info.fatal_class, "known_code": info.known, "pci_bus_id": ev.pci,
            "switch_index": ev.switch_index, "link": ev.link, "severity": ev.severity_level,
            "engine_instance": ev.engine_instance, "data": [f"0x{w:08x}" for w in ev.data],
            "lines": list(ev.lines), "orphan": ev.orphan, "event_time": iso(at),
            "seq": record_seq(record), "catalog_version": sxid_catalog().version,
        }
        if info.recovery:
            details["recovery"] = info.recovery
        link = f" link {ev.link}" if ev.link is not None else ""
        return Result(check=self.name, status=status, target=target, reason=ev.reason,
                      message=f"{kind} SXid {ev.code} ({info.name}) on {target}{link}: "
                              f"{ev.message[:160]}",
                      details=details, action=action, observed_at=ctx.clock.now())

    # --- standing state -------------------------------------------------------------------------

    def _state(self, ctx: Context) -> list[Result]:
        return (self._switch_state(ctx, follower_unread(ctx)) + self._fabric(ctx)
                + self._fabric_manager(ctx))

    def _scan(self, ctx: Context) -> list[Result]:
        """The whole kernel log (an event's lines grouped), then the standing state."""
        self._grouper = SxidGrouper()
        found: dict[int, tuple[SxidEvent, KmsgRecord]] = {}
        log_scan = self.log_scan(ctx)
        for item in log_scan:
            if isinstance(item, KmsgGap):
                continue
            for eid, ev, new in self._ingest(item, ctx):
                first = item if new or eid not in found else found[eid][1]
                found[eid] = (ev, first)
        unread = log_scan.unread
        results = [self._result(ctx, ev, rec) for ev, rec in found.values()]
        seen = {r.target for r in results}
        results += [r for r in self._switch_state(ctx, unread) if r.target not in seen]
        self.unread_at_node(ctx, unread, results)  # when no switch carries it
        return results + self._fabric(ctx) + self._fabric_manager(ctx)

    def _switch_state(self, ctx: Context, unread: UnreadLog | None = None) -> list[Result]:
        """Each switch's open SXid problem, else ``ok`` -- or, when a one-shot scan could not
        read the log (``unread``), ``unknown`` naming the path and error."""
        now = ctx.clock.now()
        boot = boot_id(ctx)
        window = float(ctx.setting(self.name, "nonfatal_window_s"))
        switches = _switch_addresses(ctx)
        targets = {nvswitch_target(i): pci for i, pci in enumerate(switches)}
        problems = self._open.current(ctx, lambda p: self._still_open(p, boot, now, window))
        results = []
        for target in sorted(set(targets) | set(problems)):
            prob = problems.get(target)
            if prob is not None:
                results.append(Result(
                    check=self.name, status=Status(prob["status"]), target=target,
                    reason=prob["reason"], action=Action(prob["action"]),
                    message=f"{prob['reason']} on {target} since {prob['at']}: "
                            f"{prob.get('message', '')[:160]}",
                    details={"pci_bus_id": prob.get("pci") or targets.get(target),
                             "code": prob.get("code"), "since": prob["at"], "open": True},
                    observed_at=now))
            elif target in targets:
                results.append(self.quiet(ctx, target, unread, "no open SXid problem",
                                          {"pci_bus_id": targets[target]}))
        return results

    @staticmethod
    def _still_open(prob: dict[str, Any], boot: str, now: datetime, window: float) -> bool:
        if prob.get("boot_id") != boot:
            return False
        if prob["status"] == Status.FAILED.value:
            return True
        return (now - parse_iso(prob["at"])).total_seconds() <= window

    # --- fabric ---------------------------------------------------------------------------------

    def _in_grace(self, ctx: Context) -> tuple[bool, float | None, float]:
        grace = float(ctx.setting(self.name, "boot_grace_s", BOOT_GRACE_S))
        up = uptime_s(ctx)
        return (up is not None and up < grace), up, grace

    def _fabric(self, ctx: Context) -> list[Result]:
        nvml = ctx.host.nvml
        if not nvml.available():
            return []  # inventory reports NVML itself; there is no GPU to say unknown about
        try:
            gpus = nvml.gpus()
        except NvmlError as exc:
            return [enumeration_error(self, ctx, exc)]
        grace, up, grace_s = self._in_grace(ctx)
        out = []
        for g in gpus:
            target = gpu_target(g.index)
            base = {"uuid": g.uuid}
            if g.lost:
                out.append(self.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                                       f"{target} is lost to NVML",
                                       {**base, **(error_details(g.error) if g.error else {})}))
                continue
            unread = unidentified(self, ctx, g, base, "the fabric state")
            if unread is not None:
                out.append(unread)
                continue
            try:
                f = nvml.fabric(g.index)
            except NvmlError as exc:
                if exc.kind in (NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.FUNCTION_NOT_FOUND):
                    out.append(self.result(ctx, Status.SKIPPED, target, "NotSupported",
                                           "no GPU fabric state on this GPU/driver", base))
                else:
                    out.append(self.result(ctx, Status.UNKNOWN, target, "NvmlReadError",
                                           f"cannot read the fabric state: {exc}",
                                           {**base, "error": str(exc), **error_details(exc)}))
                continue
            if not f.supported:
                out.append(self.result(ctx, Status.SKIPPED, target, "NotSupported",
                                       f"GPU fabric state not supported here ({f.call}: "
                                       "not_supported)", {**base, "nvml_call": f.call}))
                continue
            details = {**base, "fabric_state": FABRIC_STATES.get(f.state, str(f.state)),
                       "fabric_status": f.status, "clique_id": f.clique_id,
                       "cluster_uuid": f.cluster_uuid, "expected_state": "completed",
                       "expected_status": NVML_SUCCESS}
            if f.state == NVML_GPU_FABRIC_STATE_COMPLETED and f.status == NVML_SUCCESS:
                out.append(self.ok(ctx, target, "fabric registration completed", details))
                continue
            reason = ("FabricNotReady" if f.state != NVML_GPU_FABRIC_STATE_COMPLETED
                      else "FabricError")
            text = (f"fabric state {details['fabric_state']}" if reason == "FabricNotReady"
                    else f"fabric registration failed with NVML status {f.status}")
            if grace:
                out.append(self.result(ctx, Status.UNKNOWN, target, "BootGrace",
                                       f"{text} during the boot grace period",
                                       {**details, "uptime_s": up, "boot_grace_s": grace_s,
                                        "problem": reason}))
            else:
                out.append(self.result(ctx, Status.FAILED, target, reason, f"{target}: {text}",
                                       details, Action.REBOOT))
        return out

    def _fabric_manager(self, ctx: Context) -> list[Result]:
        if not ctx.profile.get("nvlink.nvswitch"):
            return []
        pid = find_process(ctx, FABRIC_MANAGER)
        if pid is not None:
            return [self.ok(ctx, NODE, f"{FABRIC_MANAGER} is running (pid {pid})",
                            {"fabric_manager_pid": pid})]
        grace, up, grace_s = self._in_grace(ctx)
        details = {"process": FABRIC_MANAGER, "uptime_s": up, "boot_grace_s": grace_s}
        if grace:
            return [self.result(ctx, Status.UNKNOWN, NODE, "BootGrace",
                                f"{FABRIC_MANAGER} not running yet (boot grace period)",
                                {**details, "problem": "FabricManagerDown"})]
        return [self.result(ctx, Status.DEGRADED, NODE, "FabricManagerDown",
                            f"no {FABRIC_MANAGER} process: the NVSwitch fabric cannot be "
                            "(re)configured and new NVLink jobs may fail", details,
                            Action.WATCH)]


def find_process(ctx: Context, name: str) -> int | None:
    """The pid of a process called ``name`` (the kernel cuts ``comm`` to 15 characters)."""
    procfs = ctx.host.procfs
    wanted = (name, name[:15])
    for pid in procfs.pids():
        if procfs.comm(pid) in wanted:
            return pid
    return None
